"""The busiest download slots of a crawl-wide crawl (frontier/busiest.py) on a real
Redis: what each slot's figures are, the order, a crawl without slots, and a bounded
read of a crawl with thousands of slots, a crawl-wide queue's slots (binary entries)."""

from __future__ import annotations

from typing import Any

import redis
from helpers import BUSY_SLOTS, DemoSpider, busy_slots
from scrapy import Request
from scrapy.settings import Settings
from slotqueue import SlotEntry, SlotQueue

from scrapy_bloomdupe import keys
from scrapy_bloomdupe.frontier import busiest
from scrapy_bloomdupe.frontier.busiest import busiest_slots
from scrapy_bloomdupe.frontier.leased import LeasedQueue
from scrapy_bloomdupe.frontier.politeness import ONE_SLOT, OneSlot, SlotPolicy
from scrapy_bloomdupe.transport.link import Link

TAG = "site:bloomdupe"


class CountingLink(Link):
    """A link that counts its round trips."""

    round_trips = 0

    def execute(self, commands: Any, **kwargs: Any) -> list[Any]:
        self.round_trips += 1
        return super().execute(commands, **kwargs)


def test_each_slot_in_flight_limit_waiting_delay_next_start_and_backoff(
        client: redis.Redis) -> None:
    busy_slots(client, TAG)
    found = busiest_slots(client, TAG)
    assert found is not None
    assert [(s.slot, s.in_flight, s.concurrency, s.waiting) for s in found.slots] == BUSY_SLOTS
    one, slow, paused, odd = found.slots
    assert (found.in_flight_slots, found.ready_slots) == (2, 2)  # paused.test and odd
    assert one.delay == 0 and one.next_start == 0 and one.backoff == 0
    assert slow.delay == 30 and 25 < slow.next_start <= 30 and slow.backoff == 0
    assert paused.next_start == 0 and 55 < paused.backoff <= 60
    assert odd.backoff == 0 and odd.next_start == 0
    assert [s.slot for s in busiest_slots(client, TAG, 2).slots] == ["one.test", "slow.test"]


def test_acks_and_an_empty_slot_show_at_once(client: redis.Redis) -> None:
    q = SlotQueue(client, TAG, owner="w2")
    q.push([SlotEntry("a.test", 0, b"\x01https://a.test/", 1)])
    (lease,) = q.pop(10).leases
    found = busiest_slots(client, TAG)
    assert found is not None
    assert [(s.slot, s.in_flight, s.waiting) for s in found.slots] == [("a.test", 1, 0)]
    q.ack([lease])
    found = busiest_slots(client, TAG)
    assert found is not None and found.slots == []  # the crawl keeps slots, none busy


def test_a_crawl_without_slots_reads_none(client: redis.Redis) -> None:
    assert busiest_slots(client, TAG) is None
    client.zadd(keys.queue(TAG, 0), {b"x": 0})  # a queue of the default layout
    client.hset(keys.leases(TAG, 0), "w1:1.0", b"0|x")
    assert busiest_slots(client, TAG) is None


