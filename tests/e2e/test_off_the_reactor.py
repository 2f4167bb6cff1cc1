"""End to end: during a crawl on one Redis (or a Sentinel master) and Scrapy's asyncio
reactor, the scheduler's Redis jobs run on the reactor's loop with ``redis.asyncio``,
from the crawl's start (the scheduler's open) to its end (its close); no round trip
blocks the reactor, and every command goes through the link
(``transport/link.py``), none through the client.

The link is where a round trip is sent, a lost script loaded again, a Sentinel master
followed and a cluster's failover retried, and where ``redis.asyncio`` takes over
from the blocking connection; a call of the client's own would bypass all of that,
and block the reactor. Two real ``scrapy crawl`` workers of the example project run
with a ``sitecustomize`` (``tests/harness/direct_calls``) that records, while the jobs
run off the reactor's blocking path, each client or pipeline call where they run and
each round trip written on a blocking connection from the reactor's thread. The
crawls exercise growth (a tiny first generation), the local cache's forget check,
the crawl-wide stats and live figures, the idle look at the queue's shards, and with
a window its time slices.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from harness.local_sentinel import LocalSentinel
from helpers import (
    assert_finished_crawl_left,
    crawl_through_a_freeze,
    demo_site,
    run_workers,
    take_fetches,
)

PAGES = 400
PROBE = Path(__file__).resolve().parents[1] / "harness" / "direct_calls"


def test_the_crawl_sends_every_command_through_the_link_with_growth(
        redis_url: str, site: Any, tmp_path: Path) -> None:
    """The Lua engine: a first generation of 100 items grows twice during the crawl."""
    found = crawl(redis_url, site, tmp_path, "BLOOMDUPE_CAPACITY=100", "BLOOMDUPE_GROWTH=True")
    assert any("added generation" in log for log in found)


def test_the_crawl_sends_every_command_through_the_link_with_a_window(
        engine_url: str, site: Any, tmp_path: Path) -> None:
    """Each engine, with a recrawl window (the filter's scripts queue into the intake
    whatever the politeness mode: "crawl" differs in the slots, which the other tests
    here run). A capacity large enough that each shard's filter has millions of bits:
    RedisBloom's filters of a few thousand bits answer
    "seen" for about one new item in 1,000 (measured 1.6e-4 at 8e-9 configured, for 28
    items: its hashing degenerates for about one item in the filter's bit count), which
    with 400 pages lost one in a quarter of the runs."""
    crawl(engine_url, site, tmp_path, "BLOOMDUPE_WINDOW=3600", "BLOOMDUPE_CAPACITY=1e6")


@pytest.mark.parametrize("politeness", ["worker", "crawl"])
def test_the_crawl_follows_a_sentinel_master_on_the_loop(
        site: Any, tmp_path: Path, politeness: str) -> None:
    """A master found through Redis Sentinel: the sentinels are asked on the loop too
    (redis.asyncio's Sentinel), and the round trips go to the master they name; with
    crawl-wide politeness too (its download slots on the master)."""
    with LocalSentinel() as servers:
        crawl("redis:///0", site, tmp_path,
              f"BLOOMDUPE_SENTINELS={','.join(servers.sentinel_addresses)}",
              f"BLOOMDUPE_SENTINEL_MASTER={servers.master_name}",
              f"BLOOMDUPE_POLITENESS={politeness}")
        master = servers.client(servers.master_port())
        assert master.dbsize() > 0, "the crawl wrote to the master the sentinels name"
        master.close()


def test_the_crawl_routes_by_slot_on_the_loop(
        engine: str, engine_cluster_url: str, site: Any, tmp_path: Path) -> None:
    """A Redis Cluster, each engine: every master's share of a round trip awaited on
    redis.asyncio (together); with the Lua engine growth's new shards are placed on the
    masters and their room checked through the link. (RedisBloom's tiny filters have
    the false-positive floor the window test above describes: a large capacity.)"""
    capacity = "100" if engine == "lua" else "1e6"
    found = crawl(engine_cluster_url, site, tmp_path, "BLOOMDUPE_REDIS_CLUSTER=True",
                  f"BLOOMDUPE_CAPACITY={capacity}", "BLOOMDUPE_GROWTH=True")
    if engine == "lua":
        assert any("added generation" in log for log in found)


@pytest.mark.parametrize("politeness", ["worker", "crawl"])
def test_the_last_job_of_a_finished_crawl_clears_through_the_link(
        redis_url: str, site: Any, tmp_path: Path, politeness: str) -> None:
    """``SCHEDULER_PERSIST`` off (scrapy-redis's default): once the crawl is done the last
    worker out deletes the queue and the filter, in the crawl's last job, through the
    link (its SCANs included); with crawl-wide politeness, its download slots too."""
    import redis

    crawl(redis_url, site, tmp_path, f"BLOOMDUPE_POLITENESS={politeness}", persist=False)
    client = redis.Redis.from_url(redis_url)
    # All gone but the mark that tells a worker paused past the end what happened, and
    # the crawl's report (BLOOMDUPE_REPORT_TTL).
    assert_finished_crawl_left(client, "site:bloomdupe")
    client.close()


def crawl(url: str, site: Any, tmp_path: Path, *settings: str, persist: bool = True
          ) -> list[str]:
    """Two workers crawl the site with ``settings``; checks that every page was fetched
    once and that no Redis command bypassed the link; the workers' logs."""
    calls = tmp_path / "calls"
    calls.mkdir()
    results = run_workers(url, site.url, tmp_path, 2, *settings, "BLOOMDUPE_SHARDS=4",
                          "BLOOMDUPE_ERROR_RATE=1e-7", "BLOOMDUPE_LOCAL_CACHE=1000",
                          "BLOOMDUPE_STATS_INTERVAL=0.2", "BLOOMDUPE_LIVE_INTERVAL=0.2",
                          "BLOOMDUPE_DONE_GRACE=1",
                          f"SCHEDULER_PERSIST={persist}",
                          env={"PYTHONPATH": str(PROBE), "DIRECT_CALLS_DIR": str(calls)})
    for code, log in results:
        assert code == 0, log[-3000:]
    assert take_fetches(site) == [1] * PAGES
    recorded = [json.loads(path.read_text()) for path in sorted(calls.glob("*.json"))]
    assert len(recorded) == 2, "each worker writes what it recorded at exit"
    for found in recorded:
        assert found["direct"] == {}, "client calls where the jobs run, not through the link"
        assert found["blocking"] == {}, "round trips that blocked the reactor"
        # One Redis or a Sentinel master, the asyncio reactor (Scrapy's default):
        # redis.asyncio on the loop.
        assert found["io"] == "IOLoop"
        assert found["awaited"] > 0
        # The crawl's start and end ran as jobs too, under both probes above.
        assert found["phases"] == {"join": True, "leave": True, "filter closed": True}
    return [log for _, log in results]


FROZEN_PAGES = 300


@pytest.mark.parametrize("mode, settings, holds", [
    # A worker of the shared scheduler starts a page only while it holds fewer than
    # CONCURRENT_REQUESTS and a quarter of it unacked (leases.Leases.full): its acks wait
    # for Redis, so a freeze may find it with nothing it may start, by design (under a
    # loaded CI, 0 pages in some runs). Its reactor still turns.
    ("the scheduler", ("CONCURRENT_REQUESTS=8",), False),
    # Scrapy's own scheduler holds what was queued before the freeze: it is fetched.
    ("the middleware under Scrapy's scheduler", ("CONCURRENT_REQUESTS=2",
                                                 "SCHEDULER=scrapy.core.scheduler.Scheduler"),
     True),
])
def test_a_frozen_redis_stops_no_download_and_loses_no_request(
        tmp_path: Path, mode: str, settings: tuple[str, ...], holds: bool) -> None:
    """Redis frozen (SIGSTOP) for 5 s in mid-crawl: the reactor keeps turning (no gap of
    half the freeze between two turns of a 50 ms timer; a round trip on the reactor's
    thread shows the whole 5 s), what a worker holds in its own memory is fetched during
    the freeze, and once Redis is back every page is fetched, once. With the batch
    middleware under Scrapy's own scheduler a callback's output waits for Redis in a job
    (it checked it on the reactor's thread: 0 pages were fetched during such a freeze)."""
    with demo_site(FROZEN_PAGES, delay=0.05) as site:
        seen = crawl_through_a_freeze(site, tmp_path, *settings, after=60)
    assert seen.longest_gap < 2.5, f"{mode}: a reactor stood still {seen.longest_gap:.1f} s"
    if holds:
        assert seen.during > 0, f"{mode}: no page fetched while Redis was frozen"
    assert seen.total == [1] * FROZEN_PAGES, mode
