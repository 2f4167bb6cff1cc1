"""The shared request queue (frontier/queue.py): leases, acks, heartbeats and the dead
workers' leases, priorities, retry-safe pops and pushes, check-and-queue in one script,
failed requests, pops on a cluster, its dotted paths."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from helpers import DemoSpider, crawler_for, shard_of
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from scrapy import Request
from scrapy_redis.queue import PriorityQueue as ScrapyRedisPriorityQueue

from scrapy_bloomdupe import cluster as old_home
from scrapy_bloomdupe import hashing, keys, sizing
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.frontier import failed
from scrapy_bloomdupe.frontier.leased import LeasedQueue
from scrapy_bloomdupe.frontier.queue import PriorityQueue
from scrapy_bloomdupe.scheduler import Scheduler


def test_queue_pop_is_replayed_when_its_reply_was_lost(redis_url: str) -> None:
    crawler = crawler_for(redis_url, SCHEDULER_PERSIST=True)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    for i in range(3):
        scheduler.enqueue_request(Request(f"http://a.example/{i}"))
    queue = scheduler.queue
    first = queue.pop()
    # A retry after a lost reply carries the same pop number (it advances only
    # once a reply is in): it gets the same request, and pops nothing more.
    queue._pop_number -= 1
    again = queue.pop()
    assert again.url == first.url
    assert len(queue) == 2
    assert queue.pop().url != first.url


def test_scrapy_redis_priority_queue_cannot_pop_on_a_cluster(rc: RedisCluster) -> None:
    """Why the cluster needs scrapy_bloomdupe's PriorityQueue."""
    spider = DemoSpider()
    theirs = ScrapyRedisPriorityQueue(rc, spider, "demo:requests")
    theirs.push(Request("https://a.example/"))
    with pytest.raises(RedisClusterException, match="multi"):
        theirs.pop()
    ours = PriorityQueue(rc, spider, "demo:requests", tag="demo:bloomdupe", shards=3)
    ours.push(Request("https://a.example/"))
    request = ours.pop()
    assert request is not None and request.url == "https://a.example/"
    assert len(ours) == 0


@pytest.mark.parametrize("path", [None, "scrapy_bloomdupe.frontier.leased.LeasedQueue",
                                  "scrapy_bloomdupe.frontier.queue.PriorityQueue",
                                  "scrapy_bloomdupe.cluster.PriorityQueue",
                                  "scrapy_bloomdupe.frontier.crawlwide.CrawlWideQueue"])
@pytest.mark.parametrize("politeness", ["worker", "crawl"])
def test_every_old_dotted_path_still_names_the_one_queue(redis_url: str, path: str | None,
                                                         politeness: str) -> None:
    """One queue class runs (LeasedQueue, both politeness modes); the paths users may
    have in SCHEDULER_QUEUE_CLASS from earlier releases name it too."""
    assert old_home.PriorityQueue is PriorityQueue
    settings: dict[str, Any] = {"BLOOMDUPE_POLITENESS": politeness}
    if path is not None:
        settings["SCHEDULER_QUEUE_CLASS"] = path
    crawler = crawler_for(redis_url, **settings)
    scheduler = Scheduler.from_crawler(crawler)
    if path is None:  # the scheduler's default is the queue's own path
        assert scheduler.queue_cls == "scrapy_bloomdupe.frontier.leased.LeasedQueue"
    scheduler.open(crawler.spider)
    try:
        queue = scheduler.leases.queue
        assert type(queue) is LeasedQueue
        assert queue.policy.crawl_wide == (politeness == "crawl")
    finally:
        scheduler.close("shutdown")


TAG = "demo:bloomdupe"


def queue(client: redis.Redis, shards: int = 1, lease_timeout: float = 30.0) -> PriorityQueue:
    return PriorityQueue(client, DemoSpider(), "demo:requests", tag=TAG, shards=shards,
                         lease_timeout=lease_timeout)


