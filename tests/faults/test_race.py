"""16 processes check-and-add the same 20,000 URLs: each must be accepted exactly once.

Every worker is a separate OS process with its own Redis client and its own
:class:`BloomFilter` on the same key, as the workers of a distributed crawl
are. They open the filter at the same moment (racing its creation), then all
check-and-add the same fingerprints, either each in its own random order or
all in the identical order (the order in which a non-atomic GETBIT-then-SETBIT
filter accepts thousands of duplicates), in lock mode and in atomic mode, one
``add`` a call or ``add_many`` in batches of 100. Each reports the fingerprints
it was told were new; the union must be every fingerprint exactly once.

False positives. A fingerprint that nobody is told is new ("never accepted")
is also what a Bloom-filter false positive looks like: all its bits set by
other items before anyone added it. The filter is sized so that this chance is
negligible: capacity 10,000,000 at error rate 0.01 gives m = 95,850,624 bits
(8 shards of 11,981,328) and k = 7 hashes. With at most n = 20,000 items in
it, the share of bits set is 1 - exp(-k n / m) = 0.00146, so one lookup is a
false positive with probability at most 0.00146 ** 7 = 1.4e-20, and the chance
that any of the 20,000 items is one is below 20,000 * 1.4e-20 = 2.8e-16 per
run (the first test recomputes this bound from the real sizing). A missing
fingerprint here is therefore a lost URL, not bad luck. (k = 7 rather than the
k = 20 of error rate 1e-6: the check-and-add costs Redis about 2 us per hash,
and 16 x 20,000 checks a case must fit the time budget.)

Runtime. A single ``add`` costs the client about 80 us of Python, so 16 x
20,000 single adds take 20-40 s on two cores. By default the single-add path
runs in one combination (lock mode, identical order: every worker hits the
same shard lock at the same moment), over the first 5,000 URLs; all 20,000 and
the other three single-add combinations run when ``BLOOMDUPE_RACE_FULL=1`` is
set. All four ``add_many`` combinations always run, over all 20,000.

Growth. 6 processes add the same 12,000 items to a filter sized for 2,000, so
it grows twice while they race (``test_race_while_growing``): each item is
still accepted exactly once.
"""

from __future__ import annotations

import multiprocessing
import os
import random
from typing import Any

import pytest
import redis
from helpers import first_plan, fps
from racing import (
    RACE_URLS,
    RACE_WORKERS,
    acceptances,
    check_and_add,
    false_positive_bound,
    race_fingerprints,
    totals,
)

from scrapy_bloomdupe import sizing
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.bloom.native import NativeEngine

pytestmark = pytest.mark.slow

WORKERS = RACE_WORKERS
URLS = RACE_URLS
BATCH = 100
CAPACITY = 10_000_000
ERROR_RATE = 0.01
SHARDS = 8
TASK_TIMEOUT = 120.0


# Every test here runs on both engines (``engine_url``: the session's plain Redis, then
# the one with RedisBloom, where ``BLOOMDUPE_ENGINE = "auto"`` picks the native engine).


def test_false_positives_are_negligible_for_the_race_assertion() -> None:
    plan = sizing.plan(CAPACITY, ERROR_RATE, shards=SHARDS)
    fill, bound = false_positive_bound(plan, URLS)
    assert bound < 1e-15, (
        f"m={plan.total_bits} k={plan.hashes}: fill {fill:.4f} at {URLS} items, "
        f"P(any false positive) <= {bound:.3g}"
    )


FULL = os.environ.get("BLOOMDUPE_RACE_FULL") == "1"
full_only = pytest.mark.skipif(
    not FULL, reason="16 x 20,000 single adds take 20-40 s; set BLOOMDUPE_RACE_FULL=1"
)
#: The single adds' one default combination races over a quarter of the URLs (each of
#: its 80,000 adds still contends for one shard lock with 15 others): 16 x 20,000 took
#: about 60 CPU-seconds, the most of any test. All 20,000 with BLOOMDUPE_RACE_FULL=1.
SINGLE_URLS = URLS if FULL else URLS // 4

CASES = [
    # (use_lock, shuffle, batch, urls)
    pytest.param(True, True, BATCH, URLS, id="lock-random-add_many"),
    pytest.param(True, False, BATCH, URLS, id="lock-identical-add_many"),
    pytest.param(False, True, BATCH, URLS, id="atomic-random-add_many"),
    pytest.param(False, False, BATCH, URLS, id="atomic-identical-add_many"),
    pytest.param(True, False, 1, SINGLE_URLS, id="lock-identical-add"),
    pytest.param(True, True, 1, URLS, id="lock-random-add", marks=full_only),
    pytest.param(False, True, 1, URLS, id="atomic-random-add", marks=full_only),
    pytest.param(False, False, 1, URLS, id="atomic-identical-add", marks=full_only),
]


