"""What Redis does to a running crawl's state (issue 14): keys flushed, deleted, replaced
or evicted, commands refused, memory full. Each is found and stops the crawl with one
clear error; nothing is made again empty, nothing answered from a cache for a filter
that is gone. The same events in real ``scrapy crawl`` workers: tests/e2e/test_operator.py.
"""

from __future__ import annotations

import logging
import time

import pytest
import redis
from helpers import crawler_for, fps
from redis.cluster import RedisCluster
from scrapy import Request

from scrapy_bloomdupe import keys, sizing
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.dupefilter import LOST_REASON, REFUSED_REASON, RedisBloomDupeFilter
from scrapy_bloomdupe.exceptions import BloomDupeError, FilterLostError
from scrapy_bloomdupe.scheduler import Scheduler
from scrapy_bloomdupe.testing import RedisServer
from scrapy_bloomdupe.transport.diagnose import check_eviction
from scrapy_bloomdupe.transport.link import Link
from scrapy_bloomdupe.transport.outage import OutageGuard, RedisUnavailable

PLAN = sizing.plan(10_000, 0.001, shards=4)


@pytest.mark.parametrize("cache", [0, 1000], ids=["no-cache", "local-cache"])
def test_a_flushed_filter_is_found_at_the_next_check(client: redis.Redis, cache: int) -> None:
    bf = BloomFilter.open(client, "t", PLAN, local_cache=cache)
    assert all(bf.add_many(fps(50)))
    client.flushdb()
    with pytest.raises(FilterLostError, match=r"lost its state in Redis: \{t:\d\}:bits is gone"):
        bf.add_many(fps(60))  # 50 seen (the cache knew them) and 10 new
    assert client.dbsize() == 0  # no shard made again, empty
    assert not bf.cache.size or all(f not in bf.cache for f in fps(50))


def test_a_deleted_shard_is_not_made_again(client: redis.Redis) -> None:
    bf = BloomFilter.open(client, "t", PLAN)
    bf.add_many(fps(100))
    client.delete(keys.bits("t", 2))
    with pytest.raises(FilterLostError, match=r"\{t:2\}:bits is gone"):
        bf.add_many(fps(200, "v"))
    assert not client.exists(keys.bits("t", 2))
    # A worker that joins now is refused too: the first worker made every shard.
    with pytest.raises(FilterLostError, match=r"1 of its 4 shard\(s\) of generation 0 are gone"):
        BloomFilter.open(client, "t", PLAN)
    assert not client.exists(keys.bits("t", 2))


def test_deleted_metadata_is_found_and_never_given_a_new_seed(client: redis.Redis) -> None:
    bf = BloomFilter.open(client, "t", PLAN)
    bf.add_many(fps(100))
    bf.verify()
    client.delete(keys.meta("t"))
    with pytest.raises(FilterLostError, match="its metadata t:meta is gone"):
        bf.verify()
    with pytest.raises(FilterLostError, match="are there but its metadata t:meta is not"):
        BloomFilter.open(client, "t", PLAN)
    assert not client.exists(keys.meta("t"))


def test_replaced_metadata_is_found(client: redis.Redis) -> None:
    bf = BloomFilter.open(client, "t", PLAN)
    client.flushdb()
    BloomFilter.open(client, "t", PLAN)  # another crawl made anew at the same key
    with pytest.raises(FilterLostError, match="was replaced"):
        bf.verify()


def test_a_filter_whose_maker_died_before_its_shards_is_finished_by_the_next(
        client: redis.Redis) -> None:
    BloomFilter.open(client, "t", PLAN)
    client.hdel(keys.meta("t"), "ready")
    client.delete(keys.bits("t", 3))  # never made: the first worker died meanwhile
    bf = BloomFilter.open(client, "t", PLAN)
    assert client.strlen(keys.bits("t", 3)) == PLAN.bytes_per_shard
    assert client.hget(keys.meta("t"), "ready") == b"1"
    assert bf.add(b"x")


def test_the_scheduler_does_not_call_a_flushed_crawl_done(redis_url: str,
                                                         client: redis.Redis) -> None:
    crawler = crawler_for(redis_url, BLOOMDUPE_DONE_GRACE=0)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    scheduler.enqueue_request(Request("http://a.example/1"))
    client.flushdb()  # the queue and the filter are gone: the queue looks empty
    scheduler.end.spider_idle(crawler.spider)
    assert not scheduler.crawl_done
    assert scheduler.df.failure == LOST_REASON
    scheduler.close("bloomdupe_filter_lost")
    assert client.dbsize() == 0  # nothing written back into the empty Redis