def urls(leases: list) -> list[str]:
    return [lease.request.url for lease in leases]


def test_a_popped_request_stays_leased_until_acked(client: redis.Redis) -> None:
    q = queue(client)
    q.push_many([Request("http://a.example/1"), Request("http://a.example/2")])
    assert q.status() == (2, 0)
    leases = q.pop_leases(1)
    assert urls(leases) == ["http://a.example/1"]
    assert q.status() == (1, 1)
    q.ack(leases)
    q.heartbeat()  # acks ride on the next round trip
    assert q.status() == (1, 0)


def test_on_one_node_the_queue_has_one_shard_whatever_the_filter_has(
        client: redis.Redis) -> None:
    """Its pops, heartbeats, reaps and idle looks cost what one shard costs; every filter
    shard's new requests go into shard 0's queue."""
    q = queue(client, shards=24)
    assert q.shards == 1 and q.filter_shards == 24
    assert {q.sink_keys(i)[0] for i in range(24)} == {keys.queue(TAG, 0)}
    q.push_many([Request(f"http://a.example/{i}") for i in range(30)])
    q.heartbeat()
    assert client.keys("*owners*") == [keys.owners(TAG, 0).encode()]
    assert len(q.pop_leases(40)) == 30
    # An idle worker's look at an empty queue: one pop, one count; no look at each shard.
    client.config_resetstat()
    assert q.pop_leases(16) == [] and q.status() == (0, 30)
    stats = client.info("commandstats")
    assert stats["cmdstat_zcard"]["calls"] == 1 and stats["cmdstat_evalsha"]["calls"] == 1


def test_an_earlier_versions_queue_shards_are_merged_when_a_worker_starts(
        redis_url: str, client: redis.Redis) -> None:
    """A crawl queued on one node by an earlier version (one queue shard a filter shard):
    the first worker of this version moves what shards 1.. hold into shard 0, leases
    included, and its start's migration gives back a dead owner's leases at once and
    moves every request into the download slots."""
    crawler = crawler_for(redis_url, SCHEDULER_PERSIST=True, BLOOMDUPE_SHARDS=4)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    tag = scheduler.queue.tag
    old = PriorityQueue(client, DemoSpider(), "demo:requests", tag=tag, shards=4)
    entry = old.entry(Request("http://a.example/queued"))
    client.zadd(keys.queue(tag, 2), {entry[1]: entry[0]})
    client.hset(keys.leases(tag, 3), "gone:1.0",
                b"0|" + old.entry(Request("http://a.example/leased"))[1])
    client.zadd(keys.owners(tag, 3), {"gone": 1})
    scheduler.close("finished")

    crawler = crawler_for(redis_url, SCHEDULER_PERSIST=True, BLOOMDUPE_SHARDS=4,
                          BLOOMDUPE_LEASE_TIMEOUT=1)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    queue = scheduler.queue
    assert not client.exists(keys.queue(tag, 2), keys.leases(tag, 3), keys.owners(tag, 3))
    assert queue.status() == (2, 0)
    assert not client.exists(keys.queue(tag, 0), keys.leases(tag, 0))  # all in the slots
    assert queue.reap() == []
    assert sorted(urls(queue.pop_leases(5))) == ["http://a.example/leased",
                                                  "http://a.example/queued"]
    scheduler.close("finished")


def test_higher_priority_first_within_a_shard(client: redis.Redis) -> None:
    q = queue(client)
    q.push_many([Request("http://a.example/low", priority=-1),
                 Request("http://a.example/high", priority=10), Request("http://a.example/mid")])
    assert urls(q.pop_leases(3)) == ["http://a.example/high", "http://a.example/mid",
                                     "http://a.example/low"]


