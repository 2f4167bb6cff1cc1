"""The filter on a real Redis Cluster: configuration, every operation, races and a failover.

A session-scoped local cluster (3 masters, 3 replicas, ``cluster-node-timeout``
2000 ms, AOF on; :class:`scrapy_bloomdupe.testing_cluster.LocalCluster`) serves
every test but the failover ones, which kill a master and so get their own.
Each test starts with every master empty and every script cache flushed.

Race: 16 processes check-and-add the same 20,000 URLs through cluster clients
built from Scrapy settings, as in tests/test_race.py (whose fingerprints and
false-positive bound are reused), in lock mode and in atomic mode.

Failover: worker processes check-and-add at a steady pace while a master is
SIGKILLed; its replica takes over. Measured per worker: the longest gap
between two successful calls (the stall), the errors that reached the caller
(must be none: the cluster link retries through the failover), and afterwards
every URL accepted exactly once.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import multiprocessing
import os
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from scrapy import Request, Spider
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler
from scrapy_redis.queue import PriorityQueue as ScrapyRedisPriorityQueue
from test_race import URLS, fingerprints

from scrapy_bloomdupe import cluster, connection, sizing
from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter
from scrapy_bloomdupe.exceptions import BloomDupeError, ConfigError
from scrapy_bloomdupe.filter import BloomFilter
from scrapy_bloomdupe.scheduler import Scheduler
from scrapy_bloomdupe.testing import RedisServer, free_port
from scrapy_bloomdupe.testing_cluster import LocalCluster
from scrapy_bloomdupe.transport import Link

KEY = "cl"
SHARDS = 12


def cluster_settings(url: str, **extra: Any) -> Settings:
    return Settings({"REDIS_URL": url, "BLOOMDUPE_REDIS_CLUSTER": True, **extra})


def cluster_client(url: str, **extra: Any) -> RedisCluster:
    client = connection.from_settings(cluster_settings(url, **extra))
    assert isinstance(client, RedisCluster)
    return client


# -- fixtures -----------------------------------------------------------------


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    """3 masters + 3 replicas on free loopback ports, for the whole session."""
    with LocalCluster(masters=3, replicas=1, node_timeout_ms=2000) as servers:
        yield servers


@pytest.fixture
def cluster_url(local_cluster: LocalCluster) -> str:
    """The session cluster's URL, every master emptied and every script cache flushed."""
    local_cluster.wait_ok()
    local_cluster.flushall()
    return local_cluster.url


@pytest.fixture
def rc(cluster_url: str) -> Iterator[RedisCluster]:
    client = cluster_client(cluster_url)
    yield client
    client.close()


def plan(shards: int = SHARDS) -> sizing.Sizing:
    return sizing.plan(1_000_000, 0.001, shards=shards)


def node_clients(servers: LocalCluster) -> dict[str, redis.Redis]:
    return {f"127.0.0.1:{p}": servers.node(p).client() for p in servers.master_ports()}


# -- configuration --------------------------------------------------------------


def test_the_cluster_setting_builds_a_cluster_client_with_a_failover_retry(
    cluster_url: str,
) -> None:
    client = cluster_client(cluster_url, REDIS_PARAMS={"socket_timeout": 5})
    try:
        connection.check(client)
        assert connection.server_mode(client) == "cluster"
        assert client.retry.get_retries() == cluster.CLUSTER_RETRIES
        assert len(client.get_primaries()) == 3
        assert connection.describe(client).startswith("Redis Cluster (3 masters: 127.0.0.1:")
        # health_check_interval (a package default) was dropped, socket_timeout kept.
        kwargs = client.get_connection_kwargs()
        assert "health_check_interval" not in kwargs
        assert kwargs["socket_timeout"] == 5
    finally:
        client.close()


def test_redis_cls_in_redis_params_still_makes_a_cluster_client(cluster_url: str) -> None:
    settings = Settings({"REDIS_URL": cluster_url,
                         "REDIS_PARAMS": {"redis_cls": "redis.cluster.RedisCluster"}})
    assert connection.cluster_mode(settings)
    client = connection.from_settings(settings)
    try:
        assert isinstance(client, RedisCluster)
        connection.check(client)
        assert client.retry.get_retries() == cluster.CLUSTER_RETRIES
    finally:
        client.close()


