#!/usr/bin/env python
"""scrapy-bloomdupe against scrapy-redis, side by side, in one run.

``python benchmarks/run.py`` (``--quick`` for a small smoke run, ``--out DIR`` for the
results, default ``benchmarks/out``; ``--help``). It starts its own ``redis-server``
(and a delaying TCP proxy) and measures: (a) checks per second in one process, (b) the
same at +0.5 and +2 ms a round trip, (c) bytes per URL, (d) the false-positive rate at
capacity and (d2) a recrawl window's, (e) 16 processes checking the same URLs at once,
(f) an end-to-end crawl. What each is and how it is taken: docs/benchmarks.md. Markdown
tables go to stdout and ``DIR/results.md``, raw figures to ``DIR/results.json``.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import hashlib
import json
import math
import multiprocessing
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import e2e  # first: it puts tests/ (the harness) on sys.path
import redis
from harness.latency_proxy import LatencyProxy, measure_rtt, proxy_overhead
from latency_crawl import SCRAPY_REDIS as LATENCY_CRAWL_SCRAPY_REDIS
from report import progress, table
from scrapy import Request, Spider
from scrapy.dupefilters import RFPDupeFilter as ScrapyRFPDupeFilter
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler
from scrapy_redis.dupefilter import RFPDupeFilter as ScrapyRedisRFPDupeFilter

from scrapy_bloomdupe import keys, sizing
from scrapy_bloomdupe.bloom import native
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter
from scrapy_bloomdupe.testing import RedisServer, redisbloom_module

ERROR_RATE = 0.001
#: Capacity of the dupefilter in the throughput and race runs (the package's default).
BENCH_CAPACITY = 10_000_000
SCRAPY_REDIS_KEY = "bench:sr"


@dataclass(frozen=True)
class Size:
    requests: int  # one-process run, no added latency
    repeats: int
    latency_requests: int
    latency_repeats: int
    batched_latency_repeats: int
    memory_urls: int
    fpr_probes: int
    race_processes: int
    race_urls: int
    e2e_pages: int  # 0: skip
    e2e_workers: int


FULL = Size(20_000, 5, 4_000, 3, 7, 1_000_000, 1_000_000, 16, 20_000, 3_000, 4)
QUICK = Size(1_500, 2, 150, 1, 1, 20_000, 20_000, 4, 1_000, 0, 2)
DELAYS_MS = (0.5, 2.0)


# -- the machine ----------------------------------------------------------------------
def machine(redis_url: str) -> dict[str, Any]:
    def proc(path: str, field: str) -> str:  # a /proc file's first line starting with it
        lines = Path(path).read_text().splitlines() if Path(path).exists() else []
        return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(field)), "")

    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "not installed"

    total = proc("/proc/meminfo", "MemTotal:")
    with redis.Redis.from_url(redis_url) as client:
        server, allocator = client.info("server"), client.info("memory").get("mem_allocator")
    return {
        "cpu": proc("/proc/cpuinfo", "model name") or "unknown", "cores": os.cpu_count(),
        "memory": f"{int(total.split()[0]) / 1024 / 1024:.1f} GiB" if total else "unknown",
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "redis-server": f"{server.get('redis_version')} ({allocator})",
        **{name: version(package) for name, package in (
            ("redis-py", "redis"), ("hiredis", "hiredis"), ("Scrapy", "scrapy"),
            ("scrapy-redis", "scrapy-redis"), ("mmh3", "mmh3"),
            ("scrapy-bloomdupe", "scrapy-bloomdupe"))},
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load average at start (1/5/15 min)": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


# -- requests -------------------------------------------------------------------------

_HOSTS = ("www.shop.example", "news.example.org", "blog.example.net", "catalog.example.com",
          "forum.example.io", "docs.example.dev", "m.example.co.uk", "market.example.de")
_SECTIONS = ("products", "category/garden-tools", "articles/2024/05", "t", "wiki/Special",
             "search", "users/profile", "p")
_WORDS = ("blue", "chair", "lamp", "review", "guide", "cheap", "best", "how-to", "spring",
          "sale", "oak", "steel")


def _new_url(rng: random.Random, index: int) -> str:
    host = rng.choice(_HOSTS)
    section = rng.choice(_SECTIONS)
    slug = "-".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 4)))
    kind = rng.random()
    if kind < 0.4:
        return f"https://{host}/{section}/{slug}-{index}.html"
    if kind < 0.8:
        sort = rng.choice(("price", "date", "name"))
        return f"https://{host}/{section}/item?id={index}&page={rng.randint(1, 50)}&sort={sort}"
    return f"https://{host}/{section}/{slug}/{index}/?ref=list&utm_source=feed{rng.randint(1, 9)}"


def url_stream(count: int, repeat: float, seed: int = 2024) -> tuple[list[str], int]:
    """``count`` URLs, each a repeat of an earlier one with probability ``repeat``; and
    the number of distinct URLs."""
    rng = random.Random(seed)
    distinct: list[str] = []
    stream: list[str] = []
    for _ in range(count):
        if distinct and rng.random() < repeat:
            stream.append(rng.choice(distinct))
        else:
            distinct.append(_new_url(rng, len(distinct)))
            stream.append(distinct[-1])
    return stream, len(distinct)


# -- contenders -----------------------------------------------------------------------
class BenchSpider(Spider):
    name = "bench"


@dataclass(frozen=True)
class Contender:
    name: str
    kind: str  # "scrapy-redis", "memory" or "bloom"
    lock: bool = True
    batched: bool = False
    #: BLOOMDUPE_LOCAL_CACHE on (the default): repeats this process has met are
    #: answered without Redis. Off: every check is a round trip.
    cache: bool = True


SCRAPY_REDIS = Contender("scrapy-redis RFPDupeFilter (SADD)", "scrapy-redis")
MEMORY = Contender("Scrapy RFPDupeFilter (in memory)", "memory")
LOCK = Contender("bloomdupe, lock mode", "bloom", lock=True)
ATOMIC = Contender("bloomdupe, atomic mode", "bloom", lock=False)
BATCHED_LOCK = Contender("bloomdupe batched, lock mode", "bloom", lock=True, batched=True)
BATCHED_ATOMIC = Contender("bloomdupe batched, atomic mode", "bloom", lock=False, batched=True)
LOCK_UNCACHED = Contender("bloomdupe, lock mode, local cache off", "bloom", lock=True,
                          cache=False)
ATOMIC_UNCACHED = Contender("bloomdupe, atomic mode, local cache off", "bloom", lock=False,
                            cache=False)
ALL = (SCRAPY_REDIS, MEMORY, LOCK, ATOMIC, BATCHED_LOCK, BATCHED_ATOMIC, LOCK_UNCACHED,
       ATOMIC_UNCACHED)
#: With added latency: the defaults (a round trip per check without the cache
#: is section a's figure, plus the added delay).
REDIS_CONTENDERS = (SCRAPY_REDIS, LOCK, ATOMIC, BATCHED_LOCK, BATCHED_ATOMIC)


def crawler_for(redis_url: str, **settings: Any) -> Any:
    crawler = get_crawler(BenchSpider, {"REDIS_URL": redis_url,
                                        "BLOOMDUPE_CAPACITY": BENCH_CAPACITY, **settings})
    crawler.spider = crawler._create_spider()
    return crawler


def build(contender: Contender, redis_url: str) -> tuple[Any, Callable[[], None]]:
    """The contender's dupefilter, and how to let go of it (without deleting its data)."""
    if contender.kind == "scrapy-redis":
        server = redis.Redis.from_url(redis_url)
        df = ScrapyRedisRFPDupeFilter(server=server, key=SCRAPY_REDIS_KEY)
        return df, server.close
    if contender.kind == "memory":
        df = build_from_crawler(ScrapyRFPDupeFilter, crawler_for(redis_url))
        return df, lambda: None
    crawler = crawler_for(redis_url, BLOOMDUPE_LOCK=contender.lock,
                          BLOOMDUPE_LOCAL_CACHE=None if contender.cache else 0)
    bloom_df: RedisBloomDupeFilter = build_from_crawler(RedisBloomDupeFilter, crawler)

    def close() -> None:
        bloom_df.bloom.close()
        bloom_df.bloom.client.close()

    return bloom_df, close


