"""A recrawl window (``BLOOMDUPE_WINDOW``): the filter as a ring of time slices.

Redis's clock (``TIME`` in the script, never the workers') cuts a window into S = 8 to 12 slices
(:class:`~scrapy_bloomdupe.sizing.Window`); each shard has one filter a slice. One script on one
shard looks an item up in the live slices (the current one and the S before it) and adds a new
one to the current slice, which it makes when missing and sets to expire (``PEXPIREAT``) when no
longer live: the filter forgets without a sweeper, an item being new again between one window
and one window plus one slice after it was added, never before. A script whose slice or
generations differ from Redis's answers :data:`STALE_SLICE` (Redis's, nothing written) and the
client asks again. A slice the shard's record (``keys.slice_record``, made with the filter)
holds that is gone before its time is lost state (``SHARD_MISSING``); an expired one is not.

Each slice holds ``BLOOMDUPE_CAPACITY / S`` items at ``BLOOMDUPE_ERROR_RATE / (S + 1)``, so all
live slices add up to the configured rate (:func:`~scrapy_bloomdupe.sizing.fit_window`). With
``BLOOMDUPE_GROWTH`` the script grows the current slice by a generation once it holds its share
(at most one a call: the Lua engine's items past it are answered ``G`` and asked again);
otherwise a full slice fills on (Lua) or refuses items (RedisBloom:
:class:`~scrapy_bloomdupe.exceptions.FilterFullError`). The local cache answers for an item
only until it is sure to be in a live slice, less a drift margin (:meth:`SliceClock.now`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import hashing, keys, luascript, sizing
from ..exceptions import ConfigError, FilterLostError
from . import oplog
from .engine import ScriptedEngine
from .info import FilterInfo, GenerationInfo, ShardInfo
from .lua import LuaEngine, check_room
from .native import NativeEngine, _one, item, reserve_of

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

    from ..transport.link import Link

#: How far this machine's clock may be from Redis's: 1 s plus 0.1% of the time since synced.
CLOCK_MARGIN_MS = 1000.0
CLOCK_DRIFT = 0.001


class SliceClock:
    """Redis's time as this worker reckons it (its monotonic clock, set by each ``TIME`` and each
    :data:`STALE_SLICE` reply), and each shard's current slice as the scripts last told it."""

    def __init__(self, window: sizing.Window, shards: int) -> None:
        self.window = window
        self._offset = -float("inf")
        self._synced = 0.0
        self.current = [0] * shards

    def sync(self, redis_ms: float) -> None:
        """Redis's time is ``redis_ms`` now. The latest of the servers is kept (a
        Cluster's masters differ a little): the cache then lets go early, not late."""
        mono = time.monotonic() * 1000
        self._offset = max(self._offset, redis_ms - mono)
        self._synced = mono

    def now(self) -> float:
        """Redis's time now, at the latest it may be (ms): the margin added."""
        mono = time.monotonic() * 1000
        return mono + self._offset + CLOCK_MARGIN_MS + CLOCK_DRIFT * (mono - self._synced)

    def estimate(self) -> float:
        """Redis's time now as best reckoned (ms), for figures."""
        return time.monotonic() * 1000 + self._offset

    def adopt(self, shard: int, slice_id: int, redis_ms: float) -> None:
        self.current[shard] = slice_id
        self.sync(redis_ms)

    def start(self, link: Link) -> None:
        """Ask Redis its time: every shard's slice, until a script says otherwise."""
        seconds, micros = max(reply for _, reply in link.on_masters("TIME"))
        now = seconds * 1000 + micros // 1000
        self.sync(now)
        self.current = [self.window.slice_of(now)] * len(self.current)


#: Most generations a slice may grow to (each twice the items of the one before).
MAX_SLICE_GENERATIONS = 8


