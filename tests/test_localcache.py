"""The local cache (localcache.py): bounded, keeps what is hot, answers from memory."""

from __future__ import annotations

import pytest

from scrapy_bloomdupe.localcache import LocalCache


def test_remembers_what_it_is_given() -> None:
    cache = LocalCache(10)
    cache.update([b"a", b"b"])
    assert b"a" in cache and b"b" in cache and b"c" not in cache
    assert len(cache) == 2


def test_off_at_size_zero() -> None:
    cache = LocalCache(0)
    cache.update([b"a"])
    assert b"a" not in cache and len(cache) == 0


def test_bounded_by_its_size() -> None:
    cache = LocalCache(100)
    cache.update(str(i).encode() for i in range(10_000))
    assert len(cache) <= 100


def test_a_hit_in_the_older_half_is_kept() -> None:
    cache = LocalCache(4)  # halves of 2
    cache.update([b"hot", b"x"])  # now the older half
    assert b"hot" in cache  # moved to the younger half
    cache.update([b"y"])  # the younger half fills: the older one (x) goes
    assert b"hot" in cache
    assert b"x" not in cache


def test_clear_and_a_negative_size() -> None:
    cache = LocalCache(10)
    cache.update([b"a"])
    cache.clear()
    assert b"a" not in cache
    with pytest.raises(ValueError):
        LocalCache(-1)
