"""Fingerprint to shard and bit positions: mmh3 128-bit, triple hashing.

The 128-bit hash splits into two 64-bit halves h1 and h2. The shard is taken
from the high bits of h1 (h1 * shards >> 64), so all k bits of an item live in
one shard and one Redis command can check-and-add it. Inside the shard, whose
used bits number a prime m (see ``Sizing.modulus``), the k offsets are

    g_i = (a + i*b + c*(i^3 - i)/6) mod m,    i < k,

with a = h1 mod m, and b and c the two lowest base-(m - 1) digits of h2, plus
one (never 0). This extends double hashing (Kirsch and Mitzenmacher 2006;
Dillinger and Manolios 2004) because of two measured failures:

* Plain double hashing (a + i*b) lets items with the same stride cover each
  other's runs: on a small filter (m = 19,319 bits a shard, k = 20, full) it
  gave 14 times the ideal false-positive rate.
* With only (a, b) there are m(m - 1) offset patterns, so an item whose pair
  equals an inserted item's is always a false positive: a floor of about n/m^2
  (measured 6e-7 on 57,731-bit shards at a configured 1e-12). The third
  coefficient c lowers that floor to about n/m^3.

At real sizes both effects are far below the configured rate (n/m^2 is 5e-9 at
1,000,000 URLs and 0.001); they matter for small filters with tiny rates.

The client expands (a, b, c) into the k offsets (:func:`offsets`) and sends them
to the check-and-add script as strings: Redis converts a Lua number to a string
for every ``redis.call`` argument, which costs more than the client's work.
"""

from __future__ import annotations

from typing import NamedTuple

import mmh3

_MASK64 = (1 << 64) - 1


class Position(NamedTuple):
    """Where an item's bits live: its shard, and the three offset coefficients in it."""

    shard: int
    a: int
    b: int
    c: int


def halves(fingerprint: bytes, seed: int) -> tuple[int, int]:
    """The two 64-bit halves of the item's mmh3 128-bit hash."""
    h = mmh3.hash128(fingerprint, seed, signed=False)
    return h & _MASK64, h >> 64


def shard_of(h1: int, shards: int) -> int:
    return (h1 * shards) >> 64


def coefficients(h1: int, h2: int, modulus: int) -> tuple[int, int, int]:
    """(a, b, c) of an item in a shard whose used bits number ``modulus`` (a prime)."""
    digits, b = divmod(h2, modulus - 1)
    return h1 % modulus, 1 + b, 1 + digits % (modulus - 1)


def offsets(pos: Position, hashes: int, modulus: int) -> list[int]:
    """The ``hashes`` bit offsets of an item inside its shard."""
    a, b, c = pos.a, pos.b, pos.c
    return [(a + i * b + c * ((i * i * i - i) // 6)) % modulus for i in range(hashes)]


def keyed_item(h1: int, h2: int) -> bytes:
    """An item as the filter names it where a name is needed (RedisBloom's ``BF.*``, the
    forgotten set of ``bloomdupe forget``): its seeded 128-bit hash, 16 bytes."""
    return (h1 | h2 << 64).to_bytes(16, "little")
