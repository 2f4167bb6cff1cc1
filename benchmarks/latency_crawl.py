#!/usr/bin/env python
"""The end-to-end crawl with Redis on another machine: local, +0.5 ms and +2 ms a round trip.

``python benchmarks/latency_crawl.py`` (``--help``; ``--quick``: a smoke run): the demo
crawl (``e2e.py``) through a delaying TCP proxy, scrapy-redis beside this package; then
on a local Redis Cluster, then with workers SIGKILLed. docs/benchmarks.md, section f2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import e2e  # first: it puts tests/ (the harness) on sys.path
from harness import kill_workers as kw
from harness.latency_proxy import LatencyProxy, measure_rtt
from harness.local_cluster import LocalCluster
from report import median_rounds, progress, table

from scrapy_bloomdupe.testing import RedisServer

HERE = e2e.ROOT / "benchmarks"
SCRAPY_REDIS = ("scrapy-redis", {
    "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
    "DUPEFILTER_CLASS": "harness.timed.TimedScrapyRedisDupeFilter",
    "BLOOMDUPE_BATCH": "False",
    "EXTENSIONS": json.dumps({"harness.wait_for_queue.WaitForSharedQueue": 510,
                              "demo.extensions.StatsToJson": 900}),
})
BLOOMDUPE = ("bloomdupe", {
    "DUPEFILTER_CLASS": "harness.timed.TimedRedisBloomDupeFilter",
    "SPIDER_MIDDLEWARES": json.dumps(
        {"scrapy_bloomdupe.middleware.BloomDupeBatchMiddleware": 10}),
})


def one_crawl(name: str, settings: dict[str, str], url: str,
              args: argparse.Namespace, label: str) -> dict[str, Any]:
    result = e2e.crawl(f"{name} {label}", settings, redis_url=url, pages=args.pages,
                       workers=args.workers, out=args.out)
    progress(f"  {name:12} {label:>8}: {result['crawl_seconds']:6.1f} s, "
             f"{result['pages_per_second']:5.0f} pages/s, "
             f"{result['round_trips_per_page']:.2f} round trips/page, fetched twice "
             f"{result['fetched_twice']}, never {result['never_fetched']}")
    return result


def latency_runs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every delay for both contenders, ``args.repeat`` rounds of them in turn (so that
    a slow spell of the machine falls on all of them alike)."""
    rows: list[dict[str, Any]] = []
    with RedisServer(persist=True, extra=["--appendfsync", "everysec"]) as server:
        base_rtt = measure_rtt(server.url)
        for round_, delay in ((r, d) for r in range(args.repeat) for d in args.delays):
            proxy = LatencyProxy(server.port, delay).start() if delay else None
            try:
                url = proxy.url if proxy is not None else server.url
                rtt = measure_rtt(url)
                for name, settings in (SCRAPY_REDIS, BLOOMDUPE):
                    rows.append({**one_crawl(name, settings, url, args,
                                             f"+{delay:g} ms" if delay else "local"),
                                 "contender": name, "delay_ms": delay, "round": round_,
                                 "added_rtt_us": (rtt - base_rtt) * 1e6})
            finally:
                if proxy is not None:
                    proxy.stop()
    return rows


def cluster_run(args: argparse.Namespace) -> dict[str, Any]:
    with LocalCluster(masters=3, replicas=0) as cluster:
        masters = [cluster.node(port).client() for port in cluster.master_ports()]
        for client in masters:
            client.config_resetstat()
        name, settings = BLOOMDUPE
        settings = {**settings, "BLOOMDUPE_REDIS_CLUSTER": "True", "BLOOMDUPE_SHARDS": "24"}
        result = e2e.crawl(f"{name} cluster", settings, redis_url=cluster.url, pages=args.pages,
                           workers=args.workers, out=args.out)
        per_master = {f"127.0.0.1:{c.connection_pool.connection_kwargs['port']}":
                      sum(int(v["calls"]) for v in c.info("commandstats").values())
                      for c in masters}
        for client in masters:
            client.close()
    total = sum(per_master.values()) or 1
    result["master_share"] = {k: v / total for k, v in per_master.items()}
    progress(f"  cluster: {result['pages_per_second']:.0f} pages/s, shares "
             + ", ".join(f"{k} {v:.0%}" for k, v in result["master_share"].items()))
    return result


