"""Round trips on a Redis Cluster (ClusterLink): scripts on every master, MOVED, WAIT.

On the session's local cluster (3 masters, 3 replicas; ``local_cluster`` in
tests/conftest.py), every master emptied and every script cache flushed before
each test; the WAIT test without a replica has a single Redis of its own.
"""

from __future__ import annotations

import time

import pytest
import redis
from harness.local_cluster import LocalCluster
from helpers import (
    cluster_client,
    cluster_settings,
    crawler_for,
    fps,
    node_clients,
    plan,
    shard_of,
)
from redis.cluster import RedisCluster
from scrapy import Request
from scrapy.utils.misc import build_from_crawler

from scrapy_bloomdupe import connection
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.bloom.placement import shard_slots
from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter
from scrapy_bloomdupe.scheduler import Scheduler
from scrapy_bloomdupe.settings import wait_replicas
from scrapy_bloomdupe.testing import RedisServer
from scrapy_bloomdupe.transport import wait as wait_module
from scrapy_bloomdupe.transport.link import Link
from scrapy_bloomdupe.transport.wait import WAIT_DEGRADED_TRIES, WAIT_PROBE_INTERVAL

KEY = "cl"


def test_scripts_are_loaded_on_every_master_and_reloaded_after_a_flush(
    rc: RedisCluster, local_cluster: LocalCluster,
) -> None:
    bf = BloomFilter.open(rc, KEY, plan())
    try:
        masters = node_clients(local_cluster)
        sha = bf.engine.sha
        assert all(c.script_exists(sha) == [True] for c in masters.values())
        # A replica promoted by a failover has no scripts (Redis 7 does not replicate
        # SCRIPT LOAD): the same as a master whose cache was flushed.
        for c in masters.values():
            c.script_flush()
        assert all(bf.add_many(fps(200, "ns-")))
        assert bf.counters.script_reloads == 1
        assert all(c.script_exists(sha) == [True] for c in masters.values())
        for c in masters.values():
            c.close()
    finally:
        bf.close()


def test_a_stale_slot_map_is_corrected_by_following_moved(rc: RedisCluster) -> None:
    bf = BloomFilter.open(rc, KEY, plan())
    try:
        slot = shard_slots(bf)[0]
        slots = rc.nodes_manager.slots_cache
        right = slots[slot][0]
        wrong = next(n for n in rc.get_primaries() if n.name != right.name)
        slots[slot] = [wrong]  # as after a resharding the client has not seen
        items = [fp for fp in fps(400, "mv-") if shard_of(bf, fp) == 0]
        assert items and all(bf.add_many(items))
        link = bf.link.counters
        assert link is not None and link.redirects >= 1 and link.retries == 0, link
        assert slots[slot][0].name == right.name
        assert not any(bf.add_many(items))
    finally:
        bf.close()


@pytest.mark.parametrize("use_lock", [True, False], ids=["lock", "atomic"])
def test_a_batch_over_every_shard_is_one_script_call_a_master(
    rc: RedisCluster, local_cluster: LocalCluster, use_lock: bool,
) -> None:
    """Redis 7's script flag lets one call reach every shard of its master (the op log
    declared, the others in ARGV): the call's fixed part is paid once a master, not once
    a shard. Each shard's lock is still taken, once."""
    bf = BloomFilter.open(rc, KEY, plan(24), use_lock=use_lock)
    masters = node_clients(local_cluster)
    try:
        assert bf.engine.sections
        items = fps(300, "sec-")
        assert len({shard_of(bf, x) for x in items}) == 24
        for c in masters.values():
            c.config_resetstat()
        assert bf.add_many(items) == [True] * 300
        calls = [c.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
                 for c in masters.values()]
        assert calls == [1, 1, 1]
        if use_lock:
            assert bf.counters.lock.acquired == 24
            assert not any(c.keys(f"*{KEY}*lock*") for c in masters.values())  # released
        assert bf.add_many(items) == [False] * 300
    finally:
        for c in masters.values():
            c.close()
        bf.close()


def test_the_start_line_says_how_many_script_calls_a_batch_costs(
        cluster_url: str, caplog: pytest.LogCaptureFixture) -> None:
    crawler = crawler_for(cluster_url, BLOOMDUPE_REDIS_CLUSTER=True, BLOOMDUPE_ENGINE="lua")
    with caplog.at_level("INFO", logger="scrapy_bloomdupe.dupefilter"):
        df = build_from_crawler(RedisBloomDupeFilter, crawler)
    df.close("finished")
    (line,) = [r.getMessage() for r in caplog.records if "Bloom filter" in r.getMessage()]
    assert line.endswith("after each write, one script call a master"), line


