"""The sharded Bloom filter in Redis: open or join, check-and-add in batches, growth, clear.

The engine-neutral front: it hashes fingerprints (a per-filter seed), groups a batch into
script calls of at most ``MAX_ITEMS_PER_SCRIPT`` items, gives each call an op id so a retry
after a lost reply is answered from the op log (:mod:`.oplog`), takes the shard locks in the
same round trip (:mod:`.lock`), answers repeats from the local cache, counts, and grows. The
engine (``BLOOMDUPE_ENGINE``, stored in :mod:`.meta`) holds the bits: :mod:`.lua`
(``BITFIELD``) or :mod:`.native` (RedisBloom). See also :mod:`.calls`, :mod:`.growth`,
:mod:`.forgetting` and :mod:`.window`.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import NoPermissionError

from .. import hashing, keys, sizing
from ..exceptions import FilterLostError, FilterMismatchError
from ..localcache import LocalCache, TimedCache
from ..transport.link import Link
from ..transport.outage import OutageGuard
from ..transport.sentinel import master_epoch
from . import meta, native
from .calls import Calls, _LockState
from .creation import _new_engine, _refuse_orphans, lost_message
from .engine import Engine, Sink
from .forgetting import Forgetting
from .growth import Growth
from .info import FilterInfo
from .lock import LockCounters, ShardLocks
from .lua import (
    LuaEngine,
    check_room,
)
from .native import NativeEngine
from .window import WindowLuaEngine, WindowNativeEngine

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How long the mark of a finished crawl whose state was deleted stays (seconds).
FINISHED_TTL = 7 * 86_400
#: ``BLOOMDUPE_ENGINE`` name of each engine.
ENGINES: dict[str, type[Engine]] = {"lua": LuaEngine, native.NAME: NativeEngine}
#: The same, with a recrawl window (``BLOOMDUPE_WINDOW``, :mod:`.window`).
WINDOW_ENGINES: dict[str, type[WindowLuaEngine | WindowNativeEngine]] = {
    "lua": WindowLuaEngine, native.NAME: WindowNativeEngine}


@dataclass
class FilterCounters:
    """What this worker's filter did; lock figures live in ``lock``."""

    checked: int = 0
    new: int = 0
    duplicates: int = 0
    #: Duplicates answered by the local cache, without Redis (in ``duplicates`` too).
    local_hits: int = 0
    script_reloads: int = 0
    stale_generation: int = 0
    #: Calls refused because a new time slice had started (a window), redone in it.
    stale_slice: int = 0
    #: Calls in which a full shard refused items (native engine), redone after growth.
    full: int = 0
    #: Calls in which a window's current slice grew a generation (items redone in it).
    slice_growths: int = 0
    #: Multi-shard calls refused by a master that lost one (a slot moved), redone a call a shard.
    regrouped: int = 0
    generations_added: int = 0
    lock: LockCounters = field(default_factory=LockCounters)