def test_thousands_of_slots_are_read_in_four_round_trips_and_bounded(
        client: redis.Redis) -> None:
    q = SlotQueue(client, TAG, owner="w1")
    n = 3 * busiest.IN_FLIGHT
    q.push([SlotEntry(f"h{j}.test", 0, b"\x01u%d" % j, 1) for j in range(n)])
    q.pop(busiest.IN_FLIGHT)  # a third of the slots have one in flight, the rest wait
    q.push([SlotEntry("h0.test", 5, b"\x01more", 1), SlotEntry("h1.test", 0, b"\x01more", 1)])
    seconds, micros = client.time()
    set_at = seconds * 1000 + micros // 1000
    q.backoff(f"h{n - 1}.test", set_at + 60_000)
    client.config_resetstat()
    link = CountingLink(client)
    try:
        found = busiest_slots(link, TAG)
    finally:
        link.close()
    assert found is not None
    assert link.round_trips == 4  # the workers' leases: a second; other priorities: a fourth
    looked_at = busiest.IN_FLIGHT + 2 * busiest.READY_ENDS
    stats = client.info("commandstats")
    assert stats["cmdstat_hmget"]["calls"] <= looked_at + 1  # and the defaults
    assert stats["cmdstat_llen"]["calls"] <= looked_at + 1
    assert (found.in_flight_slots, found.ready_slots) == (busiest.IN_FLIGHT,
                                                         n - busiest.IN_FLIGHT)
    top = found.slots
    assert [(s.in_flight, s.waiting) for s in top[:2]] == [(1, 1), (1, 1)]  # h0, h1
    assert {s.slot for s in top[:2]} == {"h0.test", "h1.test"}
    assert all(s.in_flight == 1 for s in top) and len(top) == busiest.BUSIEST
    # The backed-off slot sits at the end of the ready set: it is looked at.
    last = busiest_slots(client, TAG, n)
    seconds, micros = client.time()
    waited = (seconds * 1000 + micros // 1000 - set_at) / 1000  # 5 s once, in a loaded CI
    assert last is not None
    paused = [s for s in last.slots if s.slot == f"h{n - 1}.test"]
    assert paused and 60 - waited - 0.002 <= paused[0].backoff <= 60
    # More slots in flight than are read: still bounded.
    q.pop(busiest.IN_FLIGHT)
    client.config_resetstat()
    found = busiest_slots(client, TAG)
    assert found is not None and found.in_flight_slots == 2 * busiest.IN_FLIGHT
    assert client.info("commandstats")["cmdstat_hmget"]["calls"] <= looked_at + 1
    assert [s.in_flight for s in found.slots] == [1] * busiest.BUSIEST


def test_a_crawl_wide_queue_s_slots_as_its_workers_leave_them(client: redis.Redis) -> None:
    policy = SlotPolicy(Settings({"CONCURRENT_REQUESTS_PER_DOMAIN": 2, "DOWNLOAD_DELAY": 0.25,
                                  "RANDOMIZE_DOWNLOAD_DELAY": False}), None)
    q = LeasedQueue(client, DemoSpider(), "site:requests", tag=TAG, policy=policy)
    q.push_many([Request(f"https://a.test/{j}") for j in range(4)]
                + [Request("https://b.test/0", meta={"download_slot": "b:slot"})])
    assert len(q.pop_leases(10)) == 2  # one a slot: a delay
    found = busiest_slots(client, TAG)
    assert found is not None
    assert [(s.slot, s.in_flight, s.concurrency, s.waiting, s.delay) for s in found.slots] == [
        ("a.test", 1, 2, 3, 0.25), ("b:slot", 1, 2, 0, 0.25)]
    assert 0 < found.slots[0].next_start <= 0.25


def test_a_clusters_slots_are_read_on_their_home_shards(rc: Any) -> None:
    """``"crawl"`` mode on a Redis Cluster: each slot's figures come from its home
    shard, its in-flight count from the leases there; every shard's slots are read."""
    rc.flushall()
    policy = SlotPolicy(Settings({"CONCURRENT_REQUESTS_PER_DOMAIN": 2, "DOWNLOAD_DELAY": 0}),
                        None)
    q = LeasedQueue(rc, DemoSpider(), "site:requests", tag=TAG, shards=4, policy=policy)
    hosts = [f"h{j}.test" for j in range(6)]
    for n in range(3):
        q.push_many([Request(f"https://{host}/{n}") for host in hosts])
    taken = [lease for _ in range(8) for lease in q.pop_leases(20)]
    assert len(taken) == 12  # two a host
    assert len({q.home(keys.slot_name(host)) for host in hosts}) > 1
    found = busiest_slots(rc, TAG, limit=10, shards=4)
    assert found is not None and found.in_flight_slots == 6
    assert sorted((s.slot, s.in_flight, s.concurrency, s.waiting) for s in found.slots) == [
        (host, 2, 2, 1) for host in hosts]


def test_a_clusters_one_slot_of_worker_mode_is_read_on_every_shard(rc: Any) -> None:
    """``"worker"`` mode on a Redis Cluster: each queue shard keeps its own slot ``*``;
    its waiting requests are every shard's (shard 0's alone were shown before)."""
    rc.flushall()
    q = LeasedQueue(rc, DemoSpider(), "site:requests", tag=TAG, shards=4, policy=OneSlot())
    for j in range(6):  # a push goes to the next shard in turn
        q.push_many([Request(f"https://h{j}.test/{n}") for n in range(5)])
    taken = q.pop_leases(4)
    for shard in range(4):
        q.sort(shard=shard)  # every shard's intake into its slot
    waiting = sum(rc.llen(keys.slot_prefix(TAG, i) + keys.slot_name(ONE_SLOT) + ":0")
                  for i in range(4))
    assert waiting == 30 - len(taken)
    assert sum(1 for i in range(4)
               if rc.llen(keys.slot_prefix(TAG, i) + keys.slot_name(ONE_SLOT) + ":0")) > 1
    found = busiest_slots(rc, TAG, limit=10, shards=4)
    assert found is not None
    assert [(s.slot, s.in_flight, s.waiting) for s in found.slots] == [
        (ONE_SLOT, len(taken), 30 - len(taken))]
    # One slot ready, whatever the number of shards whose ready set holds it.
    assert (found.in_flight_slots, found.ready_slots) == (1, 1)
