"""BLOOMDUPE_POLITENESS = "crawl": the crawl-wide queue (frontier/leased.py) on a
real Redis, without a crawl: the intake moved into download slots (a queue of the
default layout too: the migration), a slot's limit held across workers, leases put
back by a reap or a reclaim, undecodable entries retired, the queue's figures, its
clearing; the slot policy; the back-off's Retry-After."""

from __future__ import annotations

import time
import warnings

import pytest
import redis
from redis.cluster import RedisCluster
from scrapy import Request, Spider
from scrapy.settings import Settings
from slotqueue import SlotEntry, SlotQueue, leased

from scrapy_bloomdupe import keys
from scrapy_bloomdupe.backoff import _strike, crawl_delay, retry_after
from scrapy_bloomdupe.exceptions import ConfigError
from scrapy_bloomdupe.frontier import failed
from scrapy_bloomdupe.frontier.leased import CLAIM_AHEAD, LeasedQueue, claim_horizon
from scrapy_bloomdupe.frontier.politeness import SCRAPY_JITTER, OneSlot, SlotPolicy
from scrapy_bloomdupe.frontier.queue import PriorityQueue, status
from scrapy_bloomdupe.settings import FrontierConfig

TAG = "cw:bloomdupe"


class DemoSpider(Spider):
    name = "cw"


def policy(**settings: object) -> SlotPolicy:
    base = {"CONCURRENT_REQUESTS_PER_DOMAIN": 1, "DOWNLOAD_DELAY": 0,
            "RANDOMIZE_DOWNLOAD_DELAY": False}
    base.update(settings)
    return SlotPolicy(Settings(base), None)


def crawlwide(client: redis.Redis, **settings: object) -> LeasedQueue:
    return LeasedQueue(client, DemoSpider(), "cw:requests", tag=TAG,
                          policy=policy(**settings), lease_timeout=1.0)


def urls(leases: list) -> list[str]:
    return [lease.request.url for lease in leases]


def test_a_slot_at_its_limit_is_not_walked_past_and_an_ack_gives_room_back(
        client: redis.Redis) -> None:
    a, b = crawlwide(client), crawlwide(client)
    a.push_many([Request(f"https://one.test/{j}") for j in range(3)]
                + [Request("https://two.test/0")])
    first = a.pop_leases(10)
    assert sorted(urls(first)) == ["https://one.test/0", "https://two.test/0"]
    assert b.pop_leases(10) == []  # both slots at their limit (1), crawl-wide
    assert b.slots_waiting and b.next_due is None
    a.ack([lease for lease in first if "one.test" in lease.request.url])
    a.send_acks()
    assert urls(b.pop_leases(10)) == ["https://one.test/1"]
    assert status(client, TAG, 1) == (1, 2)


def test_a_pop_takes_its_share_of_the_slots_due_and_the_other_workers_the_rest(
        client: redis.Redis) -> None:
    """With two workers on the crawl, a pop takes from half the ready slots (rounded up):
    one worker taking every slot's room would parse every page while the other waits.
    Stopped by its share, it says no slot is due (its next pop waits for an ack or the
    slot poll); the next pops take the rest, each its share of what is ready then. Alone,
    a worker takes them all."""
    alone = crawlwide(client)
    alone.push_many([Request(f"https://h{j}.test/0") for j in range(4)])
    assert len(alone.pop_leases(10)) == 4  # its own the only heartbeat: every slot
    alone.close()
    client.flushdb()
    a, b = crawlwide(client), crawlwide(client)
    assert b.pop_leases(10) == []  # b is on the crawl (the owners' heartbeats)
    a.push_many([Request(f"https://h{j}.test/0") for j in range(4)])
    first = urls(a.pop_leases(10))
    assert len(first) == 2 and a.next_due is None and a.slots_waiting
    second = urls(b.pop_leases(10))  # 2 ready now: its share is 1
    third = urls(a.pop_leases(10))
    assert (len(second), len(third)) == (1, 1)
    assert sorted(first + second + third) == [f"https://h{j}.test/0" for j in range(4)]


def test_a_pop_takes_back_the_slots_its_acks_freed_and_its_share_of_the_rest(
        client: redis.Redis) -> None:
    """The slots a worker's acks free go to the pop that carries them (no other worker's
    pop is on its way), and of the other ready slots it takes its share: with 2 freed
    and 2 others ready, 2 workers, 2 + 1."""
    a, b = crawlwide(client), crawlwide(client)
    assert b.pop_leases(10) == []
    a.push_many([Request(f"https://h{j}.test/{i}") for j in range(4) for i in range(2)])
    held = a.pop_leases(10)
    assert len(held) == 2  # its share of 4 slots
    a.ack(held)
    again = urls(a.pop_leases(10))  # the acks ride on this pop, which frees 2 slots
    assert len(again) == 3, again
    assert len(urls(b.pop_leases(10))) == 1


def test_priorities_hold_within_a_slot(client: redis.Redis) -> None:
    q = crawlwide(client, CONCURRENT_REQUESTS_PER_DOMAIN=0)
    q.push_many([Request("https://one.test/low", priority=-1),
                 Request("https://one.test/high", priority=5),
                 Request("https://one.test/mid")])
    assert urls(q.pop_leases(10)) == ["https://one.test/high", "https://one.test/mid",
                                      "https://one.test/low"]


