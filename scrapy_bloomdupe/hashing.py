"""Fingerprint to shard and bit positions: mmh3 128-bit, triple hashing.

The hash splits into 64-bit halves h1, h2. The shard comes from h1's high bits
(h1 * shards >> 64), so an item's k bits share one shard and one command checks-and-adds it.
In a shard of m used bits (a prime, ``Sizing.modulus``) the offsets are

    g_i = (a + i*b + c*(i^3 - i)/6) mod m,    i < k,

with a = h1 mod m and b, c the two lowest base-(m - 1) digits of h2, plus one (never 0).
Beyond double hashing, c keeps items of equal stride from covering each other's runs and
lowers the floor of whole-pattern collisions from about n/m^2 to n/m^3; both matter only
for small filters with tiny rates (docs/architecture.md).

The client expands (a, b, c) into offsets (:func:`offsets`) and sends them as strings:
Redis converts every Lua number ``redis.call`` argument to a string, which costs more.
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
    """An item's name where one is needed (RedisBloom's ``BF.*``, ``bloomdupe forget``'s
    set): its seeded 128-bit hash, 16 bytes."""
    return (h1 | h2 << 64).to_bytes(16, "little")