def check_all(contender: Contender, df: Any, requests: Sequence[Request],
              batch: int) -> bytearray:
    """Run the requests through the dupefilter as Scrapy would; 1 where one was new."""
    accepted = bytearray(len(requests))
    if not contender.batched:
        seen = df.request_seen
        for i, request in enumerate(requests):
            if not seen(request):
                accepted[i] = 1
        return accepted
    for start in range(0, len(requests), batch):
        chunk = requests[start:start + batch]
        for i, (request, was_seen) in enumerate(zip(chunk, df.requests_seen(chunk),
                                                    strict=True)):
            # The scheduler then calls request_seen on each request the batch let
            # through; the mark makes it pass without a second check.
            if not was_seen and not df.request_seen(request):
                accepted[start + i] = 1
    return accepted


def redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def measure(contender: Contender, redis_url: str, direct: redis.Redis, urls: Sequence[str],
            batch: int) -> dict[str, float]:
    """One timed run of ``urls`` through a fresh dupefilter over an empty Redis."""
    direct.flushdb()
    df, close = build(contender, redis_url)
    try:
        requests = [Request(u) for u in urls]
        gc.collect()
        server_cpu = redis_cpu(direct)
        cpu = time.process_time()
        wall = time.perf_counter()
        accepted = check_all(contender, df, requests, batch)
        wall = time.perf_counter() - wall
        cpu = time.process_time() - cpu
        server_cpu = redis_cpu(direct) - server_cpu
    finally:
        close()
    n = len(urls)
    return {"rate": n / wall, "wall_us": wall / n * 1e6, "cpu_us": cpu / n * 1e6,
            "redis_cpu_us": server_cpu / n * 1e6 if contender.kind != "memory" else 0.0,
            "new": float(sum(accepted))}


