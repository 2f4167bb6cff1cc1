from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_bloomdupe import sizing
from scrapy_bloomdupe.exceptions import ConfigError

capacities = st.integers(min_value=1, max_value=10**10)
rates = st.floats(min_value=1e-9, max_value=0.5)


def test_known_values() -> None:
    # 1,000,000 items at 0.001: 14.38 bits (1.80 bytes) an item, 10 hashes.
    plan = sizing.plan(1_000_000, 0.001)
    assert plan.total_bits == 14_377_592
    assert plan.hashes == 10
    assert plan.shards == 1
    assert plan.total_bits / 8 / 1_000_000 == pytest.approx(1.797, abs=0.001)


@given(capacities, rates)
def test_plan_meets_error_rate_at_capacity(capacity: int, rate: float) -> None:
    plan = sizing.plan(capacity, rate, max_bytes=None, max_shards=None)
    expected = sizing.false_positive_rate(plan.total_bits, plan.hashes, capacity)
    # Rounding k to a whole number costs at most a few percent.
    assert expected <= rate * 1.05
    assert plan.bits_per_shard % 8 == 0
    assert plan.bits_per_shard <= sizing.DEFAULT_MAX_SHARD_BYTES * 8
    assert plan.total_bits >= sizing.optimal_bits(capacity, rate)
    # Never more than one byte a shard above the optimum.
    assert plan.total_bits - sizing.optimal_bits(capacity, rate) < 8 * plan.shards


@given(st.integers(min_value=2, max_value=2**32))
def test_modulus_is_the_largest_prime_at_most(n: int) -> None:
    p = sizing.largest_prime_at_most(n)
    assert p <= n and n - p < 400
    assert all(p % d for d in range(2, min(p, 2000)) if d * d <= p)


def test_known_primes() -> None:
    assert sizing.largest_prime_at_most(2**32) == 4_294_967_291
    assert sizing.largest_prime_at_most(19_320) == 19_319
    assert sizing.largest_prime_at_most(2) == 2
    assert [n for n in range(2, 60) if sizing._is_prime(n)] == [
        2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59]


@given(capacities, rates, st.integers(min_value=1024, max_value=2**29))
def test_shards_respect_the_size_ceiling(capacity: int, rate: float, max_bytes: int) -> None:
    plan = sizing.plan(capacity, rate, max_shard_bytes=max_bytes, max_bytes=None,
                       max_shards=None)
    assert plan.bytes_per_shard <= max(max_bytes, 1)
    # And no more shards than needed.
    if plan.shards > 1:
        assert plan.shards - 1 < sizing.optimal_bits(capacity, rate) / (max_bytes * 8)


@given(st.integers(min_value=1, max_value=10**7), st.integers(min_value=1, max_value=30),
       st.floats(min_value=0.0, max_value=0.95))
def test_estimate_inverts_expected_fill(items: int, hashes: int, _unused: float) -> None:
    bits = 64 * items
    expected_set = bits * (1 - math.exp(-hashes * items / bits))
    estimate = sizing.estimate_items(bits, hashes, round(expected_set))
    assert estimate == pytest.approx(items, rel=0.01, abs=2)


def test_estimate_of_a_full_filter_is_infinite() -> None:
    assert sizing.estimate_items(100, 3, 100) == math.inf


