"""Redis Sentinel (``transport/sentinel.py``): settings, the client, the filter, the queue,
the stats and the command line on a real master, replica and three sentinels
(``harness.local_sentinel``). Failovers under a crawl are in
``tests/faults/test_sentinel_failover.py``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import redis
from harness.local_sentinel import LocalSentinel
from helpers import DemoSpider, fps
from scrapy import Request
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from scrapy_bloomdupe import connection, crawlstats, keys, sizing
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.exceptions import BloomDupeError, ConfigError
from scrapy_bloomdupe.frontier.queue import PriorityQueue, Reclaimed
from scrapy_bloomdupe.scheduling.health import CrawlHealth
from scrapy_bloomdupe.scheduling.jobs import RedisJobs
from scrapy_bloomdupe.scheduling.upkeep import RECLAIMED_FAILOVER, LeaseUpkeep
from scrapy_bloomdupe.settings import FrontierConfig, RedisSettings
from scrapy_bloomdupe.testing import RedisServer
from scrapy_bloomdupe.transport import wait as wait_module
from scrapy_bloomdupe.transport.diagnose import check, describe
from scrapy_bloomdupe.transport.link import Link
from scrapy_bloomdupe.transport.onloop import run_bridged
from scrapy_bloomdupe.transport.outage import OutageGuard
from scrapy_bloomdupe.transport.sentinel import is_sentinel_client, master_epoch, master_watch

T = TypeVar("T")


@pytest.fixture(scope="module")
def sentinel() -> Iterator[LocalSentinel]:
    with LocalSentinel() as servers:
        yield servers


def sentinel_client(servers: LocalSentinel, **extra: Any) -> redis.Redis:
    client = connection.from_settings(Settings(servers.settings(**extra)))
    assert isinstance(client, redis.Redis) and is_sentinel_client(client)
    return client


# -- settings ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [
    ["127.0.0.1:26379", "10.0.0.2:26380"],
    "127.0.0.1:26379, 10.0.0.2:26380",
    '["127.0.0.1:26379", "10.0.0.2:26380"]',
    [("127.0.0.1", 26379), ["10.0.0.2", "26380"]],
])
def test_sentinels_from_settings_and_from_the_command_line(value: Any) -> None:
    parsed = RedisSettings.from_settings(Settings({
        "BLOOMDUPE_SENTINELS": value, "BLOOMDUPE_SENTINEL_MASTER": "mymaster",
        "BLOOMDUPE_SENTINEL_PASSWORD": "s3cret",
        "BLOOMDUPE_SENTINEL_PARAMS": '{"username": "sentinel-user"}'}))
    assert parsed.sentinels == (("127.0.0.1", 26379), ("10.0.0.2", 26380))
    assert parsed.sentinel_master == "mymaster"
    assert parsed.sentinel_params == {"username": "sentinel-user", "password": "s3cret"}


@pytest.mark.parametrize(("values", "setting", "says"), [
    ({"BLOOMDUPE_SENTINELS": "127.0.0.1:26379"}, "BLOOMDUPE_SENTINEL_MASTER",
     "must name the master"),
    ({"BLOOMDUPE_SENTINEL_MASTER": "mymaster"}, "BLOOMDUPE_SENTINELS", "must list the sentinels"),
    ({"BLOOMDUPE_SENTINELS": "127.0.0.1", "BLOOMDUPE_SENTINEL_MASTER": "m"},
     "BLOOMDUPE_SENTINELS", 'must be "host:port"'),
    ({"BLOOMDUPE_SENTINELS": "127.0.0.1:port", "BLOOMDUPE_SENTINEL_MASTER": "m"},
     "BLOOMDUPE_SENTINELS", "the port must be a number"),
    ({"BLOOMDUPE_SENTINELS": "h:26379", "BLOOMDUPE_SENTINEL_MASTER": "m",
      "BLOOMDUPE_REDIS_CLUSTER": True}, "BLOOMDUPE_SENTINELS", "cannot be used with a Redis "
                                                              "Cluster"),
    ({"BLOOMDUPE_SENTINELS": "h:26379", "BLOOMDUPE_SENTINEL_MASTER": "m",
      "REDIS_HOST": "10.0.0.1"}, "REDIS_HOST", "the sentinels say where the master is"),
])
def test_bad_sentinel_settings_name_the_setting(values: dict[str, Any], setting: str,
                                                says: str) -> None:
    with pytest.raises(ConfigError) as info:
        connection.from_settings(Settings(values))
    assert info.value.setting == setting and says in str(info.value)


# -- the client ----------------------------------------------------------------------------


def test_the_client_talks_to_the_master_the_sentinels_name(
        sentinel: LocalSentinel, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="redis")
    client = sentinel_client(sentinel)
    check(client)
    client.set("sentinel-probe", "1")
    # Neither the master's connections nor the sentinels' asked for redis-py 8's
    # maintenance notifications (CLIENT MAINT_NOTIFICATIONS: unknown to Redis 7); the
    # test's own clients, below, do.
    assert not [r for r in caplog.records if "maintenance notifications" in r.getMessage()]
    master = sentinel.master_port()
    assert describe(client) == (f"Sentinel master 'mymaster' db 0 (sentinels "
                                f"{', '.join(sentinel.sentinel_addresses)})")
    direct = sentinel.client(master)
    assert direct.get("sentinel-probe") == b"1"
    direct.close()
    # What the connections learn lives in the client's MasterWatch, none of it on
    # redis-py's pool (whose attributes are redis-py's to change).
    watch = master_watch(client)
    assert watch is not None and watch.address == ("127.0.0.1", master)
    assert [name for name in vars(client.connection_pool) if "bloomdupe" in name] == []
    client.close()


def test_the_url_gives_the_masters_password_and_db_not_its_address() -> None:
    with LocalSentinel(replicas=0, sentinels=1) as servers:
        master = servers.client(servers.master_port())
        master.config_set("requirepass", "master-pw")
        master.close()
        client = sentinel_client(servers, REDIS_URL="redis://:master-pw@ignored.invalid:1/3")
        check(client)
        client.set("in-db-3", "1")
        direct = redis.Redis(port=servers.master_port(), password="master-pw", db=3)
        assert direct.get("in-db-3") == b"1"
        direct.close()
        client.close()
        wrong = sentinel_client(servers, REDIS_URL="redis://:wrong@/0")
        with pytest.raises(BloomDupeError, match="refused the credentials"):
            check(wrong)
        wrong.close()


def test_an_unknown_master_name_is_one_clear_error(sentinel: LocalSentinel) -> None:
    client = sentinel_client(sentinel, BLOOMDUPE_SENTINEL_MASTER="nosuchmaster")
    with pytest.raises(BloomDupeError) as info:
        check(client)
    text = str(info.value)
    assert text.startswith("No sentinel gives the address of the master: Sentinel master "
                           "'nosuchmaster'"), text
    assert "BLOOMDUPE_SENTINEL_MASTER" in text and "SENTINEL MASTERS" in text
    client.close()


def test_a_url_that_names_a_sentinel_says_to_use_the_sentinel_settings(
        sentinel: LocalSentinel) -> None:
    client = connection.from_settings(Settings({"REDIS_URL": f"redis://{sentinel.sentinel_addresses[0]}/0"}))
    with pytest.raises(ConfigError, match="is a Redis Sentinel, not a Redis that holds data"):
        check(client)
    client.close()


# -- the filter, WAIT, the stats ----------------------------------------------------------


def test_the_filter_and_wait_replicas_on_a_sentinel_master(
        sentinel: LocalSentinel, monkeypatch: pytest.MonkeyPatch) -> None:
    """``BLOOMDUPE_WAIT_REPLICAS = 1``: every check-and-add waits for the replica, and
    no ``WAIT`` comes back short; the replica holds the filter."""
    # WAIT's 500 ms is a production trade-off; a replica starved of CPU by a loaded
    # machine answered short past it (a clean-clone CI run, 4 xdist workers on 2 cores,
    # 2026-11-27), as on a cluster (test_cluster_link.py). What this test checks is the
    # count and the wiring, so it gives the replica time to answer.
    monkeypatch.setattr(wait_module, "WAIT_TIMEOUT_MS", 10_000)
    client = sentinel_client(sentinel)
    plan = sizing.plan(10_000, 0.001, shards=2)
    bf = BloomFilter.open(client, "sentinel-wait", plan, wait_replicas=1)
    items = fps(500, "sentinel-wait/")
    assert all(bf.add_many(items[i:i + 50]) == [True] * 50 for i in range(0, 500, 50))
    assert bf.add_many(items[:50]) == [False] * 50
    assert bf.link.wait.short == 0 and bf.link.wait.skipped == 0
    stats = crawlstats.CrawlStats(client, bf.key)
    stats.flush({"checked": 550, "new": 500}, None)
    (replica,) = [p for p in sentinel.servers if p != sentinel.master_port()]
    on_replica = sentinel.client(replica)
    assert on_replica.exists("sentinel-wait:meta", "{sentinel-wait:0}:bits",
                             "{sentinel-wait:1}:bits") == 3
    bf.clear()
    bf.close()
    on_replica.close()
    client.close()


def test_a_forget_waits_for_the_replica(sentinel: LocalSentinel,
                                        caplog: pytest.LogCaptureFixture) -> None:
    """``bloomdupe forget`` ends its writes with ``WAIT 1`` where the master has a replica
    (a failover right after it then keeps the forget), and says so when the replica does
    not answer in time (paused here); the forget is written either way."""
    client = sentinel_client(sentinel)
    bf = BloomFilter.open(client, "sentinel-forget", sizing.plan(1000, 0.01, shards=2))
    items = fps(20, "forget/")
    bf.add_many(items)
    master = sentinel.client(sentinel.master_port())
    (replica,) = [p for p in sentinel.servers if p != sentinel.master_port()]
    on_replica = sentinel.client(replica)
    try:
        master.config_resetstat()
        assert bf.forget_many(items[:5]) == 5
        assert master.info("commandstats")["cmdstat_wait"]["calls"] == 1
        assert sum(on_replica.scard(keys.forgotten("sentinel-forget", shard))
                   for shard in range(2)) == 5
        assert on_replica.get(keys.forgets("sentinel-forget")) == b"1"
        assert "not on a replica" not in caplog.text
        process = sentinel.node(replica).process
        assert process is not None
        caplog.set_level(logging.WARNING)
        os.kill(process.pid, signal.SIGSTOP)
        try:
            assert bf.forget_many(items[5:10]) == 5
        finally:
            os.kill(process.pid, signal.SIGCONT)
        assert "The forget is not on a replica of" in caplog.text
        assert bf.forgotten() == 10
    finally:
        bf.clear()
        bf.close()
        on_replica.close()
        master.close()
        client.close()


def test_the_command_line_follows_the_sentinels(sentinel: LocalSentinel) -> None:
    client = sentinel_client(sentinel)
    bf = BloomFilter.open(client, "sentinel-cli", sizing.plan(1000, 0.01, shards=1))
    bf.add_many(fps(10, "cli/"))
    result = subprocess.run(
        [sys.executable, "-m", "scrapy_bloomdupe.cli", "info", "--key", "sentinel-cli",
         "--sentinels", ",".join(sentinel.sentinel_addresses), "--sentinel-master", "mymaster",
         "--json"], capture_output=True, text=True, timeout=180,
        env={"PATH": "/usr/bin:/bin", "REDIS_URL": "redis:///0"})
    assert result.returncode == 0, result.stdout + result.stderr
    info = json.loads(result.stdout)
    assert info["key"] == "sentinel-cli" and round(info["estimated_items"]) == 10
    assert info["redis"].startswith("Sentinel master 'mymaster'")
    bf.clear()
    bf.close()
    client.close()


def test_a_plain_redis_is_not_mistaken_for_a_sentinel() -> None:
    with RedisServer(maxmemory="64mb") as server:
        client = connection.from_settings(Settings({"REDIS_URL": server.url}))
        assert not is_sentinel_client(client)
        check(client)
        client.close()


# -- a failover between building a round trip and sending it -----------------------------


def on(where: str, call: Callable[[], T], *links: Link) -> T:
    """``call()`` blocking, or as the crawl runs it on Scrapy's asyncio reactor: in a
    job on a loop (its round trips on redis.asyncio), behind the outage guard; the
    ``links``' asynchronous connections closed on that loop after."""
    if where == "blocking":
        return call()
    guard = OutageGuard(30, "test")

    async def job() -> T:
        try:
            return await run_bridged(lambda: guard.call(call))
        finally:
            for link in links:
                link.close()
            await asyncio.sleep(0.01)  # the closes run

    return asyncio.run(job())


