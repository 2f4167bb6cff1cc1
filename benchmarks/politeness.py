#!/usr/bin/env python
"""Politeness as a site sees it: 1 worker and N against per-site limits, timed by the site.

``python benchmarks/politeness.py`` (``--help`` for the options): the demo site over
``--hosts`` loopback hosts (one Scrapy download slot each, ``demo.site --hosts``)
crawled with ``CONCURRENT_REQUESTS_PER_DOMAIN``, ``DOWNLOAD_DELAY`` and
``RANDOMIZE_DOWNLOAD_DELAY = False``; its ``--throttle``-th request to the last host
answers ``429`` with ``Retry-After: 2``. One table row a worker count: what each
column is, and the figures, in docs/benchmarks.md (section i).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import e2e  # noqa: E402
from redis_cpu import main_thread_cpu  # noqa: E402

from scrapy_bloomdupe.testing import RedisServer  # noqa: E402

#: What the site's 429 asks for (demo.site: ``Retry-After: 2``), in seconds.
RETRY_AFTER = 2.0


def run(workers: int, mode: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One crawl by ``workers`` processes in politeness ``mode``; the site's and Redis's
    figures."""
    settings = {"DUPEFILTER_CLASS": "benchmarks.timed.TimedRedisBloomDupeFilter",
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
    after_429 = None
    if stats["throttled"]:
        host, at = stats["throttled"]
        later = [s for s in hosts[host]["starts"] if s > at]
        after_429 = min(later) - at if later else None
    # A host that answered 429 asked for a pause of RETRY_AFTER s on top of its delays.
    paused = stats["throttled"][0] if stats["throttled"] else None
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
    lines = [f"`python benchmarks/politeness.py`: {args.pages} pages over {args.hosts} hosts, "
             f"{args.page_delay} s a page, CONCURRENT_REQUESTS_PER_DOMAIN = {args.concurrency}, "
             f"DOWNLOAD_DELAY = {args.delay} (not randomized)", "",
             "| politeness | workers | most in flight on a host (limit) | gap p10, worst host / "
             "median "
             f"(asked {args.delay} s) | crawl s | slot-limited ideal s | x ideal | first "
             "request after the 429 (Retry-After 2 s) | Redis µs a page | fetched twice / "
             "never |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        after = "n/a" if r["after_429"] is None else f"{r['after_429']:.2f} s"
        lines.append(
            f"| {r['mode']} | {r['workers']} | {r['max_in_flight']} ({args.concurrency}) | "
            f"{r['gap_p10_worst']:.3f} / {r['gap_median']:.3f} | {r['seconds']:.1f} | "
            f"{r['ideal']:.1f} | {r['seconds'] / r['ideal']:.2f} | {after} | "
            f"{r['redis_us_per_page']:.0f} | {r['twice']} / {r['never']} |")
    return "\n".join(lines)


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
