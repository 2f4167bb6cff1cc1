"""Bloom-filter arithmetic: sizes from capacity and error rate, and estimates.

Pure functions, no I/O. Formulas (n items, m bits, k hashes, p error rate):
m = -n ln p / (ln 2)^2, k = (m / n) ln 2, p(n) = (1 - e^(-k n / m))^k, and the
item count estimated from X set bits, n* = -(m / k) ln(1 - X / m)
(Swamidass and Baldi, 2007).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .exceptions import ConfigError

#: Redis strings hold at most 512 MiB, that is 2**32 bits.
REDIS_MAX_STRING_BITS = 2**32
#: Default ceiling for one shard: 64 MiB, an eighth of Redis's string limit,
#: small enough to spread over the masters of a cluster.
DEFAULT_MAX_SHARD_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Sizing:
    """The shape of one filter: how many bits, hashes and shards."""

    capacity: int
    error_rate: float
    shards: int
    bits_per_shard: int
    hashes: int

    @property
    def total_bits(self) -> int:
        return self.shards * self.bits_per_shard

    @property
    def bytes_per_shard(self) -> int:
        return self.bits_per_shard // 8


def optimal_bits(capacity: int, error_rate: float) -> int:
    """Bits needed for ``capacity`` items at false-positive rate ``error_rate``."""
    return math.ceil(-capacity * math.log(error_rate) / (math.log(2) ** 2))


def optimal_hashes(bits: int, capacity: int) -> int:
    """Number of hash functions that minimises the false-positive rate."""
    return max(1, round(bits / capacity * math.log(2)))


def plan(
    capacity: int,
    error_rate: float,
    shards: int | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> Sizing:
    """Size a filter, validating every input.

    The shard count is ``shards`` when given, otherwise the smallest count that
    keeps every shard at or under ``max_shard_bytes``. Each shard is a whole
    number of bytes, so the filter may have a few bits more than the optimum.
    """
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        raise ConfigError("BLOOMDUPE_CAPACITY", capacity, "must be a whole number above 0")
    if (
        isinstance(error_rate, bool)
        or not isinstance(error_rate, (int, float))
        or not 0 < error_rate < 1
    ):
        raise ConfigError(
            "BLOOMDUPE_ERROR_RATE", error_rate, "must be a number between 0 and 1, exclusive"
        )
    if (
        isinstance(max_shard_bytes, bool)
        or not isinstance(max_shard_bytes, int)
        or max_shard_bytes <= 0
    ):
        raise ConfigError(
            "BLOOMDUPE_MAX_SHARD_BYTES", max_shard_bytes, "must be a whole number above 0"
        )
    if max_shard_bytes * 8 > REDIS_MAX_STRING_BITS:
        raise ConfigError(
            "BLOOMDUPE_MAX_SHARD_BYTES",
            max_shard_bytes,
            "is over Redis's 512 MiB (536870912 bytes) string limit",
        )
    bits = optimal_bits(capacity, error_rate)
    hashes = optimal_hashes(bits, capacity)
    if shards is None:
        shards = max(1, math.ceil(bits / (max_shard_bytes * 8)))
    elif isinstance(shards, bool) or not isinstance(shards, int) or shards <= 0:
        raise ConfigError("BLOOMDUPE_SHARDS", shards, "must be a whole number above 0")
    bits_per_shard = math.ceil(bits / shards / 8) * 8
    if bits_per_shard > REDIS_MAX_STRING_BITS:
        raise ConfigError(
            "BLOOMDUPE_SHARDS",
            shards,
            f"gives {bits_per_shard} bits a shard, over Redis's limit of 2**32 bits; "
            f"use at least {math.ceil(bits / REDIS_MAX_STRING_BITS)} shards",
        )
    return Sizing(capacity, float(error_rate), shards, bits_per_shard, hashes)


def false_positive_rate(bits: int, hashes: int, items: float) -> float:
    """Expected false-positive rate of a filter of ``bits`` holding ``items``."""
    if items <= 0:
        return 0.0
    return float((1.0 - math.exp(-hashes * items / bits)) ** hashes)


def estimate_items(bits: int, hashes: int, set_bits: int) -> float:
    """Estimated number of items in a filter from its count of set bits."""
    if set_bits >= bits:
        return math.inf
    return -bits / hashes * math.log1p(-set_bits / bits)


def fill_false_positive_rate(fill_ratio: float, hashes: int) -> float:
    """False-positive rate now, from the share of bits set (a probe hits k set bits)."""
    return float(fill_ratio**hashes)