def test_a_dead_workers_leases_go_back_and_a_live_ones_stay(client: redis.Redis) -> None:
    dead, live = queue(client, lease_timeout=0.3), queue(client, lease_timeout=0.3)
    dead.push_many([Request(f"http://a.example/{i}") for i in range(3)])
    taken = dead.pop_leases(2)
    assert len(taken) == 2
    mine = live.pop_leases(1)
    assert live.reap() == []  # everyone heartbeat just now
    for _ in range(3):
        time.sleep(0.15)
        live.heartbeat()  # the live worker keeps beating; the dead one does not
    back = live.reap()
    assert sorted((n, r.url) for n, r in back) == sorted((1, url) for url in urls(taken))
    assert live.status() == (2, 1)
    again = live.pop_leases(5)
    assert sorted(urls(again)) == sorted(urls(taken))
    assert [lease.requeues for lease in again] == [1, 1]  # counted once each
    assert mine[0].request.url not in urls(taken)


def test_a_request_counts_each_time_its_lease_expires(client: redis.Redis) -> None:
    """The count rides in the queued member (REQUEUED's prefix): it survives being
    leased again, and only an expired lease adds to it (a closing worker giving back
    what it took and a reclaim after a failover do not)."""
    q = queue(client, lease_timeout=0.1)
    q.push(Request("http://a.example/1", meta={"k": "v"}, priority=5))
    for expected in (1, 2, 3):
        assert len(q.pop_leases(1)) == 1
        time.sleep(0.15)  # q stops heartbeating: its lease expires
        reaper = queue(client, lease_timeout=0.1)
        assert [(n, r.url) for n, r in reaper.reap()] == [(expected, "http://a.example/1")]
    (lease,) = q.pop_leases(1)
    assert lease.requeues == 3
    assert lease.request.meta == {"k": "v"} and lease.request.priority == 5
    q.close()  # given back by its holder: not counted
    (lease,) = q.pop_leases(1)
    assert lease.requeues == 3
    q._taken.clear()  # as if that pop's reply had been lost (a failover)
    assert q.reclaim().total == 1  # not held: back, not counted
    (lease,) = q.pop_leases(1)
    assert lease.requeues == 3


def test_close_gives_back_what_was_taken_and_not_acked(client: redis.Redis) -> None:
    q = queue(client)
    q.push_many([Request("http://a.example/1"), Request("http://a.example/2")])
    done, kept = q.pop_leases(1), q.pop_leases(1)
    q.ack(done)
    q.close()
    assert q.status() == (1, 0)
    assert urls(queue(client).pop_leases(5)) == urls(kept)


def test_reclaim_puts_back_this_workers_leases_it_does_not_hold(client: redis.Redis) -> None:
    """After a failover the new master can hold leases whose ack (or whose pop's reply)
    went to the old one; :meth:`reclaim` puts them back, keeps the ones held, and
    sends the pending acks first (their work is done: not put back)."""
    q, other = queue(client), queue(client)
    q.push_many([Request(f"http://a.example/{i}") for i in range(4)])
    held, done, orphan = q.pop_leases(1), q.pop_leases(1), q.pop_leases(1)
    theirs = other.pop_leases(1)
    q.ack(done)
    del q._taken[orphan[0].field]  # as if the orphan's pop reply had been lost
    assert q.reclaim(held).total == 1
    assert q.status() == (1, 2)  # the orphan is back; held and theirs stay leased
    assert urls(other.pop_leases(5)) == urls(orphan)
    assert theirs and q.reclaim(held).total == 0


def test_a_retried_pop_gets_the_same_leases_and_takes_nothing_more(client: redis.Redis) -> None:
    q = queue(client, shards=2)
    q.push_many([Request(f"http://a.example/{i}") for i in range(4)])
    q.push_many([Request(f"http://b.example/{i}") for i in range(4)])
    first = q.pop_leases(2)
    q._pop_number -= 1  # as if the reply had been lost: a retry carries the same number
    q._pop_shard = first[0].shard
    again = q.pop_leases(2)
    assert urls(again) == urls(first)
    assert [lease.field for lease in again] == [lease.field for lease in first]
    assert q.status() == (6, 2)