def test_a_users_retry_is_kept_and_retry_attempts_are_mapped() -> None:
    mine = Retry(cluster.EqualJitterBackoff(), 7)
    assert connection.cluster_params({"retry": mine}, user_retry=True)["retry"] is mine
    mapped = connection.cluster_params({"cluster_error_retry_attempts": 3})
    assert "cluster_error_retry_attempts" not in mapped
    assert mapped["retry"].get_retries() == 3
    dropped = connection.cluster_params({"db": 0, "health_check_interval": 30,
                                         "retry_on_timeout": True, "socket_timeout": 2})
    assert dropped == {"socket_timeout": 2, "retry": dropped["retry"]}


@pytest.mark.parametrize(("params", "setting"), [
    ({"db": 2}, "REDIS_DB"),
    ({"unix_socket_path": "/tmp/redis.sock"}, "REDIS_PARAMS"),
    ({"connection_pool": object()}, "REDIS_PARAMS"),
])
def test_what_a_cluster_cannot_take_is_a_config_error(params: dict[str, Any],
                                                       setting: str) -> None:
    with pytest.raises(ConfigError) as info:
        connection.cluster_params(params)
    assert info.value.setting == setting


def test_conflicting_cluster_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"redis_cls must be redis\.cluster\.RedisCluster"):
        connection.cluster_mode(Settings({"BLOOMDUPE_REDIS_CLUSTER": True,
                                          "REDIS_PARAMS": {"redis_cls": "redis.Redis"}}))
    with pytest.raises(ConfigError, match="BLOOMDUPE_REDIS_CLUSTER"):
        connection.cluster_mode(Settings({"BLOOMDUPE_REDIS_CLUSTER": False, "REDIS_PARAMS": {
            "redis_cls": "redis.cluster.RedisCluster"}}))
    with pytest.raises(ConfigError, match="must be true or false"):
        connection.cluster_mode(Settings({"BLOOMDUPE_REDIS_CLUSTER": "maybe"}))
    assert connection.cluster_mode(Settings({"BLOOMDUPE_REDIS_CLUSTER": "true"}))
    assert not connection.cluster_mode(Settings({}))
    with pytest.raises(ConfigError, match="BLOOMDUPE_WAIT_REPLICAS"):
        connection.wait_replicas_setting(Settings({"BLOOMDUPE_WAIT_REPLICAS": -1}))


def test_cluster_mode_on_a_single_redis_is_a_config_error(redis_url: str) -> None:
    with pytest.raises(ConfigError) as info:
        connection.from_settings(cluster_settings(redis_url))
    assert info.value.setting == "BLOOMDUPE_REDIS_CLUSTER"
    assert "cluster support disabled" in str(info.value)
    assert info.value.__cause__ is None


def test_cluster_mode_with_the_cluster_down_is_one_clear_error() -> None:
    with pytest.raises(BloomDupeError, match=r"Cannot reach Redis Cluster at 127\.0\.0\.1:"):
        connection.from_settings(cluster_settings(f"redis://127.0.0.1:{free_port()}"))


def test_a_single_node_client_on_a_cluster_node_is_told_to_set_cluster_mode(
    cluster_url: str, local_cluster: LocalCluster,
) -> None:
    plain = connection.from_settings(Settings({"REDIS_URL": cluster_url}))
    try:
        assert isinstance(plain, redis.Redis)
        with pytest.raises(ConfigError, match="Set BLOOMDUPE_REDIS_CLUSTER = True") as info:
            connection.check(plain)
        assert info.value.setting == "BLOOMDUPE_REDIS_CLUSTER"
        # And at run time: a check-and-add round trip that meets MOVED says the same.
        port = int(cluster_url.rsplit(":", 1)[1])
        elsewhere = next(f"{{k{i}}}" for i in range(1000)
                         if key_slot(f"{{k{i}}}".encode()) not in owned_slots(plain, port))
        link = Link(plain)
        with pytest.raises(ConfigError, match="Set BLOOMDUPE_REDIS_CLUSTER = True"):
            link.execute([("GET", elsewhere)])
        link.close()
    finally:
        plain.close()


def test_a_single_redis_is_not_mistaken_for_a_cluster(redis_url: str) -> None:
    for protocol in (2, 3):
        plain = connection.from_settings(Settings({"REDIS_URL": redis_url,
                                                   "REDIS_PARAMS": {"protocol": protocol}}))
        try:
            connection.check(plain)
            assert connection.server_mode(plain) == "standalone"
        finally:
            plain.close()


