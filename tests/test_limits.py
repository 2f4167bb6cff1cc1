"""Refusing what cannot work before writing anything, and shards that cost their size once.

A capacity or shard count past ``BLOOMDUPE_MAX_BYTES`` / ``BLOOMDUPE_MAX_SHARDS``
stops the crawl with one ConfigError and no key written; a filter that would not
fit in the server's ``maxmemory`` likewise; shards are created by a script in
Redis (their bytes never sent), so two workers opening filters together in a
small Redis both succeed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from helpers import crawler_for, fps

from scrapy_bloomdupe import sizing
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.bloom.lua import CREATE_SHARD_SCRIPT, MEMORY_HEADROOM
from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter
from scrapy_bloomdupe.exceptions import ConfigError, FilterLostError, FilterMismatchError
from scrapy_bloomdupe.testing import RedisServer

MB = 1024 * 1024


@pytest.fixture(scope="module")
def small_redis() -> Iterator[RedisServer]:
    """A Redis of 20 MB (``--maxmemory 20mb``), emptied by each test that uses it."""
    with RedisServer(maxmemory="20mb") as server:
        yield server


@pytest.fixture
def small(small_redis: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(small_redis.url)
    c.flushall()
    c.config_set("maxmemory-policy", "noeviction")
    c.config_set("maxmemory", "20mb")
    yield c
    c.close()


def plan_of(total_bytes: int, **kwargs: Any) -> sizing.Sizing:
    """A one-shard plan of about ``total_bytes`` (1.8 bytes an item at 0.001)."""
    return sizing.plan(int(total_bytes / 1.7975), 0.001, **kwargs)


# -- settings that cannot work ------------------------------------------------------------


@pytest.mark.parametrize(("settings", "setting", "limit"), [
    ({"BLOOMDUPE_CAPACITY": 10**13}, "BLOOMDUPE_CAPACITY", "BLOOMDUPE_MAX_BYTES"),
    ({"BLOOMDUPE_SHARDS": 10**6}, "BLOOMDUPE_SHARDS", "BLOOMDUPE_MAX_SHARDS"),
], ids=["capacity-1e13", "shards-1e6"])
def test_a_crawl_that_cannot_work_stops_before_writing(
        redis_url: str, client: redis.Redis, settings: dict[str, Any], setting: str,
        limit: str) -> None:
    crawler = crawler_for(redis_url, **settings)
    with pytest.raises(ConfigError) as info:
        RedisBloomDupeFilter.from_crawler(crawler)
    assert info.value.setting == setting
    assert limit in str(info.value)
    assert client.dbsize() == 0


# -- maxmemory ----------------------------------------------------------------------------


def test_a_filter_larger_than_maxmemory_is_refused_before_writing(small: redis.Redis) -> None:
    plan = plan_of(25 * MB)
    with pytest.raises(ConfigError) as info:
        BloomFilter.open(small, "big", plan)
    message = str(info.value)
    assert info.value.setting == "BLOOMDUPE_CAPACITY"
    assert "maxmemory is 20 MiB" in message and "Nothing was written" in message
    assert "Lower BLOOMDUPE_CAPACITY" in message
    assert small.dbsize() == 0
    # Near the limit is refused too (headroom for the queue and buffers) ...
    with pytest.raises(ConfigError):
        BloomFilter.open(small, "near", plan_of(int(20 * MB * (1 - MEMORY_HEADROOM))))
    assert small.dbsize() == 0
    # ... and what fits is made.
    bf = BloomFilter.open(small, "fits", plan_of(8 * MB))
    assert bf.add(b"x") and not bf.add(b"x")


def test_memory_in_use_counts(small: redis.Redis) -> None:
    small.setrange("other", 10 * MB - 1, b"x")
    with pytest.raises(ConfigError, match="in use"):
        BloomFilter.open(small, "f", plan_of(8 * MB))
    assert small.keys("f*") == []
    # Even where Redis would evict other keys to make room: it may evict the filter's.
    small.config_set("maxmemory-policy", "allkeys-lru")
    with pytest.raises(ConfigError, match="in use"):
        BloomFilter.open(small, "f", plan_of(8 * MB))
    assert small.keys("f*") == []
    small.delete("other")
    bf = BloomFilter.open(small, "f", plan_of(8 * MB))
    assert small.strlen(bf.shard_key(0)) == bf.sizing.bytes_per_shard > 7 * MB


def test_joining_an_existing_filter_needs_no_room(small: redis.Redis) -> None:
    plan = plan_of(8 * MB)
    BloomFilter.open(small, "f", plan).add(b"x")
    # Now a new 8 MB filter would not fit (6 MB, not 8: see the same test in test_native).
    small.setrange("other", 6 * MB - 1, b"x")
    with pytest.raises(ConfigError):
        BloomFilter.open(small, "g", plan)
    assert not BloomFilter.open(small, "f", plan).add(b"x")


def test_no_config_permission_skips_the_check(small_redis: RedisServer,
                                              small: redis.Redis) -> None:
    small.acl_setuser("noconfig", enabled=True, passwords=["+pw"],
                      commands=["+@all", "-config"], keys=["*"])
    try:
        limited = redis.Redis(port=small_redis.port, username="noconfig", password="pw")
        bf = BloomFilter.open(limited, "f", plan_of(2 * MB))
        assert bf.add(b"x")
        limited.close()
    finally:
        small.acl_deluser("noconfig")


def test_growth_that_would_not_fit_in_maxmemory_is_not_added(
        small: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    plan = sizing.plan(200, sizing.first_generation_error_rate(0.01, True))
    bf = BloomFilter.open(small, "g", plan, growth=True, use_lock=False)
    small.setrange("other", 10 * MB - 1, b"x")
    # In use: more than maxmemory less the 10% headroom, less than maxmemory itself.
    small.config_set("maxmemory", small.info("memory")["used_memory"] + MB)
    with caplog.at_level(logging.WARNING, logger="scrapy_bloomdupe"):
        for i in range(0, 1_000, 50):
            bf.add_many(fps(50, f"b{i}-"))
    assert len(bf.generations) == 1 and small.keys("{g:0}:bits:*") == []
    refusals = [r for r in caplog.records if "cannot grow" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in caplog.records]  # warned once
    assert "maxmemory" in refusals[0].getMessage()
    small.config_set("maxmemory", "20mb")  # room again: the next look grows it
    bf.add_many(fps(300, "after-"))
    assert len(bf.generations) > 1


def test_growth_stops_at_max_bytes(client: redis.Redis,
                                   caplog: pytest.LogCaptureFixture) -> None:
    first = sizing.plan(1_000, sizing.first_generation_error_rate(0.01, True))
    # Room for the first two generations, not the third.
    limit = sizing.total_bytes(first, 2) + 10
    bf = BloomFilter.open(client, "g", sizing.plan(1_000, first.error_rate, max_bytes=limit),
                          growth=True, use_lock=False)
    with caplog.at_level(logging.WARNING, logger="scrapy_bloomdupe"):
        for i in range(0, 8_000, 100):
            bf.add_many(fps(100, f"b{i}-"))
    assert len(bf.generations) == 2
    refusals = [r.getMessage() for r in caplog.records if "cannot grow" in r.getMessage()]
    assert len(refusals) == 1 and f"BLOOMDUPE_MAX_BYTES={limit}" in refusals[0]
    assert "generation 2" in refusals[0]
    # A worker with a higher limit grows it.
    other = BloomFilter.open(client, "g", sizing.plan(1_000, first.error_rate), growth=True,
                             use_lock=False)
    other.add_many(fps(100, "more"))
    assert len(other.generations) > 2


# -- shards made in Redis, not sent -------------------------------------------------------


def test_a_shard_is_made_in_redis_at_its_length_all_zero(client: redis.Redis) -> None:
    plan = sizing.plan(5_000_000, 0.001, shards=2)
    before = client.info("stats")["total_net_input_bytes"]
    bf = BloomFilter.open(client, "t", plan)
    sent = client.info("stats")["total_net_input_bytes"] - before
    assert plan.total_bytes > 8 * MB and sent < 64 * 1024, sent  # the bytes never travel
    for i in range(2):
        name = bf.shard_key(i)
        assert client.strlen(name) == plan.bytes_per_shard
        assert client.bitcount(name) == 0
        assert client.get(name) == bytes(plan.bytes_per_shard)
    # The script never overwrites: a shard with bits keeps them.
    bf.add(b"x")
    bits = client.bitcount(bf.shard_key(0)) + client.bitcount(bf.shard_key(1))
    assert bits == plan.hashes
    assert client.eval(CREATE_SHARD_SCRIPT, 1, bf.shard_key(0), plan.bytes_per_shard) == \
        plan.bytes_per_shard
    BloomFilter.open(client, "t", plan)
    assert client.bitcount(bf.shard_key(0)) + client.bitcount(bf.shard_key(1)) == bits
    assert not bf.add(b"x")


def test_a_shard_of_the_wrong_length_is_refused(client: redis.Redis) -> None:
    plan = sizing.plan(10_000, 0.001, shards=2)
    BloomFilter.open(client, "t", plan).add(b"x")
    client.set("{t:1}:bits", b"\0" * 10)
    with pytest.raises(FilterMismatchError, match=r"length of \{t:1\}:bits"):
        BloomFilter.open(client, "t", plan)
    assert client.strlen("{t:0}:bits") == plan.bytes_per_shard


def test_a_shard_without_metadata_is_refused_not_given_a_new_seed(client: redis.Redis) -> None:
    plan = sizing.plan(10_000, 0.001, shards=2)
    client.set("{t:1}:bits", b"\0" * 10)
    with pytest.raises(FilterLostError, match=r"\{t:1\}:bits are there but its metadata"):
        BloomFilter.open(client, "t", plan)
    assert not client.exists("t:meta", "{t:0}:bits")  # nothing written


def test_two_filters_made_at_once_in_80mb() -> None:
    """Sending zeros (``SET name bytes(size) NX``) failed here with OOM for one of two."""
    with RedisServer(maxmemory="80mb") as server:
        plan = sizing.plan(15_000_000, 0.001)  # one shard of 25.7 MiB each
        assert plan.shards == 1 and plan.total_bytes > 25 * MB
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def open_one(name: str) -> None:
            c = redis.Redis.from_url(server.url)
            try:
                barrier.wait(10)
                BloomFilter.open(c, name, plan).add(b"x")
            except BaseException as e:  # reported below
                errors.append(e)
            finally:
                c.close()

        threads = [threading.Thread(target=open_one, args=(n,)) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        c = redis.Redis.from_url(server.url)
        assert c.strlen("{a:0}:bits") == c.strlen("{b:0}:bits") == plan.bytes_per_shard
        assert c.info("memory")["used_memory_peak"] <= 80 * MB
        c.close()