def test_a_slots_delay_holds_across_workers(client: redis.Redis) -> None:
    a, b = crawlwide(client, DOWNLOAD_DELAY=30), crawlwide(client, DOWNLOAD_DELAY=30)
    a.push_many([Request(f"https://slow.test/{j}") for j in range(2)]
                + [Request("https://fast.test/0")])
    a_got = a.pop_leases(10)
    assert sorted(urls(a_got)) == ["https://fast.test/0", "https://slow.test/0"]
    a.ack(a_got)
    a.send_acks()
    b.horizon = CLAIM_AHEAD  # not as far ahead as the delay (see claim_horizon)
    assert b.pop_leases(10) == []  # room, but not before 30 s: no start
    assert b.next_due is not None and 25 < b.next_due <= 30
    # As far ahead as the crawl's longest delay (the default): taken, to start in 30 s.
    assert a.horizon == 30
    (ahead,) = a.pop_leases(10)
    assert ahead.request.url == "https://slow.test/1" and 25 < ahead.start_in <= 30


def test_a_pop_takes_a_slot_due_within_its_horizon_with_when_it_may_start(
        client: redis.Redis) -> None:
    a = crawlwide(client, CONCURRENT_REQUESTS_PER_DOMAIN=3, DOWNLOAD_DELAY=3)
    a.horizon = 5.0
    a.push_many([Request(f"https://slow.test/{j}") for j in range(3)])
    (now,) = a.pop_leases(10)
    assert now.start_in == 0
    (ahead,) = a.pop_leases(10)  # the slot's next start (in 3 s) is within 5 s
    assert ahead.request.url == "https://slow.test/1" and 2 < ahead.start_in <= 3
    # The one after starts 3 s later still: 6 s away, 1 s past the horizon.
    assert a.pop_leases(10) == []
    assert a.next_due is not None and 0 < a.next_due <= 1
    assert a.slots_waiting


def test_a_pop_looks_as_far_ahead_as_the_longest_delay() -> None:
    assert claim_horizon(policy()) == CLAIM_AHEAD
    assert claim_horizon(policy(DOWNLOAD_DELAY=2)) == 2
    assert claim_horizon(policy(DOWNLOAD_DELAY=2, RANDOMIZE_DOWNLOAD_DELAY=True)) == 3
    if SCRAPY_JITTER:  # a gap of up to 1 + DOWNLOAD_DELAY_JITTER times the delay
        assert claim_horizon(policy(DOWNLOAD_DELAY=2, DOWNLOAD_DELAY_JITTER=0.25)) == 2.5
    assert claim_horizon(policy(DOWNLOAD_DELAY=1,
                                DOWNLOAD_SLOTS={"slow.test": {"delay": 4}})) == 4


#: Scrapy 2.16-2.18 read neither DOWNLOAD_DELAY_JITTER nor a DOWNLOAD_SLOTS "jitter".
NEEDS_JITTER = pytest.mark.skipif(not SCRAPY_JITTER, reason="Scrapy before 2.19: no jitter")


@pytest.mark.parametrize(("settings", "jitter", "before_2_19"), [
    ({}, 0.5, 0.5),  # Scrapy's defaults: ±50%
    ({"DOWNLOAD_DELAY_JITTER": 0.2}, 0.2, 0.5),
    ({"DOWNLOAD_DELAY_JITTER": 0}, 0.0, 0.5),
    ({"DOWNLOAD_DELAY_JITTER": -0.2}, 0.2, 0.5),  # Scrapy's uniform(0.2, -0.2): ±20%
    ({"RANDOMIZE_DOWNLOAD_DELAY": False}, 0.0, 0.0),  # the old name, set: it wins
    # Both set alike: the new name wins, as in Scrapy's downloader.
    ({"RANDOMIZE_DOWNLOAD_DELAY": False, "DOWNLOAD_DELAY_JITTER": 0.3}, 0.3, 0.0),
])
def test_a_delays_jitter_is_the_one_scrapys_downloader_applies(
        settings: dict[str, object], jitter: float, before_2_19: float) -> None:
    """Scrapy 2.19's DOWNLOAD_DELAY_JITTER (a magnitude: 0.2 is 0.8x-1.2x) crawl-wide, and
    RANDOMIZE_DOWNLOAD_DELAY where Scrapy still reads it (set at a higher priority, or a
    Scrapy before 2.19, the floor: 2.16). Any jitter was 0.5x-1.5x before, and
    DOWNLOAD_DELAY_JITTER = 0 went on randomizing where RANDOMIZE_DOWNLOAD_DELAY was on."""
    crawl = SlotPolicy(Settings({"DOWNLOAD_DELAY": 1, **settings}), None)
    assert crawl.jitter == (jitter if SCRAPY_JITTER else before_2_19)
    assert crawl.defaults().jitter == crawl.jitter


