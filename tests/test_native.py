"""The native (RedisBloom) engine: engine choice, keyed items, missing and full shards.

What both engines share (check-and-add, op log, growth, info) is tested on both
in test_filter.py, test_growth.py and tests/faults/.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import redis
from helpers import DemoSpider, crawler_for, fps, server_config, shard_of
from scrapy import Request
from scrapy.utils.misc import build_from_crawler

from scrapy_bloomdupe import hashing, keys, sizing
from scrapy_bloomdupe.bloom import meta, native
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.dupefilter import FULL_REASON, RedisBloomDupeFilter
from scrapy_bloomdupe.exceptions import (
    ConfigError,
    FilterFullError,
    FilterLostError,
    FilterMismatchError,
)
from scrapy_bloomdupe.frontier.queue import PriorityQueue
from scrapy_bloomdupe.testing import RedisServer


@pytest.fixture
def bf_client(redisbloom_server: RedisServer | str) -> Iterator[redis.Redis]:
    """A client on the Redis with RedisBloom, emptied."""
    if isinstance(redisbloom_server, str):
        pytest.skip(redisbloom_server)
    c = redis.Redis.from_url(redisbloom_server.url)
    c.flushall()
    yield c
    c.close()


def test_auto_picks_redisbloom_when_the_server_has_it(bf_client: redis.Redis) -> None:
    bf = BloomFilter.open(bf_client, "t", sizing.plan(1000, 0.01, shards=2))
    assert bf.engine_name == "redisbloom"
    assert bf_client.hget("t:meta", "engine") == b"redisbloom"
    assert bf_client.type(keys.bloom("t", 1)) == b"MBbloom--"
    assert not bf_client.exists(keys.bits("t", 0))


def test_auto_picks_lua_without_the_module(client: redis.Redis) -> None:
    assert not native.available(client, "t")
    bf = BloomFilter.open(client, "t", sizing.plan(1000, 0.01))
    assert bf.engine_name == "lua"
    assert client.hget("t:meta", "engine") == b"lua"


def test_redisbloom_without_the_module_is_one_clear_error(client: redis.Redis) -> None:
    with pytest.raises(ConfigError) as info:
        BloomFilter.open(client, "t", sizing.plan(1000, 0.01), engine="redisbloom")
    message = str(info.value)
    assert message.startswith("BLOOMDUPE_ENGINE='redisbloom'")
    assert "--loadmodule" in message and "'lua'" in message
    assert "\n" not in message
    assert client.keys("*") == [], "nothing may be written"


def test_an_existing_filter_keeps_its_engine(bf_client: redis.Redis) -> None:
    plan = sizing.plan(1000, 0.01)
    BloomFilter.open(bf_client, "old", plan, engine="lua").add(b"x")
    # A filter stored before the engine field is a Lua one.
    bf_client.hdel("old:meta", "engine")
    joined = BloomFilter.open(bf_client, "old", plan)
    assert joined.engine_name == "lua"
    assert not joined.add(b"x")
    with pytest.raises(FilterMismatchError) as info:
        BloomFilter.open(bf_client, "old", plan, engine="redisbloom")
    assert info.value.differences["BLOOMDUPE_ENGINE"] == ("lua", "redisbloom")
    BloomFilter.open(bf_client, "new", plan, engine="redisbloom")
    with pytest.raises(FilterMismatchError, match="BLOOMDUPE_ENGINE"):
        BloomFilter.open(bf_client, "new", plan, engine="lua")
    assert BloomFilter.open(bf_client, "new", None).engine_name == "redisbloom"


def test_items_are_keyed_hashes_never_the_fingerprint(bf_client: redis.Redis) -> None:
    bf = BloomFilter.open(bf_client, "t", sizing.plan(1000, 0.01, shards=1))
    fingerprint = fps(1)[0]
    assert bf.add(fingerprint)
    name = keys.bloom("t", 0)
    assert not bf_client.execute_command("BF.EXISTS", name, fingerprint)
    assert not bf_client.execute_command("BF.EXISTS", name, fingerprint.hex())
    keyed = native.item(*hashing.halves(fingerprint, bf.seed))
    assert bf_client.execute_command("BF.EXISTS", name, keyed)
    # Another filter (another seed) gives the same fingerprint another item.
    other = BloomFilter.open(bf_client, "u", sizing.plan(1000, 0.01, shards=1))
    assert other.seed != bf.seed
    assert native.item(*hashing.halves(fingerprint, other.seed)) != keyed


def test_a_missing_shard_is_an_error_never_recreated(bf_client: redis.Redis) -> None:
    bf = BloomFilter.open(bf_client, "t", sizing.plan(1000, 0.01, shards=2))
    items = fps(20)
    bf.add_many(items)
    lost = [fp for fp in items if shard_of(bf, fp) == 1]
    bf_client.delete(keys.bloom("t", 1))
    with pytest.raises(FilterLostError, match=r"\{t:1\}:bf is gone"):
        bf.add(lost[0])
    assert not bf_client.exists(keys.bloom("t", 1))
    # A worker that joins it now is refused too, creating nothing.
    with pytest.raises(FilterLostError, match="gone"):
        BloomFilter.open(bf_client, "t", sizing.plan(1000, 0.01, shards=2))
    assert not bf_client.exists(keys.bloom("t", 1))


def test_reserve_keeps_the_lua_engines_bits_with_headroom() -> None:
    plan = sizing.plan(1_000_000, 0.001 * (1 - sizing.TIGHTENING), shards=4)
    reserve = native.reserve_of(plan)
    assert reserve.capacity == math.ceil(250_000 * (1 + native.HEADROOM))
    # RedisBloom's own sizing of that reserve: the plan's bits.
    bits = reserve.capacity * -math.log(reserve.error_rate) / math.log(2) ** 2
    assert bits == pytest.approx(plan.bits_per_shard, rel=1e-9)
    assert reserve.hashes == plan.hashes


def test_bytes_per_url_at_a_million(bf_client: redis.Redis) -> None:
    plan = sizing.plan(1_000_000, sizing.first_generation_error_rate(0.001, True))
    bf = BloomFilter.open(bf_client, "t", plan, growth=True)
    assert bf.info().memory_bytes / 1_000_000 <= 1.85


def test_a_full_shard_grows_the_filter(bf_client: redis.Redis) -> None:
    # A worker that never looks at the fill (one batch far past the headroom, no
    # growth checks in between) is refused by the full shard and grows the filter.
    plan = sizing.plan(1000, 0.01, shards=1)
    bf = BloomFilter.open(bf_client, "t", plan, growth=True)
    bf._room = 10**9  # as if it had looked at the fill long ago
    bf._part_floor = 10**9
    flags = bf.add_many(fps(1500))
    assert bf.counters.full >= 1
    assert len(bf.generations) >= 2
    assert sum(flags) >= 1500 - 30  # a few false positives at most
    assert all(bf.contains_many(fps(1500)))


def test_a_full_filter_without_growth_stops_with_an_error(bf_client: redis.Redis) -> None:
    bf = BloomFilter.open(bf_client, "t", sizing.plan(1000, 0.01, shards=1), growth=False)
    bf.add_many(fps(1000))
    with pytest.raises(FilterFullError, match="BLOOMDUPE_GROWTH is off"):
        bf.add_many(fps(200, "more"))


@pytest.fixture
def small_bf(bf_client: redis.Redis) -> Iterator[redis.Redis]:
    """The RedisBloom server with a maxmemory of 20 MB for the test."""
    with server_config(bf_client, "maxmemory", "20mb"):
        yield bf_client


def test_maxmemory_is_checked_before_reserving(small_bf: redis.Redis) -> None:
    big = sizing.plan(int(25 * MB / 1.7975), 0.001, shards=1)
    with pytest.raises(ConfigError, match="maxmemory is 20 MiB"):
        BloomFilter.open(small_bf, "big", big)
    assert small_bf.dbsize() == 0
    fits = sizing.plan(int(8 * MB / 1.7975), 0.001, shards=1)
    BloomFilter.open(small_bf, "f", fits).add(b"x")
    # Now a new 8 MB filter would not fit. 6 MB, not 8: with 8 the server sat within
    # 0.6 MB of its maxmemory, and a client connection more (each has its buffers) made
    # the join's add below fail with OOM.
    small_bf.setrange("other", 6 * MB - 1, b"x")
    with pytest.raises(ConfigError):
        BloomFilter.open(small_bf, "g", fits)
    # Joining the existing one needs no room.
    joined = BloomFilter.open(small_bf, "f", fits)
    assert joined.engine_name == "redisbloom"
    assert not joined.add(b"x")


MB = 1024 * 1024


@pytest.fixture
def fixed_seed(monkeypatch: pytest.MonkeyPatch) -> int:
    """New filters get this seed instead of a random one: a tiny RedisBloom filter's false
    positives then fall on the same items every run, so a test whose bounds allow for
    them is deterministic (it failed at random under load: a false positive at index 33)."""
    seed = 20261127
    monkeypatch.setattr(meta, "secrets", SimpleNamespace(randbits=lambda bits: seed))
    return seed


def test_a_call_refused_whole_by_a_full_shard_is_redone_as_a_new_call(
        bf_client: redis.Redis, fixed_seed: int) -> None:
    # The refused call's reply ('F' for each item) is in the op log: the redo after
    # growth must not be answered from it.
    plan = sizing.plan(100, 0.01, shards=1)
    bf = BloomFilter.open(bf_client, "t", plan, growth=True)
    assert bf.seed == fixed_seed
    bf._room = bf._part_floor = bf._grow_check_every = 10**9  # never looks at the fill
    reserve = native.reserve_of(plan)
    # False positives of this 111-item filter among the items that fill it (RedisBloom,
    # measured over 51,000 runs): mean 0.34; 3 or more in 0.44% of runs (the bound of 2
    # failed so), 5 once, never more. Up to 5 (6 or more: about 2e-6 a run).
    assert sum(bf.add_many(fps(reserve.capacity))) >= reserve.capacity - 5
    # Those take no room: more items until the shard is full, so the next call is refused
    # whole. (With room left, its first new items went into generation 0, and a later
    # one could become a false positive there after `false_positives` was read: the
    # check of the answers below failed so in 26 runs of 2,000, all with room left.)
    assert isinstance(bf.engine, native.NativeEngine)
    more = iter(fps(50, "more"))
    while bf.engine.inserted(0)[0] < reserve.capacity:
        bf.add_many([next(more)])
    assert len(bf.generations) == 1
    fresh = fps(50, "fresh")
    false_positives = bf.contains_many(fresh)  # of the overfull generation 0
    flags = bf.add_many(fresh)
    assert bf.counters.full == 1 and len(bf.generations) == 2
    # Answered as generation 0 answered before the call: its false positives seen, every
    # other item new and in generation 1; but for a false positive of generation 1 among
    # the items the redo added to it before (measured: one such item in 6 runs of
    # 25,000; at most 2 are allowed). Nothing answered new is missing from generation 1.
    wrong = [i for i, (new, seen) in enumerate(zip(flags, false_positives, strict=True))
             if new == seen]
    assert not any(flags[i] for i in wrong) and len(wrong) <= 2, wrong
    assert bf.engine.inserted(1) == [sum(flags)]
    assert all(bf.contains_many(fresh))


# -- lost state (issue 14's guarantees, on the native engine) ------------------------------


def test_a_flushed_native_filter_is_found_at_the_next_check(bf_client: redis.Redis) -> None:
    plan = sizing.plan(10_000, 0.001, shards=4)
    bf = BloomFilter.open(bf_client, "t", plan, local_cache=1000)
    assert all(bf.add_many(fps(50)))
    bf_client.flushdb()
    with pytest.raises(FilterLostError, match=r"\{t:\d\}:bf is gone"):
        bf.add_many(fps(60))
    assert bf_client.dbsize() == 0  # no shard made again, empty
    with pytest.raises(FilterLostError):
        bf.verify()


def test_orphaned_native_shards_get_no_new_metadata(bf_client: redis.Redis) -> None:
    plan = sizing.plan(10_000, 0.001, shards=4)
    BloomFilter.open(bf_client, "t", plan).add(b"x")
    bf_client.delete(keys.meta("t"))
    with pytest.raises(FilterLostError, match="metadata"):
        BloomFilter.open(bf_client, "t", plan)
    assert not bf_client.exists(keys.meta("t"))


def test_a_native_filter_whose_maker_died_before_its_shards_is_finished(
        bf_client: redis.Redis) -> None:
    plan = sizing.plan(10_000, 0.001, shards=4)
    BloomFilter.open(bf_client, "t", plan)
    bf_client.hdel(keys.meta("t"), "ready")
    bf_client.delete(keys.bloom("t", 3))  # never made: the first worker died meanwhile
    bf = BloomFilter.open(bf_client, "t", plan)
    assert bf_client.type(keys.bloom("t", 3)) == b"MBbloom--"
    assert bf_client.hget(keys.meta("t"), "ready") == b"1"
    assert bf.add(b"x")


def test_a_full_native_filter_stops_the_crawl_with_its_reason(
        redisbloom_server: RedisServer, bf_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    crawler = crawler_for(redisbloom_server.url, BLOOMDUPE_CAPACITY=100,
                          BLOOMDUPE_GROWTH=False, BLOOMDUPE_LOCAL_CACHE=0)
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    assert df.bloom.engine_name == "redisbloom"
    with caplog.at_level(logging.ERROR):
        for i in range(200):
            df.request_seen(Request(f"http://a.example/{i}"))
    assert df.failure == FULL_REASON
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "is full" in errors[0] and "BLOOMDUPE_GROWTH is off" in errors[0]


def test_a_sink_refused_mid_crawl_leaves_nothing_in_the_filter(
        bf_client: redis.Redis) -> None:
    """An ACL that loses the queue's ZADD mid-crawl: the native check-and-queue script is
    refused before its first write (the sink's ACL guard), so no item is in the filter
    without being in the queue."""
    q = PriorityQueue(bf_client, DemoSpider(), "demo:requests", tag="demo:bloomdupe",
                      shards=2)
    bf = BloomFilter.open(bf_client, "demo:bloomdupe", sizing.plan(1000, 0.01, shards=2))
    requests = [Request(f"http://a.example/{i}") for i in range(10)]
    fingerprints = [r.url.encode() for r in requests]
    bf_client.acl_setuser("default", enabled=True, nopass=True,
                          commands=["+@all", "-zadd"], keys=["*"], channels=["*"])
    try:
        with pytest.raises(redis.exceptions.NoPermissionError, match="zadd"):
            bf.add_many(fingerprints, q, lambda i: q.entry(requests[i]))
    finally:
        bf_client.acl_setuser("default", enabled=True, nopass=True, commands=["+@all"],
                              keys=["*"], channels=["*"])
    assert isinstance(bf.engine, native.NativeEngine)
    assert sum(bf.engine.inserted(0)) == 0
    assert q.status() == (0, 0)
    assert bf.add_many(fingerprints, q, lambda i: q.entry(requests[i])) == [True] * 10
    assert q.status() == (10, 0)
