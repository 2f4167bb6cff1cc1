"""Queue entries that cannot be decoded into requests (frontier/undecodable.py): each is
decoded on its own, and one that fails (garbage bytes, a callback the spider no longer
has, an unknown request class, another serializer's bytes) is retired to the failed
requests' record, out of the lease hash or the queue, by a pop and by a reap; the
requests taken with it go on. The scheduler counts and logs it, and no reclaim
blames a failover for it."""

from __future__ import annotations

import json
import logging
import pickle
import time
from typing import Any

import pytest
import redis
from helpers import DemoSpider, crawler_for
from redis.cluster import RedisCluster
from scrapy import Request, Spider

from scrapy_bloomdupe import keys
from scrapy_bloomdupe.frontier import entry, failed, undecodable
from scrapy_bloomdupe.frontier.queue import PriorityQueue, Reclaimed
from scrapy_bloomdupe.scheduler import Scheduler
from scrapy_bloomdupe.scheduling.upkeep import RECLAIMED_LOST_ACKS

TAG = "demo:bloomdupe"
GONE_CALLBACK = "http://a.example/renamed-callback"
GONE_CLASS = "http://a.example/gone-class"
JSON_URL = "http://a.example/json-entry"


class OldSpider(DemoSpider):
    """The spider before a deploy renamed its callback (``DemoSpider`` has none)."""

    def parse_item(self, response: Any) -> None:
        pass


class RestoredSpider(DemoSpider):
    """The spider once the callback is restored."""

    def parse_item(self, response: Any) -> None:
        pass


def queue(client: redis.Redis | RedisCluster, spider: Spider | None = None, shards: int = 1,
          lease_timeout: float = 30.0) -> PriorityQueue:
    return PriorityQueue(client, spider or DemoSpider(), "demo:requests", tag=TAG,
                         shards=shards, lease_timeout=lease_timeout)


def bad_entries() -> dict[str, bytes]:
    """Entries a spider without ``parse_item`` cannot decode, by what is wrong, each with
    the URL that can be read back from it ("" where none can)."""
    old = OldSpider()
    gone_callback = pickle.dumps(Request(GONE_CALLBACK, callback=old.parse_item)
                                 .to_dict(spider=old), protocol=-1)
    gone_class = pickle.dumps({**Request(GONE_CLASS).to_dict(spider=old),
                               "_class": "scrapy.http.GoneRequest"}, protocol=-1)
    return {"garbage": b"\x80\x05not a pickle at all", "callback": gone_callback,
            "class": gone_class, "json": json.dumps({"url": JSON_URL}).encode()}


READABLE = {"garbage": "", "callback": GONE_CALLBACK, "class": GONE_CLASS, "json": JSON_URL}
ERRORS = {"garbage": "UnpicklingError", "callback": "parse_item", "class": "GoneRequest",
          "json": "UnpicklingError"}


def queue_raw(client: redis.Redis | RedisCluster, entries: dict[str, bytes],
              shard: int = 0) -> None:
    client.zadd(keys.queue(TAG, shard), {member: 0 for member in entries.values()})


def records(client: redis.Redis | RedisCluster) -> dict[str, failed.FailedRequest]:
    return {r.url: r for r in failed.read(client, TAG)}


@pytest.mark.parametrize("kind", sorted(READABLE))
def test_a_pop_retires_what_it_cannot_decode_and_hands_out_the_rest(
        client: redis.Redis, kind: str) -> None:
    q = queue(client)
    q.push_many([Request("http://a.example/1", priority=1)])
    member = bad_entries()[kind]
    queue_raw(client, {kind: member})
    q.push_many([Request("http://a.example/2", priority=-1)])
    leases = q.pop_leases(5)
    assert [lease.request.url for lease in leases] == ["http://a.example/1",
                                                      "http://a.example/2"]
    # Out of the lease hash and the queue: it never comes back by itself.
    assert q.status() == (0, 2)
    leased = client.hvals(keys.leases(TAG, 0))
    assert not any(member in value for value in leased)
    (record,) = failed.read(client, TAG)
    assert record.url == READABLE[kind]
    assert "cannot be decoded" in record.reason and ERRORS[kind] in record.reason
    (retired,) = q.take_retired()
    assert retired.url == READABLE[kind] and retired.reason == record.reason
    assert q.take_retired() == []
    # Kept raw, with its score: what `bloomdupe failed --requeue` queues again.
    raw = client.xrange(keys.failed(TAG))[0][1]
    assert raw[b"request"] == member and raw[b"score"] == b"0"
    # Nothing of this worker's is left to reclaim: the pop was answered.
    q.ack(leases)
    assert q.reclaim() == Reclaimed()
    assert q.status() == (0, 0)


def test_a_pop_of_nothing_but_undecodable_entries_retires_them_all(
        client: redis.Redis) -> None:
    q = queue(client)
    queue_raw(client, bad_entries())
    assert q.pop_leases(10) == []
    assert q.status() == (0, 0)
    assert {r.url for r in q.take_retired()} == set(READABLE.values())
    assert failed.count(client, TAG) == len(READABLE)