class _Slices:
    """What both windowed engines share: a call's slice keys and arguments, and the live
    slices' generations as the scripts last told them."""

    key: str
    shards: int
    client: Redis | RedisCluster
    link: Link
    sha: str
    script: Any
    clock: SliceClock
    window: sizing.Window
    generations: list[sizing.Sizing]
    _client_id: str

    def _setup(self, window: sizing.Window, client_id: str, growth: bool,
               schedule: int) -> None:
        self.window = window
        self.growth = growth
        #: How a slice grows (:func:`sizing.slice_generation`; stored as the format).
        self.schedule = schedule
        self.clock = SliceClock(window, self.shards)
        self._call_keys = [
            (keys.op_log(self.key, i, client_id), keys.slice_record(self.key, i),
             keys.lock(self.key, i), keys.forgotten(self.key, i))
            for i in range(self.shards)
        ]
        #: Per shard, its live slices' generations (slice id: count) as the scripts last told;
        #: a slice not in it has one (or is not made).
        self.slice_gens: list[dict[int, int]] = [{} for _ in range(self.shards)]
        self._shapes: dict[int, list[Any]] = {}
        self._plans: list[sizing.Sizing] = []
        self._max_gens = 1

    def set_generations(self, generations: list[sizing.Sizing]) -> None:
        """The first generation of a slice (its share of a window); later ones follow from it
        (:func:`sizing.slice_generation`), up to :data:`MAX_SLICE_GENERATIONS` and the bytes cap."""
        super().set_generations(generations[:1])  # type: ignore[misc]
        first = generations[0]
        plans = [first]
        while self.growth and len(plans) < MAX_SLICE_GENERATIONS:
            try:
                later = sizing.slice_generation(first, len(plans), self.schedule)
            except ConfigError:
                break
            if first.max_bytes is not None and sizing.total_bytes(
                    first, len(plans) + 1, self.schedule) > first.max_bytes:
                break
            plans.append(later)
        self._max_gens = len(plans)
        self._plans = plans
        self._shapes = {}

    def _shape(self, plan: sizing.Sizing) -> list[Any]:
        """What the script needs to make a generation of ``plan``'s sizing."""
        raise NotImplementedError

    def slice_key(self, shard: int, slice_id: int, generation: int = 0) -> str:
        raise NotImplementedError

    def _believed(self, shard: int) -> list[int]:
        """The generations of shard ``shard``'s live slices, oldest first."""
        c = self.clock.current[shard]
        gens = self.slice_gens[shard]
        return [gens.get(s, 1) for s in range(c - self.window.slices, c + 1)]

    def offsets_for(self, shard: int) -> int:
        """G: the generations an item's offsets are sent for (the most a live slice has)."""
        return max(self._believed(shard))

    def live_keys(self, shard: int) -> list[str]:
        """Shard ``shard``'s keys a call looks at: each live slice's generations, oldest first."""
        c = self.clock.current[shard]
        return [self.slice_key(shard, s, g)
                for s, count in zip(range(c - self.window.slices, c + 1),
                                    self._believed(shard), strict=True)
                for g in range(count)]

    def _script_keys(self, shard: int) -> list[str]:
        c = self.clock.current[shard]
        grow = self.slice_key(shard, c, self._believed(shard)[-1])
        return [*self._call_keys[shard], *self.live_keys(shard), grow]

    def _args(self, shard: int, token: bytes, call: int, ack: int, items: int) -> list[Any]:
        believed = self._believed(shard)
        most = max(believed)
        return [token, call, ack, oplog.OP_LOG_TTL_MS, self.window.slice_ms,
                self.window.slices, self.clock.current[shard], items, most, self._max_gens,
                *(x for g in range(most + 1) for x in self._shape_args(g)), *believed]

    def _shape_args(self, generation: int) -> list[Any]:
        """A generation's shape in a call (what its script needs to make it, then the items it
        holds before the next); any a live slice has, maybe grown past our limits by another."""
        shape = self._shapes.get(generation)
        if shape is None:
            plan = self.plan_of(generation)
            shape = self._shapes[generation] = [*self._shape(plan),
                                                -(-plan.capacity // plan.shards)]
        return shape

    def adopt(self, shard: int, reply: Sequence[Any]) -> None:
        """A STALE_SLICE reply: Redis's slice, its time, its live slices' generations (0: none)."""
        current = int(reply[0])
        self.clock.adopt(shard, current, float(reply[1]))
        first = current - self.window.slices
        self.slice_gens[shard] = {first + i: int(g) for i, g in enumerate(reply[2:])
                                  if int(g) > 1}

    def grew(self, shard: int) -> None:
        """A call answered 'G': it made the current slice's next generation."""
        c = self.clock.current[shard]
        gens = self.slice_gens[shard]
        gens[c] = gens.get(c, 1) + 1
        for s in [s for s in gens if s < c - self.window.slices]:
            del gens[s]

    def newest_items(self) -> float:
        """Not asked with a window: a slice grows in its script, not by the growth check."""
        raise NotImplementedError("a window's slices grow in their check-and-add script")

    def deadline(self, shard: int, new: bool) -> int:
        """Until when (Redis's clock, ms) an item just answered on ``shard`` is sure to be in a
        live slice: one added, until its slice expires; one seen, until the current slice ends."""
        c = self.clock.current[shard]
        return self.window.expires_at(c) if new else (c + 1) * self.window.slice_ms

    def create_shards(self, generation: int, plan: sizing.Sizing, *,
                      existing: bool = False) -> None:
        """No slice is made here (the script that first adds to one makes it), only each shard's
        record (``made``: its loss is lost state; with ``existing`` a missing one raises
        :class:`FilterLostError`). The live slices must fit in the server's ``maxmemory``."""
        self.clock.start(self.link)
        records = [keys.slice_record(self.key, i) for i in range(self.shards)]
        if existing:
            there = self.link.calls([("EXISTS", r) for r in records])
            gone = [r for r, is_there in zip(records, there, strict=True) if not is_there]
            if gone:
                raise FilterLostError(f"{len(gone)} of its {len(records)} slice record(s) "
                                      f"are gone ({gone[0]}, ...)")
            return
        whole = sizing.Sizing(plan.capacity * self.window.live, plan.error_rate, plan.shards,
                              plan.bits_per_shard * self.window.live, plan.hashes)
        check_room(self.link, self.key, 0, whole, [0] * plan.shards)
        self.link.calls([("HSET", r, "made", 1) for r in records])

    def _records(self, shards: Sequence[int]) -> dict[int, dict[int, int]]:
        """Shards' records, as {slice: generations}."""
        got = self.link.calls([("HGETALL", keys.slice_record(self.key, i)) for i in shards])
        out: dict[int, dict[int, int]] = {}
        for i, record in zip(shards, got, strict=True):
            pairs = (record.items() if isinstance(record, dict)
                     else zip(record[::2], record[1::2], strict=True))
            out[i] = {int(f): int(v) for f, v in pairs if f.isdigit()}
        return out

    def refresh(self, shards: Sequence[int]) -> None:
        """Read these shards' records (tools that only read: their generations)."""
        for i, record in self._records(sorted(set(shards))).items():
            self.slice_gens[i] = {s: g for s, g in record.items() if g > 1}

    def shard_names(self) -> list[str]:
        names: list[str] = []
        for i in range(self.shards):
            names.append(keys.slice_record(self.key, i))
            names.append(keys.forgotten(self.key, i))
            names.extend(self.link.scan(self._slices_pattern(i)))
        return names

    def _slices_pattern(self, shard: int) -> str:
        return keys.escape_pattern(self.slice_key(shard, 0))[:-1] + "*"

    def slices(self) -> list[int]:
        """Ids of the slices with a shard in Redis (expired ones are gone), oldest first."""
        return sorted({s for s, _, _ in self._existing()})

    def _existing(self) -> list[tuple[int, int, list[str]]]:
        """(slice, shard, keys of its generations) of every slice shard in Redis, oldest first."""
        records = self._records(range(self.shards))
        found = sorted((s, i, [self.slice_key(i, s, g) for g in range(gens)])
                       for i, record in records.items() for s, gens in record.items())
        there = self.link.calls([("EXISTS", name) for _, _, names in found
                                 for name in names[:1]])
        return [f for f, is_there in zip(found, there, strict=True) if is_there]

    def lost_keys(self) -> list[str]:
        """Slice keys the records hold that are gone before their time, and lost records."""
        seconds, micros = max(reply for _, reply in self.link.on_masters("TIME"))
        current = self.window.slice_of(seconds * 1000 + micros // 1000)
        records = [keys.slice_record(self.key, i) for i in range(self.shards)]
        there = self.link.calls([("EXISTS", r) for r in records])
        lost = [r for r, is_there in zip(records, there, strict=True) if not is_there]
        names = [self.slice_key(i, s, g)
                 for i, record in self._records(range(self.shards)).items()
                 for s, gens in record.items() if s >= current - self.window.slices
                 for g in range(gens)]
        there = self.link.calls([("EXISTS", n) for n in names])
        return lost + [n for n, is_there in zip(names, there, strict=True) if not is_there]

    def _figures(self, names: Sequence[str], generations: Sequence[int]
                 ) -> list[tuple[int, int, int]]:
        """(set bits, bits, memory) of each of these keys, of these generations."""
        raise NotImplementedError

    def plan_of(self, generation: int) -> sizing.Sizing:
        """The sizing of a slice's generation ``generation`` (:func:`sizing.slice_generation`)."""
        if generation < len(self._plans):
            return self._plans[generation]
        try:
            return sizing.slice_generation(self._plans[0], generation, self.schedule)
        except ConfigError:  # past what a slice may grow to: never made, sized as the last
            return self._plans[-1]

    def slice_infos(self) -> list[tuple[int, int, list[ShardInfo]]]:
        """(slice, generation, every shard's figures) of each slice generation in Redis and the
        current slice's first, oldest first; a shard no item reached has no set bits."""
        found = self._existing()
        names = [name for _, _, group in found for name in group]
        figures = iter(self._figures(names, [g for _, _, group in found
                                             for g in range(len(group))]))
        got: dict[tuple[int, int, int], tuple[str, tuple[int, int, int]]] = {}
        for s, i, group in found:
            for g, name in enumerate(group):
                got[(s, g, i)] = (name, next(figures))
        rows = sorted({(s, g) for s, g, _ in got} | {(max(self.clock.current), 0)})
        out = []
        for s, g in rows:
            shards = []
            for i in range(self.shards):
                name, (set_bits, bits, memory) = got.get(
                    (s, g, i), (self.slice_key(i, s, g), (0, self._bits_of(g), 0)))
                shards.append(ShardInfo(i, s, name, set_bits, bits, memory))
            out.append((s, g, shards))
        return out

    def _bits_of(self, generation: int) -> int:
        """Bits a shard of a slice's generation ``generation`` has."""
        raise NotImplementedError

    def figures(self, info: FilterInfo) -> dict[str, float]:
        """From a filter's :class:`FilterInfo`: the time slices in Redis (``slices``) and
        how long ago the oldest of them began (``oldest_slice_age``, seconds)."""
        made = {g.index for g in info.generations if g.memory_bytes}
        oldest = min(made, default=None)
        age = 0.0 if oldest is None else max(
            0.0, (self.clock.estimate() - oldest * self.window.slice_ms) / 1000)
        return {"slices": len(made), "oldest_slice_age": round(age, 3)}

    def missing(self, shards: Sequence[int]) -> str:
        return (f"{keys.slice_record(self.key, shards[0])} or one of "
                + ", ".join(self.live_keys(shards[0])) + " is gone before its time")

    def start(self) -> None:
        """Set the slice clock from Redis's (a worker's is set by its first call)."""
        self.clock.start(self.link)

    def generation_infos(self) -> list[GenerationInfo]:
        """The time slices in Redis, oldest first, each slice's generations."""
        return [GenerationInfo(s, self.plan_of(g), shards, g)
                for s, g, shards in self.slice_infos()]


class WindowLuaEngine(_Slices, LuaEngine):
    """The Lua engine's bits, one string a shard, time slice and generation."""

    CHECK_ADD_SCRIPT = luascript.read(__package__, "check_add_window_bits.lua")
    #: Its script's calls are one shard each (ScriptedEngine's layout).
    SECTIONS = False
    check_add_command = ScriptedEngine.check_add_command

    def __init__(self, link: Link, key: str, shards: int, client_id: str,
                 window: sizing.Window, growth: bool = False,
                 schedule: int = sizing.SLICE_GROWTH_BY_ITEMS) -> None:
        LuaEngine.__init__(self, link, key, shards, client_id)
        self._setup(window, client_id, growth, schedule)

    def slice_key(self, shard: int, slice_id: int, generation: int = 0) -> str:
        return keys.slice_bits(self.key, shard, slice_id, generation)

    def shard_key(self, index: int, generation: int = 0) -> str:
        return self.live_keys(index)[-1]

    def _shape(self, plan: sizing.Sizing) -> list[Any]:
        return [plan.bytes_per_shard, plan.hashes]

    def item_args(self, shard: int, h1: int, h2: int) -> list[Any]:
        """An item's part of a call: its keyed hash (for the forgotten set), then its offsets in
        each generation a live slice of ``shard`` has (all slices share offsets)."""
        args: list[Any] = [item(h1, h2)]
        for plan in map(self.plan_of, range(self.offsets_for(shard))):
            m = plan.modulus
            args.extend(hashing.offsets(
                hashing.Position(shard, *hashing.coefficients(h1, h2, m)), plan.hashes, m))
        return args

    def _live_by_generation(self, shard: int) -> list[tuple[str, int]]:
        """(key, generation) of each generation of shard ``shard``'s live slices."""
        c = self.clock.current[shard]
        return [(self.slice_key(shard, s, g), g)
                for s, count in zip(range(c - self.window.slices, c + 1),
                                    self._believed(shard), strict=True)
                for g in range(count)]

    def contains_many(self, halves: Sequence[tuple[int, int]]) -> list[bool]:
        """Whether each item is in a live slice. ``EXISTS`` first, then bits read only where a
        live generation exists: most of a window's slices are empty or gone."""
        shards = [hashing.shard_of(h1, self.shards) for h1, _ in halves]
        self.refresh(shards)
        live = {shard: self._live_by_generation(shard) for shard in set(shards)}
        names = sorted({name for pairs in live.values() for name, _ in pairs})
        there = {name for name, n in zip(names, self.link.calls(
            [("EXISTS", name) for name in names]), strict=True) if n}
        commands: list[tuple[Any, ...]] = []
        counts = []
        for (h1, h2), shard in zip(halves, shards, strict=True):
            present = [(name, g) for name, g in live[shard] if name in there]
            counts.append(len(present))
            for name, g in present:
                plan = self.plan_of(g)
                m = plan.modulus
                args: list[Any] = []
                for offset in hashing.offsets(
                        hashing.Position(shard, *hashing.coefficients(h1, h2, m)),
                        plan.hashes, m):
                    args.extend(("GET", "u1", offset))
                commands.append(("BITFIELD_RO", name, *args))
        replies = self.link.calls(commands) if commands else []
        out, at = [], 0
        for count in counts:
            out.append(any(all(bits) for bits in replies[at:at + count]))
            at += count
        return out

    def _figures(self, names: Sequence[str], generations: Sequence[int]
                 ) -> list[tuple[int, int, int]]:
        raw = self.link.calls([command for name in names for command in
                               (("BITCOUNT", name), ("MEMORY USAGE", name, "SAMPLES", 0))])
        return [(int(n or 0), self._bits_of(g), int(m or 0))
                for n, m, g in zip(raw[::2], raw[1::2], generations, strict=True)]

    def _bits_of(self, generation: int) -> int:
        return self.plan_of(generation).modulus


class WindowNativeEngine(_Slices, NativeEngine):
    """The native engine's RedisBloom filters, one a shard, time slice and generation."""

    CHECK_ADD_SCRIPT = luascript.read(__package__, "check_add_window_bf.lua")

    def __init__(self, link: Link, key: str, shards: int, client_id: str,
                 window: sizing.Window, growth: bool = False,
                 schedule: int = sizing.SLICE_GROWTH_BY_ITEMS) -> None:
        NativeEngine.__init__(self, link, key, shards, client_id)
        self._setup(window, client_id, growth, schedule)

    def slice_key(self, shard: int, slice_id: int, generation: int = 0) -> str:
        return keys.slice_bloom(self.key, shard, slice_id, generation)

    def shard_key(self, index: int, generation: int = 0) -> str:
        return self.live_keys(index)[-1]

    def _shape(self, plan: sizing.Sizing) -> list[Any]:
        reserve = reserve_of(plan)
        return [repr(reserve.error_rate), reserve.capacity]

    def _counts(self, names: Sequence[str]) -> list[int]:
        """Items in each of these BF keys; 0 for one that is gone (expired)."""
        counts = []
        for reply in self.link.execute([("BF.INFO", name, "ITEMS") for name in names]):
            counts.append(0 if isinstance(reply, Exception) else _one(reply))
        return counts

    def contains_many(self, halves: Sequence[tuple[int, int]]) -> list[bool]:
        self.refresh([hashing.shard_of(h1, self.shards) for h1, _ in halves])
        commands: list[tuple[Any, ...]] = []
        counts = []
        for h1, h2 in halves:
            live = self.live_keys(hashing.shard_of(h1, self.shards))
            counts.append(len(live))
            commands += [("BF.EXISTS", name, item(h1, h2)) for name in live]
        replies = self.link.execute(commands)
        out, at = [], 0
        for count in counts:
            out.append(any(r == 1 for r in replies[at:at + count]))
            at += count
        return out

    def _figures(self, names: Sequence[str], generations: Sequence[int]
                 ) -> list[tuple[int, int, int]]:
        counts = self._counts(names)
        memory = self.link.calls([("MEMORY USAGE", name, "SAMPLES", 0) for name in names])
        out = []
        for n, m, g in zip(counts, memory, generations, strict=True):
            bits = self._bits_of(g)
            out.append((round(bits * -math.expm1(-self.plan_of(g).hashes * n / bits)), bits,
                        int(m or 0)))
        return out

    def _bits_of(self, generation: int) -> int:
        return reserve_of(self.plan_of(generation)).bits
