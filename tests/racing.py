"""The 16-process races' plumbing (tests/faults/test_race.py, test_cluster_race.py): a
pool of spawned processes lined up at a barrier, and the fingerprints they race over.

Light on purpose: a spawned process imports this module (the pool's initializer and the
races live here and import only the filter; the cluster's race imports ``helpers`` for
its client), not ``helpers`` with Scrapy and Twisted. A pool of 16 started in 0.7 s on
1.3 CPU-seconds, against 6.8 s on 13.4 when its initializer was in ``helpers``; every
pytest-xdist worker that runs a race starts its own pool of each module."""

from __future__ import annotations

import hashlib
import math
import multiprocessing
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from scrapy_bloomdupe import sizing
from scrapy_bloomdupe.bloom.filter import BloomFilter

#: How long a pool's process waits for the others at the barrier (s).
BARRIER_TIMEOUT = 60.0

#: URLs the 16-process races check and add.
RACE_URLS = 20_000
#: Processes a race's pool holds.
RACE_WORKERS = 16


def acceptances(results: list[tuple[list[bool], dict[str, Any]]], urls: int) -> list[int]:
    """How many of a race's workers accepted each URL (each worker's result: its flags,
    one a URL, and its counters)."""
    accepted = [0] * urls
    for flags, _ in results:
        for i, flag in enumerate(flags):
            accepted[i] += flag
    return accepted


def totals(results: list[tuple[list[bool], dict[str, Any]]], *names: str) -> dict[str, int]:
    """The race's workers' counters ``names``, summed."""
    return {name: sum(c[name] for _, c in results) for name in names}


def false_positive_bound(plan: sizing.Sizing, items: int) -> tuple[float, float]:
    """The share of ``plan``'s bits set once ``items`` are in, and the bound on the chance
    that any of them was a false positive (a race's "each accepted once" then holds
    whatever the hashes did)."""
    fill = 1.0 - math.exp(-plan.hashes * items / plan.total_bits)
    return fill, items * fill**plan.hashes

_barrier: Any = None


def fp(prefix: str, n: int) -> bytes:
    """The fingerprint (SHA-1) of ``f"{prefix}{n}"``."""
    return hashlib.sha1(f"{prefix}{n}".encode()).digest()


def fps(n: int, prefix: str = "u") -> list[bytes]:
    """``n`` distinct fingerprints: those of ``prefix0`` ... ``prefix{n-1}``."""
    return [fp(prefix, i) for i in range(n)]


def race_fingerprints() -> list[bytes]:
    return fps(RACE_URLS, "https://example.com/page/")


def _init_worker(barrier: Any) -> None:
    global _barrier
    _barrier = barrier


def _ready(_: int) -> int:
    _barrier.wait(BARRIER_TIMEOUT)
    return os.getpid()


def barrier_wait() -> None:
    """In a :func:`spawn_pool` worker: wait until every worker of the pool is here."""
    _barrier.wait(BARRIER_TIMEOUT)


@contextmanager
def spawn_pool(workers: int) -> Iterator[Any]:
    """``workers`` spawned processes sharing a barrier (:func:`barrier_wait`).

    Every process is started and has imported before the pool is handed out: a
    task waits at the barrier until every process runs one, so they are
    ``workers`` distinct processes.
    """
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers)
    p = ctx.Pool(workers, initializer=_init_worker, initargs=(barrier,))
    try:
        pids = p.map(_ready, range(workers), chunksize=1)
        assert len(set(pids)) == workers, pids
        yield p
    finally:
        p.close()
        p.join()


# -- the races (each runs in a pool's process) -------------------------------------------


def _race_order(urls: int, seed: int | None) -> tuple[list[bytes], list[int]]:
    """The first ``urls`` race fingerprints and the order to add them in: shuffled
    (``seed``) or as they are. Made before the barriers, so that the race starts at once."""
    order = list(range(urls))
    if seed is not None:
        random.Random(seed).shuffle(order)
    return race_fingerprints()[:urls], order


def _add_all(bf: BloomFilter, fingerprints: list[bytes], order: list[int], batch: int
             ) -> bytes:
    """Check and add ``fingerprints`` in ``order``, one ``add`` a call (``batch`` 1) or
    ``add_many`` of ``batch``: one byte per fingerprint, 1 when this worker was told it
    was new."""
    new = bytearray(len(fingerprints))
    if batch == 1:
        for i in order:
            if bf.add(fingerprints[i]):
                new[i] = 1
        return bytes(new)
    for start in range(0, len(order), batch):
        chunk = order[start:start + batch]
        flags = bf.add_many([fingerprints[i] for i in chunk])
        for i, flag in zip(chunk, flags, strict=True):
            if flag:
                new[i] = 1
    return bytes(new)


def check_and_add(
    url: str, key: str, worker: int, shuffle: bool, use_lock: bool, batch: int, urls: int,
    capacity: int, error_rate: float, shards: int
) -> tuple[bytes, dict[str, Any]]:
    """One crawl worker, over the first ``urls`` fingerprints: returns one byte per
    fingerprint (1 = told new) and its counters.

    Runs in a pool process; the barrier (shared at the pool's start) lines the
    workers up before opening the filter and again before the first add.
    """
    fingerprints, order = _race_order(urls, 1_000 + worker if shuffle else None)
    client = redis.Redis.from_url(url)
    try:
        barrier_wait()
        bf = BloomFilter.open(
            client, key, sizing.plan(capacity, error_rate, shards=shards), use_lock=use_lock
        )
        try:
            barrier_wait()
            new = _add_all(bf, fingerprints, order, batch)
            c = bf.counters
            counters = {
                "checked": c.checked,
                "new": c.new,
                "duplicates": c.duplicates,
                "lock_acquired": c.lock.acquired,
                "lock_waits": c.lock.waits,
                "lock_timeouts": c.lock.timeouts,
                "lock_lost": c.lock.lost,
                "pid": os.getpid(),
            }
            return new, counters
        finally:
            bf.close()
    finally:
        client.close()


def race_worker(url: str, key: str, worker: int, shuffle: bool, use_lock: bool,
                capacity: int, error_rate: float, shards: int, batch: int
                ) -> tuple[bytes, dict[str, Any]]:
    """One crawl worker on the cluster: one byte per fingerprint (1 = told new), counters."""
    from helpers import cluster_client  # Scrapy's settings, as a crawl builds the client

    fingerprints, order = _race_order(RACE_URLS, 2_000 + worker if shuffle else None)
    client = cluster_client(url)
    try:
        barrier_wait()
        bf = BloomFilter.open(client, key,
                              sizing.plan(capacity, error_rate, shards=shards),
                              use_lock=use_lock)
        try:
            barrier_wait()
            new = _add_all(bf, fingerprints, order, batch)
            c = bf.counters
            link = bf.link.counters
            return new, {
                "checked": c.checked, "new": c.new, "lock_acquired": c.lock.acquired,
                "retries": link.retries if link else -1, "pid": os.getpid(),
            }
        finally:
            bf.close()
    finally:
        client.close()