def throughput(contenders: Sequence[Contender], redis_url: str, direct: redis.Redis,
               urls: Sequence[str], repeats: int, batch: int, label: str,
               batched_repeats: int | None = None) -> dict[str, Any]:
    """Best of ``repeats`` runs per contender (``batched_repeats`` for the batched ones,
    whose runs are short with added latency), contenders interleaved in each round."""
    wanted = {c.name: (batched_repeats or repeats) if c.batched else repeats
              for c in contenders}
    rounds = max(wanted.values())
    runs: dict[str, list[dict[str, float]]] = {c.name: [] for c in contenders}
    for rep in range(rounds):
        for contender in contenders:
            if rep >= wanted[contender.name]:
                continue
            result = measure(contender, redis_url, direct, urls, batch)
            runs[contender.name].append(result)
            progress(f"  {label} run {rep + 1}/{wanted[contender.name]}: {contender.name}: "
                     f"{result['rate']:,.0f} checks/s")
    out: dict[str, Any] = {}
    for name, results in runs.items():
        best = max(results, key=lambda r: r["rate"])
        out[name] = {"rate": best["rate"], "rates": [r["rate"] for r in results],
                     "runs": len(results), "wall_us": best["wall_us"], "new": best["new"],
                     **{k: statistics.median(r[k] for r in results)
                        for k in ("cpu_us", "redis_cpu_us")}}
    return out


# -- memory and false positives -------------------------------------------------------
def fingerprints(count: int, prefix: bytes) -> list[bytes]:
    """sha1 digests, the size of Scrapy's request fingerprints."""
    return [hashlib.sha1(prefix + b"%d" % i).digest() for i in range(count)]


def answered(call: Callable[[list[bytes]], list[bool]], items: list[bytes]) -> int:
    """How many of ``items`` ``call`` (``add_many``, ``contains_many``) answers true."""
    return sum(sum(call(items[i:i + 10_000])) for i in range(0, len(items), 10_000))


def freed_by_deleting(client: redis.Redis, keys: Sequence[str]) -> int:
    """Bytes of ``used_memory`` that deleting ``keys`` gives back (a synchronous DEL)."""
    client.info("memory")  # once first: the reply buffers of INFO itself settle
    before = int(client.info("memory")["used_memory"])
    client.delete(*keys)
    return before - int(client.info("memory")["used_memory"])


def memory_and_fpr(redis_url: str, count: int, probes: int) -> dict[str, Any]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    try:
        items = fingerprints(count, b"https://www.example.com/item?id=")
        plan = sizing.plan(count, ERROR_RATE)
        progress(f"  filling a Bloom filter (capacity {count:,}, p={ERROR_RATE}) "
                 f"with {count:,} fingerprints")
        bloom = BloomFilter.open(client, "bench:mem", plan, use_lock=False)
        started = time.perf_counter()
        new = answered(bloom.add_many, items)
        add_seconds = time.perf_counter() - started
        info = bloom.info()
        op_logs = list(client.scan_iter(match=keys.ALL_OP_LOGS))
        op_log_bytes = sum(int(client.memory_usage(k, samples=0) or 0) for k in op_logs)
        progress(f"  probing with {probes:,} fresh fingerprints")
        started = time.perf_counter()
        false_positives = answered(bloom.contains_many, fingerprints(
            probes, b"https://probe.example.net/never-added/"))
        probe_seconds = time.perf_counter() - started
        # The allocator's footprint of the filter's bits: used_memory before and
        # after deleting them (nothing else changes in between).
        bloom_delta = freed_by_deleting(client, [s.key for s in info.shards])
        bloom.clear()
        bloom.close()

        progress(f"  scrapy-redis: SADD of {count:,} sha1 hex fingerprints")
        key = "bench:sr-mem"
        hexes = [fp.hex() for fp in items]
        for start in range(0, count, 100_000):
            pipe = client.pipeline(transaction=False)
            for s in range(start, min(start + 100_000, count), 1000):
                pipe.sadd(key, *hexes[s:min(s + 1000, count)])
            pipe.execute()
        set_bytes = int(client.memory_usage(key, samples=0) or 0)
        set_members = int(client.scard(key))
        set_delta = freed_by_deleting(client, [key])
        del hexes

        # The dupefilter as users get it: its defaults (growth on sizes the first
        # generation at a tighter error rate), capacity = count. A filter's
        # shards are allocated in full when it is opened.
        crawler = crawler_for(redis_url, BLOOMDUPE_CAPACITY=count,
                              BLOOMDUPE_ERROR_RATE=ERROR_RATE)
        df = build_from_crawler(RedisBloomDupeFilter, crawler)
        default_info = df.bloom.info()
        default_plan = df.bloom.sizing
        default_growth = bool(getattr(df.bloom, "growth", False))
        df.bloom.clear()
        df.bloom.close()
        df.bloom.client.close()
    finally:
        client.close()
    rate = false_positives / probes
    # Wilson score interval, 95%.
    z = 1.96
    centre = (rate + z * z / (2 * probes)) / (1 + z * z / probes)
    half = z * math.sqrt(rate * (1 - rate) / probes + z * z / (4 * probes * probes)) / (
        1 + z * z / probes)
    theory = -math.log(ERROR_RATE) / math.log(2) ** 2 / 8
    return {
        "urls": count, "bloom_bytes": info.memory_bytes,
        "bloom_bytes_per_url": info.memory_bytes / count, "bloom_bits": plan.total_bits,
        "bloom_hashes": plan.hashes, "bloom_shards": plan.shards, "new_when_filling": new,
        "add_seconds": add_seconds, "op_log_bytes": op_log_bytes, "set_bytes": set_bytes,
        "set_members": set_members, "set_bytes_per_url": set_bytes / count,
        "set_used_memory_delta": set_delta, "bloom_used_memory_delta": bloom_delta,
        "bloom_string_bytes": plan.shards * plan.bytes_per_shard,
        "default_string_bytes": default_plan.shards * default_plan.bytes_per_shard,
        "theory_bytes_per_url": theory, "ratio": set_bytes / info.memory_bytes,
        "default_bytes": default_info.memory_bytes,
        "default_bytes_per_url": default_info.memory_bytes / count,
        "default_error_rate": default_plan.error_rate, "default_growth": default_growth,
        "probes": probes, "false_positives": false_positives, "fpr": rate,
        "fpr_ci95": (max(0.0, centre - half), centre + half),
        "fpr_expected": sizing.false_positive_rate(plan.total_bits, plan.hashes, count),
        "probe_seconds": probe_seconds,
    }