def owned_slots(plain: redis.Redis, port: int) -> set[int]:
    owned: set[int] = set()
    for start, end, master, *_ in plain.execute_command("CLUSTER SLOTS"):
        if int(master[1]) == port:
            owned.update(range(int(start), int(end) + 1))
    return owned


# -- the filter on a cluster ----------------------------------------------------------


@pytest.mark.parametrize("use_lock", [True, False], ids=["lock", "atomic"])
def test_every_operation_works_on_a_cluster(rc: RedisCluster, local_cluster: LocalCluster,
                                            use_lock: bool) -> None:
    bf = BloomFilter.open(rc, KEY, plan(), use_lock=use_lock)
    try:
        spread = cluster.shard_nodes(rc, bf)
        fps = [hashlib.sha1(b"op-%d" % i).digest() for i in range(3000)]
        # One add_many whose shards live on all three masters.
        batch = fps[:60]
        shards = {_shard_of(bf, fp) for fp in batch}
        assert {n for n, idx in spread.items() if set(idx) & shards} == set(spread), spread
        assert bf.add_many(batch) == [True] * len(batch)
        assert bf.add_many(batch) == [False] * len(batch)
        assert bf.add(fps[60]) is True
        assert bf.add(fps[60]) is False
        assert sum(bf.add_many(fps)) == len(fps) - 61
        assert all(bf.contains_many(fps))
        others = [hashlib.sha1(b"other-%d" % i).digest() for i in range(1000)]
        assert sum(bf.contains_many(others)) <= 5
        link = bf._link.counters
        assert link is not None and link.retries == 0 and link.round_trips > 0
        info = bf.info()
        assert len(info.shards) == SHARDS
        assert abs(info.estimated_items - len(fps)) < 0.02 * len(fps), info.estimated_items
        assert info.memory_bytes >= SHARDS * bf.sizing.bytes_per_shard
        # Every master holds bits: the shards' keys really are spread.
        masters = node_clients(local_cluster)
        held = {name: c.dbsize() for name, c in masters.items()}
        assert all(held[name] > 0 for name in spread if spread[name]), (held, spread)
        bf.clear()
        left = {name: c.dbsize() for name, c in masters.items()}
        assert left == dict.fromkeys(masters, 0), left
        for c in masters.values():
            c.close()
    finally:
        bf.close()


def _shard_of(bf: BloomFilter, fp: bytes) -> int:
    from scrapy_bloomdupe import hashing

    h1, _ = hashing.halves(fp, bf.seed)
    return hashing.shard_of(h1, bf.sizing.shards)


def test_shards_spread_over_every_master_and_each_shard_is_one_slot(
    rc: RedisCluster, local_cluster: LocalCluster,
) -> None:
    bf = BloomFilter.open(rc, KEY, plan(12))
    try:
        spread = cluster.shard_nodes(rc, bf)
        masters = {f"127.0.0.1:{p}" for p in local_cluster.master_ports()}
        assert set(spread) == masters
        assert all(spread[m] for m in masters), f"a master holds no shard: {spread}"
        assert sorted(i for idx in spread.values() for i in idx) == list(range(12))
        assert cluster.spread_summary(spread).startswith("3 master(s): 127.0.0.1:")
        slots = cluster.shard_slots(bf)
        for i in range(12):
            assert {key_slot(k.encode()) for k in cluster.shard_keys(bf, i)} == {slots[i]}
        assert len(set(slots)) == 12
        # The shard's node as the client sees it is the node that holds its keys.
        for name, indexes in spread.items():
            node = redis.Redis(host="127.0.0.1", port=int(name.rsplit(":", 1)[1]))
            assert all(node.exists(bf.shard_key(i)) for i in indexes), name
            node.close()
    finally:
        bf.close()


def test_scripts_are_loaded_on_every_master_and_reloaded_after_a_flush(
    rc: RedisCluster, local_cluster: LocalCluster,
) -> None:
    bf = BloomFilter.open(rc, KEY, plan())
    try:
        masters = node_clients(local_cluster)
        sha = bf._sha
        assert all(c.script_exists(sha) == [True] for c in masters.values())
        # A replica promoted by a failover has no scripts (Redis 7 does not replicate
        # SCRIPT LOAD): the same as a master whose cache was flushed.
        for c in masters.values():
            c.script_flush()
        fps = [hashlib.sha1(b"ns-%d" % i).digest() for i in range(200)]
        assert all(bf.add_many(fps))
        assert bf.counters.script_reloads == 1
        assert all(c.script_exists(sha) == [True] for c in masters.values())
        for c in masters.values():
            c.close()
    finally:
        bf.close()