def test_a_reap_retires_a_dead_workers_undecodable_lease_from_the_queue(
        client: redis.Redis) -> None:
    old = queue(client, OldSpider(), lease_timeout=0.1)
    old.push_many([Request(GONE_CALLBACK, callback=old.spider.parse_item),
                   Request("http://a.example/kept")])
    assert len(old.pop_leases(5)) == 2  # then its worker dies, and a deploy happens
    time.sleep(0.15)
    reaper = queue(client, lease_timeout=0.1)
    back = reaper.reap()
    assert [(n, r.url) for n, r in back] == [(1, "http://a.example/kept")]
    (retired,) = reaper.take_retired()
    assert retired.url == GONE_CALLBACK and "parse_item" in retired.reason
    assert reaper.status() == (1, 0)  # only the request that decodes is queued
    # Kept without its requeue count: a requeue starts afresh.
    raw = client.xrange(keys.failed(TAG))[0][1]
    assert not raw[b"request"].startswith(entry.REQUEUED)
    assert [lease.request.url for lease in reaper.pop_leases(5)] == ["http://a.example/kept"]


def test_the_retire_script_records_an_entry_once(client: redis.Redis) -> None:
    """A retry after a lost reply (or another worker that took the entry meanwhile)
    records nothing again: the record is written only by the call that removed it."""
    client.hset(keys.leases(TAG, 0), "me:1.0", b"0|x")
    client.zadd(keys.queue(TAG, 0), {b"y": 3})
    script = client.register_script(undecodable.RETIRE_SCRIPT)
    args = [100, "lease", "me:1.0", "u1", "GET", "why", 0, b"x",
            "queued", b"y", "u2", "", "why", 3, b"y"]
    lists = [keys.leases(TAG, 0), keys.queue(TAG, 0), keys.failed(TAG)]
    assert script(keys=lists, args=args) == [1, 1]
    assert script(keys=lists, args=args) == [0, 0]
    assert sorted(records(client)) == ["u1", "u2"]
    assert not client.exists(keys.leases(TAG, 0), keys.queue(TAG, 0))


def test_two_workers_that_meet_one_entry_count_and_log_it_once(client: redis.Redis) -> None:
    """Two workers that decode the same queued entry (both sorting one intake at once:
    test_deploy counted 38 for 37 entries once) retire it once: only the one whose
    call removed it counts and logs it."""
    members = bad_entries()
    queue_raw(client, {"json": members["json"]})
    first, second = queue(client), queue(client)
    error = ValueError("not a request")
    bad: list[entry.Bad] = [(members["json"], 0, members["json"], error)]
    first._retire(0, "queued", bad)
    second._retire(0, "queued", bad)
    assert [r.url for r in first.take_retired()] == [JSON_URL]
    assert second.take_retired() == []
    assert list(records(client)) == [JSON_URL]


def test_requeued_once_the_callback_is_restored_it_is_fetched(client: redis.Redis) -> None:
    q = queue(client)
    queue_raw(client, {"callback": bad_entries()["callback"]})
    assert q.pop_leases(5) == []
    (record,) = failed.read(client, TAG)
    assert failed.requeue(client, TAG, [record.id]) == 1
    assert failed.count(client, TAG) == 0
    (lease,) = queue(client, RestoredSpider()).pop_leases(5)
    assert lease.request.url == GONE_CALLBACK
    assert lease.request.callback.__name__ == "parse_item"


def test_on_a_cluster_a_shard_outside_the_records_slot_retires_too(rc: RedisCluster) -> None:
    """On a cluster the record is in shard 0's slot and shard 1's leases elsewhere: the
    record is written first, then the lease removed (two round trips)."""
    q = queue(rc, shards=3)
    assert keys.failed(TAG).split("}")[0] != keys.leases(TAG, 1).split("}")[0]
    queue_raw(rc, {"callback": bad_entries()["callback"]}, shard=1)
    rc.zadd(keys.queue(TAG, 1), {q.entry(Request("http://a.example/kept"))[1]: 1})
    leases = q._pop_from(1, 5)
    assert [lease.request.url for lease in leases] == ["http://a.example/kept"]
    assert rc.hlen(keys.leases(TAG, 1)) == 1
    assert list(records(rc)) == [GONE_CALLBACK]
    rc.delete(keys.failed(TAG), *(name for shard in range(3) for name in (
        keys.queue(TAG, shard), keys.leases(TAG, shard), keys.owners(TAG, shard))))


def test_the_scheduler_counts_and_logs_it_once_and_no_failover_is_blamed(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Measured before: the worker that popped such an entry logged "Leasing requests
    failed", the lease stayed, and the reclaim put it back blaming a failover that never
    happened; the next worker took it, for ever. A pop that took only such entries is not
    taken for an empty queue: the scheduler pops again at once."""
    crawler = crawler_for(redis_url, SCHEDULER_PERSIST=True, CONCURRENT_REQUESTS=1)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    try:
        scheduler.enqueue_request(Request("http://a.example/1"))
        client = redis.Redis.from_url(redis_url)
        tag = scheduler.queue.tag
        # Ahead of the request (a higher priority): the first pop takes it alone.
        client.zadd(keys.queue(tag, 0), {bad_entries()["callback"]: -10})
        client.close()
        caplog.set_level(logging.INFO)
        request = scheduler.next_request()
        assert request is not None and request.url == "http://a.example/1"
        stats = crawler.stats.get_stats()
        assert stats["bloomdupe/undecodable"] == 1 and stats["bloomdupe/failed"] == 1
        (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert GONE_CALLBACK in error.getMessage()
        assert "bloomdupe failed --requeue" in error.getMessage()
        assert "Leasing requests failed" not in caplog.text
        assert scheduler.queue.status() == (0, 1)  # the request handed out, leased
        scheduler.upkeep._next_reclaim = 0.0  # a reclaim is due: nothing to put back
        scheduler.upkeep.tick()
        assert "failover" not in caplog.text and RECLAIMED_LOST_ACKS not in caplog.text
        assert "Put" not in caplog.text
    finally:
        scheduler.close("finished")
