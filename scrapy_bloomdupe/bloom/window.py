"""A recrawl window (``BLOOMDUPE_WINDOW``): the filter as a ring of time slices.

Time, on Redis's clock (``TIME`` in the script, never the workers'), is cut into
slices of ``window / S`` (:class:`~scrapy_bloomdupe.sizing.Window`, S = 8). Each
shard has one filter a slice (``keys.slice_bits`` or ``keys.slice_bloom``, with
the shard's hash tag). A check looks an item up in the live slices (the current
one and the S before it, which overlap the window) and adds a new one to the
current slice, in one script on one shard, as the generations of a filter without
a window are checked and added to. The script makes the current slice when it is
missing and sets it to expire (``PEXPIREAT``) when it stops being live, so the
filter forgets without a sweeper: an item is new again between one window and one
window plus one slice after it was added, and never before.

The client sends the keys of the slices it believes live; the script compares
its slice with Redis's ``TIME`` and answers :data:`STALE_SLICE` (Redis's slice
and time, having written nothing) when another slice has started; the client
moves on and asks again. A slice that expired on schedule is not lost state; one
the shard's slice record (``keys.slice_record``) holds that is gone before its
time is (``SHARD_MISSING``).

Sizing (:func:`~scrapy_bloomdupe.sizing.window_plan`): each slice holds
``BLOOMDUPE_CAPACITY / S`` items at ``BLOOMDUPE_ERROR_RATE / (S + 1)``, so the
false positives of every live slice add up to the configured rate; with S + 1
slices live that is about 21.3 bits per fingerprint added within a window at
p = 0.001. Slices do not grow: a slice past its share fills on (Lua engine: its
false-positive rate climbs) or refuses items (RedisBloom:
:class:`~scrapy_bloomdupe.exceptions.FilterFullError`), as a filter without a
window does with ``BLOOMDUPE_GROWTH`` off.

The worker's local cache keeps, with each item, until when (on Redis's clock) the
item is sure to be in a live slice: the end of the current slice for one found
seen, the end of its slice's life for one just added; it answers only before
then, less a margin for the drift of this machine's clock (:meth:`SliceClock.now`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import hashing, keys, luascript, sizing
from . import oplog
from .info import FilterInfo, ShardInfo
from .lua import LuaEngine, _pipelined, check_room
from .native import NativeEngine, _one, item, reserve_of

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

#: How far this machine's clock may be from Redis's: 1 s, plus 0.1% of the time
#: since it was last compared (clocks drift, NTP slews).
CLOCK_MARGIN_MS = 1000.0
CLOCK_DRIFT = 0.001


class SliceClock:
    """Redis's time as this worker reckons it (its monotonic clock, set by each
    ``TIME`` and each :data:`STALE_SLICE` reply), and each shard's current slice as
    the scripts last told it."""

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

    def start(self, client: Redis | RedisCluster) -> None:
        """Ask Redis its time: every shard's slice, until a script says otherwise."""
        seconds, micros = client.time()
        now = seconds * 1000 + micros // 1000
        self.sync(now)
        self.current = [self.window.slice_of(now)] * len(self.current)