def kill_runs(args: argparse.Namespace) -> list[dict[str, Any]]:
    # The workers import the scrapy-redis contender's extension from the harness.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(HERE.parent / "tests"), os.environ.get("PYTHONPATH")]))
    scrapy_redis = {**SCRAPY_REDIS[1], "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter"}
    return kw.side_by_side(args.out, [("scrapy-redis", scrapy_redis), ("bloomdupe", {})],
                           args.kills, workers=args.workers)


def report(rows: list[dict[str, Any]], cluster: dict[str, Any] | None,
           kills: list[dict[str, Any]]) -> str:
    rows = median_rounds(rows, lambda r: (r["contender"], r["delay_ms"]),
                         lambda r: float(r["crawl_seconds"]))
    local = {r["contender"]: r["crawl_seconds"] for r in rows if not r["delay_ms"]}
    by = {(r["contender"], r["delay_ms"]): r for r in rows}
    repeated = any(len(r["rounds"]) > 1 for r in rows)
    body = []
    for r in rows:
        theirs = by.get(("scrapy-redis", r["delay_ms"]))
        vs = (f"{theirs['crawl_seconds'] / r['crawl_seconds']:.2f}"
              if r["contender"] == "bloomdupe" and theirs and r["crawl_seconds"] else "")
        base = local.get(r["contender"]) or r["crawl_seconds"]
        label = (f"+{r['delay_ms']:g} ms (measured +{r['added_rtt_us'] / 1000:.2f} ms)"
                 if r["delay_ms"] else "local")
        each = (" (" + ", ".join(f"{t:.1f}" for t in r["rounds"]) + ")") if repeated else ""
        body.append([r["contender"], label, f"{r['crawl_seconds']:.1f}{each}",
                     f"{r['crawl_seconds'] / base:.2f}", f"{r['pages_per_second']:.0f}", vs,
                     f"{r['round_trips_per_page']:.2f}",
                     f"{r['fetched_twice']} / {r['never_fetched']}"])
    lines = [table(["contender", "added per round trip", "crawl s"
                    + (" (median; each round)" if repeated else ""), "x its local time",
                    "pages/s", "scrapy-redis s / bloomdupe s", "Redis round trips per page",
                    "fetched twice / never"], body, left=2)]
    if cluster is not None:
        lines += ["", "Local Redis Cluster, 3 masters, 24 shards: "
                  f"{cluster['pages_per_second']:.0f} pages/s, fetched twice "
                  f"{cluster['fetched_twice']}, never {cluster['never_fetched']}; each "
                  "master's share of the crawl's commands: "
                  + ", ".join(f"{k} {v:.1%}" for k, v in cluster["master_share"].items())]
    if kills:
        lines += ["", kw.side_by_side_table(kills)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--delays", default="0,0.5,2",
                        help="ms added to each round trip, comma-separated (0: local)")
    parser.add_argument("--no-cluster", action="store_true")
    parser.add_argument("--kills", default="1,2",
                        help="workers SIGKILLed in the kill runs, comma-separated ('': none)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of every delay and contender, in turn; the table "
                             "shows each cell's median")
    parser.add_argument("--quick", action="store_true", help="300 pages, local and +2 ms")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "latency_crawl")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.delays = [float(d) for d in args.delays.split(",")]
    args.kills = [int(k) for k in args.kills.split(",") if k.strip()]
    if args.quick:
        args.pages, args.delays, args.kills = 300, [0.0, 2.0], args.kills[:1]
    started = time.monotonic()
    rows = latency_runs(args)
    cluster = None if args.no_cluster else cluster_run(args)
    kills = kill_runs(args)
    text = report(rows, cluster, kills)
    print(f"`python benchmarks/latency_crawl.py`, {args.pages:,} pages, {args.workers} "
          f"workers, {time.monotonic() - started:.0f} s\n\n{text}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "cluster": cluster, "kills": kills},
                                        indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