#: Arrival patterns: each slice's items in a row, in shares (S a window of S slices).
WINDOW_PATTERNS: dict[str, Callable[[int], list[float]]] = {
    "steady": lambda s: [1] * (s + 1),
    "one burst of the whole capacity": lambda s: [s],
    "two bursts of half, half a window apart": lambda s: [s / 2, *[0] * (s // 2 - 1), s / 2],
    "twice the capacity, steady (growth)": lambda s: [2] * (s + 1),
}


def window_patterns(url: str, count: int, probes: int, engine_name: str
                    ) -> list[dict[str, Any]]:
    """A window of ``count`` fingerprints under each arrival pattern: bits per live
    fingerprint (``MEMORY USAGE`` of every live slice key over the fingerprints added
    within the last window), false positives, false negatives. Each slice's keys are
    kept (PERSIST) once filled: a slow machine does not expire them early."""
    client, rows, add_seconds = redis.Redis.from_url(url), [], time.perf_counter()
    plain = BloomFilter.open(client, "bench:fill", sizing.plan(count, ERROR_RATE),
                             use_lock=False, engine=engine_name)
    answered(plain.add_many, fingerprints(count, b"fill/"))
    add_seconds = time.perf_counter() - add_seconds
    plain.clear()
    slices = sizing.fit_window(1000, count, ERROR_RATE)[0].slices  # whatever the length
    for name, shape in WINDOW_PATTERNS.items():  # a slice: 30x its largest part's fill time
        window, plan = sizing.fit_window(max(2000, math.ceil(
            add_seconds * 30_000 * max(shape(slices)))), count, ERROR_RATE)
        bloom = BloomFilter.open(client, "bench:win", plan, window=window, growth=True,
                                 use_lock=False, engine=engine_name)
        engine: Any = bloom.engine  # a window's: its slice clock
        added, late, first = [], 0, window.slice_of(engine.clock.estimate()) + 1
        for j, shares in enumerate(shape(window.slices)):  # each from its slice's start
            time.sleep(max(0, (first + j) * window.slice_ms - engine.clock.estimate()) / 1000
                       + 0.01)
            part = fingerprints(round(shares * count / window.slices), b"w%d/" % j)
            added.append([x for i in range(0, len(part), 10_000) for x, new in zip(
                part[i:i + 10_000], bloom.add_many(part[i:i + 10_000]), strict=True) if new])
            late += max(engine.clock.current) > first + j  # ran into the next slice
            for n in (n for _, _, group in engine._existing() for n in group):
                client.persist(n)
        live = [x for j, part in enumerate(added) if first + j > max(engine.clock.current)
                - window.slices for x in part]  # answered new within the last window
        used = sum(int(client.memory_usage(n, samples=0) or 0) for s, _, group in
                   engine._existing() if s >= engine.clock.current[0] - window.slices
                   for n in group)
        n_probes = min(probes, 100_000)  # each probe reads every live slice
        fp = answered(bloom.contains_many, fingerprints(n_probes, b"https://probe.example.net/w/"))
        sample = live[::max(1, len(live) // 20_000)]
        fn = len(sample) - answered(bloom.contains_many, sample)
        rows.append({"engine": engine_name, "pattern": name, "slices": window.slices,
                     "window_s": window.window_ms / 1e3, "live": len(live), "fp": fp,
                     "bits": used * 8 / len(live), "probes": n_probes, "fpr": fp / n_probes,
                     "fn": fn, "checked": len(sample), "late": late})
        progress(f"  {engine_name}, {name}: {rows[-1]}")
        bloom.clear()
    client.close()
    return rows


# -- many processes at once -----------------------------------------------------------
def _race_worker(contender: Contender, redis_url: str, urls: Sequence[str], batch: int,
                 barrier: Any, results: Any, index: int) -> None:
    try:
        df, close = build(contender, redis_url)
        requests = [Request(u) for u in urls]
        barrier.wait(120)
        started = time.perf_counter()
        accepted = check_all(contender, df, requests, batch)
        finished = time.perf_counter()
        lock = {k: getattr(df.bloom.counters.lock, k) for k in
                ("waits", "timeouts", "lost", "wait_time")} if contender.kind == "bloom" else {}
        close()
        results.put((index, bytes(accepted), started, finished, lock, None))
    except Exception as e:  # reported by the parent
        results.put((index, b"", 0.0, 0.0, {}, repr(e)))


def race(contender: Contender, redis_url: str, direct: redis.Redis, urls: Sequence[str],
         processes: int, batch: int) -> dict[str, Any]:
    """``processes`` processes check the same URLs in the same order, all at once."""
    direct.flushdb()
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(processes)
    results = ctx.Queue()
    workers = [ctx.Process(target=_race_worker,
                           args=(contender, redis_url, urls, batch, barrier, results, i))
               for i in range(processes)]
    for w in workers:
        w.start()
    replies = [results.get(timeout=900) for _ in workers]
    for w in workers:
        w.join(60)
    errors = [r[5] for r in replies if r[5]]
    if errors:
        raise RuntimeError(f"race worker failed: {errors[0]}")
    counts = [sum(flags) for flags in zip(*(r[1] for r in replies), strict=True)]
    seconds = max(r[3] for r in replies) - min(r[2] for r in replies)
    return {"processes": processes, "urls": len(urls),
            "duplicates": sum(1 for c in counts if c > 1),
            "extra_accepts": sum(c - 1 for c in counts if c > 1),
            "lost": sum(1 for c in counts if c == 0), "seconds": seconds,
            "aggregate_rate": processes * len(urls) / seconds,
            "lock": {k: sum(r[4].get(k, 0) for r in replies) for r0 in replies for k in r0[4]}}


# -- end to end -----------------------------------------------------------------------

_BATCH_MIDDLEWARE = '{"scrapy_bloomdupe.middleware.BloomDupeBatchMiddleware": 10}'
# The demo's settings turn the batch middleware on; per-request contenders turn it off
# (BLOOMDUPE_BATCH=False), so their dupefilter sees one request a call. scrapy-redis's
# settings (with the harness's wait_for_queue.py, which keeps its workers as long as ours
# stay) are latency_crawl.py's.
E2E_CONTENDERS: tuple[tuple[Contender, dict[str, str]], ...] = (
    (SCRAPY_REDIS, LATENCY_CRAWL_SCRAPY_REDIS[1]),
    *((c, {"DUPEFILTER_CLASS": "harness.timed.TimedRedisBloomDupeFilter",
           "BLOOMDUPE_LOCK": str(c.lock), "BLOOMDUPE_BATCH": str(c.batched),
           **({"SPIDER_MIDDLEWARES": _BATCH_MIDDLEWARE} if c.batched else {})})
      for c in (LOCK, ATOMIC, BATCHED_LOCK, BATCHED_ATOMIC)),
)


# -- reporting ------------------------------------------------------------------------
def ratio(x: float, base: float) -> str:
    return f"{x / base:.2f}x" if base else "-"


def report(results: dict[str, Any], size: Size, quick: bool, batch: int) -> str:
    out = ["## Machine\n", table(["", ""], [[k, v] for k, v in results["machine"].items()])]
    if quick:
        out.append("\n**Quick run (`--quick`): sizes are too small for the figures to mean "
                   "much; targets are shown but not judged on them.**")

    local = results.get("local")
    if local:
        sr, mem = local[SCRAPY_REDIS.name]["rate"], local[MEMORY.name]["rate"]
        out.append(f"\n## a. Checks per second, one process, local Redis\n\n"
                   f"{size.requests:,} requests ({results['local_distinct']:,} distinct URLs, "
                   f"the rest repeats), best of {size.repeats}; batched = `requests_seen` on "
                   f"batches of {batch}. CPU figures are medians per check.\n")
        rows = [[c.name, f"{r['rate']:,.0f}", f"{min(r['rates']):,.0f} - {max(r['rates']):,.0f}",
                 ratio(r["rate"], sr), ratio(r["rate"], mem), f"{r['cpu_us']:.0f}",
                 f"{r['redis_cpu_us']:.0f}" if c.kind != "memory" else "-", f"{r['wall_us']:.0f}",
                 f"{r['new']:,.0f}"] for c in ALL for r in [local[c.name]]]
        out.append(table(["contender", "checks/s (best)", "all runs", "vs scrapy-redis",
                          "vs in-memory", "client CPU µs/check", "Redis CPU µs/check",
                          "wall µs/check", "new"], rows))

    latency = results.get("latency")
    if latency:
        out.append("\n## b. Checks per second with added round-trip latency\n\n"
                   f"{size.latency_requests:,} requests (same stream, cut), best of "
                   f"{size.latency_repeats} (batched: of {size.batched_latency_repeats}), "
                   "through a TCP proxy that delays every chunk from client to Redis (its own "
                   "overhead, "
                   f"{latency['proxy_overhead_us']:.0f} µs, taken off the delay it is given). "
                   f"Median PING round trip: direct {latency['base_rtt_us']:.0f} µs; "
                   + "; ".join(f"+{d['delay_ms']} ms: {d['rtt_us']:.0f} µs (added "
                               f"{d['added_us']:.0f} µs)" for d in latency["delays"])
                   + ".\n")
        header = ["contender"]
        for d in latency["delays"]:
            header += [f"+{d['delay_ms']} ms checks/s (best)", "all runs", "vs scrapy-redis"]
        rows = []
        for c in REDIS_CONTENDERS:
            row = [c.name]
            for d in latency["delays"]:
                got = d["results"][c.name]
                r = got["rate"]
                row += [f"{r:,.0f}", f"{min(got['rates']):,.0f} - {max(got['rates']):,.0f}",
                        ratio(r, d["results"][SCRAPY_REDIS.name]["rate"])]
            rows.append(row)
        out.append(table(header, rows))

    memory = results.get("memory")
    if memory:
        n = memory["urls"]
        out.append(f"\n## c. Bytes per URL in Redis, {n:,} URLs, error rate {ERROR_RATE}\n")
        set_delta_pu = memory["set_used_memory_delta"] / n
        bloom_delta_pu = memory["bloom_used_memory_delta"] / n
        rows = [
            ["scrapy-redis: SET of sha1 hex", f"{memory['set_bytes_per_url']:.2f}", "1.0x",
             f"{set_delta_pu:.2f}", "1.0x", "-"],
            [f"bloomdupe: BloomFilter(capacity {n:,}, p={ERROR_RATE})",
             f"{memory['bloom_bytes_per_url']:.3f}", f"{memory['ratio']:.1f}x",
             f"{bloom_delta_pu:.3f}", f"{set_delta_pu / bloom_delta_pu:.1f}x",
             f"{memory['bloom_string_bytes'] / n:.3f}"],
            [f"bloomdupe: dupefilter defaults (growth "
             f"{'on' if memory['default_growth'] else 'off'}, first generation at "
             f"p={memory['default_error_rate']:.2g})",
             f"{memory['default_bytes_per_url']:.3f}",
             f"{memory['set_bytes'] / memory['default_bytes']:.1f}x", "-", "-",
             f"{memory['default_string_bytes'] / n:.3f}"],
            ["Bloom theory: -ln(p) / ln(2)² / 8", f"{memory['theory_bytes_per_url']:.3f}",
             f"{memory['set_bytes_per_url'] / memory['theory_bytes_per_url']:.1f}x",
             f"{memory['theory_bytes_per_url']:.3f}",
             f"{set_delta_pu / memory['theory_bytes_per_url']:.1f}x",
             f"{memory['theory_bytes_per_url']:.3f}"],
        ]
        out.append(table(["store", "bytes/URL (MEMORY USAGE)", "less than scrapy-redis",
                          "bytes/URL (used_memory delta)", "less than scrapy-redis",
                          "bytes/URL (bits / 8)"], rows))
        out.append(f"\nThe filter: {memory['bloom_bits']:,} bits, {memory['bloom_hashes']} "
                   f"hashes, {memory['bloom_shards']} shard(s), filled in "
                   f"{memory['add_seconds']:.1f} s (`add_many`, batches of 10,000). Not "
                   f"counted above: the clients' op logs of their last round trip "
                   f"({memory['op_log_bytes']:,} bytes; an hour's TTL).")

        lo, hi = memory["fpr_ci95"]
        out.append(f"\n## d. False-positive rate at capacity\n\n"
                   f"Filled with {n:,} items (its capacity), probed with "
                   f"{memory['probes']:,} fresh items via `contains_many`.\n")
        out.append(table(
            ["configured p", "expected for these m, k, n", "measured", "95% interval",
             "false positives"],
            [[f"{ERROR_RATE}", f"{memory['fpr_expected']:.5f}", f"{memory['fpr']:.5f}",
              f"{lo:.5f} - {hi:.5f}",
              f"{memory['false_positives']:,} of {memory['probes']:,}"]]))

    rows = results.get("window")
    if rows:
        out.append(f"\n## d2. A recrawl window by arrival pattern\n\n{rows[0]['live']:,} "
                   f"fingerprints a window, p = {ERROR_RATE}, growth on. Bits: `MEMORY USAGE` "
                   "of every live slice key over the fingerprints added within the last "
                   "window. False negatives: live fingerprints answered new.\n")
        out.append(table(["engine", "pattern", "slices", "window (s)", "bits per live "
                          "fingerprint", "false-positive rate", "false negatives"], [[
                              r["engine"], r["pattern"], r["slices"], f"{r['window_s']:g}",
                              f"{r['bits']:.1f}", f"{r['fpr']:.5f} ({r['fp']:,} of "
                              f"{r['probes']:,})", f"{r['fn']} of {r['checked']:,}"
                              + (f" ({r['late']} slices late)" if r.get("late") else "")]
                          for r in rows]))

    races = results.get("race")
    if races:
        first = next(iter(races.values()))
        out.append(f"\n## e. {first['processes']} processes, the same {first['urls']:,} URLs "
                   "in the same order, at once\n\nA URL accepted by more than one process is "
                   "a duplicate crawl; a URL accepted by none is a lost page.\n")
        rows = []
        for name, r in races.items():
            lock = r["lock"]
            lock_text = (f"{lock.get('waits', 0):,.0f} / {lock.get('timeouts', 0):,.0f} / "
                         f"{lock.get('lost', 0):,.0f}" if lock and "lock mode" in name
                         else "-")
            rows.append([name, f"{r['duplicates']:,}", f"{r['lost']:,}",
                         f"{r['aggregate_rate']:,.0f}", f"{r['seconds']:.1f}", lock_text])
        out.append(table(["contender", "URLs accepted >1 time", "URLs never accepted",
                          "checks/s, all processes", "seconds", "lock waits / timeouts / lost"],
                         rows))

    crawl = results.get("e2e")
    if crawl is not None:
        out.append("\n## f. End-to-end crawl of the demo site\n")
        if isinstance(crawl, str):
            out.append(crawl)
        else:
            first = crawl[0]
            out.append(f"`example_project` (scrapy-redis shared queue), {first['workers']} "
                       f"`scrapy crawl` workers, {first['pages']:,} pages.\n")
            rows = []
            for r in crawl:
                per = r["dedup_cpu"] / r["pages"] * 1e6
                rows.append([r["name"], f"{r['pages_per_second']:,.0f}",
                             f"{r['dedup_cpu_share']:.1%}", f"{per:,.0f}",
                             f"{r['dedup_wall'] / r['worker_wall']:.1%}",
                             f"{r['dedup_calls']:,} / {r['dedup_requests']:,}",
                             f"{r['fetched_twice']}", f"{r['never_fetched']}",
                             f"{r['crawl_seconds']:.1f}",
                             f"{r.get('round_trips_per_page', 0):.2f}"])
            out.append(table(["contender", "pages/s", "dedup share of worker CPU",
                              "dedup CPU µs per page", "dedup share of worker wall time",
                              "dedup calls / requests", "pages fetched twice",
                              "pages never fetched", "crawl s",
                              "Redis round trips per page"], rows))

    targets = results.get("targets")
    if targets:
        out.append("\n## Targets\n")
        out.append(table(["target", "measured", "result"],
                         [[t["target"], t["measured"],
                           t["result"] if not quick else f"({t['result']}, quick run)"]
                          for t in targets]))
    return "\n".join(out) + "\n"


def judge(results: dict[str, Any]) -> list[dict[str, str]]:
    targets: list[dict[str, str]] = []

    def add(target: str, measured: str, ok: bool) -> None:
        targets.append({"target": target, "measured": measured, "result": "PASS" if ok else "FAIL"})

    memory = results.get("memory")
    if memory:
        bpu = memory["bloom_bytes_per_url"]
        add(f"memory ≤ 1.9 bytes/URL at p={ERROR_RATE}", f"{bpu:.3f}", bpu <= 1.9)
        add("memory ≥ 45x less than scrapy-redis (MEMORY USAGE of both keys)",
            f"{memory['ratio']:.1f}x", memory["ratio"] >= 45)
        delta_ratio = memory["set_used_memory_delta"] / memory["bloom_used_memory_delta"]
        add("memory ≥ 45x less than scrapy-redis (used_memory delta of both)",
            f"{delta_ratio:.1f}x", delta_ratio >= 45)
        lo, _hi = memory["fpr_ci95"]
        add(f"false-positive rate at capacity ≤ {ERROR_RATE} (95% interval reaches it)",
            f"{memory['fpr']:.5f}", lo <= ERROR_RATE)
    local = results.get("local")
    if local:
        sr = local[SCRAPY_REDIS.name]["rate"]
        mem = local[MEMORY.name]["rate"]

        def rel(c: Contender, base: float) -> float:
            return float(local[c.name]["rate"]) / base

        # The same targets a round trip per check (BLOOMDUPE_LOCAL_CACHE = 0).
        for name, c, floor in (("atomic", ATOMIC, 1.0), ("lock", LOCK, 0.85),
                               ("atomic, local cache off,", ATOMIC_UNCACHED, 1.0),
                               ("lock, local cache off,", LOCK_UNCACHED, 0.85)):
            add(f"{name} ≥ {floor}x scrapy-redis per request", f"{rel(c, sr):.2f}x",
                rel(c, sr) >= floor)
        for c in (BATCHED_LOCK, BATCHED_ATOMIC):
            add(f"{c.name} ≥ 2.5x scrapy-redis", f"{rel(c, sr):.2f}x", rel(c, sr) >= 2.5)
            add(f"{c.name} ≥ 0.7x Scrapy in-memory", f"{rel(c, mem):.2f}x", rel(c, mem) >= 0.7)
    latency = results.get("latency")
    if latency:
        for d in latency["delays"]:
            if d["delay_ms"] != 2.0:
                continue
            sr = d["results"][SCRAPY_REDIS.name]["rate"]
            for c in (BATCHED_LOCK, BATCHED_ATOMIC):
                x = d["results"][c.name]["rate"] / sr
                add(f"+2 ms round trip: {c.name} ≥ 20x scrapy-redis", f"{x:.1f}x", x >= 20)
    races = results.get("race")
    if races:
        for name, r in races.items():
            if name == SCRAPY_REDIS.name:
                continue
            add(f"{name}: 0 duplicates, 0 lost ({r['processes']} processes)",
                f"{r['duplicates']} / {r['lost']}", r["duplicates"] == 0 and r["lost"] == 0)
    crawl = results.get("e2e")
    if isinstance(crawl, list):
        for r in crawl:
            if r["name"] == SCRAPY_REDIS.name:
                continue
            add(f"e2e {r['name']}: every page fetched once",
                f"{r['fetched_twice']} twice / {r['never_fetched']} never",
                r["fetched_twice"] == 0 and r["never_fetched"] == 0)
    return targets


# -- main -----------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out",
                        help="directory for results.md and results.json")
    parser.add_argument("--only", default="local,latency,memory,window,race,e2e",
                        help="comma-separated sections to run (default: all)")
    parser.add_argument("--batch", type=int, default=50, help="batch size of batched mode")
    parser.add_argument("--e2e-pages", type=int, help="pages of the e2e crawl (0 skips it)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    size = QUICK if args.quick else FULL
    if args.e2e_pages is not None:
        size = Size(**{**size.__dict__, "e2e_pages": args.e2e_pages})
    sections = set(args.only.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"quick": args.quick, "size": size.__dict__, "batch": args.batch}
    with RedisServer() as server:
        direct = redis.Redis.from_url(server.url)
        results["machine"] = machine(server.url)
        progress(f"redis-server on {server.url}; results to {args.out}")
        stream, distinct = url_stream(size.requests, repeat=0.5)
        results["local_distinct"] = distinct

        if "local" in sections:
            progress(f"a. one process, local Redis: {len(ALL)} contenders x {size.requests:,} "
                     f"requests x {size.repeats}")
            results["local"] = throughput(ALL, server.url, direct, stream, size.repeats,
                                          args.batch, "local")

        if "latency" in sections:
            urls = stream[:size.latency_requests]
            delays = []
            base_rtt = measure_rtt(server.url)
            overhead = proxy_overhead(server.port, base_rtt)
            for delay in DELAYS_MS:
                setting = max(0.0, delay - overhead * 1000)
                with LatencyProxy(server.port, setting) as proxy:
                    rtt = measure_rtt(proxy.url)
                    progress(f"b. +{delay} ms (proxy delay {setting:.3f} ms; PING {rtt * 1e6:.0f} "
                             f"µs through the proxy, {base_rtt * 1e6:.0f} µs direct): "
                             f"{len(urls):,} requests x {size.latency_repeats}")
                    delays.append({
                        "delay_ms": delay, "proxy_delay_ms": setting, "rtt_us": rtt * 1e6,
                        "added_us": (rtt - base_rtt) * 1e6,
                        "results": throughput(REDIS_CONTENDERS, proxy.url, direct, urls,
                                              size.latency_repeats, args.batch,
                                              f"+{delay} ms",
                                              batched_repeats=size.batched_latency_repeats),
                    })
            results["latency"] = {"base_rtt_us": base_rtt * 1e6,
                                  "proxy_overhead_us": overhead * 1e6, "delays": delays}

        if "memory" in sections:
            progress(f"c/d. memory and false positives at {size.memory_urls:,} URLs")
            results["memory"] = memory_and_fpr(server.url, size.memory_urls, size.fpr_probes)

        if "race" in sections:
            race_urls, _ = url_stream(size.race_urls, repeat=0.0, seed=7)
            results["race"] = {}
            for contender in (SCRAPY_REDIS, LOCK, ATOMIC, BATCHED_LOCK, BATCHED_ATOMIC):
                progress(f"e. {size.race_processes} processes x {len(race_urls):,} URLs: "
                         f"{contender.name}")
                results["race"][contender.name] = race(contender, server.url, direct,
                                                       race_urls, size.race_processes,
                                                       args.batch)
        direct.close()

    if "window" in sections:  # both engines where RedisBloom is at hand (not --quick)
        module = redisbloom_module()
        with RedisServer(modules=[module] if module else [], maxmemory="2gb") as server:
            for engine_name in ("lua", native.NAME)[:2 if module and not args.quick else 1]:
                progress(f"d2. a window of {size.memory_urls // 10:,} by pattern, {engine_name}")
                results.setdefault("window", []).extend(window_patterns(  # probes: a tenth
                    server.url, size.memory_urls // 10, size.fpr_probes // 10, engine_name))

    if "e2e" in sections:
        if size.e2e_pages <= 0:
            results["e2e"] = "Skipped (quick run; `--e2e-pages N` runs it)."
        else:
            crawls = []
            # Persistence on, as the demo runs it (a shared crawl keeps state in Redis).
            with RedisServer(persist=True, extra=["--appendfsync", "everysec"]) as server:
                for contender, settings in E2E_CONTENDERS:
                    progress(f"f. crawl of {size.e2e_pages:,} pages by {size.e2e_workers} "
                             f"workers: {contender.name}")
                    r = e2e.crawl(contender.name, settings, redis_url=server.url,
                                  pages=size.e2e_pages, workers=size.e2e_workers, out=args.out)
                    progress(f"  {r['pages_per_second']:,.0f} pages/s, dedup "
                             f"{r['dedup_cpu_share']:.1%} of worker CPU")
                    crawls.append(r)
            results["e2e"] = crawls

    results["machine"]["load average at end (1/5/15 min)"] = " / ".join(
        f"{x:.2f}" for x in os.getloadavg())
    results["targets"] = judge(results)
    text = report(results, size, args.quick, args.batch)
    command = "python benchmarks/run.py" + (" --quick" if args.quick else "")
    text = f"# scrapy-bloomdupe benchmarks\n\nCommand: `{command}`\n\n" + text
    (args.out / "results.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    print(text)
    progress(f"done: {args.out / 'results.md'}")
    failed = [t for t in results["targets"] if t["result"] == "FAIL"]
    return 1 if args.strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