def test_a_download_slots_jitter_is_its_own() -> None:
    """DOWNLOAD_SLOTS' ``jitter`` (Scrapy 2.19) and its older ``randomize_delay`` (±50% or
    none) give a slot its own jitter; the pop gets those that are not the default."""
    crawl = SlotPolicy(Settings({"DOWNLOAD_DELAY": 1, "DOWNLOAD_SLOTS": {
        "new.test": {"jitter": 0.1}, "old.test": {"randomize_delay": False},
        "same.test": {"delay": 2}}}), None)
    assert crawl.limits("old.test").jitter == 0.0
    assert crawl.limits("same.test").jitter == crawl.jitter == 0.5
    if SCRAPY_JITTER:
        assert crawl.limits("new.test").jitter == 0.1
        assert crawl.jitters() == {"new.test": 0.1, "old.test": 0.0}
    else:
        assert crawl.limits("new.test").jitter == 0.5  # not read by Scrapy 2.16-2.18
        assert crawl.jitters() == {"old.test": 0.0}
    assert claim_horizon(crawl) == 3  # same.test: 2 s, up to 1.5 times


@NEEDS_JITTER
def test_a_pop_spreads_each_delay_by_the_jitter(client: redis.Redis) -> None:
    """The crawl-wide pop applies the jitter's magnitude: with DOWNLOAD_DELAY_JITTER = 0.1
    each slot's next start is 0.9-1.1 s after its first (it was 0.5-1.5 s, whatever the
    magnitude), and a DOWNLOAD_SLOTS entry without jitter waits its delay exactly."""
    q = crawlwide(client, DOWNLOAD_DELAY=1, DOWNLOAD_DELAY_JITTER=0.1,
                  CONCURRENT_REQUESTS_PER_DOMAIN=0,
                  DOWNLOAD_SLOTS={"fixed.test": {"jitter": 0}})
    hosts = [f"h{j}.test" for j in range(30)]
    q.push_many([Request(f"https://{host}/") for host in [*hosts, "fixed.test"]])

    def redis_ms() -> int:
        seconds, micros = client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    before = redis_ms()
    taken = q.pop_leases(100)
    after = redis_ms()
    assert len(taken) == 31

    def next_start(host: str) -> int:
        return int(client.hget(q.k[0].prefix + keys.slot_name(host), "next"))

    # The pop ran between before and after (one time of Redis's, read once each).
    starts = [next_start(host) for host in hosts]
    assert all(before + 900 <= t <= after + 1100 for t in starts), (before, after, starts)
    assert max(starts) - min(starts) > 50, starts  # spread, not one value
    assert before + 1000 <= next_start("fixed.test") <= after + 1000
    assert claim_horizon(q.policy) == 1.1


def test_a_queue_of_the_default_layout_is_moved_into_the_slots(client: redis.Redis) -> None:
    old = PriorityQueue(client, DemoSpider(), "cw:requests", tag=TAG)
    old.push_many([Request(f"https://h{j % 3}.test/{j}") for j in range(30)])
    q = crawlwide(client, CONCURRENT_REQUESTS_PER_DOMAIN=0)
    assert len(q) == 30
    got = q.pop_leases(100)
    assert sorted(urls(got)) == sorted(f"https://h{j % 3}.test/{j}" for j in range(30))
    assert client.zcard(keys.queue(TAG, 0)) == 0
    assert status(client, TAG, 1) == (0, 30)


def test_a_dead_workers_slot_leases_come_back_counted_and_free_room(
        client: redis.Redis) -> None:
    dead, live = crawlwide(client), crawlwide(client)
    dead.push_many([Request("https://one.test/0"), Request("https://one.test/1")])
    (held,) = dead.pop_leases(10)
    client.zadd(keys.owners(TAG, 0), {dead.owner: 0})  # its heartbeat stopped long ago
    back = live.reap()
    assert [(n, r.url) for n, r in back] == [(1, held.request.url)]
    (again,) = live.pop_leases(10)
    assert again.request.url == held.request.url and again.requeues == 1
    assert client.zscore(keys.owners(TAG, 0), dead.owner) is None


def test_a_heartbeat_that_ages_between_a_reaps_round_trips_leaves_the_owner_to_the_next(
        client: redis.Redis) -> None:
    """A reap was two round trips: the slot leases (slot_reap.lua), then the default
    layout's (reap.lua, which forgot the dead owners). A dead worker's heartbeat that
    passed the lease timeout between the two was seen alive by the first and dead by
    the second: forgotten then, its slot leases never came back and the crawl never
    ended (a SIGKILL test's workers once stayed idle for good with 20 leased). Now
    slot_reap.lua gives back and forgets in one script, one round trip without an old
    lease hash: an owner seen alive is kept, and the next reap gives its leases back."""
    dead, live = crawlwide(client), crawlwide(client)
    dead.push_many([Request("https://one.test/0")])
    (held,) = dead.pop_leases(10)
    execute, rounds = live._execute, []

    def aging(commands: list, **kw: object) -> list:
        replies = execute(commands, **kw)
        if not rounds:  # between the two round trips: the timeout passes
            client.zadd(keys.owners(TAG, 0), {dead.owner: 0})
        rounds.append(len(commands))
        return replies

    live._execute = aging  # type: ignore[method-assign]
    assert live.reap() == [] and len(rounds) == 1
    assert client.zscore(keys.owners(TAG, 0), dead.owner) == 0  # not forgotten
    live._execute = execute  # type: ignore[method-assign]
    assert [r.url for _, r in live.reap()] == [held.request.url]
    assert client.zscore(keys.owners(TAG, 0), dead.owner) is None
    assert leased(client, TAG) == 0