def reclaiming_upkeep(queue: PriorityQueue, client: redis.Redis) -> LeaseUpkeep:
    """The lease upkeep of ``queue``'s worker outside a crawl (a reclaim due now)."""
    return LeaseUpkeep(jobs=RedisJobs(CrawlHealth(OutageGuard(0, "test"))), queue=queue,
                       dupefilter=None,
                       server=client, frontier=FrontierConfig.from_settings(Settings()),
                       stats=get_crawler(DemoSpider).stats, spider=DemoSpider(),
                       settle=lambda: None, held=list)


@pytest.mark.parametrize("where", ["blocking", "on the loop"])
@pytest.mark.parametrize("route", ["own round trip", "riding on a check-and-queue"])
def test_an_ack_built_for_the_old_master_is_never_sent_to_the_new_one(
        route: str, where: str, caplog: pytest.LogCaptureFixture) -> None:
    """A page's lease may be acked only on the master its work was written to. The
    worker drops an ack whose lease it took before the master changed; but a round
    trip built while the worker still knew the old master can reach the new one
    anyway: its connection drops, and the retry reconnects, asking the sentinels.
    Sent there, the ack deletes a lease whose page's links went to the old master
    and were lost with it: the page would be neither fetched again nor queued. (Seen
    once in CI: 1 page of 1,000 never fetched after a SENTINEL FAILOVER, exit 0.)"""
    tag = "demo:bloomdupe"
    with LocalSentinel() as servers:
        client = sentinel_client(servers)
        queue = PriorityQueue(client, DemoSpider(), "demo:requests", tag=tag, shards=1)
        bf = BloomFilter.open(client, tag, sizing.plan(1000, 0.001))
        queue.push_many([Request("http://a.example/page")])
        (lease,) = queue.pop_leases(1)
        old = servers.master_port()
        old_client = servers.client(old)
        assert old_client.wait(1, 5000) == 1  # the lease is on the replica too
        # The page was fetched and its links written to the old master after the
        # replica took over (lost with it); its ack waits for the next round trip.
        queue.ack([lease])
        servers.failover()
        new, _ = servers.wait_new_master(old)
        servers.wait_agreed(new)  # whichever sentinel the reconnect asks names it
        # The worker has not asked the sentinels since; its connections to the old
        # master drop, so the round trip is sent again, to the master they name.
        watch = master_watch(client)
        assert watch is not None
        watch.checked = time.monotonic() + 3600
        old_client.client_kill_filter(_type="normal", skipme=True)
        if route == "own round trip":
            on(where, queue.send_acks, queue.link)
        else:
            assert on(where, lambda: bf.add_many(
                [b"link"], queue, lambda _: queue.entry(Request("http://a.example/link"))),
                queue.link, bf.link) == [True]
        new_client = servers.client(new)
        assert new_client.hlen(keys.leases(tag, 0)) == 1, "the ack reached the new master"
        assert queue.stale == 1
        # What the reconnecting connection learned is what the queue's epoch says (all
        # connections share the client's MasterWatch): one change, logged once.
        assert master_epoch(client) == 1
        changes = [r for r in caplog.records if "the master of 'mymaster' is now" in r.message]
        assert len(changes) == 1, [r.message for r in changes]
        # The worker puts the lease back in the queue: the page is fetched again. Its
        # WARNING says why: the master changed (and no other reason is given).
        caplog.clear()
        upkeep = reclaiming_upkeep(queue, client)
        upkeep.tick()  # a reclaim is due (and the heartbeat and the reap, run too)
        put_back = [r.getMessage() for r in caplog.records if "back in the shared" in r.message]
        assert put_back == [f"Put 1 request(s) back in the shared queue: leased to this "
                            f"worker in Redis but not held by it: {RECLAIMED_FAILOVER}; they "
                            f"are fetched again"], put_back
        assert upkeep.stats.get_value("bloomdupe/requeued") == 1
        assert queue.reclaim() == Reclaimed()  # nothing more of this worker's
        urls = {lease.request.url for lease in queue.pop_leases(5)}
        assert "http://a.example/page" in urls
        for c in (old_client, new_client):
            c.close()
        bf.close()
        client.close()
