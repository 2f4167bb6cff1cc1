#!/usr/bin/env python
"""Politeness as a site sees it: N workers against per-site limits, measured by the server.

``python benchmarks/politeness.py`` (``--pages``, ``--hosts``, ``--page-delay``,
``--concurrency``, ``--delay``, ``--workers 1,4``, ``--json PATH``). The demo site
spread over ``--hosts`` loopback hosts (127.0.0.1, 127.0.0.2, ...: one Scrapy
download slot each, ``demo.site --hosts``), every page answering after
``--page-delay`` s, crawled by the example project with
``CONCURRENT_REQUESTS_PER_DOMAIN = --concurrency``, ``DOWNLOAD_DELAY = --delay`` and
``RANDOMIZE_DOWNLOAD_DELAY = False``, by 1 worker and by N. The site records when
each request to each host started and how many were in flight at once; its
``--throttle`` request to the last host answers ``429`` with ``Retry-After: 2``.
Printed, per run:

* the most requests in flight on any host at once (the limit: ``--concurrency``);
* the gaps between request starts on a host: the worst host's 10th percentile and
  the median of all (the settings ask for ``--delay``);
* the crawl's time (first to last fetch) against the slot-limited ideal (each host's
  pages one ``--delay`` apart, or its pages' time over the concurrency, the slower);
* how long after the 429 the next request to its host came (``Retry-After: 2``);
* Redis's CPU a fetched page (``INFO cpu``, the main thread), and pages fetched twice
  or never (a shared crawl fetches each page once).

Issue 38 (``BLOOMDUPE_POLITENESS = "crawl"``) is measured here against these rows.
"""

from __future__ import annotations

import argparse
import json
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

from scrapy_bloomdupe.testing import RedisServer  # noqa: E402


def run(workers: int, url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One crawl by ``workers`` processes; the site's and Redis's figures."""
    client = redis.Redis.from_url(url)
    settings = {
        "DUPEFILTER_CLASS": "benchmarks.timed.TimedRedisBloomDupeFilter",
        "CONCURRENT_REQUESTS_PER_DOMAIN": str(args.concurrency),
        "DOWNLOAD_DELAY": str(args.delay), "RANDOMIZE_DOWNLOAD_DELAY": "False",
    }
    before = client.info("cpu")
    result = e2e.crawl(f"{workers} workers", settings, redis_url=url, pages=args.pages,
                       workers=workers, out=args.out, idle_timeout=2.0, timeout=args.timeout,
                       delay=args.page_delay, hosts=args.hosts, throttle=args.throttle)
    after = client.info("cpu")
    client.close()
    redis_cpu = sum(float(after[k]) - float(before[k])
                    for k in ("used_cpu_user_main_thread", "used_cpu_sys_main_thread"))
    stats = result["site"]
    hosts: dict[str, Any] = stats["hosts"]
    gaps = {h: [b - a for a, b in zip(v["starts"], v["starts"][1:], strict=False)]
            for h, v in hosts.items()}
    after_429 = None
    if stats["throttled"]:
        host, at = stats["throttled"]
        later = [s for s in hosts[host]["starts"] if s > at]
        after_429 = min(later) - at if later else None
    ideal = max(max((len(v["starts"]) - 1) * args.delay,
                    len(v["starts"]) * args.page_delay / args.concurrency)
                for v in hosts.values())
    return {
        "workers": workers, "max_in_flight": max(v["max_in_flight"] for v in hosts.values()),
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
             "| workers | most in flight on a host (limit) | gap p10, worst host / median "
             f"(asked {args.delay} s) | crawl s | slot-limited ideal s | x ideal | first "
             "request after the 429 (Retry-After 2 s) | Redis µs a page | fetched twice / "
             "never |", "|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        after = "n/a" if r["after_429"] is None else f"{r['after_429']:.2f} s"
        lines.append(
            f"| {r['workers']} | {r['max_in_flight']} ({args.concurrency}) | "
            f"{r['gap_p10_worst']:.3f} / {r['gap_median']:.3f} | {r['seconds']:.1f} | "
            f"{r['ideal']:.1f} | {r['seconds'] / r['ideal']:.2f} | {after} | "
            f"{r['redis_us_per_page']:.0f} | {r['twice']} / {r['never']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=480)
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--page-delay", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--delay", type=float, default=0.2)
    parser.add_argument("--throttle", type=int, default=10)
    parser.add_argument("--workers", default="1,4")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--out", type=Path, default=HERE / "out" / "politeness")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    started = time.monotonic()
    with RedisServer(maxmemory="256mb") as server:
        rows = [run(int(n), server.url, args) for n in args.workers.split(",")]
    print(report(rows, args) + f"\n\n({time.monotonic() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