def test_a_call_that_meets_a_moved_slot_is_redone_a_call_a_shard(rc: RedisCluster) -> None:
    """A master that no longer holds one of its call's shards (the client's slot map is
    stale: a resharding it has not seen) refuses the call before any write ("non local
    key"); its items go again, a call a shard routed by their own keys, with the locks
    the first call took, and the slot map is reloaded."""
    bf = BloomFilter.open(rc, KEY, plan(24))
    try:
        slots = rc.nodes_manager.slots_cache
        slot = shard_slots(bf)[0]
        right = slots[slot][0]
        wrong = next(n for n in rc.get_primaries() if n.name != right.name)
        slots[slot] = [wrong]  # as after a resharding the client has not seen
        items = fps(300, "mvd-")
        assert {shard_of(bf, x) for x in items} >= {0}
        assert bf.add_many(items) == [True] * 300
        assert bf.counters.regrouped == 1
        assert bf.counters.lock.waits == 0  # its own locks: no wait for them to expire
        assert slots[slot][0].name == right.name  # reloaded
        assert bf.add_many(items) == [False] * 300
        assert bf.counters.regrouped == 1
    finally:
        bf.close()


def test_a_slot_without_a_known_master_gets_a_call_of_its_own(rc: RedisCluster) -> None:
    """Mid-failover the slot map may lack a slot's master: its shard's items go in a call
    of their own, which the link retries once the map is reloaded; the others go as
    usual."""
    bf = BloomFilter.open(rc, KEY, plan(24))
    try:
        del rc.nodes_manager.slots_cache[shard_slots(bf)[0]]
        items = fps(300, "gap-")
        assert {shard_of(bf, x) for x in items} >= {0}
        assert bf.add_many(items) == [True] * 300
        link = bf.link.counters
        assert link is not None and link.retries >= 1, link
        assert bf.add_many(items) == [False] * 300
    finally:
        bf.close()


def test_without_info_in_the_acl_a_batch_is_still_a_call_a_master(
        cluster_url: str, local_cluster: LocalCluster) -> None:
    """A user whose ACL refuses ``INFO`` gets one script call a master too: every master
    runs Redis 7 or later (a worker refuses an older one at start, by ``HELLO``, which no
    ACL refuses), so nothing is read to choose (it was a call a shard, 24 here, as for a
    Redis 6 cluster)."""
    masters = node_clients(local_cluster)
    for c in masters.values():
        c.acl_setuser("noinfo", enabled=True, passwords=["+pw"], keys=["*"],
                      commands=["+@all", "-info"])
    client = cluster_client(cluster_url.replace("redis://", "redis://noinfo:pw@"))
    try:
        bf = BloomFilter.open(client, KEY, plan(24))
        assert bf.engine.sections
        items = fps(300, "noinfo-")
        for c in masters.values():
            c.config_resetstat()
        assert bf.add_many(items) == [True] * 300
        calls = sum(c.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
                    for c in masters.values())
        assert calls == len(masters)
        assert bf.add_many(items) == [False] * 300
        bf.close()
    finally:
        client.close()
        for c in masters.values():
            c.acl_deluser("noinfo")
            c.close()


