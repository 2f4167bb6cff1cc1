"""End-to-end crawl: N ``scrapy crawl site`` workers on the example project's demo site.

``example_project/`` as it is; a contender changes its dedup settings only, with a
timed ``DUPEFILTER_CLASS`` (:mod:`harness.timed`) so each worker reports its CPU in
dedup. Not ``run_demo.py``, which runs this package's filter only.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from harness.processes import PROJECT, Worker, start_site, start_worker  # noqa: E402


def crawl(name: str, settings: dict[str, str], *, redis_url: str, pages: int, workers: int,
          out: Path, idle_timeout: float = 3.0, timeout: float = 600.0, delay: float = 0.0,
          hosts: int = 1, throttle: int = 0) -> dict[str, Any]:
    """One crawl of the demo site by ``workers`` processes; figures from the site and
    workers (``site``: the site's own, ``demo.site``'s ``/__stats``)."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    directory = out / f"e2e-{slug}"
    timing = directory / "timing"
    timing.mkdir(parents=True, exist_ok=True)
    for stale in timing.glob("*.json"):  # an earlier run's
        stale.unlink()
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    site = start_site(directory, pages=pages, delay=delay, hosts=hosts, throttle=throttle)
    # The workers import the harness's timed dupefilters and wait_for_queue extension.
    path = os.environ.get("PYTHONPATH", "")
    if str(ROOT / "tests") not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT / "tests"), str(PROJECT), path]))
    running: list[Worker] = []
    try:
        common = {
            "REDIS_URL": redis_url, "DEMO_SITE_URL": site.url, "LOG_LEVEL": "INFO",
            # How long an idle worker waits for more work: scrapy-redis's contender
            # (tests/harness/wait_for_queue.py), and this package's end-of-crawl grace.
            "SHARED_QUEUE_IDLE_TIMEOUT": str(idle_timeout),
            "BLOOMDUPE_DONE_GRACE": str(idle_timeout), "BENCH_TIMING_DIR": str(timing),
            "BLOOMDUPE_CAPACITY": str(max(10_000, 2 * pages)),
        }
        started = time.monotonic()
        running = [start_worker(i, directory, {**common, **settings}) for i in range(workers)]
        procs = [w.process for w in running]
        while any(p.poll() is None for p in procs):
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"e2e crawl {name!r} did not finish in {timeout:.0f}s")
            time.sleep(0.1)
        wall = time.monotonic() - started
        failed = [i for i, p in enumerate(procs) if p.returncode != 0]
        if failed:
            raise RuntimeError(f"e2e crawl {name!r}: worker(s) {failed} failed; see {directory}")
        stats = site.stats()
    finally:
        for worker in running:
            worker.close()
        site.stop()
        client.close()
    fetches: list[int] = stats["fetches"]
    timings = [json.loads(p.read_text()) for p in sorted(timing.glob("*.json"))]
    if len(timings) != workers:
        raise RuntimeError(f"e2e crawl {name!r}: {len(timings)} of {workers} workers wrote "
                           f"timings; see {directory}")
    crawl_seconds = (stats["last_fetch"] - stats["first_fetch"]) if stats["first_fetch"] else 0.0
    dedup_cpu = sum(t["dedup_cpu"] for t in timings)
    worker_cpu = sum(t["worker_cpu"] for t in timings)
    fetched = sum(1 for n in fetches if n)
    total = {k: sum(t.get(k, 0) for t in timings)
             for k in ("dedup_wall", "worker_wall", "requests", "calls", "round_trips")}
    return {
        "name": name, "pages": len(fetches), "workers": workers, "fetches": sum(fetches),
        "fetched_twice": sum(1 for n in fetches if n > 1),
        "never_fetched": sum(1 for n in fetches if n == 0),
        "crawl_seconds": crawl_seconds, "wall_seconds": wall,
        "pages_per_second": fetched / crawl_seconds if crawl_seconds else 0.0,
        "dedup_cpu": dedup_cpu, "dedup_wall": total["dedup_wall"], "worker_cpu": worker_cpu,
        "worker_wall": total["worker_wall"], "dedup_requests": total["requests"],
        "dedup_calls": total["calls"],
        "dedup_cpu_share": dedup_cpu / worker_cpu if worker_cpu else 0.0,
        "round_trips": total["round_trips"],
        "round_trips_per_page": total["round_trips"] / max(1, fetched), "logs": str(directory),
        "site": stats,
    }
