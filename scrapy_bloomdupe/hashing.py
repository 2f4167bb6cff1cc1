"""Fingerprint to shard and bit positions: mmh3 128-bit, double hashing.

The 128-bit hash splits into two 64-bit halves h1 and h2. The shard is taken
from the high bits of h1 (h1 * shards >> 64), and the k bit offsets inside that
shard are g_i = (a + i*b + (i^3 - i)/6) mod m with a = h1 mod m and
b = 1 + h2 mod (m - 1): enhanced double hashing (Kirsch and Mitzenmacher 2006;
Dillinger and Manolios 2004), so all k bits of an item live in one shard and
one Redis command can check-and-add it. Plain double hashing (no cubic term)
lets two items with the same stride cover each other's runs: measured on a
small filter (m = 19,319 bits a shard, k = 20, full), it gave 14 times the
ideal false-positive rate; the cubic term cut that to 4 times, and the excess
shrinks as 1/m (at 1,000,000 URLs and p = 0.001 it is below 1e-8). m is prime
(see ``Sizing.modulus``) and b is never 0, so the stride has no short cycles.

Redis's Lua has only doubles, so the offsets are sent as the pair (a, b) and
expanded by the script: every intermediate value stays below 2**53 for
m <= 2**32 and k <= 1000. :func:`offsets` does the same expansion in Python,
for checks and tests.
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


def halves(fingerprint: bytes, seed: int) -> tuple[int, int]:
    """The two 64-bit halves of the item's mmh3 128-bit hash."""
    h = mmh3.hash128(fingerprint, seed, signed=False)
    return h & _MASK64, h >> 64


def shard_of(h1: int, shards: int) -> int:
    return (h1 * shards) >> 64


def start_and_stride(h1: int, h2: int, modulus: int) -> tuple[int, int]:
    """First offset and stride in a shard whose used bits number ``modulus`` (a prime).

    The stride is never 0, so with a prime modulus the k offsets are distinct.
    """
    return h1 % modulus, 1 + h2 % (modulus - 1)


def position(fingerprint: bytes, seed: int, shards: int, modulus: int) -> Position:
    """Shard and offset pair of ``fingerprint`` under the filter's ``seed``."""
    h1, h2 = halves(fingerprint, seed)
    return Position(shard_of(h1, shards), *start_and_stride(h1, h2, modulus))


def offsets(pos: Position, hashes: int, modulus: int) -> list[int]:
    """The ``hashes`` bit offsets of an item inside its shard (enhanced double hashing)."""
    return [(pos.a + i * pos.b + (i * i * i - i) // 6) % modulus for i in range(hashes)]