def test_wait_replicas_costs_one_wait_per_master_and_counts_none_short(
        cluster_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # WAIT's 500 ms is a production trade-off; a replica starved of CPU by a loaded
    # machine (xdist, a busy CI host) answered short past it about 1 run in 2. What this
    # test checks is the count and the wiring, so it gives the replicas time to answer.
    monkeypatch.setattr(wait_module, "WAIT_TIMEOUT_MS", 10_000)
    settings = cluster_settings(cluster_url, BLOOMDUPE_WAIT_REPLICAS=1)
    assert wait_replicas(settings) == 1
    client = connection.from_settings(settings)
    try:
        bf = BloomFilter.open(client, KEY, plan(), wait_replicas=wait_replicas(settings))
        try:
            items = fps(2000, "w-")
            for start in range(0, len(items), 100):
                assert all(bf.add_many(items[start:start + 100]))
            assert bf.link.wait.replicas == 1
            assert bf.link.wait.short == 0 and bf.link.wait.skipped == 0
        finally:
            bf.close()
    finally:
        client.close()
    # A crawl's dupefilter passes the setting to its filter.
    crawler = crawler_for(cluster_url, BLOOMDUPE_REDIS_CLUSTER=True, BLOOMDUPE_WAIT_REPLICAS=1)
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    assert df.bloom.link.wait.replicas == 1
    assert not df.request_seen(Request("https://a.example/"))
    assert df.bloom.link.wait.short == 0
    df.close("finished")


def test_unset_a_cluster_whose_masters_have_replicas_waits_for_one(cluster_url: str) -> None:
    """On a cluster a page's links and its lease are on different masters: a master that
    crashed before passing the links on would lose them after the page was acked. So
    ``BLOOMDUPE_WAIT_REPLICAS`` unset means ``WAIT 1`` there, for the filter's round
    trips, the queue's, and the failure records (on the queue's link)."""
    crawler = crawler_for(cluster_url, BLOOMDUPE_REDIS_CLUSTER=True)
    assert wait_replicas(crawler.settings) is None
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    try:
        assert scheduler.df.bloom.link.wait.replicas == 1
        assert scheduler.queue.link.wait.replicas == 1
        assert not scheduler.df.request_seen(Request("https://a.example/"))
        assert scheduler.df.bloom.link.wait.short == 0
    finally:
        scheduler.close("finished")
    # Set, the setting decides.
    crawler = crawler_for(cluster_url, BLOOMDUPE_REDIS_CLUSTER=True, BLOOMDUPE_WAIT_REPLICAS=0)
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    assert df.bloom.link.wait.replicas == 0
    df.close("finished")


def test_unset_a_cluster_without_replicas_or_one_node_waits_for_none(redis_url: str) -> None:
    with LocalCluster(masters=3, replicas=0) as servers:
        crawler = crawler_for(servers.url, BLOOMDUPE_REDIS_CLUSTER=True)
        df = build_from_crawler(RedisBloomDupeFilter, crawler)
        assert df.bloom.link.wait.replicas == 0
        df.close("finished")
    df = build_from_crawler(RedisBloomDupeFilter, crawler_for(redis_url))
    assert df.bloom.link.wait.replicas == 0
    df.close("finished")


def test_wait_without_a_replica_costs_the_short_timeout_only(
        caplog: pytest.LogCaptureFixture) -> None:
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        try:
            link = Link(client, wait_replicas=1, wait_timeout_ms=300)
            started = time.monotonic()
            for _ in range(WAIT_DEGRADED_TRIES):
                assert link.execute([("SET", "k", "v")]) == [b"OK"]
            tries = time.monotonic() - started
            # 300 ms once, then WAIT_DEGRADED_TIMEOUT_MS (20 ms, but Redis ends a
            # blocked WAIT on its 100 ms timer at hz 10) per round trip.
            assert 0.3 + 9 * 0.02 <= tries < 0.3 + 9 * 0.2, tries
            started = time.monotonic()
            for _ in range(100):
                assert link.execute([("SET", "k", "v")]) == [b"OK"]
            elapsed = time.monotonic() - started
            # Then one WAIT per WAIT_PROBE_INTERVAL (1 s) at most: none in the usual
            # 0.1 s, one a second of a machine busy enough to take longer (1.24 s for
            # the 100 once in CI). (0.1 s: from the last short reply to ``started``.)
            probes = link.wait.short - WAIT_DEGRADED_TRIES
            assert probes <= int((elapsed + 0.1) / WAIT_PROBE_INTERVAL), (probes, elapsed)
            assert link.wait.skipped == 100 - probes
            warnings = [r for r in caplog.records if r.levelname == "WARNING"]
            assert len(warnings) == 1 and "0 replica(s) acknowledged" in warnings[0].getMessage()
            link.close()
        finally:
            client.close()


def test_a_scan_goes_to_the_master_of_its_patterns_hash_tag(rc: RedisCluster) -> None:
    """The link's SCAN (the keys a filter's and a queue's clear look for, at the end of a
    crawl) goes to the master of the slot its pattern's hash tag names, escapes undone:
    a shard's keys, on a cluster, found through the link rather than the client."""
    tags = ["a*b:0", "plain:3", "x[1]:2"]  # glob characters escaped in a pattern
    names = {tag: [f"{{{tag}}}:ops:{i}" for i in range(3)] for tag in tags}
    for created in names.values():
        for name in created:
            rc.set(name, 1)
    link = Link(rc)
    try:
        for tag, created in names.items():
            escaped = "".join("\\" + c if c in "*?[]\\" else c for c in tag)
            found = link.scan(f"{{{escaped}}}:ops:*", count=2)
            assert sorted(found) == sorted(name.encode() for name in created), tag
    finally:
        link.close()
        for created in names.values():
            for name in created:
                rc.delete(name)
