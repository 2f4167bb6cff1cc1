"""The Lua engine: the filter's bits are plain Redis strings, checked and set with BITFIELD.

Each shard's bits are one string per generation (``keys.bits``), created at full size by a
script (as ``SETRANGE key size-1 "\\0"``: no bytes sent, allocated once, never regrown); a filter
that would not fit in ``maxmemory`` is refused before anything is written (:func:`check_room`).
An item's k bits are in one shard, so one call of ``check_add_bits.lua`` (beside this module)
atomically checks every generation and sets the bits in the newest. The client computes the
offsets (:mod:`scrapy_bloomdupe.hashing`); one ``BITFIELD`` sets an item's k bits.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.crc import key_slot
from redis.exceptions import RedisClusterException, ResponseError

from .. import hashing, keys, luascript, sizing
from ..exceptions import ConfigError, FilterLostError, FilterMismatchError
from ..transport.cluster import is_cluster
from ..transport.link import Link, link_to
from . import oplog
from .engine import ScriptedEngine, Section, Sink
from .info import ShardInfo

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

logger = logging.getLogger(__name__)

#: Script replies besides the per-item flags.
LOCK_BUSY = -1
STALE_GENERATION = -2
#: A shard's bits are gone (flushed, evicted, deleted): nothing written.
SHARD_MISSING = -3



CREATE_SHARD_SCRIPT = luascript.read(__package__, "create_shard.lua")
#: Commands in one pipeline when looking at or creating many shards.
PIPELINE_CHUNK = 256
#: Share of ``maxmemory`` a new generation must leave free (queue, op logs, buffers).
MEMORY_HEADROOM = 0.1


#: Script's first line on a cluster: it reaches its master's other slots' keys (Redis 7.0+).
CROSS_SLOT = "#!lua flags=allow-cross-slot-keys\n"


class LuaEngine(ScriptedEngine):
    """The bits of one filter, every generation, and the script that checks and sets them."""

    CHECK_ADD_SCRIPT = luascript.read(__package__, "check_add_bits.lua")
    #: Whether the script takes sections (a window's takes one shard a call).
    SECTIONS = True

    def __init__(self, link: Link, key: str, shards: int, client_id: str) -> None:
        super().__init__(link, key, shards, client_id)
        client = link.client
        self.bits_keys: list[list[str]] = []
        #: One call carries every shard of one node (on a cluster: of one master, its keys
        #: but the op log in ARGV, as declared keys must share a slot; Redis 7.0 script
        #: flags), so a call's fixed cost is paid once a call, not once a shard.
        self.cluster = is_cluster(client)
        self.sections = self.SECTIONS
        if self.cluster and self.sections:
            self.script = client.register_script(CROSS_SLOT + self.CHECK_ADD_SCRIPT)
            self.sha = self.script.sha
            self._slots = [key_slot(keys.bits(key, i).encode()) for i in range(shards)]

    def group_of(self, shard: int) -> Any:
        """Which call a batch's items of ``shard`` go in: one a node, one a master on a cluster,
        one a shard without sections or while its slot has no known master (mid-failover)."""
        if not self.sections:
            return shard
        if not self.cluster:
            return 0
        try:
            node = self.client.nodes_manager.get_node_from_slot(  # type: ignore[union-attr]
                self._slots[shard])
        except RedisClusterException:
            return shard
        return node.name

    def set_generations(self, generations: list[sizing.Sizing]) -> None:
        count = len(generations)
        self.generations = generations
        self._gen_args = [count, *(plan.hashes for plan in generations)]
        self.bits_keys = [[keys.bits(self.key, i, g) for g in range(count)]
                          for i in range(self.shards)]

    def shard_key(self, index: int, generation: int = 0) -> str:
        return keys.bits(self.key, index, generation)

    # -- check-and-add ------------------------------------------------------

    def item_args(self, shard: int, h1: int, h2: int) -> list[int | bytes]:
        """An item's call arguments: keyed hash, then offsets per generation, oldest first."""
        args: list[int | bytes] = [hashing.keyed_item(h1, h2)]
        for plan in self.generations:
            m = plan.modulus
            args.extend(hashing.offsets(
                hashing.Position(shard, *hashing.coefficients(h1, h2, m)), plan.hashes, m))
        return args

    def _script_keys(self, shard: int) -> list[str]:
        return [*self._fixed_keys[shard], *self.bits_keys[shard]]

    def check_add_command(self, token: bytes, call: int, ack: int,
                          sections: Sequence[Section], sink: Sink | None = None
                          ) -> tuple[Any, ...]:
        """The ``EVALSHA`` of one ``check_add_bits.lua`` call: the first section's op log, each
        section's keys (marker, lock, forgotten, bits, sink's), then item counts and args."""
        script_keys: list[Any] = [self._fixed_keys[sections[0].shard][0]]
        args: list[Any] = [token, call, ack, oplog.OP_LOG_TTL_MS, *self._gen_args,
                           "1" if sink is not None else "0"]
        for section in sections:
            shard = section.shard
            _, marker, lock, forgotten = self._fixed_keys[shard]
            script_keys.extend((marker, lock, forgotten, *self.bits_keys[shard]))
            args.append(len(section.indexes))
            args.extend(section.args)
            if sink is not None:
                script_keys.extend(sink.sink_keys(shard))
                args.append(sink.sink_prefix(shard))
                args.extend(section.sink_args)
        if self.cluster and self.sections:
            # The op log is declared (it routes the call); the others ride in ARGV.
            return ("EVALSHA", self.sha, 1, script_keys[0], *args, *script_keys[1:],
                    len(script_keys) - 1)
        return ("EVALSHA", self.sha, len(script_keys), *script_keys, *args)

    # -- shards -------------------------------------------------------------

    def create_shards(self, generation: int, plan: sizing.Sizing, *,
                      existing: bool = False) -> None:
        """Create ``generation``'s missing shards at full size (never overwriting bits). Raises
        :class:`FilterMismatchError` for a shard of another size, :class:`ConfigError` if new
        ones would not fit (:func:`check_room`), and with ``existing``,
        :class:`FilterLostError` for a missing shard (lost state, never remade empty)."""
        names = generation_names(self.key, generation, plan.shards)
        size = plan.bytes_per_shard
        lengths = self.link.calls([("STRLEN", n) for n in names])
        missing = [n for n, length in zip(names, lengths, strict=True) if not length]
        if missing and existing:
            raise FilterLostError(f"{len(missing)} of its {len(names)} shard(s) of generation "
                                  f"{generation} are gone ({missing[0]}, ...)")
        if missing:
            check_room(self.link, self.key, generation, plan, lengths)
            created = self._create(missing, size)
            made = dict(zip(missing, created, strict=True))
            lengths = [made.get(n, length) for n, length in zip(names, lengths, strict=True)]
            logger.info("Created %d Bloom filter shard(s) of %d bytes for %s generation %d",
                        len(missing), size, self.key, generation)
        for name, got in zip(names, lengths, strict=True):
            if got != size:
                raise FilterMismatchError(self.key, {f"length of {name}": (got, size)})

    def _create(self, names: Sequence[str], size: int) -> list[int]:
        """Run :data:`CREATE_SHARD_SCRIPT` on ``names`` (EVALSHA only: least-privilege ACL)."""
        (sha,) = self.link.knows(CREATE_SHARD_SCRIPT)
        replies: list[int] = []
        for start in range(0, len(names), PIPELINE_CHUNK):
            replies += self.link.calls([("EVALSHA", sha, 1, n, size)
                                        for n in names[start:start + PIPELINE_CHUNK]])
        return replies

    def shard_names(self) -> list[str]:
        """Every key of this engine's shards, for deleting the filter."""
        names: list[str] = []
        for i, bits in enumerate(self.bits_keys):
            names.extend(bits)
            names.extend(self.link.scan(keys.later_bits_pattern(self.key, i)))
        return names

    # -- reading ------------------------------------------------------------

    def newest_items(self) -> float:
        """Estimated items in the newest generation (``BITCOUNT`` of its shards)."""
        g = len(self.generations) - 1
        plan = self.generations[g]
        counts = self.link.calls([("BITCOUNT", bits[g]) for bits in self.bits_keys])
        return sum(sizing.estimate_items(plan.modulus, plan.hashes, int(n or 0))
                   for n in counts)

    def contains_many(self, halves: Sequence[tuple[int, int]]) -> list[bool]:
        """Whether every bit of each item is set in some generation. Writes nothing."""
        commands: list[tuple[Any, ...]] = []
        for h1, h2 in halves:
            shard = hashing.shard_of(h1, self.shards)
            for g, plan in enumerate(self.generations):
                m = plan.modulus
                pos = hashing.Position(shard, *hashing.coefficients(h1, h2, m))
                args: list[Any] = []
                for offset in hashing.offsets(pos, plan.hashes, m):
                    args.extend(("GET", "u1", offset))
                commands.append(("BITFIELD_RO", self.bits_keys[shard][g], *args))
        replies = self.link.calls(commands)
        count = len(self.generations)
        return [
            any(all(bits) for bits in replies[i * count:(i + 1) * count])
            for i in range(len(halves))
        ]

    def shard_infos(self) -> list[list[ShardInfo]]:
        """Per generation, each shard's set bits and memory (``BITCOUNT``: O(shard size))."""
        raw = iter(self.link.calls([
            command for g in range(len(self.generations)) for bits in self.bits_keys
            for command in (("BITCOUNT", bits[g]), ("MEMORY USAGE", bits[g], "SAMPLES", 0))]))
        return [
            [ShardInfo(i, g, bits[g], int(next(raw) or 0), plan.modulus, int(next(raw) or 0))
             for i, bits in enumerate(self.bits_keys)]
            for g, plan in enumerate(self.generations)
        ]


