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
    plan = sizing.plan(capacity, rate)
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
    plan = sizing.plan(capacity, rate, max_shard_bytes=max_bytes)
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
        ({"capacity": 10**10, "error_rate": 0.001, "shards": 1}, "BLOOMDUPE_SHARDS"),
    ],
)
def test_invalid_inputs_name_the_setting(kwargs: dict[str, object], setting: str) -> None:
    with pytest.raises(ConfigError) as info:
        sizing.plan(**kwargs)  # type: ignore[arg-type]
    assert info.value.setting == setting
    assert str(info.value).startswith(setting + "=")