def test_a_reclaim_gives_back_what_a_lost_pop_leased(client: redis.Redis) -> None:
    q = crawlwide(client, CONCURRENT_REQUESTS_PER_DOMAIN=0)
    q.push_many([Request("https://one.test/0"), Request("https://two.test/0")])
    kept = q.pop_leases(1)
    # A pop whose reply never came: its leases are in Redis, not in the worker's hands.
    q._unanswered_pops.add(q._pop_number)
    k = q.k[0]
    q._execute([("EVALSHA", q._scripts["slot_pop"].sha, 5, k.ready, k.leased, k.owners,
                 k.defaults, k.waiting, q.owner, q._pop_number, 10, k.prefix, 0, 1)],
               acks=False)
    dead = crawlwide(client, CONCURRENT_REQUESTS_PER_DOMAIN=0)
    dead.push_many([Request("https://three.test/0")])
    dead.pop_leases(10)
    client.zadd(keys.owners(TAG, 0), {dead.owner: 0})  # a dead worker's: the reap's
    back = q.reclaim(kept)
    assert back.lost_pops == 1 and back.total == 1
    assert [r.url for _, r in q.reap()] == ["https://three.test/0"]
    assert leased(client, TAG) == 1
    assert len(q) == 2


def test_a_closing_worker_gives_back_what_it_did_not_start(client: redis.Redis) -> None:
    q = crawlwide(client)
    q.push_many([Request("https://one.test/0")])
    q.pop_leases(10)
    q.close()
    other = crawlwide(client)
    (lease,) = other.pop_leases(10)
    assert lease.requeues == 0


def test_undecodable_entries_are_retired_in_the_intake_and_in_a_lease(
        client: redis.Redis) -> None:
    q = crawlwide(client, CONCURRENT_REQUESTS_PER_DOMAIN=0)
    q.push_many([Request("https://one.test/0")])
    client.zadd(keys.queue(TAG, 0), {b"\x80not a request": 0})
    assert urls(q.pop_leases(10)) == ["https://one.test/0"]
    # One that reached a slot and does not decode when popped: retired, its room back.
    SlotQueue(client, TAG).push([SlotEntry("one.test", 0, b"\x80garbage")])
    assert q.pop_leases(10) == []
    records = failed.read(client, TAG)
    assert len(records) == 2
    assert leased(client, TAG) == 1  # one.test/0's only
    assert status(client, TAG, 1) == (0, 1)


def test_clearing_deletes_every_key_of_the_slots(client: redis.Redis) -> None:
    q = crawlwide(client, DOWNLOAD_DELAY=5)
    q.push_many([Request(f"https://h{j}.test/") for j in range(3)] * 1)
    q.pop_leases(1)
    q.backoff("h2.test", 10**13)
    q.clear()
    assert list(client.scan_iter(match=f"{{{TAG}:*")) == []


def test_a_backoff_pauses_the_slot_for_every_worker(client: redis.Redis) -> None:
    a, b = crawlwide(client), crawlwide(client)
    a.push_many([Request("https://busy.test/0"), Request("https://calm.test/0")])
    now = a.redis_time_ms()
    a.backoff("busy.test", now + 60_000)
    assert urls(b.pop_leases(10)) == ["https://calm.test/0"]
    assert b.next_due is not None and 55 < b.next_due <= 60


def test_a_backoff_without_retry_after_doubles_and_is_forgiven(client: redis.Redis) -> None:
    q = crawlwide(client)
    assert [_strike(q, "s.test", 1_000_000 + j, 60) for j in range(8)] == \
        [1, 2, 4, 8, 16, 32, 60, 60]
    assert _strike(q, "s.test", 1_000_007 + 61_000, 60) == 1  # a quiet minute: forgiven


def test_retry_after_reads_seconds_and_dates() -> None:
    assert retry_after(b"2") == 2
    assert retry_after(None) is None and retry_after(b"soon") is None
    assert 9 <= retry_after("Wed, 21 Oct 2015 07:28:10 GMT",  # type: ignore[operator]
                            now=1445412480.0) <= 10


def test_the_slot_policy_is_scrapys() -> None:
    p = policy(CONCURRENT_REQUESTS_PER_DOMAIN=2, DOWNLOAD_DELAY=0.25,
               DOWNLOAD_SLOTS={"api.test": {"concurrency": 5, "delay": 1.5}})
    one = p.of(Request("https://www.example.test/a"))
    assert (one.slot, one.concurrency, one.delay_ms) == ("www.example.test", 2, 250)
    api = p.of(Request("https://api.test/"))
    assert (api.concurrency, api.delay_ms) == (5, 1500)
    meta = p.of(Request("https://x.test/", meta={"download_slot": "shared"}))
    assert meta.slot == "shared"
    with warnings.catch_warnings():  # Scrapy 2.19 deprecates the setting; it still works
        warnings.simplefilter("ignore")
        per_ip = policy(CONCURRENT_REQUESTS_PER_IP=3)
        assert per_ip.of(Request("https://a.test/")).concurrency == 3


