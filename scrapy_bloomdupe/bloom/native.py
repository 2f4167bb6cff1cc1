"""The native engine: each shard is a RedisBloom filter, checked and added with ``BF.*``.

For servers with the Bloom commands (Redis 8, Redis Stack, RedisBloom loaded). One ``BF`` key
per shard and generation (``keys.bloom``) in the shard's hash tag, run inside the same kind
of script as the Lua engine: op log replay (:mod:`.oplog`), fence (:mod:`.lock`), body, record.

* **Keyed items.** ``BF.*`` hashes with a fixed seed, so the item is the 16-byte seeded mmh3
  hash of the fingerprint, never the fingerprint (a hostile site could aim at chosen bits).
* **A missing shard is lost state,** never re-created (``SHARD_MISSING``, then
  :class:`~scrapy_bloomdupe.exceptions.FilterLostError`).
* **Growth** is this package's generations, each shard ``NONSCALING``: RedisBloom's own
  scaling reserves its first layer at half the error rate, taking more memory.
* **Headroom.** Each shard is reserved for :data:`HEADROOM` more items than its share (shards
  fill unevenly), at the rate that gives the Lua engine's bits; an item past it is refused
  (``'F'``) rather than raising the rate, and the front grows the filter.
* **Hashing** is RedisBloom's double hashing, whose floor (:mod:`scrapy_bloomdupe.hashing`)
  is far below the configured rate at real shard sizes."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import hashing, keys, luascript, sizing
from ..exceptions import ConfigError, FilterLostError, FilterMismatchError
from ..transport.diagnose import describe
from .engine import ScriptedEngine
from .info import ShardInfo
from .lua import _pipelined, check_room

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

    from ..transport.link import Link

logger = logging.getLogger(__name__)

NAME = "redisbloom"
#: Items a shard's filter takes past its share of the capacity before it refuses more.
HEADROOM = 0.1
_LN2 = math.log(2)


@dataclass(frozen=True)
class Reserve:
    """A shard's ``BF.RESERVE`` (capacity, error rate) and RedisBloom's bits and hashes."""

    capacity: int
    error_rate: float
    bits: int
    hashes: int


def reserve_of(plan: sizing.Sizing) -> Reserve:
    """The ``BF.RESERVE`` of a shard of ``plan``: :data:`HEADROOM` more items at the rate
    that gives RedisBloom (bits = capacity * -ln(rate) / ln(2)^2) the plan's bits."""
    capacity = math.ceil(math.ceil(plan.capacity / plan.shards) * (1 + HEADROOM))
    per_item = plan.bits_per_shard / capacity
    return Reserve(capacity, math.exp(-per_item * _LN2 * _LN2), plan.bits_per_shard,
                   math.ceil(_LN2 * per_item))


#: What ``BF.*`` is given for an item: its seeded 128-bit hash, 16 bytes.
item = hashing.keyed_item


def available(client: Redis | RedisCluster, key: str, *, required: bool = False) -> bool:
    """Whether the server of ``key``'s shard 0 has ``BF.*`` and this user may run them. With
    ``required``, an ACL denying them is a :class:`ConfigError` naming the rule to add."""
    server: Any = client
    try:
        server.execute_command("BF.EXISTS", keys.bloom(key, 0), b"probe")
    except NoPermissionError as e:
        if required:
            raise ConfigError(
                "BLOOMDUPE_ENGINE", NAME,
                f"Redis at {describe(client)} refuses this user BF.EXISTS ({e}). Add "
                "+bf.reserve +bf.insert +bf.mexists +bf.exists +bf.info to its ACL "
                "(docs/security.md, the native engine's rules)",
            ) from None
        return False
    except ResponseError as e:
        text = str(e).lower()
        if "unknown command" in text:
            return False
        if "wrongtype" in text or "not found" in text:
            return True
        raise
    except RedisError as e:
        # redis-py's cluster client refuses a command missing from the server's COMMAND.
        if "doesn't exist" in str(e) and not isinstance(e, (RedisConnectionError,
                                                          RedisTimeoutError)):
            return False
        raise
    return True


def unavailable_error(client: Redis | RedisCluster, why: str) -> ConfigError:
    return ConfigError(
        "BLOOMDUPE_ENGINE", NAME,
        f"{why}, but Redis at {describe(client)} has no BF.* commands (or this user may "
        "not run them). Use Redis 8 or Redis Stack, or load RedisBloom "
        "(redis-server --loadmodule /path/to/redisbloom.so), grant the ACL of "
        "docs/security.md, or set BLOOMDUPE_ENGINE = 'lua' (or 'auto') for a new filter",
    )


def _one(reply: Any) -> int:
    """The value of a one-field ``BF.INFO`` reply (a dict or not, by redis-py and protocol)."""
    if isinstance(reply, dict):
        (reply,) = reply.values()
    elif isinstance(reply, list):
        (reply,) = reply
    return int(reply)


def first_shards_present(client: Redis | RedisCluster, key: str, plan: sizing.Sizing
                         ) -> list[int]:
    """Per first shard, 1 if either engine's key exists, else 0 (for :func:`~.lua.check_room`)."""
    names = [name for i in range(plan.shards) for name in (keys.bits(key, i), keys.bloom(key, i))]
    there = _pipelined(client, [("EXISTS", n) for n in names])
    return [int(bool(bits or bf)) for bits, bf in zip(there[::2], there[1::2], strict=True)]