def test_a_retried_push_does_not_queue_a_popped_request_again(client: redis.Redis) -> None:
    pusher, popper = queue(client), queue(client)
    request = Request("http://a.example/1")
    pusher.push_many([request])
    assert urls(popper.pop_leases(1)) == [request.url]
    # The reply to the push was lost: the retry carries the same push number.
    pusher._push_number -= 1
    pusher._next_shard = (pusher._next_shard - 1) % pusher.shards
    pusher.push_many([request])
    assert pusher.status() == (0, 1)


def test_check_and_queue_is_one_script_and_a_retry_queues_nothing_twice(
        engine_client: redis.Redis, engine: str) -> None:
    client = engine_client  # both engines run the queue's sink in their script
    q = queue(client, shards=3)
    bf = BloomFilter.open(client, TAG, sizing.plan(10_000, 0.001, shards=3))
    assert bf.engine_name == engine
    requests = [Request(f"http://a.example/{i}") for i in range(20)]
    requests.append(Request("http://a.example/3"))  # twice in one batch: queued once
    fps = [r.url.encode() for r in requests]
    new = bf.add_many(fps, q, lambda i: q.entry(requests[i]))
    assert new == [True] * 20 + [False]
    assert q.status() == (20, 0)
    # On one node the queue is shard 0's, whichever filter shard checked a request.
    per_shard = [client.zcard(keys.queue(TAG, i)) for i in range(3)]
    assert per_shard == [20, 0, 0]
    # A retry of the very same calls (a lost reply) is answered from the op log.
    op = bf._next_op
    halves = {i: bf_halves(bf, fps[i]) for i in range(3)}
    fresh = [Request(f"http://b.example/{i}") for i in range(3)]
    units = bf._group(halves, [0, 1, 2], op,
                     lambda i, shard: q.sink_item(shard, q.entry(fresh[i])))
    first = bf._round_trip(units, op, use_lock=True, sink=q)
    second = bf._round_trip(units, op, use_lock=True, sink=q)
    assert first == second
    assert q.status() == (20, 0)  # those fingerprints were seen: nothing queued either time


def test_pending_acks_ride_on_the_check_and_queue_round_trip(client: redis.Redis) -> None:
    """Acks pending when the filter checks and queues go in its round trip: no round trip
    of their own."""
    q = queue(client, shards=3)
    bf = BloomFilter.open(client, TAG, sizing.plan(10_000, 0.001, shards=3))
    q.push_many([Request(f"http://a.example/{i}") for i in range(6)])
    leases = q.pop_leases(6) + q.pop_leases(6) + q.pop_leases(6)
    assert q.status() == (0, 6)
    q.ack(leases)
    sends = q.link.execute
    q.link.execute = None  # type: ignore[assignment]  # the queue sends nothing itself
    requests = [Request("http://b.example/1")]
    assert bf.add_many([b"b1"], q, lambda i: q.entry(requests[i])) == [True]
    q.link.execute = sends  # type: ignore[method-assign]
    assert q.status() == (1, 0)
    assert not q._acks
    bf.close()


def test_acks_ride_only_to_the_masters_a_round_trip_goes_to(rc: RedisCluster) -> None:
    """On a cluster an ack rides on a pop or a check-and-queue only to a master it goes
    to anyway; the others wait for their own (here: the heartbeat's)."""
    shards = 6
    q = PriorityQueue(rc, DemoSpider(), "demo:requests", tag=TAG, shards=shards)
    bf = BloomFilter.open(rc, TAG, sizing.plan(10_000, 0.001, shards=shards))
    try:
        for i in range(shards):  # one a shard
            q.push(Request(f"http://a.example/{i}"))
        leases = [lease for _ in range(shards) for lease in q.pop_leases(1)]
        assert sorted(lease.shard for lease in leases) == list(range(shards))
        # A new item on one shard: the acks of that shard's master ride, the rest wait.
        item = next(f for f in (f"n{i}".encode() for i in range(100)) if shard_of(bf, f) == 0)
        master = rc.nodes_manager.get_node_from_slot(rc.keyslot(keys.queue(TAG, 0))).name
        there = {lease.shard for lease in leases
                 if rc.nodes_manager.get_node_from_slot(
                     rc.keyslot(keys.queue(TAG, lease.shard))).name == master}
        assert 0 in there and len(there) < shards  # 6 shards over 3 masters
        q.ack(leases)
        requests = [Request("http://b.example/1")]
        assert bf.add_many([item], q, lambda i: q.entry(requests[i])) == [True]
        assert set(q._acks) == set(range(shards)) - there
        assert q.status() == (1, shards - len(there))
        q.heartbeat()  # on every master: the rest go
        assert q.status() == (1, 0) and not q._acks
    finally:
        q.clear()
        bf.clear()
        bf.close()