def test_a_stale_slot_map_is_corrected_by_following_moved(rc: RedisCluster) -> None:
    bf = BloomFilter.open(rc, KEY, plan())
    try:
        slot = cluster.shard_slots(bf)[0]
        slots = rc.nodes_manager.slots_cache
        right = slots[slot][0]
        wrong = next(n for n in rc.get_primaries() if n.name != right.name)
        slots[slot] = [wrong]  # as after a resharding the client has not seen
        fps = [fp for fp in (hashlib.sha1(b"mv-%d" % i).digest() for i in range(400))
               if _shard_of(bf, fp) == 0]
        assert fps and all(bf.add_many(fps))
        link = bf._link.counters
        assert link is not None and link.redirects >= 1 and link.retries == 0, link
        assert slots[slot][0].name == right.name
        assert not any(bf.add_many(fps))
    finally:
        bf.close()


def test_growth_works_on_a_cluster(rc: RedisCluster) -> None:
    small = sizing.plan(2000, 0.0001, shards=6)
    bf = BloomFilter.open(rc, KEY, small, growth=True)
    try:
        fps = [hashlib.sha1(b"grow-%d" % i).digest() for i in range(6000)]
        new = 0
        for start in range(0, len(fps), 100):
            new += sum(bf.add_many(fps[start:start + 100]))
        assert len(bf.generations) >= 2
        assert new >= len(fps) - 10, new
        assert all(bf.contains_many(fps))
        for i in range(6):
            keys = [bf.shard_key(i, g) for g in range(len(bf.generations))]
            assert len({key_slot(k.encode()) for k in keys}) == 1
    finally:
        bf.clear()
        bf.close()


def test_wait_replicas_costs_one_wait_per_master_and_counts_none_short(cluster_url: str) -> None:
    client = cluster_client(cluster_url, BLOOMDUPE_WAIT_REPLICAS=1)
    try:
        assert cluster.wait_replicas(client) == 1
        bf = BloomFilter.open(client, KEY, plan())
        try:
            fps = [hashlib.sha1(b"w-%d" % i).digest() for i in range(2000)]
            for start in range(0, len(fps), 100):
                assert all(bf.add_many(fps[start:start + 100]))
            assert bf._link.wait.replicas == 1
            assert bf._link.wait.short == 0 and bf._link.wait.skipped == 0
        finally:
            bf.close()
    finally:
        client.close()


def test_wait_without_a_replica_costs_the_short_timeout_only(
        caplog: pytest.LogCaptureFixture) -> None:
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        try:
            link = Link(client, wait_replicas=1, wait_timeout_ms=300)
            started = time.monotonic()
            for _ in range(cluster.WAIT_DEGRADED_TRIES):
                assert link.execute([("SET", "k", "v")]) == [b"OK"]
            tries = time.monotonic() - started
            # 300 ms once, then WAIT_DEGRADED_TIMEOUT_MS (20 ms, but Redis ends a
            # blocked WAIT on its 100 ms timer at hz 10) per round trip.
            assert 0.3 + 9 * 0.02 <= tries < 0.3 + 9 * 0.2, tries
            started = time.monotonic()
            for _ in range(100):
                assert link.execute([("SET", "k", "v")]) == [b"OK"]
            # Then one WAIT per WAIT_PROBE_INTERVAL (1 s) at most.
            assert time.monotonic() - started < 0.5
            assert link.wait.short == cluster.WAIT_DEGRADED_TRIES
            assert link.wait.skipped == 100
            warnings = [r for r in caplog.records if r.levelname == "WARNING"]
            assert len(warnings) == 1 and "0 replica(s) acknowledged" in warnings[0].getMessage()
            link.close()
        finally:
            client.close()


class DemoSpider(Spider):
    name = "demo"