def test_bad_politeness_settings_say_what_to_do() -> None:
    for name, value in (("BLOOMDUPE_POLITENESS", "site"), ("BLOOMDUPE_BACKOFF_CODES", "x"),
                        ("BLOOMDUPE_BACKOFF_CODES", [999])):
        try:
            FrontierConfig.from_settings(Settings({name: value}))
        except ConfigError as e:
            assert name in str(e)
        else:
            raise AssertionError(f"{name} = {value!r} was accepted")
    assert FrontierConfig.from_settings(
        Settings({"BLOOMDUPE_POLITENESS": "Crawl"})).politeness == "crawl"


def test_a_robots_crawl_delay_holds_for_the_slots_next_requests(client: redis.Redis) -> None:
    body = b"User-agent: *\nCrawl-delay: 20\nDisallow: /private\n"
    assert crawl_delay(body, "demo-bot") == 20
    assert crawl_delay(b"User-agent: *\nDisallow:\n", "demo-bot") is None
    a, b = crawlwide(client), crawlwide(client)
    a.robots_delay("polite.test", 20_000)
    a.push_many([Request(f"https://polite.test/{j}") for j in range(2)])
    got = a.pop_leases(10)
    a.ack(got)
    a.send_acks()
    assert b.pop_leases(10) == []  # room, but the slot's next start is 20 s away
    assert b.next_due is not None and 15 < b.next_due <= 20


def test_a_dead_workers_leases_of_the_default_layout_come_back_into_the_slots(
        client: redis.Redis) -> None:
    """A crawl of the last release: its queue in the sorted set and a dead worker's
    leases in the sorted set's lease hash. The new worker's reap puts them back, and its
    pops move everything into the slots: nothing is lost in the migration."""
    old = PriorityQueue(client, DemoSpider(), "cw:requests", tag=TAG)
    old.push_many([Request(f"https://old.test/{j}") for j in range(5)])
    held = old.pop_leases(2)
    client.zadd(keys.owners(TAG, 0), {old.owner: 0})  # it stopped heartbeating long ago
    q = crawlwide(client, CONCURRENT_REQUESTS_PER_DOMAIN=0)
    back = q.reap()
    assert sorted(r.url for _, r in back) == sorted(lease.request.url for lease in held)
    got = q.pop_leases(10)
    assert sorted(urls(got)) == [f"https://old.test/{j}" for j in range(5)]
    assert client.hlen(keys.leases(TAG, 0)) == 0 and client.zcard(keys.queue(TAG, 0)) == 0


def test_acks_riding_on_a_check_and_queue_survive_a_script_flush(redis_url: str) -> None:
    """A crawl-wide queue's acks are slot_ack.lua calls that ride on the filter's
    check-and-queue round trips: after a Redis restart (its scripts gone) the filter's
    link loads that script too, instead of stopping the crawl on NOSCRIPT."""
    from helpers import crawler_for
    from scrapy.utils.misc import build_from_crawler

    from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter

    crawler = crawler_for(redis_url, SCHEDULER_PERSIST=True)
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    client = df.bloom.client
    q = LeasedQueue(client, crawler.spider, "demo:requests", tag=df.bloom.key,
                       policy=policy(CONCURRENT_REQUESTS_PER_DOMAIN=0))
    first = [Request("https://a.test/1"), Request("https://a.test/2")]
    assert df.check_and_queue([df.fingerprinter.fingerprint(r) for r in first], q,
                              [q.sink_entry(r) for r in first]) == [True, True]
    leases = q.pop_leases(10)
    q.ack(leases)  # pending: rides on the next check-and-queue
    client.script_flush()
    later = Request("https://a.test/3")
    assert df.check_and_queue([df.fingerprinter.fingerprint(later)], q,
                              [q.sink_entry(later)]) == [True]
    assert q.pending_acks() == 0 and leased(client, df.bloom.key) == 0


def test_a_command_the_acl_refuses_leaves_the_slots_as_they_were(redis_url: str,
                                                                  client: redis.Redis) -> None:
    """ZADD revoked mid-crawl (tests/e2e/test_operator.py's acl-revoked-zadd): a slot
    script that wrote its lists before the refused ZADD of the ready set left requests
    no pop found, and the next workers' crawl never ended. Every slot script asks the
    ACL first: refused, it writes nothing."""
    from urllib.parse import urlsplit

    from redis.exceptions import NoPermissionError

    q = crawlwide(client, CONCURRENT_REQUESTS_PER_DOMAIN=0)
    # In the intake (an earlier build's), which the first pop moves into the slots.
    PriorityQueue.push_many(q, [Request(f"https://one.test/{j}") for j in range(3)])
    before = sorted(client.keys("*"))
    client.acl_setuser("limited", enabled=True, passwords=["+pw"], keys=["*"],
                       commands=["+@all", "-zadd"])
    port = urlsplit(redis_url).port
    limited = redis.Redis(host="127.0.0.1", port=port, username="limited", password="pw")
    try:
        refused = crawlwide(limited, CONCURRENT_REQUESTS_PER_DOMAIN=0)
        for call in (refused.sort, lambda: refused.pop_leases(10),
                     lambda: refused.backoff("one.test", 1)):
            try:
                call()
            except NoPermissionError as e:
                assert "'zadd'" in str(e)
            else:
                raise AssertionError("not refused")
            assert sorted(client.keys("*")) == before
            assert client.zcard(keys.queue(TAG, 0)) == 3
    finally:
        limited.close()
        client.acl_deluser("limited")
    assert sorted(urls(q.pop_leases(10))) == [f"https://one.test/{j}" for j in range(3)]