def bf_halves(bf: BloomFilter, fp: bytes) -> tuple[int, int]:
    return hashing.halves(fp, bf.seed)


def test_failed_requests_are_kept_listed_and_requeued(client: redis.Redis) -> None:
    q = queue(client)
    for i in range(3):
        score, payload = q.entry(Request(f"http://a.example/{i}", priority=i))
        failed.record(client, TAG, url=f"http://a.example/{i}", method="GET",
                      reason="HTTP 500", score=score, request=payload, limit=1000)
    records = failed.read(client, TAG)
    assert [r.url for r in records] == [f"http://a.example/{i}" for i in range(3)]
    assert {r.reason for r in records} == {"HTTP 500"}
    assert failed.requeue(client, TAG, [r.id for r in records[:2]]) == 2
    assert failed.count(client, TAG) == 1
    assert urls(q.pop_leases(5)) == ["http://a.example/1", "http://a.example/0"]


def test_scripts_flushed_by_a_restart_are_loaded_again_by_the_link(client: redis.Redis) -> None:
    """The queue's scripts, like the filter's, are loaded again where a round trip is
    answered NOSCRIPT (the link does it for both), and the round trip repeated."""
    q = queue(client)
    q.push_many([Request("http://a.example/1"), Request("http://a.example/2")])
    loaded = q.link.script_reloads  # the push loaded its script: a new server lacked it
    client.script_flush()
    leases = q.pop_leases(1)
    assert urls(leases) == ["http://a.example/1"]
    assert q.link.script_reloads == loaded + 1
    q.ack(leases)
    client.script_flush()
    q.heartbeat()  # the ack and the heartbeat script, after another flush
    assert q.link.script_reloads == loaded + 2
    assert q.status() == (1, 0)


@pytest.mark.parametrize("legacy_cls", ["scrapy_redis.queue.PriorityQueue",
                                        "scrapy_redis.queue.FifoQueue"])
def test_a_scrapy_redis_queue_is_taken_over_through_the_link(
        client: redis.Redis, legacy_cls: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crawl moving over from scrapy-redis (its sorted set, or its list): what waits
    there is queued here in batches and removed there, every command on the link (none
    through the client's own calls, which would block the loop in a crawl's job)."""
    from scrapy.utils.misc import load_object

    spider = DemoSpider()
    legacy = load_object(legacy_cls)(client, spider, "demo:requests")
    urls = [f"http://a.example/{i}" for i in range(5)]
    for i, url in enumerate(urls):
        legacy.push(Request(url, priority=i))
    queue = PriorityQueue(client, spider, "demo:requests", tag="demo:bloomdupe", shards=2)
    direct: list[object] = []
    own = client.execute_command
    monkeypatch.setattr(client, "execute_command", lambda *a, **k: (direct.append(a[0]),
                                                                    own(*a, **k))[1])
    assert queue.adopt("demo:requests", batch=2) == 5
    monkeypatch.undo()
    assert direct == []
    assert not client.exists("demo:requests")
    assert sorted(r.url for r in iter(queue.pop, None)) == urls
