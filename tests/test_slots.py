"""The per-slot queue layout (frontier/slots.py) on a real Redis: no head-of-line
blocking, priorities within a slot, a slot's concurrency and delay held across workers
on Redis's clock, acks, reaps, retried pops, back-off, and its memory a request."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter

import pytest
import redis
from redis.cluster import RedisCluster
from slotqueue import SlotEntry, SlotQueue, leased

from scrapy_bloomdupe import keys
from scrapy_bloomdupe.frontier.entry import REQUEUED

TAG = "slots:bloomdupe"


def queue(client: redis.Redis, owner: str = "w1", **kwargs: int) -> SlotQueue:
    return SlotQueue(client, TAG, owner=owner, **kwargs)


def entries(slot: str, n: int, *, priority: int = 0, concurrency: int = 0,
            delay_ms: int = 0) -> list[SlotEntry]:
    return [SlotEntry(slot, priority, f"\x01https://{slot}/{j}".encode(), concurrency, delay_ms)
            for j in range(n)]


def ready(client: redis.Redis) -> list[str]:
    return [name.decode() for name in client.zrange(keys.ready(TAG, 0), 0, -1)]


def test_a_slot_at_its_limit_does_not_block_the_others(client: redis.Redis) -> None:
    q = queue(client)
    assert q.push(entries("slow", 5, concurrency=1) + entries("fast", 3, concurrency=4)) == 8
    first = q.pop(1).leases
    assert [lease.slot for lease in first] == ["fast"] or [lease.slot for lease in first] == [
        "slow"]
    rest = q.pop(10).leases
    by_slot = Counter(lease.slot for lease in first + rest)
    assert by_slot == {"slow": 1, "fast": 3}
    assert ready(client) == []  # slow at its limit, fast empty
    assert q.state("slow")["flight"] == "1" and q.state("slow")["waiting"] == "4"
    assert q.pop(10).leases == []
    (held,) = [lease for lease in first + rest if lease.slot == "slow"]
    assert q.ack([held]) == 1
    assert ready(client) == ["slow"]
    assert [lease.entry for lease in q.pop(10).leases] == [b"\x01https://slow/1"]


def test_a_priority_past_luas_number_format_keeps_its_spelling(client: redis.Redis) -> None:
    q = queue(client, lease_timeout_ms=1000)
    huge = 10**15  # Lua writes it 1e+15
    q.push([SlotEntry("t", huge, b"\x01huge"), SlotEntry("t", 0, b"\x01zero")])
    assert q.state("t")["prios"] == f"{huge},0"
    assert [lease.priority for lease in q.pop(1).leases] == [huge]
    assert q.reap(release_own=True) == 1
    assert q.state("t")["prios"] == f"{huge},0"
    assert [lease.entry for lease in q.pop(2).leases] == [b"\x01huge", b"\x01zero"]


def test_a_push_that_lowers_a_slots_limit_below_its_leases_takes_it_out_of_ready(
        client: redis.Redis) -> None:
    q = queue(client)
    q.push(entries("s", 3, concurrency=3))
    taken = q.pop(2).leases
    assert ready(client) == ["s"]
    q.push([SlotEntry("s", 0, b"\x01later", concurrency=1)])
    assert ready(client) == [] and q.pop(5).leases == []
    q.ack(taken[:1])
    assert ready(client) == []  # one lease still: no room under a limit of 1
    q.ack(taken[1:])
    assert [lease.entry for lease in q.pop(5).leases] == [b"\x01https://s/2"]


def test_a_slot_in_ready_without_room_keeps_its_requests(client: redis.Redis) -> None:
    """Whatever put it there (a limit changed by hand, a bug), a pop takes nothing
    from a slot with no room, and loses none of its requests."""
    q = queue(client)
    q.push([*entries("s", 3, concurrency=2), SlotEntry("s", 1, b"\x01high", 2)])
    q.pop(2)
    client.hset(keys.slot(TAG, 0, "s"), "conc", 1)  # two leases, a limit of one
    client.zadd(keys.ready(TAG, 0), {"s": 0})
    assert q.pop(5).leases == []
    assert q.state("s")["prios"] == "0" and q.state("s")["waiting"] == "2"
    assert len(q.waiting("s", 0)) == 2 and ready(client) == []


def test_priorities_within_a_slot_highest_first_then_in_order(client: redis.Redis) -> None:
    q = queue(client)
    pushed = [SlotEntry("s", p, f"\x01{p}:{j}".encode()) for j, p in
              enumerate([0, 5, -1, 5, 0, -3])]
    q.push(pushed)
    assert q.state("s")["prios"] == "5,0,-1,-3"
    assert q.waiting("s", 5) == [b"\x015:1", b"\x015:3"]
    taken = q.pop(4).leases
    assert [(lease.priority, lease.entry) for lease in taken] == [
        (5, b"\x015:1"), (5, b"\x015:3"), (0, b"\x010:0"), (0, b"\x010:4")]
    assert q.state("s")["prios"] == "-1,-3"
    assert not client.exists(keys.slot_list(TAG, 0, "s", 5), keys.slot_list(TAG, 0, "s", 0))
    assert [lease.priority for lease in q.pop(4).leases] == [-1, -3]
    assert q.state("s")["waiting"] == "0" and ready(client) == []


def test_concurrency_is_never_exceeded_across_four_workers(redis_url: str) -> None:
    """Four workers, each its own client and owner, pop and ack concurrently; what any
    holds of a slot at once (counted as it holds it, and the slot's Redis count after
    each pop) never passes the slot's concurrency, and reaches it."""
    limits = {"a": 1, "b": 2, "c": 3, "d": 2, "e": 1}
    seed = redis.Redis.from_url(redis_url)
    queue(seed, "pusher").push([item for slot, conc in limits.items()
                                for item in entries(slot, 30, concurrency=conc)])
    held: Counter[str] = Counter()
    most: Counter[str] = Counter()
    over: list[str] = []
    done: list[int] = []
    lock = threading.Lock()

    def work(owner: str) -> None:
        client = redis.Redis.from_url(redis_url)
        q = queue(client, owner)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with lock:
                if sum(done) == 30 * len(limits):
                    break
            popped = q.pop(3).leases
            for lease in popped:
                flight = int(q.state(lease.slot)["flight"])
                with lock:
                    held[lease.slot] += 1
                    most[lease.slot] = max(most[lease.slot], held[lease.slot], flight)
                    if max(held[lease.slot], flight) > limits[lease.slot]:
                        over.append(lease.slot)
            time.sleep(0.002)
            with lock:
                for lease in popped:
                    held[lease.slot] -= 1
                done.append(len(popped))
            q.ack(popped)
        client.close()

    threads = [threading.Thread(target=work, args=(f"w{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seed.close()
    assert sum(done) == 150
    assert over == []
    assert most == limits


def test_the_delay_between_two_starts_of_a_slot_holds_on_redis_clock(
        client: redis.Redis) -> None:
    q = queue(client)
    q.push(entries("polite", 4, concurrency=4, delay_ms=60) + entries("other", 1))
    starts: list[int] = []
    others = 0
    deadline = time.monotonic() + 5
    while len(starts) < 4 and time.monotonic() < deadline:
        popped = q.pop(10)
        starts += [popped.now_ms for lease in popped.leases if lease.slot == "polite"]
        others += sum(lease.slot == "other" for lease in popped.leases)
        assert sum(lease.slot == "polite" for lease in popped.leases) <= 1
        q.ack(popped.leases)
        time.sleep(0.005)
    assert len(starts) == 4 and others == 1
    assert all(b - a >= 60 for a, b in itertools.pairwise(starts)), starts


def test_a_randomized_delay_is_half_to_one_and_a_half_times_and_set_by_the_seed(
        client: redis.Redis) -> None:
    q = queue(client)
    waits = []
    for n in range(40):
        q.push(entries(f"s{n}", 1, delay_ms=1000))
        popped = q.pop(1, jitter=0.5, seed=n)
        waits.append(int(q.state(f"s{n}")["next"]) - popped.now_ms)
    assert all(500 <= wait <= 1500 for wait in waits), waits
    assert len(set(waits)) > 20  # spread, not a constant
    q.push(entries("again", 1, delay_ms=1000))
    popped = q.pop(1, jitter=0.5, seed=7)
    assert int(q.state("again")["next"]) - popped.now_ms == waits[7]


@pytest.mark.parametrize("jitter", [0.2, 1.5])
def test_a_delays_jitter_is_its_magnitude_and_a_slot_may_have_its_own(
        client: redis.Redis, jitter: float) -> None:
    """``DOWNLOAD_DELAY_JITTER`` (Scrapy 2.19): a gap is the delay times 1 ± jitter, at
    least 0 (Scrapy's ``Slot.download_delay``); a ``DOWNLOAD_SLOTS`` entry's own jitter
    (here 0: the delay as it is) wins for its slot. Before, any jitter was 0.5x-1.5x."""
    q = queue(client)
    waits, fixed = [], []
    for n in range(40):
        q.push(entries(f"s{n}", 1, delay_ms=1000) + entries(f"fixed{n}", 1, delay_ms=1000))
        popped = q.pop(2, jitter=jitter, seed=n, jitters={f"fixed{n}": 0.0})
        nxt = int(q.state(f"s{n}").get("next", 0))  # 0: none ahead (a gap of 0)
        waits.append(nxt - popped.now_ms if nxt else 0)
        fixed.append(int(q.state(f"fixed{n}")["next"]) - popped.now_ms)
    low, high = max(0, round(1000 * (1 - jitter))), round(1000 * (1 + jitter))
    assert all(low <= wait <= high for wait in waits), waits
    assert min(waits) < 1000 * (1 - jitter / 2) and max(waits) > 1000 * (1 + jitter / 2)
    assert fixed == [1000] * 40


def test_an_ack_frees_room_once_and_an_idle_slot_leaves_no_state(
        client: redis.Redis) -> None:
    q = queue(client)
    q.push(entries("s", 2, concurrency=1))
    (first,) = q.pop(5).leases
    assert ready(client) == []
    assert q.ack([first]) == 1 and q.ack([first.field]) == 0
    assert q.state("s")["flight"] == "0" and ready(client) == ["s"]
    (second,) = q.pop(5).leases
    assert q.ack([second]) == 1
    assert q.state("s") == {} and ready(client) == []  # no delay ahead: forgotten
    assert leased(client, TAG) == 0


def test_a_slot_with_a_start_ahead_keeps_its_state_when_idle(client: redis.Redis) -> None:
    q = queue(client)
    q.push(entries("s", 1, delay_ms=60_000))
    q.ack(q.pop(1).leases)
    assert int(q.state("s")["next"]) > 0
    q.push(entries("s", 1, delay_ms=60_000))
    assert q.pop(1).leases == []  # the delay still holds for the next request


def test_a_reap_gives_a_dead_workers_leases_back_at_the_head_and_frees_room(
        client: redis.Redis) -> None:
    dead, alive = queue(client, "dead"), queue(client, "alive", lease_timeout_ms=1000)
    dead.push(entries("s", 5, concurrency=2))
    taken = dead.pop(5).leases
    assert [lease.entry for lease in taken] == [b"\x01https://s/0", b"\x01https://s/1"]
    client.zadd(keys.owners(TAG, 0), {"dead": 0})  # its heartbeat long past
    assert alive.reap() == 2
    assert client.zscore(keys.owners(TAG, 0), "dead") is None
    assert alive.state("s")["flight"] == "0" and alive.state("s")["waiting"] == "5"
    again = alive.pop(5).leases
    assert [lease.entry for lease in again] == [
        REQUEUED + b"1\x00\x01https://s/0", REQUEUED + b"1\x00\x01https://s/1"]
    assert dead.ack(taken) == 0  # gone from the lease hash: its ack changes nothing
    assert alive.state("s")["flight"] == "2"
    assert alive.reap() == 0  # alive's heartbeat is fresh
    client.zadd(keys.owners(TAG, 0), {"alive": 0})
    alive.heartbeat()
    assert alive.reap() == 0


def test_a_worker_that_closes_gives_back_its_own_leases_uncounted(
        client: redis.Redis) -> None:
    q = queue(client)
    q.push([SlotEntry("s", 3, b"\x01x", 1), SlotEntry("t", 0, b"\x01y", 1)])
    q.pop(5)
    assert ready(client) == []
    assert q.reap(release_own=True) == 2
    assert q.waiting("s", 3) == [b"\x01x"] and q.waiting("t", 0) == [b"\x01y"]
    assert q.state("s")["prios"] == "3" and sorted(ready(client)) == ["s", "t"]


def test_a_retried_pop_returns_the_same_leases_and_takes_nothing_more(
        client: redis.Redis) -> None:
    q = queue(client)
    q.push(entries("s", 4, concurrency=2) + entries("t", 4))
    first = q.pop(3, number=7, seed=1)
    again = q.pop(3, number=7, seed=1)
    assert again.leases == first.leases and len(first.leases) == 3
    assert leased(client, TAG) == 3
    assert int(q.state("s")["flight"]) + int(q.state("t")["flight"]) == 3
    assert int(q.state("s")["waiting"]) + int(q.state("t")["waiting"]) == 5


def test_a_retried_push_queues_nothing_again(client: redis.Redis) -> None:
    q = queue(client)
    assert q.push(entries("s", 2), number=3) == 2
    assert q.push(entries("s", 2), number=3) == -1
    assert q.state("s")["waiting"] == "2" and len(q.waiting("s", 0)) == 2


def test_a_backoff_pauses_a_slot_for_every_worker(client: redis.Redis) -> None:
    one, two = queue(client, "one"), queue(client, "two")
    one.push(entries("busy", 2) + entries("calm", 2))
    now = one.pop(0).now_ms
    until = one.backoff("busy", now + 150)
    assert until == now + 150
    assert one.backoff("busy", now + 10) == until  # an earlier end does not shorten it
    popped = two.pop(10)
    assert {lease.slot for lease in popped.leases} == {"calm"}
    assert popped.next_ms == until
    time.sleep(max(0.0, (until - two.pop(0).now_ms) / 1000) + 0.01)
    assert {lease.slot for lease in one.pop(10).leases} == {"busy"}


def test_a_backoff_of_a_slot_with_nothing_queued_holds_for_later_pushes(
        client: redis.Redis) -> None:
    q = queue(client)
    now = q.pop(0).now_ms
    q.backoff("later", now + 60_000)
    q.push(entries("later", 1))
    popped = q.pop(5)
    assert popped.leases == [] and popped.next_ms == now + 60_000


def test_a_declared_pop_reads_the_ready_set_first_and_checks_it_again(
        client: redis.Redis) -> None:
    q = queue(client)
    q.push(entries("a", 2, concurrency=1) + entries("b", 1, delay_ms=60_000))
    taken = q.pop(5, declared=True).leases
    assert sorted(lease.slot for lease in taken) == ["a", "b"]
    assert q.pop(5, declared=True).leases == []  # a at its limit, b's delay ahead
    q.ack(taken)
    assert [lease.slot for lease in q.pop(5, declared=True).leases] == ["a"]


def test_slot_names_with_colons_bars_and_percents_keep_apart(client: redis.Redis) -> None:
    q = queue(client)
    odd = "a:1|x%3A"
    q.push([SlotEntry(odd, 0, b"\x01odd"), SlotEntry("a", 1, b"\x01a1")])
    assert keys.slot_from_name(keys.slot_name(odd)) == odd
    assert q.waiting(odd, 0) == [b"\x01odd"] and q.waiting("a", 1) == [b"\x01a1"]
    assert sorted((lease.slot, lease.entry) for lease in q.pop(5).leases) == [
        ("a", b"\x01a1"), (odd, b"\x01odd")]


def test_unlimited_slots_give_everything_in_one_pop(client: redis.Redis) -> None:
    """"worker" politeness: the same layout with no concurrency limit and no delay."""
    q = queue(client)
    q.push(entries("a", 3) + entries("b", 3))
    assert len(q.pop(6).leases) == 6
    assert ready(client) == []


def test_batches_past_luas_unpack_limit_push_pop_and_ack_whole(client: redis.Redis) -> None:
    """The scripts send long argument lists in calls of 1,000 (Lua's unpack has a limit)."""
    q = queue(client)
    assert q.push(entries("one", 2500) + entries("two", 2500, priority=1)) == 5000
    taken = q.pop(5000).leases
    assert len(taken) == 5000 and taken[0].slot == "one"
    assert [lease.entry for lease in taken if lease.slot == "two"][:2] == [
        b"\x01https://two/0", b"\x01https://two/1"]
    assert q.ack(taken) == 5000
    assert leased(client, TAG) == 0 and q.state("one") == {}


def test_a_slot_all_default_keeps_no_hash(client: redis.Redis) -> None:
    """Priority 0, no limits, nothing in flight: the slot is its list (and its place in
    the ready set); a lease, a limit or a start ahead brings the hash, an ack takes it."""
    q = queue(client)
    q.push(entries("s", 2))
    assert not client.exists(keys.slot(TAG, 0, "s")) and ready(client) == ["s"]
    assert q.state("s") == {"prios": "0", "waiting": "2", "flight": "0", "conc": "0",
                            "delay": "0", "next": "0", "backoff": "0"}
    taken = q.pop(1).leases
    assert client.hgetall(keys.slot(TAG, 0, "s")) == {b"flight": b"1", b"prios": b"0"}
    q.ack(taken)
    assert not client.exists(keys.slot(TAG, 0, "s")) and ready(client) == ["s"]
    q.push(entries("s", 1, priority=2))
    assert client.hgetall(keys.slot(TAG, 0, "s")) == {b"prios": b"2,0"}
    high = q.pop(1).leases
    assert [lease.priority for lease in high] == [2]
    q.ack(high + q.pop(5).leases)  # its flight back to 0, nothing waiting: forgotten
    assert not client.exists(keys.slot(TAG, 0, "s")) and q.state("s") == {}


def test_the_shards_default_limits_hold_for_a_slot_without_its_own(
        client: redis.Redis) -> None:
    q = queue(client)
    q.set_defaults(concurrency=1, delay_ms=0)
    q.push(entries("s", 3, concurrency=1) + entries("t", 3, concurrency=2))
    assert not client.exists(keys.slot(TAG, 0, "s"))  # its limit is the default
    assert client.hgetall(keys.slot(TAG, 0, "t")) == {b"conc": b"2", b"prios": b"0"}
    taken = q.pop(10).leases
    assert Counter(lease.slot for lease in taken) == {"s": 1, "t": 2}
    assert q.state("s")["conc"] == "1" and q.state("s")["flight"] == "1"
    assert q.pop(10).leases == [] and ready(client) == []
    q.ack(taken)
    assert sorted(ready(client)) == ["s", "t"]
    q.set_defaults(concurrency=0)  # "s" follows the crawl's new default, "t" keeps 2
    assert Counter(lease.slot for lease in q.pop(10).leases) == {"s": 2, "t": 1}
    assert keys.what_is(TAG, keys.slot_defaults(TAG, 0)) is not None
    assert keys.belongs(TAG, keys.slot_defaults(TAG, 0))


def memory_per_request(client: redis.Redis, slots: int, each: int) -> float:
    q = queue(client)
    url = "https://docs.example.org/python-django-doc/html/ref/models/fields.html#x"
    items = [SlotEntry(f"host{s}.example.org", 0, b"\x01" + f"{url[:60]}{j:04d}".encode())
             for s in range(slots) for j in range(each)]
    assert all(len(item.entry) == 65 for item in items)
    for start in range(0, len(items), 1000):
        q.push(items[start:start + 1000])
    total = sum(client.memory_usage(name, samples=0) or 0 for name in client.scan_iter(
        match=f"{{{TAG}:0}}:*") if b":slotpush:" not in name)
    return total / len(items)


def test_memory_per_waiting_request(client: redis.Redis) -> None:
    """A 65-byte entry (a 64-byte URL and the format byte) waiting in slots of 100
    costs far less than today's 168 bytes in the sorted set (docs/capacity.md), in
    slots of 10 still less; the figures, and the slots of one that cost more, are in
    frontier/slots.py's docstring."""
    assert memory_per_request(client, 100, 100) <= 90
    client.flushall()
    assert memory_per_request(client, 1000, 10) <= 130


def test_memory_per_waiting_request_in_slots_of_one(client: redis.Redis) -> None:
    """A slot all default keeps no hash: 10,000 slots of one request cost its list and
    its member of the ready set (377 bytes a request here; 512 with a hash a slot)."""
    assert memory_per_request(client, 10000, 1) <= 420


def test_on_a_cluster_each_shards_slots_run_in_its_hash_slot(rc: RedisCluster) -> None:
    """The scripts touch the slots' hashes and lists undeclared, in the shard's hash tag:
    Redis Cluster runs them; a declared pop, an ack, a back-off and a reap on two shards
    (two hash slots)."""
    shards = [SlotQueue(rc, TAG, shard, owner="w", lease_timeout_ms=1000) for shard in (0, 1)]
    for q in shards:
        q.push(entries("a", 2, concurrency=1) + entries("b", 1))
    for q in shards:
        taken = q.pop(5, declared=True).leases
        assert sorted(lease.slot for lease in taken) == ["a", "b"]
        assert q.pop(5, declared=True).leases == []
        assert q.ack(taken) == 2
        now = q.pop(0).now_ms
        q.backoff("a", now + 60_000)
        assert q.pop(5, declared=True).leases == []
        q.push(entries("c", 1))
        assert [lease.slot for lease in q.pop(5).leases] == ["c"]
        assert q.reap(release_own=True) == 1
        assert q.state("a")["waiting"] == "1" and q.waiting("c", 0) == [b"\x01https://c/0"]


def test_tools_name_every_key_of_the_layout(client: redis.Redis) -> None:
    """``bloomdupe keys`` (keys.what_is) and clearing a filter (keys.belongs) know them."""
    q = queue(client)
    q.push([SlotEntry("a:b", -2, b"\x01x"), SlotEntry("a:b", -2, b"\x01y")])
    q.pop(1)
    names = sorted(name.decode() for name in client.scan_iter(match=f"{{{TAG}:0}}:*"))
    # the slot's hash and list, ready, the leases' count and a worker's, owners, push
    # record, waiting count
    assert len(names) == 8
    for name in names:
        assert keys.belongs(TAG, name), name
        found = keys.what_is(TAG, name)
        assert found is not None and found[0] == 0, name


def test_a_horizon_takes_a_slot_due_within_it_with_its_start_and_a_retry_keeps_it(
        client: redis.Redis) -> None:
    q = queue(client)
    q.push(entries("soon", 3, concurrency=3, delay_ms=2_000)
           + entries("late", 2, concurrency=2, delay_ms=60_000))
    first = q.pop(10)  # both due now: one each, at once
    assert sorted(lease.slot for lease in first.leases) == ["late", "soon"]
    assert [lease.start_ms for lease in first.leases] == [0, 0]
    # "soon" may go again in 2 s, within a 3 s horizon: taken now, to start then;
    # "late" (in 60 s) is not.
    popped = q.pop(10, horizon_ms=3_000, number=50, seed=1)
    (ahead,) = popped.leases
    assert ahead.slot == "soon" and ahead.entry == b"\x01https://soon/1"
    assert 0 < ahead.start_ms - popped.now_ms <= 2_000
    assert int(q.state("soon")["next"]) == ahead.start_ms + 2_000  # starts stay apart
    assert q.pop(10, horizon_ms=3_000, number=50, seed=1).leases == [ahead]  # a retry
    assert q.pop(10, horizon_ms=3_000).leases == []  # the next start is past it
    q.ack(popped.leases + first.leases)
    assert int(q.state("soon")["flight"]) == 0 and int(q.state("late")["flight"]) == 0
    assert ready(client) == ["soon", "late"]


def test_a_lease_taken_ahead_goes_back_whole_when_its_worker_dies(
        client: redis.Redis) -> None:
    dead, alive = queue(client, "dead"), queue(client, "alive")
    dead.push(entries("s", 2, concurrency=2, delay_ms=1_000))
    dead.pop(5)
    (ahead,) = dead.pop(5, horizon_ms=2_000).leases
    assert ahead.start_ms > 0
    client.zadd(keys.owners(TAG, 0), {"dead": 0})
    assert alive.reap() == 2
    assert dead.waiting("s", 0) == [REQUEUED + b"1\x00\x01https://s/0",
                                    REQUEUED + b"1\x00\x01https://s/1"]
