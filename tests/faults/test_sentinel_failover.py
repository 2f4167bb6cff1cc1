"""A Redis Sentinel failover in the middle of a real crawl: the crawl follows the master.

Two ``scrapy crawl`` workers of the example project crawl the demo site through
a master watched by three sentinels (``harness.local_sentinel``:
one replica, ``down-after-milliseconds`` 1500). A quarter into the crawl the
master goes: by ``SENTINEL FAILOVER`` (the replica is promoted, the master
demoted), or by SIGKILL of its process (the sentinels promote the replica once
it is down; the dead server is then started again, as a supervisor would, and
comes back as a replica). Measured from the site's side: the stall (the
longest time without a fetch after the event), the pages fetched twice and
the pages never fetched; the workers must all finish on their own.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from harness.local_sentinel import LocalSentinel
from helpers import ALL_FAILOVERS_ONLY, demo_site, start_workers, wait_workers

PAGES = 1000
WORKERS = 2
#: The event comes once this share of the pages has been fetched.
EVENT_AT = 0.25
MAX_STALL = 10.0
#: CI runs one case of each event (about 15 s each); the other two with BLOOMDUPE_ALL_FAILOVERS=1.
ALL_ONLY = ALL_FAILOVERS_ONLY


@pytest.fixture
def sentinel() -> Iterator[LocalSentinel]:
    # 1.5 s: no failover for a master slowed down by a loaded machine.
    with LocalSentinel(down_after_ms=1500) as servers:
        yield servers


@pytest.fixture
def timed_site() -> Iterator[Any]:
    with demo_site(PAGES, delay=0.02) as server:
        times: list[float] = []
        count = server.count

        def counted(page: int) -> None:
            times.append(time.monotonic())
            count(page)

        server.count = counted
        server.fetch_times = times
        yield server


@pytest.mark.slow
@pytest.mark.parametrize(("event", "wait", "reactor"), [
    pytest.param("failover", 0, "", id="SENTINEL-FAILOVER-wait0"),
    pytest.param("failover", 1, "", id="SENTINEL-FAILOVER-wait1", marks=ALL_ONLY),
    pytest.param("sigkill", 0, "", id="SIGKILL-wait0", marks=ALL_ONLY),
    pytest.param("sigkill", 1, "", id="SIGKILL-wait1"),
    # Another reactor: the Redis work on the scheduler's thread, blocking, behind the guard.
    pytest.param("sigkill", 1, "twisted.internet.epollreactor.EPollReactor",
                 id="SIGKILL-wait1-epoll-thread", marks=ALL_ONLY),
])
def test_a_crawl_follows_the_master_through_a_failover(
        sentinel: LocalSentinel, timed_site: Any, tmp_path: Path, event: str, wait: int,
        reactor: str) -> None:
    settings = [*([f"TWISTED_REACTOR={reactor}"] if reactor else []),
                f"BLOOMDUPE_SENTINELS={','.join(sentinel.sentinel_addresses)}",
                f"BLOOMDUPE_SENTINEL_MASTER={sentinel.master_name}",
                f"BLOOMDUPE_WAIT_REPLICAS={wait}", "CONCURRENT_REQUESTS=8",
                "BLOOMDUPE_DONE_GRACE=2", "BLOOMDUPE_LEASE_TIMEOUT=10"]
    started = time.monotonic()
    workers = start_workers("redis:///0", timed_site.url, tmp_path, WORKERS, *settings)
    try:
        deadline = time.monotonic() + 120
        while len(timed_site.fetch_times) < PAGES * EVENT_AT:
            assert time.monotonic() < deadline, "the crawl never got going"
            assert all(w.poll() is None for w in workers), "a worker stopped early"
            time.sleep(0.01)
        old_master = sentinel.master_port()
        event_at = time.monotonic()
        if event == "failover":
            sentinel.failover()
        else:
            sentinel.kill(old_master)
        new_master, promoted = sentinel.wait_new_master(old_master)
        if event == "sigkill":
            # As a supervisor would, once every sentinel has seen the failover (before,
            # one could still name it, and send workers to it, when it comes back).
            sentinel.wait_agreed(new_master)
            sentinel.restart(old_master)  # it comes back a replica
        codes = wait_workers(workers, 150)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
    ended = time.monotonic()
    fetches = list(timed_site.fetches)
    after = [t for t in timed_site.fetch_times if t >= event_at]
    gaps = [b - a for a, b in itertools.pairwise([event_at, *after])]
    stall = max(gaps) if gaps else float("inf")
    twice = sum(1 for n in fetches if n > 1)
    never = sum(1 for n in fetches if n == 0)
    logs = [(tmp_path / f"worker-{i}.log").read_text() for i in range(WORKERS)]
    outages = sum(log.count("is unavailable") for log in logs)
    message = (f"Sentinel {event}, WAIT {wait}: master 127.0.0.1:{old_master} -> "
               f"127.0.0.1:{new_master} named after {promoted - event_at:.2f}s; stall "
               f"{stall:.2f}s; {twice} pages fetched twice, {never} never (of {PAGES}); "
               f"{outages} outage(s) logged; crawl {ended - started:.1f}s; exit codes {codes}")
    print(message)
    figures_file = os.environ.get("BLOOMDUPE_TEST_FIGURES")
    if figures_file:
        with open(figures_file, "a", encoding="utf-8") as f:
            f.write(message + "\n")
    for log in logs:
        assert reactor.rsplit(".", 1)[-1] in log  # the reactor it was given (or "")
        assert "Spider closed (finished)" in log, message + "\n" + log[-3000:]
        assert "Traceback" not in log, message + "\n" + log[-3000:]
    assert codes == [0] * WORKERS, message
    assert stall <= MAX_STALL, message
    missing = [page for page, n in enumerate(fetches) if n == 0]
    # Which pages, and what the workers' logs say of the failover, to find out why.
    assert never == 0, "\n".join([
        message, f"never fetched: pages {missing[:20]}",
        *(f"worker-{i}: {line}" for i, log in enumerate(logs) for line in log.splitlines()
          if "WARNING" in line or "ERROR" in line or "master changed" in line)])
    # The crawl-wide stats followed the master too, and the command line finds them there.
    stats = subprocess.run(
        [sys.executable, "-m", "scrapy_bloomdupe.cli", "stats", "--spider", "site", "--json",
         "--sentinels", ",".join(sentinel.sentinel_addresses),
         "--sentinel-master", sentinel.master_name],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "REDIS_URL": "redis:///0"})
    assert stats.returncode == 0, stats.stdout + stats.stderr
    report = json.loads(stats.stdout)
    assert report["redis"].startswith("Sentinel master 'mymaster'")
    assert len(report["workers"]) == WORKERS, report
    if report["totals"]["new"] < PAGES:  # seen once under load (121): what each server held
        held = {}
        for port in sentinel.servers:
            node = sentinel.client(port)
            try:
                held[port] = (sentinel.role(port), node.hget("site:bloomdupe:stats", "new"))
            except redis.RedisError as e:
                held[port] = (None, repr(e))
            finally:
                node.close()
        raise AssertionError(f"crawl-wide new {report['totals']['new']} < {PAGES}; the "
                             f"sentinels name {list(sentinel.named())}; the servers (role, "
                             f"new): {held}; {message}")
