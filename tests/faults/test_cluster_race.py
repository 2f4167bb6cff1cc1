"""16 processes check-and-add the same 20,000 URLs on a Redis Cluster, each accepted once.

As in tests/faults/test_race.py (whose fingerprints and false-positive bound are
reused), through cluster clients built from Scrapy settings, on the session's
local cluster (3 masters, 3 replicas; ``local_cluster`` in tests/conftest.py),
in lock mode and in atomic mode.
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import CLUSTER_SHARDS, cluster_client
from racing import (
    RACE_URLS,
    RACE_WORKERS,
    acceptances,
    false_positive_bound,
    race_fingerprints,
    race_worker,
    totals,
)

from scrapy_bloomdupe import sizing
from scrapy_bloomdupe.bloom.filter import BloomFilter

WORKERS = RACE_WORKERS
URLS = RACE_URLS
SHARDS = CLUSTER_SHARDS
RACE_BATCH = 100
RACE_CAPACITY = 10_000_000
RACE_ERROR_RATE = 0.01
TASK_TIMEOUT = 120.0


def test_false_positives_are_negligible_for_the_cluster_race() -> None:
    _, bound = false_positive_bound(
        sizing.plan(RACE_CAPACITY, RACE_ERROR_RATE, shards=SHARDS), URLS)
    assert bound < 1e-15, bound


@pytest.mark.slow
@pytest.mark.parametrize(("use_lock", "shuffle"), [
    pytest.param(True, False, id="lock-identical-add_many"),
    pytest.param(False, True, id="atomic-random-add_many"),
])
def test_every_url_accepted_exactly_once_on_a_cluster(
    pool: Any, engine_cluster_url: str, engine: str, use_lock: bool, shuffle: bool,
) -> None:
    cluster_url = engine_cluster_url
    jobs = [pool.apply_async(race_worker, (cluster_url, "race", w, shuffle, use_lock,
                                           RACE_CAPACITY, RACE_ERROR_RATE, SHARDS, RACE_BATCH))
            for w in range(WORKERS)]
    results = [job.get(TASK_TIMEOUT) for job in jobs]
    accepted = acceptances(results, URLS)
    twice = sum(1 for a in accepted if a > 1)
    never = sum(1 for a in accepted if a == 0)
    summed = totals(results, "checked", "new", "lock_acquired", "retries")
    figures = (f"{WORKERS} workers x {URLS} URLs on 3 masters, lock={use_lock} "
               f"shuffle={shuffle}: {twice} accepted more than once, {never} never accepted; "
               f"totals {summed}")
    assert len({c["pid"] for _, c in results}) == WORKERS, figures
    assert twice == 0, figures
    assert never == 0, figures
    assert summed["checked"] == WORKERS * URLS, figures
    assert summed["new"] == URLS, figures
    assert (summed["lock_acquired"] > 0) == use_lock, figures
    assert summed["retries"] == 0, figures
    client = cluster_client(cluster_url)
    try:
        bf = BloomFilter.open(client, "race", None)
        assert bf.engine_name == engine
        assert all(bf.contains_many(race_fingerprints())), figures
        bf.close()
    finally:
        client.close()
