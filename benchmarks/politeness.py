#!/usr/bin/env python
"""Politeness as a site sees it: 1 worker and N against per-site limits, timed by the site.

``python benchmarks/politeness.py`` (``--help`` for the options): the demo site over
``--hosts`` loopback hosts, its ``--throttle``-th request to the last host a ``429``.
What each column is, and the figures: docs/benchmarks.md, section i.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import e2e  # first: it puts tests/ (the harness) on sys.path
import redis
from redis_cpu import main_thread_cpu
from report import table

from scrapy_bloomdupe.testing import RedisServer

HERE = e2e.ROOT / "benchmarks"
#: What the site's 429 asks for (demo.site: ``Retry-After: 2``), in seconds.
RETRY_AFTER = 2.0


def run(workers: int, mode: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One crawl by ``workers`` processes in politeness ``mode``; the site's and Redis's
    figures."""
    settings = {"DUPEFILTER_CLASS": "harness.timed.TimedRedisBloomDupeFilter",
                "BLOOMDUPE_POLITENESS": mode,
                "CONCURRENT_REQUESTS_PER_DOMAIN": str(args.concurrency),
                "DOWNLOAD_DELAY": str(args.delay), "RANDOMIZE_DOWNLOAD_DELAY": "False"}
    with redis.Redis.from_url(url) as client:
        before = main_thread_cpu(client)
        result = e2e.crawl(f"{workers} workers, {mode}", settings, redis_url=url, pages=args.pages,
                           workers=workers, out=args.out, idle_timeout=2.0,
                           timeout=args.timeout, delay=args.page_delay, hosts=args.hosts,
                           throttle=args.throttle)
        redis_cpu = main_thread_cpu(client) - before
    stats = result["site"]
    hosts: dict[str, Any] = stats["hosts"]
    gaps = {h: [b - a for a, b in zip(v["starts"], v["starts"][1:], strict=False)]
            for h, v in hosts.items()}
    after_429 = paused = None
    if stats["throttled"]:
        paused, at = stats["throttled"]
        later = [s for s in hosts[paused]["starts"] if s > at]
        after_429 = min(later) - at if later else None
    # The host that answered 429 asked for a pause of RETRY_AFTER s on top of its delays.
    ideal = max(max((len(v["starts"]) - 1) * args.delay,
                    len(v["starts"]) * args.page_delay / args.concurrency)
                + (RETRY_AFTER if h == paused else 0.0)
                for h, v in hosts.items())
    return {
        "workers": workers, "mode": mode,
        "max_in_flight": max(v["max_in_flight"] for v in hosts.values()),
        "gap_p10_worst": min(statistics.quantiles(g, n=10)[0] for g in gaps.values()
                             if len(g) >= 2),
        "gap_median": statistics.median([x for g in gaps.values() for x in g]),
        "seconds": result["crawl_seconds"], "ideal": ideal, "after_429": after_429,
        "redis_us_per_page": redis_cpu * 1e6 / max(1, result["pages"] - result["never_fetched"]),
        "twice": result["fetched_twice"], "never": result["never_fetched"],
    }


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    body = [[r["mode"], r["workers"], f"{r['max_in_flight']} ({args.concurrency})",
              f"{r['gap_p10_worst']:.3f} / {r['gap_median']:.3f}", f"{r['seconds']:.1f}",
              f"{r['ideal']:.1f}", f"{r['seconds'] / r['ideal']:.2f}",
              "n/a" if r["after_429"] is None else f"{r['after_429']:.2f} s",
              f"{r['redis_us_per_page']:.0f}", f"{r['twice']} / {r['never']}"] for r in rows]
    return (f"`python benchmarks/politeness.py`: {args.pages} pages over {args.hosts} hosts, "
            f"{args.page_delay} s a page, CONCURRENT_REQUESTS_PER_DOMAIN = {args.concurrency}, "
            f"DOWNLOAD_DELAY = {args.delay} (not randomized)\n\n" + table(
                ["politeness", "workers", "most in flight on a host (limit)",
                 f"gap p10, worst host / median (asked {args.delay} s)", "crawl s",
                 "slot-limited ideal s", "x ideal", "first request after the 429 (Retry-After "
                 "2 s)", "Redis µs a page", "fetched twice / never"], body))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, kind, default in (("--pages", int, 480), ("--hosts", int, 8),
                                ("--page-delay", float, 0.05), ("--concurrency", int, 1),
                                ("--delay", float, 0.2), ("--throttle", int, 10),
                                ("--workers", str, "1,4"), ("--modes", str, "worker,crawl"),
                                ("--timeout", float, 600.0),
                                ("--out", Path, HERE / "out" / "politeness")):
        parser.add_argument(flag, type=kind, default=default)
    args = parser.parse_args(argv)
    started = time.monotonic()
    with RedisServer(maxmemory="256mb") as server:
        rows = [run(int(n), mode, server.url, args) for mode in args.modes.split(",")
                for n in args.workers.split(",")]
    print(report(rows, args) + f"\n\n({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