class BloomFilter(Calls, Growth, Forgetting):
    """A sharded, optionally growing Bloom filter in Redis, shared by every worker.

    Build it with :meth:`open`. Not thread-safe: one instance per thread (as Scrapy runs)."""

    counters: FilterCounters

    def __init__(
        self,
        client: Redis | RedisCluster,
        key: str,
        plan: sizing.Sizing,
        seed: int,
        created: float,
        *,
        growth: bool = False,
        generations: int = 1,
        fingerprint: str = "scrapy",
        use_lock: bool = True,
        lock_ttl: float = 1.0,
        lock_wait: float = 1.5,
        outage: OutageGuard | None = None,
        local_cache: int = 0,
        wait_replicas: int = 0,
        engine: str = "lua",
        window: sizing.Window | None = None,
        slice_growth: int = sizing.SLICE_GROWTH_BY_ITEMS,
    ) -> None:
        self.client = client
        #: Waits out Redis outages around each round trip (the same commands retried: op log).
        self.outage = outage
        self.key = key
        self.sizing = plan
        self.seed = seed
        self.created = created
        #: Whether this worker made the filter (found no metadata at its key).
        self.fresh = False
        #: Whether the whole filter grows (with a window each slice grows: :mod:`.window`).
        self.growth = growth and window is None
        self.fingerprint = fingerprint
        self.use_lock = use_lock
        self.counters = FilterCounters()
        #: The recrawl window (``BLOOMDUPE_WINDOW``, as stored); None: remember for good.
        self.window = window
        #: With a window: whether each time slice grows (``BLOOMDUPE_GROWTH``).
        self.slices_grow = growth and window is not None
        #: The master epoch the cache is valid for (a failover may lose what it answers for).
        self._epoch = master_epoch(client)
        #: Carries all the filter's commands during a crawl (:mod:`..transport.link`).
        self.link = Link(client, wait_replicas=wait_replicas)
        self.locks = ShardLocks(self.link, lock_ttl, lock_wait, counters=self.counters.lock)
        self.client_id = secrets.token_hex(6)
        self._next_op = 1
        #: The engine's name (``BLOOMDUPE_ENGINE``, as stored with the filter).
        self.engine_name = engine
        self.engine: Engine
        #: Items Redis has answered for (with a window: until sure to be in a live slice).
        self.cache: LocalCache | TimedCache
        if window is None:
            self.engine = ENGINES[engine](self.link, key, plan.shards, self.client_id)
            self.cache = LocalCache(local_cache)
        else:
            windowed = WINDOW_ENGINES[engine](self.link, key, plan.shards, self.client_id,
                                              window, growth, slice_growth)
            self.engine = windowed
            self.cache = TimedCache(local_cache, windowed.clock.now)
        self.link.knows(*self.engine.scripts())  # loaded again after a NOSCRIPT
        #: Replicas each round trip waits for (``WAIT``; 0: none).
        self.replicas_waited = wait_replicas
        self._lock_keys = [keys.lock(key, i) for i in range(plan.shards)]
        self._new_since_grow_check = 0
        #: ``keys.forgets`` as last read, and when (monotonic, at the read's start; None: never).
        self._forgets: bytes | None = None
        self._forgets_read_at: float | None = None
        #: Why the filter last could not grow (warned once per reason).
        self._cannot_grow: tuple[str, int] | None = None
        self._set_generations(generations)

    def _set_generations(self, count: int) -> None:
        self.generations = [sizing.generation(self.sizing, g) for g in range(count)]
        self.engine.set_generations(self.generations)
        newest = self.generations[-1]
        # Each worker looks at the fill (a BITCOUNT scan) every 0.1% of the capacity it adds,
        # so N workers overfill a generation by about N * 0.1% before it grows.
        self._grow_check_every = max(16, newest.capacity // 1000)
        #: The smallest part a batch is sent in while the newest generation is full.
        self._part_floor = max(1, newest.capacity // 1000)
        #: Items the newest generation still takes (last look at its fill less this worker's adds
        #: since; 0: unknown): a batch goes in parts this size, overfilling no more than adds.
        self._room = 0

    # -- keys ---------------------------------------------------------------

    def shard_key(self, index: int, generation: int = 0) -> str:
        """The key of shard ``index``'s bits in ``generation`` (a string or a BF key, by engine)."""
        return self.engine.shard_key(index, generation)

    # -- creation -----------------------------------------------------------

    @classmethod
    def open(
        cls,
        client: Redis | RedisCluster,
        key: str,
        plan: sizing.Sizing | None,
        *,
        growth: bool = False,
        fingerprint: str = "scrapy",
        use_lock: bool = True,
        lock_ttl: float = 1.0,
        lock_wait: float = 1.5,
        local_cache: int = 0,
        wait_replicas: int = 0,
        read_only: bool = False,
        engine: str = "auto",
        window: sizing.Window | None = None,
    ) -> BloomFilter:
        """Create the filter at ``key``, or join the one there.

        ``plan``: the first generation's sizing (with ``growth``, larger ones are added as it
        fills); a stored filter with other parameters raises :class:`FilterMismatchError`, and
        ``plan`` None joins it whatever they are (with ``read_only``, writing nothing: tools).
        ``engine`` (``BLOOMDUPE_ENGINE``): ``"lua"``, ``"redisbloom"`` (:class:`ConfigError`
        without ``BF.*``) or ``"auto"`` (``"redisbloom"`` when there); a stored filter keeps its
        own, an explicit other one is a mismatch. ``window`` (``BLOOMDUPE_WINDOW``): a filter
        that forgets (:mod:`.window`), ``plan`` one slice's (:func:`sizing.window_plan`) and
        ``growth`` not applying; another stored window (or none) is a mismatch, and ``plan``
        None uses the stored one."""
        if read_only and plan is not None:
            raise ValueError("read_only opens an existing filter: give plan=None")
        keys.validate_key(key)
        has_bf: bool | None = None
        fresh = False
        if plan is None:
            stored = meta.read(client, key)
            if not stored:
                raise FilterMismatchError(key, {"filter": ("absent", "an existing filter")})
        else:
            fresh = not meta.read(client, key)  # this worker makes the filter
            if fresh:
                _refuse_orphans(client, key, plan.shards)
            proposed = _new_engine(client, key, engine)
            has_bf = proposed == native.NAME or None
            # Before anything is written; a shard of either engine there is joined.
            check_room(client, key, 0, plan, native.first_shards_present(client, key, plan))
            stored = meta.create_or_join(client, key, plan,
                                         growth=growth,
                                         fingerprint=fingerprint, engine=proposed,
                                         requested=engine, window=window)
        stored_engine = meta.engine_of(stored)
        if stored_engine not in ENGINES:
            raise FilterMismatchError(key, {"engine": (stored_engine, "lua or redisbloom")})
        if stored_engine == native.NAME and not (has_bf or native.available(client, key)):
            raise native.unavailable_error(client, f"the filter at {key!r} was made with the "
                                                   "redisbloom engine")
        stored_plan = meta.stored_plan(stored, None if plan is None else plan.max_bytes)
        bloom = cls(
            client, key, stored_plan, stored["seed"], stored["created"],
            growth=bool(stored.get("growth", 0)), generations=stored.get("generations", 1),
            fingerprint=stored.get("fingerprint", "scrapy"),
            use_lock=use_lock, lock_ttl=lock_ttl, lock_wait=lock_wait, local_cache=local_cache,
            wait_replicas=wait_replicas, engine=stored_engine,
            window=meta.stored_window(stored), slice_growth=meta.slice_growth(stored),
        )
        if read_only:
            bloom.engine.start()
            return bloom
        # Once the first worker has made every shard ("ready"), a missing one is lost.
        ready = bool(stored.get("ready"))
        try:
            for g, generation in enumerate(bloom.generations):
                bloom.engine.create_shards(g, generation, existing=ready)
        except FilterLostError as e:
            raise bloom._lost(str(e)) from None
        if not ready:
            meta.mark_ready(client, key)
        if fresh:
            # A new crawl at a finished one's key: the report it kept is not this crawl's.
            for name in (keys.stats(key), keys.workers(key)):  # (two slots on a cluster)
                client.delete(name)
        bloom.fresh = fresh
        bloom.engine.load_script()
        return bloom

    @staticmethod
    def engine_for(client: Redis | RedisCluster, key: str, engine: str = "auto") -> str:
        """The engine of the filter at ``key``: the stored one, or for a new filter the one
        ``engine`` gives on this server (:class:`ConfigError` for ``"redisbloom"`` without
        ``BF.*``). Writes nothing; for checks before :meth:`open` (the start-up ACL check)."""
        stored = meta.read(client, key)
        return meta.engine_of(stored) if stored else _new_engine(client, key, engine)

    def _lost(self, what: str) -> FilterLostError:
        """The error for a filter whose state in Redis is gone; the local cache is forgotten."""
        self.cache.clear()
        return FilterLostError(lost_message(self.key, what))

    def verify(self) -> None:
        """Raise :class:`FilterLostError` when the filter's metadata in Redis is gone or is
        another filter's (a new seed): deleted, evicted, flushed, or Redis restarted empty. One
        ``HGETALL``; the scheduler calls it every few seconds and before it calls a crawl done."""
        stored = self._stored()
        if not stored:
            raise self._lost(f"its metadata {keys.meta(self.key)} is gone")
        if stored.get("seed") != self.seed or stored.get("created") != self.created:
            raise self._lost(f"its metadata {keys.meta(self.key)} was replaced (a new seed)")

    def _stored(self) -> dict[str, Any]:
        """The stored fields, decoded (:func:`.meta.read`, through the link)."""
        return meta.decode(self.link.call("HGETALL", keys.meta(self.key)))

    def _reload(self) -> None:
        """Adopt the generation count stored in Redis (another worker grew the filter)."""
        count = self._stored().get("generations", 1)
        if count != len(self.generations):
            logger.info("Bloom filter %s now has %d generations", self.key, count)
            self._set_generations(count)

    # -- check-and-add ------------------------------------------------------

    def add(self, fingerprint: bytes) -> bool:
        """Add one item; True when it was new, False when it was seen before."""
        return self.add_many([fingerprint])[0]

    def add_many(self, fingerprints: Sequence[bytes], sink: Sink | None = None,
                 entry: Callable[[int], Sequence[Any]] | None = None) -> list[bool]:
        """Check-and-add many items in one pipelined round trip (per lock wait); returns, in
        order, True for each item that was new (an item twice in the batch is new at most once).
        A script call carries at most ``MAX_ITEMS_PER_SCRIPT`` items, so none blocks Redis long.

        With a ``sink`` (the crawl's queue), the script that finds an item new also queues
        ``entry(i)`` (as :meth:`~.engine.Sink.sink_item` reads it), atomically: an item is never
        added without being queued. ``entry`` is called only for the items sent to Redis."""
        if not fingerprints:
            return []
        count = len(fingerprints)
        cache = self.cache
        epoch = master_epoch(self.client)
        if epoch != self._epoch:
            self._epoch = epoch
            if len(cache):
                logger.info("Bloom filter %s: the Redis master changed; forgetting the %d "
                            "item(s) of the local cache", self.key, len(cache))
                cache.clear()
        remaining: Sequence[int] = range(count)
        if cache.size:
            if not self._cache_may_answer():
                self._check_forgets()
            unknown = [i for i, fp in enumerate(fingerprints) if fp not in cache]
            # Judged after the lookup: a pause before it (or a failed read) must not let
            # the cache answer for an item forgotten since (see .forgetting).
            if self._cache_may_answer():
                remaining = unknown
                self.counters.local_hits += count - len(remaining)
        seed = self.seed
        shards = self.sizing.shards
        halves = {i: hashing.halves(fingerprints[i], seed) for i in remaining}
        asked = remaining
        op = ack = self._next_op
        self._next_op += count
        results: list[bool] = [False] * count
        lock_state = _LockState(self.use_lock, self.locks.pauses() if self.use_lock else None)
        item: Callable[[int, int], Sequence[Any]] | None = None
        if sink is not None and entry is not None:
            def item(index: int, shard: int) -> Sequence[Any]:
                return sink.sink_item(shard, entry(index))
        # With growth, in parts of at most the room (see _room). Every part keeps the batch's op
        # ids (first op + index) and ack: a retry is answered from the op log.
        start = 0
        while start < len(asked):
            size = max(self._room, self._part_floor) if self.growth else len(asked)
            part = asked[start:start + size]
            start += len(part)
            self._check_add(halves, part, op, ack, results, lock_state, sink, item)
            if self.growth:
                self._added(sum(results[i] for i in part))
        if isinstance(cache, TimedCache):
            for i in asked:
                cache.put(fingerprints[i], self.engine.deadline(
                    hashing.shard_of(halves[i][0], shards), results[i]))
        else:
            cache.update(fingerprints[i] for i in asked)
        new = sum(results)
        self.counters.checked += len(results)
        self.counters.new += new
        self.counters.duplicates += len(results) - new
        return results

    # -- reading ------------------------------------------------------------

    def contains(self, fingerprint: bytes) -> bool:
        """True when every bit of the item is set (it was probably added). Writes nothing."""
        return self.contains_many([fingerprint])[0]

    def contains_many(self, fingerprints: Sequence[bytes]) -> list[bool]:
        return self.engine.contains_many([hashing.halves(fp, self.seed) for fp in fingerprints])

    def info(self) -> FilterInfo:
        """Parameters, and per generation and shard the set bits and memory."""
        self._reload()
        return FilterInfo(self.key, self.sizing, self.seed, self.created, self.growth,
                          self.engine.generation_infos(), self.engine_name)

    def clear(self, *, finished: bool = False, report_ttl: float = 0) -> None:
        """Delete the filter: metadata, every generation's shards, locks, markers, op logs, and
        the crawl-wide stats (``crawlstats``). With ``finished`` (the last worker of a finished
        crawl, ``SCHEDULER_PERSIST`` off) a mark is left first, for :data:`FINISHED_TTL` (or the
        longer ``report_ttl``), so a worker of the crawl coming back later finds its state
        deleted on purpose (:meth:`cleared_when_finished`), not lost; with ``report_ttl`` the
        stats are kept that long (``BLOOMDUPE_REPORT_TTL``; a new filter here deletes them)."""
        kept = [keys.stats(self.key), keys.workers(self.key)] if finished and report_ttl \
            else []
        if finished:
            self.link.call("SET", keys.finished(self.key), self._identity(), "EX",
                           max(FINISHED_TTL, math.ceil(report_ttl)))
        if kept:
            try:
                self.link.calls([("EXPIRE", name, math.ceil(report_ttl)) for name in kept])
            except NoPermissionError as e:  # an ACL without +expire: delete them all
                logger.warning("Could not keep the crawl's report (BLOOMDUPE_REPORT_TTL): "
                               "%s. Add +expire to its ACL (docs/security.md); deleted with "
                               "the rest", e)
                kept = []
        names = [keys.meta(self.key), keys.growlock(self.key), keys.stats(self.key),
                 keys.workers(self.key), keys.forgets(self.key), *self._lock_keys,
                 *(keys.generation_marker(self.key, i) for i in range(self.sizing.shards)),
                 *(keys.forgotten(self.key, i) for i in range(self.sizing.shards)),
                 *self.engine.shard_names()]
        for i in range(self.sizing.shards):  # through the link: a crawl's last job
            names.extend(self.link.scan(keys.op_log_pattern(self.key, i)))
        self.link.calls([("DEL", name) for name in dict.fromkeys(names) if name not in kept])
        self.cache.clear()

    def cleared_when_finished(self) -> bool:
        """Whether the last worker of this filter's finished crawl deleted it (:meth:`clear`)."""
        found = self.link.call("GET", keys.finished(self.key))
        return found in (self._identity(), self._identity().encode())

    def _identity(self) -> str:
        return f"{self.created}:{self.seed}"

    def close(self) -> None:
        """Give the held connection back to the client's pool."""
        self.link.close()