class NativeEngine(ScriptedEngine):
    """A filter's RedisBloom shards and check-and-add script (as :class:`~.lua.LuaEngine`)."""

    name = NAME

    CHECK_ADD_SCRIPT = luascript.read(__package__, "check_add_bf.lua")

    def __init__(self, link: Link, key: str, shards: int, client_id: str) -> None:
        super().__init__(link, key, shards, client_id)
        self.reserves: list[Reserve] = []
        self.bf_keys: list[list[str]] = []

    def set_generations(self, generations: list[sizing.Sizing]) -> None:
        self.generations = generations
        self._gen_args = [len(generations)]
        self.reserves = [reserve_of(plan) for plan in generations]
        self.bf_keys = [[keys.bloom(self.key, i, g) for g in range(len(generations))]
                        for i in range(self.shards)]

    def shard_key(self, index: int, generation: int = 0) -> str:
        return keys.bloom(self.key, index, generation)

    # -- check-and-add ------------------------------------------------------

    def item_args(self, shard: int, h1: int, h2: int) -> list[bytes]:
        return [item(h1, h2)]

    def _script_keys(self, shard: int) -> list[str]:
        return [*self._fixed_keys[shard], *self.bf_keys[shard]]

    # -- shards -------------------------------------------------------------

    def create_shards(self, generation: int, plan: sizing.Sizing, *,
                      existing: bool = False) -> None:
        """Reserve ``generation``'s missing shards (``BF.RESERVE ... NONSCALING``); refuse ones
        reserved otherwise (:class:`FilterMismatchError`) or past ``maxmemory``. With
        ``existing``, a missing shard is lost state (:class:`FilterLostError`), never remade."""
        reserve = reserve_of(plan)
        names = [keys.bloom(self.key, i, generation) for i in range(plan.shards)]
        present = self.link.calls([("EXISTS", n) for n in names])
        missing = [n for n, there in zip(names, present, strict=True) if not there]
        if missing and existing:
            raise FilterLostError(f"{len(missing)} of its {len(names)} shard(s) of generation "
                                  f"{generation} are gone ({missing[0]}, ...)")
        if missing:
            check_room(self.link, self.key, generation, plan,
                       [int(bool(there)) for there in present])
            commands = [("BF.RESERVE", n, repr(reserve.error_rate), reserve.capacity,
                         "NONSCALING") for n in missing]
            for start in range(0, len(commands), 256):
                for reply in self.link.execute(commands[start:start + 256]):
                    # Another worker reserved it first: the capacity check below decides.
                    if isinstance(reply, Exception) and "exists" not in str(reply):
                        raise reply
            logger.info("Reserved %d RedisBloom shard(s) of %d bits for %s generation %d",
                        len(missing), reserve.bits, self.key, generation)
        capacities = self.link.calls([("BF.INFO", n, "CAPACITY") for n in names])
        for name, got in zip(names, capacities, strict=True):
            if _one(got) != reserve.capacity:
                raise FilterMismatchError(self.key, {f"capacity of {name}":
                                                     (_one(got), reserve.capacity)})

    def shard_names(self) -> list[str]:
        """Every key of this engine's shards, for deleting the filter."""
        names: list[str] = []
        for i, bf_keys in enumerate(self.bf_keys):
            names.extend(bf_keys)
            names.extend(self.link.scan(keys.later_bloom_pattern(self.key, i)))
        return names

    # -- reading ------------------------------------------------------------

    def inserted(self, generation: int) -> list[int]:
        """Items added to each shard of ``generation`` (``BF.INFO``: exact; 0 if missing)."""
        counts = []
        for reply in self.link.execute([("BF.INFO", bf_keys[generation], "ITEMS")
                                        for bf_keys in self.bf_keys]):
            if isinstance(reply, ResponseError) and "not found" in str(reply):
                counts.append(0)
            elif isinstance(reply, Exception):
                raise reply
            else:
                counts.append(_one(reply))
        return counts

    def newest_items(self) -> float:
        """Items in the newest generation (as counted by RedisBloom)."""
        return float(sum(self.inserted(len(self.generations) - 1)))

    def contains_many(self, halves: Sequence[tuple[int, int]]) -> list[bool]:
        """Whether each item is in some generation. Writes nothing."""
        replies = self.link.calls([("BF.EXISTS", bf_key, item(h1, h2)) for h1, h2 in halves
                                   for bf_key in self.bf_keys[hashing.shard_of(h1, self.shards)]])
        count = len(self.generations)
        return [any(replies[i * count:(i + 1) * count]) for i in range(len(halves))]

    def shard_infos(self) -> list[list[ShardInfo]]:
        """Per generation, each shard's figures; RedisBloom counts items, not bits, so the set
        bits are those expected for that many items."""
        infos = []
        for g, (plan, reserve) in enumerate(zip(self.generations, self.reserves, strict=True)):
            counts = self.inserted(g)
            memory = self.link.calls([("MEMORY USAGE", bf_keys[g], "SAMPLES", 0)
                                      for bf_keys in self.bf_keys])
            bits = reserve.bits
            infos.append([
                ShardInfo(i, g, bf_keys[g],
                          round(bits * -math.expm1(-plan.hashes * n / bits)), bits,
                          int(mem or 0))
                for i, (bf_keys, n, mem) in enumerate(zip(self.bf_keys, counts, memory,
                                                          strict=True))
            ])
        return infos