def test_on_a_cluster_each_shard_keeps_its_slot_and_a_dead_workers_leases_come_back(
        rc: RedisCluster) -> None:
    """``"worker"`` mode on a Redis Cluster: a slot (``*``) a queue shard, popped in turn;
    a dead worker's leases on every shard come back counted, a reclaim gives back only
    what this worker no longer holds, and nothing is lost or doubled."""
    rc.flushall()

    def worker_queue() -> LeasedQueue:
        return LeasedQueue(rc, DemoSpider(), "cw:requests", tag=TAG, shards=4,
                              policy=OneSlot(), lease_timeout=1.0)

    dead, live = worker_queue(), worker_queue()
    sent = [f"https://one.test/{j}" for j in range(40)]
    for j in range(0, 40, 5):  # a push a shard in turn
        dead.push_many([Request(url) for url in sent[j:j + 5]])
    taken = [lease for _ in range(4) for lease in dead.pop_leases(3)]
    assert len({lease.shard for lease in taken}) == 4 and len(taken) == 12
    assert status(rc, TAG, 4) == (28, 12)
    for shard in range(4):  # its heartbeat stopped long ago
        rc.zadd(keys.owners(TAG, shard), {dead.owner: 0})
    back = live.reap()
    assert sorted(r.url for _, r in back) == sorted(lease.request.url for lease in taken)
    assert {n for n, _ in back} == {1}
    # A lost pop's leases (its reply never read) come back with a reclaim, the rest stay.
    kept = live.pop_leases(5)
    live._unanswered_pops.add(live._pop_number)
    live._pop_number += 1
    k = live.k[kept[0].shard]
    live._execute([("EVALSHA", live._scripts["slot_pop"].sha, 5, k.ready, k.leased, k.owners,
                    k.defaults, k.waiting, live.owner, live._pop_number - 1, 2, k.prefix, 0,
                    1)], acks=False)
    assert live.reclaim(kept).lost_pops == 2
    got = [*kept]
    while leases := live.pop_leases(10):
        got += leases
    assert sorted(lease.request.url for lease in got) == sorted(sent)
    live.ack(got)
    live.send_acks()
    assert status(rc, TAG, 4) == (0, 0)


def cluster_crawlwide(rc: RedisCluster, **settings: object) -> LeasedQueue:
    return LeasedQueue(rc, DemoSpider(), "cw:requests", tag=TAG, shards=4,
                          policy=policy(**settings), lease_timeout=1.0)


def test_on_a_cluster_a_slot_lives_on_its_home_shard_and_its_limit_holds_crawl_wide(
        rc: RedisCluster) -> None:
    """``"crawl"`` mode on a Redis Cluster: requests of one host queued on every shard
    move into their slot's home shard, so its limit (1 in flight) holds for every
    worker, and its back-off too."""
    rc.flushall()
    a, b = cluster_crawlwide(rc), cluster_crawlwide(rc)
    hosts = [f"h{j}.test" for j in range(6)]
    sent = [f"https://{host}/{n}" for n in range(4) for host in hosts]
    for j in range(0, len(sent), 3):  # a push a shard in turn: each host's on several
        a.push_many([Request(url) for url in sent[j:j + 3]])
    assert {a.home(keys.slot_name(host)) for host in hosts} != {0}
    got: list = []
    for _ in range(len(sent)):  # each round: one in flight a host, whoever pops
        round_ = [lease for q in (a, b, a, b) for lease in q.pop_leases(10)]
        hosts_out = [lease.request.url.split("/")[2] for lease in round_]
        assert len(hosts_out) == len(set(hosts_out)), hosts_out
        got += round_
        for q in (a, b):
            q.ack([lease for lease in round_ if lease.field.startswith(q.owner)])
            q.send_acks()
        if len(got) == len(sent):
            break
    assert sorted(lease.request.url for lease in got) == sorted(sent)
    assert status(rc, TAG, 4) == (0, 0)
    # A back-off pauses the slot on its home, for both workers.
    a.push_many([Request("https://h0.test/late")])
    # (Redis's clock on a cluster: the back-off middleware's; it failed there, unpacking
    # one TIME reply a node, and no 429 paused its slot: benchmarks/politeness.py --cluster)
    now = a.redis_time_ms()
    assert abs(now - time.time() * 1000) < 5_000
    a.backoff("h0.test", now + 60_000)
    assert [lease for _ in range(4) for lease in b.pop_leases(10)] == []
    assert b.slots_waiting and b.next_due is not None and b.next_due > 50