def test_the_scheduler_and_the_dupefilter_run_on_a_cluster(
    cluster_url: str, local_cluster: LocalCluster,
) -> None:
    crawler = get_crawler(DemoSpider, {
        "REDIS_URL": cluster_url, "BLOOMDUPE_REDIS_CLUSTER": True, "BLOOMDUPE_CAPACITY": 10_000,
        "BLOOMDUPE_SHARDS": 6, "SCHEDULER_QUEUE_CLASS": "scrapy_bloomdupe.cluster.PriorityQueue",
    })
    crawler.spider = crawler._create_spider()
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    assert isinstance(scheduler.server, RedisCluster)
    assert isinstance(scheduler.df, RedisBloomDupeFilter)
    urls = [f"https://a.example/{i}" for i in range(20)]
    for i, url in enumerate(urls):
        assert scheduler.enqueue_request(Request(url, priority=i))
        assert not scheduler.enqueue_request(Request(url))
    popped = [scheduler.next_request() for _ in urls]
    assert [r.url for r in popped if r is not None] == urls[::-1]  # highest priority first
    assert scheduler.next_request() is None
    assert crawler.stats.get_value("dupefilter/filtered") == len(urls)
    scheduler.close("finished")  # SCHEDULER_PERSIST off: queue and filter deleted
    masters = node_clients(local_cluster)
    assert {name: c.dbsize() for name, c in masters.items()} == dict.fromkeys(masters, 0)
    for c in masters.values():
        c.close()


def test_scrapy_redis_priority_queue_cannot_pop_on_a_cluster(rc: RedisCluster) -> None:
    """Why the cluster needs scrapy_bloomdupe.cluster.PriorityQueue."""
    spider = DemoSpider()
    theirs = ScrapyRedisPriorityQueue(rc, spider, "demo:requests")
    theirs.push(Request("https://a.example/"))
    with pytest.raises(RedisClusterException, match="multi"):
        theirs.pop()
    ours = cluster.PriorityQueue(rc, spider, "demo:requests")
    request = ours.pop()
    assert request is not None and request.url == "https://a.example/"
    assert len(ours) == 0


# -- 16-process race on the cluster -----------------------------------------------------

WORKERS = 16
RACE_BATCH = 100
RACE_CAPACITY = 10_000_000
RACE_ERROR_RATE = 0.01
BARRIER_TIMEOUT = 60.0
TASK_TIMEOUT = 120.0

_barrier: Any = None


def _init_worker(barrier: Any) -> None:
    global _barrier
    _barrier = barrier


def _ready(_: int) -> int:
    _barrier.wait(BARRIER_TIMEOUT)
    return os.getpid()


def race_worker(url: str, key: str, worker: int, shuffle: bool,
                use_lock: bool) -> tuple[bytes, dict[str, Any]]:
    """One crawl worker on the cluster: one byte per fingerprint (1 = told new), counters."""
    fps = fingerprints()
    order = list(range(URLS))
    if shuffle:
        random.Random(2_000 + worker).shuffle(order)
    client = cluster_client(url)
    try:
        _barrier.wait(BARRIER_TIMEOUT)
        bf = BloomFilter.open(client, key,
                              sizing.plan(RACE_CAPACITY, RACE_ERROR_RATE, shards=SHARDS),
                              use_lock=use_lock)
        try:
            _barrier.wait(BARRIER_TIMEOUT)
            new = bytearray(URLS)
            for start in range(0, URLS, RACE_BATCH):
                chunk = order[start:start + RACE_BATCH]
                for i, flag in zip(chunk, bf.add_many([fps[i] for i in chunk]), strict=True):
                    if flag:
                        new[i] = 1
            c = bf.counters
            link = bf._link.counters
            return bytes(new), {
                "checked": c.checked, "new": c.new, "lock_acquired": c.lock.acquired,
                "retries": link.retries if link else -1, "pid": os.getpid(),
            }
        finally:
            bf.close()
    finally:
        client.close()


@pytest.fixture(scope="module")
def pool() -> Iterator[Any]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    p = ctx.Pool(WORKERS, initializer=_init_worker, initargs=(barrier,))
    try:
        pids = p.map(_ready, range(WORKERS), chunksize=1)
        assert len(set(pids)) == WORKERS, pids
        yield p
    finally:
        p.close()
        p.join()


def test_false_positives_are_negligible_for_the_cluster_race() -> None:
    race_plan = sizing.plan(RACE_CAPACITY, RACE_ERROR_RATE, shards=SHARDS)
    fill = 1.0 - math.exp(-race_plan.hashes * URLS / race_plan.total_bits)
    bound = URLS * fill**race_plan.hashes
    assert bound < 1e-15, bound