def test_a_refused_command_stops_the_crawl_and_acks_nothing(
        redis_url: str, client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    crawler = crawler_for(redis_url, SCHEDULER_PERSIST=True)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    scheduler.enqueue_request(Request("http://a.example/1"))
    parent = scheduler.next_request()
    assert parent is not None
    client.acl_setuser("default", enabled=True, nopass=True, commands=["+@all", "-zadd"],
                       keys=["*"], reset=False)
    try:
        with caplog.at_level(logging.ERROR):
            seen: list[list[bool | None]] = []  # answered at once: no crawl, no runner
            scheduler.path.queue_output([Request("http://a.example/2")]).addCallback(seen.append)
        assert scheduler.next_request() is None  # the pop is refused too, nothing taken
    finally:
        client.acl_setuser("default", enabled=True, nopass=True, commands=["+@all"],
                           keys=["*"])
    assert seen == [[None]]  # not queued (and so not passed on)
    assert scheduler.df.failure == REFUSED_REASON
    # ... nor added to the filter (the script wrote nothing): when its page is fetched
    # again, the link is new again.
    df = scheduler.df
    assert not df.bloom.contains(df.fingerprinter.fingerprint(Request("http://a.example/2")))
    assert "refuses this user command(s) the crawl needs: ZADD. Add +zadd" in caplog.text
    scheduler.close("bloomdupe_redis_refused")
    # The page whose links could not be queued is still leased: it comes back. (On one
    # node its lease is in the download slots' leases: frontier/leased.py.)
    assert int(client.get(keys.slot_leased("demo:bloomdupe", 0)) or 0) + sum(
        client.hlen(keys.leases("demo:bloomdupe", i)) for i in range(4)) >= 1


def test_a_full_redis_is_waited_like_an_outage_then_named() -> None:
    with RedisServer(maxmemory="4mb") as server:
        client = redis.Redis.from_url(server.url)
        bf = BloomFilter.open(client, "t", sizing.plan(1000, 0.01, shards=1))
        client.setrange("filler", 5_000_000, b"x")  # allowed: memory is checked before a write
        bf.outage = OutageGuard(1.0, "test")
        started = time.monotonic()
        with pytest.raises(RedisUnavailable, match="stayed out of memory, refusing writes"):
            bf.add(b"new")
        assert time.monotonic() - started >= 0.9  # waited
        client.delete("filler")
        bf.outage = OutageGuard(5.0, "test")
        assert bf.add(b"new")  # nothing was written meanwhile: still new
        client.close()


def test_a_missing_acl_rule_is_named_at_start(redis_server: RedisServer,
                                              client: redis.Redis) -> None:
    client.acl_setuser("limited", enabled=True, passwords=["+pw"],
                       commands=["+@all", "-zadd", "-xadd"], keys=["*"])
    try:
        url = f"redis://limited:pw@127.0.0.1:{redis_server.port}/0"
        crawler = crawler_for(url)
        with pytest.raises(BloomDupeError, match=r"ZADD, XADD. Add \+zadd \+xadd to its ACL"):
            RedisBloomDupeFilter.from_crawler(crawler)
        assert client.dbsize() == 0  # refused before anything was written
    finally:
        client.acl_deluser("limited")


def test_a_policy_that_evicts_any_key_is_refused(redis_url: str, client: redis.Redis,
                                                caplog: pytest.LogCaptureFixture) -> None:
    client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        with pytest.raises(BloomDupeError, match="maxmemory-policy allkeys-lru"):
            RedisBloomDupeFilter.from_crawler(crawler_for(redis_url))
        assert client.dbsize() == 0
        client.config_set("maxmemory-policy", "volatile-lru")
        with caplog.at_level(logging.WARNING):
            RedisBloomDupeFilter.from_crawler(crawler_for(redis_url)).close(clear=True)
        assert "evicts keys that expire when it is full (maxmemory-policy volatile-lru)" \
            in caplog.text
    finally:
        client.config_set("maxmemory-policy", "noeviction")


def test_a_pop_refused_halfway_takes_nothing_out_of_the_queue(redis_url: str,
                                                              client: redis.Redis) -> None:
    """Without the HSET, a pop would remove requests from the queue and lease none."""
    crawler = crawler_for(redis_url, SCHEDULER_PERSIST=True)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    scheduler.enqueue_request(Request("http://a.example/1"))
    client.acl_setuser("default", enabled=True, nopass=True, commands=["+@all", "-hset"],
                       keys=["*"], reset=False)
    try:
        assert scheduler.next_request() is None
    finally:
        client.acl_setuser("default", enabled=True, nopass=True, commands=["+@all"],
                           keys=["*"])
    assert scheduler.df.failure == REFUSED_REASON
    assert scheduler.queue.status() == (1, 0)  # still queued, not lost
    scheduler.close("bloomdupe_redis_refused")


def test_a_cluster_master_that_evicts_any_key_is_refused(rc: RedisCluster) -> None:
    node = rc.get_primaries()[1]
    server = rc.get_redis_connection(node)
    server.config_set("maxmemory-policy", "allkeys-lru")
    try:
        with pytest.raises(BloomDupeError, match=f"{node.name} evicts any key"):
            check_eviction(Link(rc))
    finally:
        server.config_set("maxmemory-policy", "noeviction")
    check_eviction(Link(rc))