@pytest.mark.parametrize(("use_lock", "shuffle", "batch", "urls"), CASES)
def test_every_url_accepted_exactly_once(
    pool: Any, engine_url: str, engine: str, use_lock: bool, shuffle: bool, batch: int,
    urls: int
) -> None:
    if engine != "lua" and batch == 1 and not FULL:
        pytest.skip("single adds race on the Lua engine only, unless BLOOMDUPE_RACE_FULL=1: "
                    "they are the client's cost, the same for both engines")
    key = "race"
    jobs = [
        pool.apply_async(check_and_add, (engine_url, key, w, shuffle, use_lock, batch, urls,
                                         CAPACITY, ERROR_RATE, SHARDS))
        for w in range(WORKERS)
    ]
    results = [job.get(TASK_TIMEOUT) for job in jobs]

    accepted = acceptances(results, urls)
    twice = sum(1 for a in accepted if a > 1)
    never = sum(1 for a in accepted if a == 0)
    extra = sum(a - 1 for a in accepted if a > 1)
    per_worker_new = [c["new"] for _, c in results]
    summed = totals(results, "checked", "new", "duplicates", "lock_acquired", "lock_waits",
                    "lock_timeouts", "lock_lost")
    figures = (
        f"{WORKERS} workers x {urls} URLs, lock={use_lock} shuffle={shuffle} batch={batch}: "
        f"{twice} accepted more than once ({extra} extra acceptances), {never} never accepted; "
        f"new per worker {per_worker_new}; totals {summed}"
    )
    assert len({c["pid"] for _, c in results}) == WORKERS, figures
    assert twice == 0, figures
    assert never == 0, figures
    assert summed["checked"] == WORKERS * urls, figures
    assert summed["new"] == urls, figures
    assert summed["duplicates"] == (WORKERS - 1) * urls, figures
    if use_lock:
        # Lock mode really went through the shard locks; atomic mode never touched them.
        assert summed["lock_acquired"] > 0, figures
    else:
        assert summed["lock_acquired"] == 0, figures

    # Afterwards the filter holds every URL: a 17th worker is told all are seen.
    client = redis.Redis.from_url(engine_url)
    try:
        bf = BloomFilter.open(client, key, sizing.plan(CAPACITY, ERROR_RATE, shards=SHARDS))
        try:
            assert bf.engine_name == engine
            fingerprints = race_fingerprints()[:urls]
            assert all(bf.contains_many(fingerprints)), figures
            again = sum(bf.add_many(fingerprints[:1000]))
            assert again == 0, f"{again} of 1000 re-added URLs reported new; {figures}"
        finally:
            bf.close()
    finally:
        client.close()


# -- racing while the filter grows ------------------------------------------------------


def growing_worker(url: str, items: list[bytes], seed: int, use_lock: bool,
                   out: multiprocessing.Queue[list[int]]) -> None:
    client = redis.Redis.from_url(url)
    bf = BloomFilter.open(client, "race", first_plan(2_000, 1e-12), growth=True,
                          use_lock=use_lock)
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    accepted = []
    for i in range(0, len(order), 50):
        chunk = order[i:i + 50]
        for index, new in zip(chunk, bf.add_many([items[j] for j in chunk]), strict=True):
            if new:
                accepted.append(index)
    out.put(accepted)
    client.close()


@pytest.mark.parametrize("use_lock", [True, False], ids=["lock", "atomic"])
def test_race_while_growing(engine_url: str, engine: str, use_lock: bool) -> None:
    """6 processes add the same 12,000 items to a filter sized for 2,000: it grows
    twice while they race. Each item is accepted exactly once.

    A false positive would show as "never accepted", so the filter is sized at
    1e-12: small shards (57,000 bits) raise double hashing's rate above the
    ideal (see hashing.py), but a simulation of this geometry found no false
    positive in 3,000,000 probes, against the 12,000 x 2 full generations
    probed here.

    RedisBloom hashes with plain double hashing (a + i*b mod m, m a multiple of
    64), whose floor on shards this small is far above 1e-12: an item whose
    stride b shares most of m's factors has a handful of distinct bits (in
    about 1 run in 15 of this test, one item was never accepted). So on the
    native engine an item never accepted is allowed only when it is proven a
    false positive: RedisBloom counts the items it inserted, and that count
    must equal the acceptances (an item inserted but answered "seen", a lost
    URL, would make it larger)."""
    if not FULL and (engine == "lua") != use_lock:
        pytest.skip("growth races on the Lua engine under the lock and on RedisBloom "
                    "atomic (each mode, each engine); the other two (25-90 s each) with "
                    "BLOOMDUPE_RACE_FULL=1")
    items = fps(12_000, "race")
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[list[int]] = ctx.Queue()
    procs = [ctx.Process(target=growing_worker, args=(engine_url, items, seed, use_lock, out))
             for seed in range(6)]
    for proc in procs:
        proc.start()
    accepted = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    counts = [0] * len(items)
    for worker in accepted:
        for index in worker:
            counts[index] += 1
    assert max(counts) == 1, "accepted twice"
    client = redis.Redis.from_url(engine_url)
    assert int(client.hget("race:meta", "generations")) >= 3
    if engine == "lua":
        assert counts.count(0) == 0, "never accepted"
    else:
        bf = BloomFilter.open(client, "race", None, read_only=True)
        assert isinstance(bf.engine, NativeEngine)
        inserted = sum(sum(bf.engine.inserted(g)) for g in range(len(bf.generations)))
        accepted_total = sum(len(worker) for worker in accepted)
        figures = f"{counts.count(0)} never accepted, {inserted} inserted, {accepted_total}"
        assert inserted == accepted_total, f"lost URLs: {figures}"
        assert counts.count(0) <= 5, f"too many false positives: {figures}"
    client.close()