class _Slices:
    """What both windowed engines share: the slice keys of a call and its arguments."""

    key: str
    shards: int
    client: Redis | RedisCluster
    sha: str
    script: Any
    clock: SliceClock
    window: sizing.Window
    _client_id: str

    def _setup(self, window: sizing.Window, client_id: str) -> None:
        self.window = window
        self.clock = SliceClock(window, self.shards)
        self._call_keys = [
            (keys.op_log(self.key, i, client_id), keys.slice_record(self.key, i),
             keys.lock(self.key, i), keys.forgotten(self.key, i))
            for i in range(self.shards)
        ]

    def slice_key(self, shard: int, slice_id: int) -> str:
        raise NotImplementedError

    def _shape_args(self) -> list[Any]:
        """ARGV[8..9]: what the script needs to make the current slice."""
        raise NotImplementedError

    def live_keys(self, shard: int) -> list[str]:
        """Shard ``shard``'s slice keys a call looks at, oldest first."""
        c = self.clock.current[shard]
        return [self.slice_key(shard, s) for s in range(c - self.window.slices, c + 1)]

    def _script_keys(self, shard: int) -> list[str]:
        return [*self._call_keys[shard], *self.live_keys(shard)]

    def _args(self, shard: int, token: bytes, call: int, ack: int, items: int) -> list[Any]:
        return [token, call, ack, oplog.OP_LOG_TTL_MS, self.window.slice_ms,
                self.window.slices, self.clock.current[shard], *self._shape_args(), items]

    def deadline(self, shard: int, new: bool) -> int:
        """Until when (Redis's clock, ms) an item just answered on ``shard`` is sure to
        be in a live slice: one added, until its slice expires; one seen, until the
        current slice ends (the oldest live slice may hold it)."""
        c = self.clock.current[shard]
        return self.window.expires_at(c) if new else (c + 1) * self.window.slice_ms

    def create_shards(self, generation: int, plan: sizing.Sizing, *,
                      existing: bool = False) -> None:
        """Nothing is made at start (each slice is made by the script that first adds
        to it); the live slices must fit in the server's ``maxmemory``."""
        self.clock.start(self.client)
        whole = sizing.Sizing(plan.capacity * self.window.live, plan.error_rate, plan.shards,
                              plan.bits_per_shard * self.window.live, plan.hashes)
        check_room(self.client, self.key, 0, whole, [0] * plan.shards)

    def shard_names(self) -> list[str]:
        names: list[str] = []
        for i in range(self.shards):
            names.append(keys.slice_record(self.key, i))
            names.append(keys.forgotten(self.key, i))
            names.extend(self.client.scan_iter(match=self._slices_pattern(i), count=1000))
        return names

    def _slices_pattern(self, shard: int) -> str:
        return keys.escape_pattern(self.slice_key(shard, 0))[:-1] + "*"

    def slices(self) -> list[int]:
        """Ids of the slices with a shard in Redis (expired ones are gone), oldest first."""
        return sorted({s for s, _, _ in self._existing()})

    def _existing(self) -> list[tuple[int, int, str]]:
        """(slice, shard, key) of every slice shard in Redis, oldest slice first."""
        recorded = _pipelined(self.client, [("ZRANGE", keys.slice_record(self.key, i), 0, -1)
                                            for i in range(self.shards)])
        found = sorted((int(s), i, self.slice_key(i, int(s)))
                       for i, ids in enumerate(recorded) for s in ids)
        there = _pipelined(self.client, [("EXISTS", name) for _, _, name in found])
        return [f for f, is_there in zip(found, there, strict=True) if is_there]

    def lost_keys(self) -> list[str]:
        """Slice keys the records hold that are gone before their time (lost state).
        Reads only."""
        seconds, micros = self.client.time()
        current = self.window.slice_of(seconds * 1000 + micros // 1000)
        recorded = _pipelined(self.client, [("ZRANGE", keys.slice_record(self.key, i), 0, -1)
                                            for i in range(self.shards)])
        names = [self.slice_key(i, int(s)) for i, ids in enumerate(recorded) for s in ids
                 if int(s) >= current - self.window.slices]
        there = _pipelined(self.client, [("EXISTS", n) for n in names])
        return [n for n, is_there in zip(names, there, strict=True) if not is_there]

    def _by_slice(self, found: Sequence[tuple[int, int, str]], figures: Sequence[Any],
                  make: Any) -> list[list[ShardInfo]]:
        """Per slice in Redis and the current one (oldest first), every shard's figures:
        ``make(shard, slice, key, figure)``, with None as the figure of a shard the slice
        does not have (no item of that shard arrived during it)."""
        ids = sorted({s for s, _, _ in found} | {max(self.clock.current)})
        got = {(s, i): f for (s, i, _), f in zip(found, figures, strict=True)}
        return [[make(i, s, self.slice_key(i, s), got.get((s, i)))
                 for i in range(self.shards)] for s in ids]

    def figures(self, info: FilterInfo) -> dict[str, float]:
        """From a filter's :class:`FilterInfo`: the time slices in Redis (``slices``) and
        how long ago the oldest of them began (``oldest_slice_age``, seconds)."""
        made = [g for g in info.generations if g.memory_bytes]
        oldest = min((g.index for g in made), default=None)
        age = 0.0 if oldest is None else max(
            0.0, (self.clock.estimate() - oldest * self.window.slice_ms) / 1000)
        return {"slices": len(made), "oldest_slice_age": round(age, 3)}

    def missing(self, shard: int) -> str:
        return " or ".join(self.live_keys(shard)) + " is gone before its time"


class WindowLuaEngine(_Slices, LuaEngine):
    """The Lua engine's bits, one string a shard and time slice."""

    CHECK_ADD_SCRIPT = luascript.read(__package__, "check_add_window_bits.lua")

    def __init__(self, client: Redis | RedisCluster, key: str, shards: int,
                 client_id: str, window: sizing.Window) -> None:
        LuaEngine.__init__(self, client, key, shards, client_id)
        self._setup(window, client_id)

    def slice_key(self, shard: int, slice_id: int) -> str:
        return keys.slice_bits(self.key, shard, slice_id)

    def shard_key(self, index: int, generation: int = 0) -> str:
        return self.live_keys(index)[-1]

    def _shape_args(self) -> list[Any]:
        plan = self.generations[0]
        return [plan.bytes_per_shard, plan.hashes]

    def item_args(self, shard: int, h1: int, h2: int) -> list[Any]:
        """An item's part of a call: its keyed hash (for the forgotten set), then its
        offsets (every slice has the same size, so the same offsets)."""
        plan = self.generations[0]
        m = plan.modulus
        return [item(h1, h2), *hashing.offsets(
            hashing.Position(shard, *hashing.coefficients(h1, h2, m)), plan.hashes, m)]

    def newest_items(self) -> float:
        plan = self.generations[0]
        pipe = self.client.pipeline(transaction=False)
        for i in range(self.shards):
            pipe.bitcount(self.live_keys(i)[-1])
        return sum(sizing.estimate_items(plan.modulus, plan.hashes, int(n or 0))
                   for n in pipe.execute())

    def contains_many(self, halves: Sequence[tuple[int, int]]) -> list[bool]:
        """Whether each item is in a live slice (as this worker reckons them)."""
        plan = self.generations[0]
        m = plan.modulus
        pipe = self.client.pipeline(transaction=False)
        count = self.window.live
        for h1, h2 in halves:
            shard = hashing.shard_of(h1, self.shards)
            args: list[Any] = []
            for offset in hashing.offsets(
                    hashing.Position(shard, *hashing.coefficients(h1, h2, m)), plan.hashes, m):
                args.extend(("GET", "u1", offset))
            for name in self.live_keys(shard):
                pipe.exists(name)
                pipe.execute_command("BITFIELD_RO", name, *args)
        replies = pipe.execute()
        out = []
        for i in range(len(halves)):
            part = replies[2 * i * count:2 * (i + 1) * count]
            out.append(any(there and all(bits) for there, bits in zip(part[::2], part[1::2],
                                                                     strict=True)))
        return out

    def shard_infos(self) -> list[list[ShardInfo]]:
        """Per slice in Redis (oldest first), each of its shards' figures."""
        plan = self.generations[0]
        found = self._existing()
        pipe = self.client.pipeline(transaction=False)
        for _, _, name in found:
            pipe.bitcount(name)
            pipe.memory_usage(name, samples=0)
        raw = pipe.execute()
        figures = list(zip(raw[::2], raw[1::2], strict=True))
        return self._by_slice(found, figures, lambda i, s, name, f: ShardInfo(
            i, s, name, int(f[0] or 0) if f else 0, plan.modulus, int(f[1] or 0) if f else 0))


class WindowNativeEngine(_Slices, NativeEngine):
    """The native engine's RedisBloom filters, one a shard and time slice."""

    CHECK_ADD_SCRIPT = luascript.read(__package__, "check_add_window_bf.lua")

    def __init__(self, client: Redis | RedisCluster, key: str, shards: int,
                 client_id: str, window: sizing.Window) -> None:
        NativeEngine.__init__(self, client, key, shards, client_id)
        self._setup(window, client_id)

    def slice_key(self, shard: int, slice_id: int) -> str:
        return keys.slice_bloom(self.key, shard, slice_id)

    def shard_key(self, index: int, generation: int = 0) -> str:
        return self.live_keys(index)[-1]

    def _shape_args(self) -> list[Any]:
        reserve = reserve_of(self.generations[0])
        return [repr(reserve.error_rate), reserve.capacity]

    def _counts(self, names: Sequence[str]) -> list[int]:
        """Items in each of these BF keys; 0 for one that is gone (expired)."""
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.execute_command("BF.INFO", name, "ITEMS")
        counts = []
        for reply in pipe.execute(raise_on_error=False):
            counts.append(0 if isinstance(reply, Exception) else _one(reply))
        return counts

    def newest_items(self) -> float:
        return float(sum(self._counts([self.live_keys(i)[-1] for i in range(self.shards)])))

    def contains_many(self, halves: Sequence[tuple[int, int]]) -> list[bool]:
        pipe = self.client.pipeline(transaction=False)
        count = self.window.live
        for h1, h2 in halves:
            shard = hashing.shard_of(h1, self.shards)
            for name in self.live_keys(shard):
                pipe.execute_command("BF.EXISTS", name, item(h1, h2))
        replies = pipe.execute()
        return [any(replies[i * count:(i + 1) * count]) for i in range(len(halves))]

    def shard_infos(self) -> list[list[ShardInfo]]:
        plan = self.generations[0]
        bits = reserve_of(plan).bits
        found = self._existing()
        counts = self._counts([name for _, _, name in found])
        memory = _pipelined(self.client, [("MEMORY", "USAGE", name, "SAMPLES", "0")
                                          for _, _, name in found])
        return self._by_slice(found, list(zip(counts, memory, strict=True)),
                              lambda i, s, name, f: ShardInfo(
                                  i, s, name,
                                  round(bits * -math.expm1(-plan.hashes * f[0] / bits)) if f
                                  else 0, bits, int(f[1] or 0) if f else 0))