@pytest.mark.parametrize(
    ("kwargs", "setting"),
    [
        ({"capacity": 0, "error_rate": 0.01}, "BLOOMDUPE_CAPACITY"),
        ({"capacity": -5, "error_rate": 0.01}, "BLOOMDUPE_CAPACITY"),
        ({"capacity": 1.5, "error_rate": 0.01}, "BLOOMDUPE_CAPACITY"),
        ({"capacity": True, "error_rate": 0.01}, "BLOOMDUPE_CAPACITY"),
        ({"capacity": 10, "error_rate": 0}, "BLOOMDUPE_ERROR_RATE"),
        ({"capacity": 10, "error_rate": 1}, "BLOOMDUPE_ERROR_RATE"),
        ({"capacity": 10, "error_rate": -0.1}, "BLOOMDUPE_ERROR_RATE"),
        ({"capacity": 10, "error_rate": "0.1"}, "BLOOMDUPE_ERROR_RATE"),
        ({"capacity": 10, "error_rate": 0.1, "shards": 0}, "BLOOMDUPE_SHARDS"),
        ({"capacity": 10, "error_rate": 0.1, "max_shard_bytes": 0}, "BLOOMDUPE_MAX_SHARD_BYTES"),
        ({"capacity": 10, "error_rate": 0.1, "max_shard_bytes": 2**29 + 1},
         "BLOOMDUPE_MAX_SHARD_BYTES"),
        # 10**10 items at 0.001 need 1.4e11 bits: one shard would pass 2**32 bits.
        ({"capacity": 10**10, "error_rate": 0.001, "shards": 1, "max_bytes": None},
         "BLOOMDUPE_SHARDS"),
        # Past the limits on the whole filter and on the shard count.
        ({"capacity": 10**13, "error_rate": 0.001}, "BLOOMDUPE_CAPACITY"),
        ({"capacity": 10**7, "error_rate": 0.001, "shards": 10**6}, "BLOOMDUPE_SHARDS"),
        ({"capacity": 10**9, "error_rate": 0.001, "max_shard_bytes": 1024},
         "BLOOMDUPE_MAX_SHARD_BYTES"),
        ({"capacity": 10, "error_rate": 0.1, "max_bytes": 0}, "BLOOMDUPE_MAX_BYTES"),
        ({"capacity": 10, "error_rate": 0.1, "max_shards": -1}, "BLOOMDUPE_MAX_SHARDS"),
        ({"capacity": 10, "error_rate": 0.1, "max_shards": True}, "BLOOMDUPE_MAX_SHARDS"),
    ],
)
def test_invalid_inputs_name_the_setting(kwargs: dict[str, object], setting: str) -> None:
    with pytest.raises(ConfigError) as info:
        sizing.plan(**kwargs)  # type: ignore[arg-type]
    assert info.value.setting == setting
    assert str(info.value).startswith(setting + "=")


def test_the_whole_filter_is_capped_by_max_bytes() -> None:
    # 10**13 items at 0.001 are 16.3 TiB: refused, naming what to change.
    with pytest.raises(ConfigError) as info:
        sizing.plan(10**13, 0.001)
    message = str(info.value)
    assert info.value.setting == "BLOOMDUPE_CAPACITY"
    assert "16.3 TiB" in message and "BLOOMDUPE_MAX_BYTES=4294967296 (4 GiB)" in message
    assert "Lower BLOOMDUPE_CAPACITY" in message
    # Just under the default limit is fine; the limit can be raised, or lifted.
    assert sizing.plan(2_000_000_000, 0.001).total_bytes <= sizing.DEFAULT_MAX_BYTES
    big = sizing.plan(10**10, 0.001, max_bytes=20 * 1024**3)
    assert big.total_bytes > sizing.DEFAULT_MAX_BYTES and big.max_bytes == 20 * 1024**3
    assert sizing.plan(10**10, 0.001, max_bytes=None).max_bytes is None
    with pytest.raises(ConfigError, match="BLOOMDUPE_MAX_BYTES=1000"):
        sizing.plan(10_000, 0.001, max_bytes=1000)


def test_the_shard_count_is_capped() -> None:
    with pytest.raises(ConfigError) as info:
        sizing.plan(10_000_000, 0.001, shards=10**6)
    assert info.value.setting == "BLOOMDUPE_SHARDS"
    assert "BLOOMDUPE_MAX_SHARDS=4096" in str(info.value)
    assert sizing.plan(10_000_000, 0.001, shards=4096).shards == 4096
    assert sizing.plan(10_000_000, 0.001, shards=5000, max_shards=5000).shards == 5000
    # Shards chosen from BLOOMDUPE_MAX_SHARD_BYTES count too.
    with pytest.raises(ConfigError) as info:
        sizing.plan(100_000_000, 0.001, max_shard_bytes=1024)
    assert info.value.setting == "BLOOMDUPE_MAX_SHARD_BYTES"
    assert "BLOOMDUPE_MAX_SHARDS" in str(info.value)


def test_the_limit_is_no_stored_parameter() -> None:
    # Workers with other limits share a filter: the limit takes no part in comparisons.
    assert sizing.plan(1000, 0.01, max_bytes=10**6) == sizing.plan(1000, 0.01, max_bytes=None)
    first = sizing.plan(1000, 0.01, max_bytes=10**6)
    assert sizing.generation(first, 3).max_bytes == 10**6
    assert sizing.total_bytes(first, 1) == first.total_bytes == first.bytes_per_shard
    assert sizing.total_bytes(first, 3) == sum(
        sizing.generation(first, g).total_bytes for g in range(3))


def test_human_bytes() -> None:
    assert [sizing.human_bytes(n) for n in (17, 1536, 64 * 1024**2, 4 * 1024**3)] == [
        "17 B", "1.5 KiB", "64 MiB", "4 GiB"]
