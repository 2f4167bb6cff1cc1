"""Fingerprint to shard and bit positions: mmh3 128-bit, double hashing.

The 128-bit hash splits into two 64-bit halves h1 and h2. The shard is taken
from the high bits of h1 (h1 * shards >> 64), and the k bit offsets inside that
shard are g_i = (h1 + i * h2) mod m (Kirsch and Mitzenmacher, 2006), so all k
bits of an item live in one shard and one Redis command can check-and-add it.

Redis's Lua has only doubles, so the offsets are sent as the pair
(h1 mod m, h2 mod m) and expanded by the script: every intermediate value stays
below 2**53 for m <= 2**32 and k <= 2**20. :func:`offsets` does the same
expansion in Python, for checks and tests.
"""

from __future__ import annotations

from typing import NamedTuple

import mmh3

_MASK64 = (1 << 64) - 1


class Position(NamedTuple):
    """Where an item's bits live: its shard, and the two offset seeds in it."""

    shard: int
    a: int
    b: int


def position(fingerprint: bytes, seed: int, shards: int, bits_per_shard: int) -> Position:
    """Shard and offset pair of ``fingerprint`` under the filter's ``seed``."""
    h = mmh3.hash128(fingerprint, seed, signed=False)
    h1 = h & _MASK64
    h2 = h >> 64
    return Position((h1 * shards) >> 64, h1 % bits_per_shard, h2 % bits_per_shard)


def offsets(pos: Position, hashes: int, bits_per_shard: int) -> list[int]:
    """The ``hashes`` bit offsets of an item inside its shard."""
    return [(pos.a + i * pos.b) % bits_per_shard for i in range(hashes)]