@pytest.mark.slow
@pytest.mark.parametrize(("use_lock", "shuffle"), [
    pytest.param(True, False, id="lock-identical-add_many"),
    pytest.param(False, True, id="atomic-random-add_many"),
])
def test_every_url_accepted_exactly_once_on_a_cluster(
    pool: Any, cluster_url: str, local_cluster: LocalCluster, use_lock: bool, shuffle: bool,
) -> None:
    jobs = [pool.apply_async(race_worker, (cluster_url, "race", w, shuffle, use_lock))
            for w in range(WORKERS)]
    results = [job.get(TASK_TIMEOUT) for job in jobs]
    accepted = [0] * URLS
    for flags, _ in results:
        for i, flag in enumerate(flags):
            accepted[i] += flag
    twice = sum(1 for a in accepted if a > 1)
    never = sum(1 for a in accepted if a == 0)
    totals = {name: sum(c[name] for _, c in results)
              for name in ("checked", "new", "lock_acquired", "retries")}
    figures = (f"{WORKERS} workers x {URLS} URLs on 3 masters, lock={use_lock} "
               f"shuffle={shuffle}: {twice} accepted more than once, {never} never accepted; "
               f"totals {totals}")
    assert len({c["pid"] for _, c in results}) == WORKERS, figures
    assert twice == 0, figures
    assert never == 0, figures
    assert totals["checked"] == WORKERS * URLS, figures
    assert totals["new"] == URLS, figures
    assert (totals["lock_acquired"] > 0) == use_lock, figures
    assert totals["retries"] == 0, figures
    client = cluster_client(cluster_url)
    try:
        bf = BloomFilter.open(client, "race", None)
        assert all(bf.contains_many(fingerprints())), figures
        bf.close()
    finally:
        client.close()


# -- failover ----------------------------------------------------------------------------

FAILOVER_WORKERS = 4
FAILOVER_URLS = 6000
FAILOVER_BATCH = 10
#: Each worker spreads its pass over the URLs across this many seconds, so the
#: kill lands mid-run and there is load on both sides of it.
FAILOVER_PASS = 9.0
KILL_AFTER = 2.0
MAX_STALL = 6.0


def failover_fingerprints() -> list[bytes]:
    return [hashlib.sha1(b"https://failover.example/%d" % i).digest()
            for i in range(FAILOVER_URLS)]


def failover_worker(url: str, key: str, worker: int, use_lock: bool, wait: int,
                    barrier: Any, results: Any) -> None:
    """Check-and-add every URL at a steady pace; report flags, success times, errors."""
    extra = {"BLOOMDUPE_WAIT_REPLICAS": wait} if wait else {}
    client = cluster_client(url, **extra)
    bf = BloomFilter.open(client, key, plan(), use_lock=use_lock)
    fps = failover_fingerprints()
    order = list(range(FAILOVER_URLS))
    random.Random(3_000 + worker).shuffle(order)
    new = bytearray(FAILOVER_URLS)
    done: list[float] = []
    errors: list[str] = []
    batches = FAILOVER_URLS // FAILOVER_BATCH
    barrier.wait(BARRIER_TIMEOUT)
    started = time.monotonic()
    done.append(started)
    for b in range(batches):
        pause = started + FAILOVER_PASS * b / batches - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        chunk = order[b * FAILOVER_BATCH:(b + 1) * FAILOVER_BATCH]
        while True:
            try:
                flags = bf.add_many([fps[i] for i in chunk])
                break
            except redis.RedisError as e:  # must not happen; counted, then retried
                errors.append(f"{time.monotonic() - started:.2f}s {type(e).__name__}: {e}")
                time.sleep(0.1)
        done.append(time.monotonic())
        for i, flag in zip(chunk, flags, strict=True):
            new[i] += flag
    link = bf._link.counters
    assert link is not None
    results.put((worker, bytes(new), done, errors, {
        "retries": link.retries, "refreshes": link.refreshes,
        "wait_short": bf._link.wait.short, "wait_skipped": bf._link.wait.skipped,
        "script_reloads": bf.counters.script_reloads, "last_error": link.last_error,
    }))
    bf.close()
    client.close()


@pytest.fixture(scope="module")
def failover_cluster() -> Iterator[LocalCluster]:
    """A cluster of its own: the failover tests kill its masters."""
    with LocalCluster(masters=3, replicas=1, node_timeout_ms=2000) as servers:
        yield servers