def test_on_a_cluster_a_dead_workers_move_goes_back_to_the_intake(rc: RedisCluster) -> None:
    """A worker that died between taking entries out of an intake and pushing them to
    their slots' homes: its entries in the move are counted as leased, then, reaped,
    back in the intake, and the next pops move and lease each once."""
    rc.flushall()
    dead, live = cluster_crawlwide(rc), cluster_crawlwide(rc)
    # In an intake, as a filter shard queues a request whose slot's home is another's.
    PriorityQueue.push_many(dead, [Request(f"https://h{j}.test/0") for j in range(5)])
    shard = next(i for i, k in enumerate(dead.k) if rc.zcard(k.intake))
    k = dead.k[shard]
    claim = [x for member, score in rc.zrange(k.intake, 0, -1, withscores=True)
             for x in (int(score), member)]
    rc.zrem(k.owners, dead.owner)  # forgotten by a reap (a pause): the claim says it lives
    moving = dead._execute([("EVALSHA", dead._scripts["slot_claim"].sha, 3, k.intake,
                             k.leased, k.owners, dead.owner, *claim)], acks=False)[0]
    assert len(moving) == 5 and status(rc, TAG, 4) == (0, 5)
    assert rc.zscore(k.owners, dead.owner)  # else no reap would ever find its list
    rc.zadd(k.owners, {dead.owner: 0})  # its heartbeat stopped long ago
    assert live.reap() == []  # nothing was fetched: nothing counted as a requeue
    assert status(rc, TAG, 4) == (5, 0)
    got = [lease for _ in range(8) for lease in live.pop_leases(10)]
    assert sorted(lease.request.url for lease in got) == [
        f"https://h{j}.test/0" for j in range(5)]
    assert {lease.requeues for lease in got} == {0}


def test_on_a_cluster_a_move_cut_short_is_ended_once_not_put_back_by_a_reclaim(
        rc: RedisCluster) -> None:
    """A move whose end did not go through (a lost reply) stays this worker's: a reclaim
    keeps its entries (they are pushed to their slots already), and the next move ends
    it; every request is leased once."""
    rc.flushall()
    q = cluster_crawlwide(rc)
    PriorityQueue.push_many(q, [Request(f"https://h{j}.test/0") for j in range(5)])  # an intake
    shard = next(i for i, k in enumerate(q.k) if rc.zcard(k.intake))
    real = q._execute

    def end_lost(commands: list, **kwargs: object) -> list:
        if commands[0][1] == q._scripts["slot_ack"].sha:
            raise redis.ConnectionError("the move's end: no reply")
        return real(commands, **kwargs)

    q._execute = end_lost  # type: ignore[method-assign]
    with pytest.raises(redis.ConnectionError):
        q.sort(shard=shard)
    q._execute = real  # type: ignore[method-assign]
    assert status(rc, TAG, 4) == (5, 5)  # pushed to their slots, still in the move
    q.reclaim()
    assert status(rc, TAG, 4) == (5, 5)
    got = [lease for _ in range(8) for lease in q.pop_leases(10)]
    assert sorted(lease.request.url for lease in got) == [
        f"https://h{j}.test/0" for j in range(5)]
    assert status(rc, TAG, 4) == (0, 5)


@pytest.mark.parametrize("window", [False, True])
@pytest.mark.parametrize("mode", ["crawl", "worker"])
def test_the_filter_s_script_queues_straight_into_the_slots(
        engine_client: redis.Redis, engine: str, mode: str, window: bool) -> None:
    """One node, both engines, with and without a window, both politeness modes: each new
    request goes from the check-and-add script into its slot's list (no intake, no
    move), counted as waiting, and each is leased once."""
    from scrapy_bloomdupe import sizing
    from scrapy_bloomdupe.bloom.filter import BloomFilter

    client = engine_client
    q = (crawlwide(client, CONCURRENT_REQUESTS_PER_DOMAIN=0) if mode == "crawl" else
         LeasedQueue(client, DemoSpider(), "cw:requests", tag=TAG, policy=OneSlot()))
    span = sizing.Window(3_600_000) if window else None
    plan = (sizing.window_plan(10_000, 0.001, span, shards=3) if span else
            sizing.plan(10_000, 0.001, shards=3))
    bf = BloomFilter.open(client, TAG, plan, window=span)  # type: ignore[arg-type]
    requests = [Request(f"https://h{j % 3}.test/{j}", priority=j % 2) for j in range(12)]
    requests.append(Request("https://h0.test/0"))  # twice: queued once
    new = bf.add_many([r.url.encode() for r in requests], q,
                      lambda i: q.sink_entry(requests[i]))
    assert new == [True] * 12 + [False]
    assert client.zcard(keys.queue(TAG, 0)) == 0  # no intake
    assert int(client.get(keys.slot_waiting(TAG, 0))) == 12 and q.status() == (12, 0)
    names = {"crawl": [f"h{j}.test" for j in range(3)], "worker": ["*"]}[mode]
    assert sorted(client.zrange(keys.ready(TAG, 0), 0, -1)) == [n.encode() for n in names]
    got = [lease for _ in range(6) for lease in q.pop_leases(20)]
    assert sorted(urls(got)) == sorted(r.url for r in requests[:12])
    assert got[0].request.priority == 1  # priorities kept