# -- shards and memory ------------------------------------------------------------------


def generation_names(key: str, generation: int, shards: int) -> list[str]:
    """The bits keys of one generation's shards, in shard order."""
    return [keys.bits(key, i, generation) for i in range(shards)]


def _pipelined(client: Redis | RedisCluster, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Replies of ``commands`` (single-key ones), sent in pipelines of ``PIPELINE_CHUNK``."""
    replies: list[Any] = []
    for start in range(0, len(commands), PIPELINE_CHUNK):
        pipe = client.pipeline(transaction=False)
        for command in commands[start:start + PIPELINE_CHUNK]:
            pipe.execute_command(*command)
        replies.extend(pipe.execute())
    return replies


def check_room(client: Redis | RedisCluster | Link, key: str, generation: int,
               plan: sizing.Sizing, lengths: Sequence[int] | None = None) -> None:
    """Raise :class:`ConfigError` if ``generation``'s missing shards (``lengths``: their
    ``STRLEN``, looked up if None) would not fit on their server in ``maxmemory`` less
    :data:`MEMORY_HEADROOM` less what is used (even under ``allkeys-*`` eviction: the room
    made may be the filter's own). Unchecked without ``maxmemory`` or ``CONFIG GET``."""
    names = generation_names(key, generation, plan.shards)
    needs: dict[str, list[int]] = {}  # where -> [bytes, shards]
    with link_to(client) as link:
        if lengths is None:
            lengths = link.calls([("STRLEN", n) for n in names])
        for name, length in zip(names, lengths, strict=True):
            if not length:
                need = needs.setdefault(link.where(name), [0, 0])
                need[0] += plan.bytes_per_shard
                need[1] += 1
        limits = _memory_limits(link) if needs else {}
    for where, (needed, count) in needs.items():
        if where not in limits:
            continue
        maxmemory, used = limits[where]
        room = maxmemory - int(maxmemory * MEMORY_HEADROOM) - used
        if needed <= room:
            continue
        what = "the filter" if generation == 0 else f"generation {generation} of the filter"
        raise ConfigError(
            "BLOOMDUPE_CAPACITY", plan.capacity,
            f"{what} {key!r} needs {sizing.human_bytes(needed)} ({count} shard(s) of "
            f"{sizing.human_bytes(plan.bytes_per_shard)}) on Redis {where}, whose maxmemory is "
            f"{sizing.human_bytes(maxmemory)} with {sizing.human_bytes(used)} in use; with "
            f"{MEMORY_HEADROOM:.0%} of it kept free, it does not fit, and "
            "writing it would fail with OOM. Nothing was written. Lower BLOOMDUPE_CAPACITY "
            "(with BLOOMDUPE_GROWTH on, the filter grows if a crawl needs more) or raise "
            "BLOOMDUPE_ERROR_RATE, or give Redis more memory (maxmemory)",
        )


def _memory_limits(link: Link) -> dict[str, tuple[int, int]]:
    """``maxmemory`` and memory used of each master with one; empty if we may not look."""
    try:
        limits = {where: int(config.get("maxmemory") or 0)
                  for where, config in link.on_masters("CONFIG GET", "maxmemory")}
        if not any(limits.values()):
            return {}
        used = {where: int(info.get("used_memory", 0))
                for where, info in link.on_masters("INFO", "memory")}
    except ResponseError as e:  # NoPermissionError is one
        logger.debug("Cannot look at Redis's maxmemory (%s); not checking the filter fits", e)
        return {}
    return {where: (maxmemory, used.get(where, 0)) for where, maxmemory in limits.items()
            if maxmemory}