@pytest.mark.slow
@pytest.mark.parametrize(("use_lock", "wait"), [
    pytest.param(False, 0, id="atomic"),
    pytest.param(True, 1, id="lock-wait1"),
])
def test_a_master_failover_stalls_briefly_and_loses_nothing(
    failover_cluster: LocalCluster, use_lock: bool, wait: int,
) -> None:
    servers = failover_cluster
    phases = {"begin": time.monotonic()}
    servers.wait_ok()
    servers.flushall()
    key = f"failover-{int(use_lock)}-{wait}"
    probe = cluster_client(servers.url)
    bf = BloomFilter.open(probe, key, plan())
    spread = cluster.shard_nodes(probe, bf)
    victim = max(spread, key=lambda name: len(spread[name]))
    victim_port = int(victim.rsplit(":", 1)[1])
    (replica_port,) = servers.replica_ports(victim_port)
    bf.close()
    probe.close()

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(FAILOVER_WORKERS + 1)
    queue = ctx.Queue()
    procs = [ctx.Process(target=failover_worker,
                         args=(servers.url, key, w, use_lock, wait, barrier, queue))
             for w in range(FAILOVER_WORKERS)]
    for p in procs:
        p.start()
    try:
        phases["spawned"] = time.monotonic()
        barrier.wait(BARRIER_TIMEOUT)
        phases["started"] = time.monotonic()
        time.sleep(KILL_AFTER)
        killed_at = time.monotonic()
        servers.kill(victim_port)
        promoted_after = wait_for_promotion(servers, replica_port) - killed_at
        # As a supervisor would: start the dead node again; it rejoins as a replica.
        servers.node(victim_port).start()
        reports = sorted(queue.get(timeout=TASK_TIMEOUT) for _ in procs)
        phases["done"] = time.monotonic()
        for p in procs:
            p.join(30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    exit_codes = [p.exitcode for p in procs]

    accepted = [0] * FAILOVER_URLS
    stalls = []
    errors = []
    link_figures = []
    for _, flags, done, worker_errors, figures in reports:
        for i, flag in enumerate(flags):
            accepted[i] += flag
        gaps = [(b - a, a - killed_at) for a, b in itertools.pairwise(done)]
        stalls.append(max(gaps))
        errors.extend(worker_errors)
        link_figures.append(figures)
    twice = sum(1 for a in accepted if a > 1)
    never = sum(1 for a in accepted if a == 0)
    stall = max(s for s, _ in stalls)
    message = (
        f"killed master {victim} (shards {spread[victim]}); replica 127.0.0.1:{replica_port}; "
        f"promoted after {promoted_after:.2f}s; "
        f"{FAILOVER_WORKERS} workers, lock={use_lock}, WAIT {wait}: stall per worker "
        + ", ".join(f"{s:.2f}s from {t:+.2f}s" for s, t in stalls)
        + f"; {len(errors)} errors reached the caller {errors[:3]}; {twice} URLs accepted "
        f"twice, {never} never; exit codes {exit_codes}; link {link_figures}"
    )
    servers.wait_ok()
    phases["settled"] = time.monotonic()
    times = list(phases.values())
    message += "; phases " + ", ".join(
        f"{name} {b - a:.1f}s" for name, a, b in zip(list(phases)[1:], times, times[1:],
                                                      strict=False))
    figures_file = os.environ.get("BLOOMDUPE_TEST_FIGURES")
    if figures_file:  # silent record of the measured figures, for reports
        with open(figures_file, "a", encoding="utf-8") as f:
            f.write(message + "\n")
    assert exit_codes == [0] * FAILOVER_WORKERS, message
    assert not errors, message
    assert servers.master_ports().count(replica_port) == 1, message
    assert all(f["retries"] > 0 for f in link_figures), "the kill was not noticed: " + message
    assert stall <= MAX_STALL, message
    assert twice == 0, message
    assert never == 0, message

    # The killed node is back, as a replica, and the cluster is whole for the next test.
    assert victim_port not in servers.master_ports()


def wait_for_promotion(servers: LocalCluster, port: int, timeout: float = 30.0) -> float:
    """When the replica on ``port`` reports itself master (monotonic clock)."""
    node = servers.node(port).client(socket_timeout=1)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if node.info("replication").get("role") == "master":
                return time.monotonic()
            time.sleep(0.02)
    finally:
        node.close()
    raise AssertionError(f"127.0.0.1:{port} was not promoted within {timeout}s")