@pytest.mark.parametrize("mode", ["crawl", "worker"])
def test_on_a_cluster_the_intake_holds_only_what_another_shard_s_slot_needs(
        rc: RedisCluster, mode: str) -> None:
    """A Redis Cluster: in ``"worker"`` mode every new request goes straight into its
    fingerprint's shard's slot ``*``; in ``"crawl"`` mode straight into its slot when
    the slot's home is the fingerprint's shard, else into that shard's intake (a pop
    moves it home). Every request is leased once either way."""
    from scrapy_bloomdupe import hashing, sizing
    from scrapy_bloomdupe.bloom.filter import BloomFilter

    rc.flushall()
    q = (cluster_crawlwide(rc, CONCURRENT_REQUESTS_PER_DOMAIN=0) if mode == "crawl" else
         LeasedQueue(rc, DemoSpider(), "cw:requests", tag=TAG, shards=4, policy=OneSlot()))
    bf = BloomFilter.open(rc, TAG, sizing.plan(10_000, 0.001, shards=4))
    requests = [Request(f"https://h{j % 5}.test/{j}") for j in range(40)]
    fps = [r.url.encode() for r in requests]
    assert bf.add_many(fps, q, lambda i: q.sink_entry(requests[i])) == [True] * 40
    elsewhere = [r for r, fp in zip(requests, fps, strict=True)
                 if q.home(keys.slot_name(r.url.split("/")[2])) !=
                 hashing.shard_of(hashing.halves(fp, bf.seed)[0], 4)]
    in_intakes = sum(rc.zcard(k.intake) for k in q.k)
    assert in_intakes == (len(elsewhere) if mode == "crawl" else 0)
    assert in_intakes < 40 or mode == "worker"
    got = [lease for _ in range(20) for lease in q.pop_leases(40)]
    assert sorted(urls(got)) == sorted(r.url for r in requests)
    assert sum(rc.zcard(k.intake) for k in q.k) == 0


@pytest.mark.parametrize("mode", ["crawl", "worker"])
def test_the_crawl_s_end_does_not_rest_on_a_counter_the_lists_disagree_with(
        client: redis.Redis, mode: str) -> None:
    """An entry another program LPUSHed into a slot's list mid-crawl is popped, retired
    (``bloomdupe failed`` lists it) and leaves the waiting count at -1: the idle look
    said "the shared queue has requests" for ever. A count raised by hand, with no list
    behind it, alike. The look checks each counter against its lists."""
    q = (crawlwide(client, CONCURRENT_REQUESTS_PER_DOMAIN=0) if mode == "crawl" else
         LeasedQueue(client, DemoSpider(), "cw:requests", tag=TAG, policy=OneSlot()))
    q.push_many([Request(f"https://one.test/{j}") for j in range(3)])
    name = "one.test" if mode == "crawl" else "*"
    client.lpush(keys.slot_list(TAG, 0, name, 0), b"\x80garbage")
    got = [lease for _ in range(4) for lease in q.pop_leases(10)]
    assert sorted(urls(got)) == [f"https://one.test/{j}" for j in range(3)]
    assert len(q.take_retired()) == 1 and len(failed.read(client, TAG)) == 1
    assert q.status() == (0, 3)  # each lease is in its worker's list
    q.ack(got)
    q.send_acks()
    assert int(client.get(keys.slot_waiting(TAG, 0))) == -1  # the counter is off...
    assert q.status() == (0, 0)  # ...the look is not: the crawl may end
    client.incrby(keys.slot_waiting(TAG, 0), 5)
    client.incrby(keys.slot_leased(TAG, 0), 2)
    assert q.status() == (0, 0)
    # A request really waiting (or leased) is still seen, whatever the counters say.
    client.set(keys.slot_waiting(TAG, 0), -7)
    q.push_many([Request("https://one.test/late")])
    assert q.status()[0] >= 1
    (late,) = q.pop_leases(10)
    assert q.status()[1] >= 1
    q.ack([late])
    q.send_acks()
    assert q.status() == (0, 0)


def test_a_lease_an_earlier_build_left_in_the_lease_hash_comes_back_once_its_owner_goes(
        client: redis.Redis) -> None:
    """The lease hash is the sorted-set layout's (a worker of the 2026-11-27 build, live
    when this one started): a reap runs reap.lua only while it holds leases, and gives
    back those of an owner no longer in the owners (slot_reap.lua forgets the dead
    ones), never leaving them for ever."""
    q = crawlwide(client)
    old = PriorityQueue(client, DemoSpider(), "cw:requests", tag=TAG)
    score, member = old.entry(Request("https://one.test/old"))
    client.hset(keys.leases(TAG, 0), "gone:1.0", b"%d|%s" % (score, member))
    assert [r.url for _, r in q.reap()] == ["https://one.test/old"]
    assert not client.exists(keys.leases(TAG, 0))
    assert urls(q.pop_leases(10)) == ["https://one.test/old"]
    assert q.reap() == []
