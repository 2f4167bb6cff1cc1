"""The Bloom filter's growth (:class:`Growth`, mixed into :class:`~.filter.BloomFilter`).

When the newest generation is full, a worker adds a larger one under ``keys.growlock`` (shards
first, then the count in the metadata). A worker still using the old count is refused by the
shard's generation marker, reloads and retries, so no item goes into an old generation. A batch
larger than the room left is sent in parts, so no generation is overfilled. The filter does not
grow past ``BLOOMDUPE_MAX_BYTES`` nor Redis's ``maxmemory``.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from redis.exceptions import RedisError

from .. import keys, sizing
from ..exceptions import ConfigError, FilterFullError
from ..transport.onloop import pause

if TYPE_CHECKING:
    from ..sizing import Sizing
    from ..transport.link import Link
    from .engine import Engine
    from .lock import ShardLocks

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How long a worker may take to add a generation before others may try.
GROW_LOCK_TTL_MS = 60_000
#: Room left in the newest generation when it cannot grow: batches go whole.
_NO_LIMIT = sys.maxsize
#: How long a worker whose shard is full waits for another worker to add a generation.
FULL_WAIT = 10.0


class GrowthCounters(Protocol):
    """What growth counts (in the filter's counters)."""

    generations_added: int


class Growth:
    """Adds a generation when the newest one is full (see the module's docstring)."""

    if TYPE_CHECKING:
        link: Link
        key: str
        sizing: Sizing
        growth: bool
        generations: list[Sizing]
        engine: Engine
        locks: ShardLocks
        counters: GrowthCounters
        _room: int
        _cannot_grow: tuple[str, int] | None
        _new_since_grow_check: int
        _grow_check_every: int

        def _reload(self) -> None: ...

        def _guarded(self, call: Callable[[], T]) -> T: ...

        def _set_generations(self, count: int) -> None: ...

    def _added(self, new: int) -> None:
        """Count ``new`` items; check the fill (and grow) every ``_grow_check_every`` of
        them and when the room left runs out."""
        if not new:
            return
        before = self._room
        self._room -= new
        self._new_since_grow_check += new
        if self._new_since_grow_check >= self._grow_check_every or before > 0 >= self._room:
            self._new_since_grow_check = 0
            try:
                # Waits an outage out as the check-and-add does (one ERROR, then resumes).
                self._guarded(self._maybe_grow)
            except RedisError as e:  # the answers stand; the next check tries again
                logger.warning("Could not check whether Bloom filter %s must grow: %s",
                               self.key, e)

    def _grow_for_full(self, used: int) -> None:
        """A full shard of the newest of ``used`` generations refused items: add a generation
        unless another worker has (or wait for it). :class:`FilterFullError` if it may not."""
        deadline = time.monotonic() + FULL_WAIT
        while True:
            self._guarded(self._reload)
            if len(self.generations) > used:
                return
            if self.growth:
                self._guarded(lambda: self._maybe_grow(full=used))
                if len(self.generations) > used:
                    return
            if not self.growth or self._room == _NO_LIMIT or time.monotonic() > deadline:
                raise FilterFullError(self.key, self.generations[-1].capacity, self.growth,
                                      self._cannot_grow[0] if self._cannot_grow else None)
            pause(0.05)  # another worker holds the grow lock

    def _maybe_grow(self, full: int | None = None) -> None:
        """Add a generation if the newest reached its capacity (with ``full``, the count of
        generations whose newest has a full shard: at once, unless grown since); updates the
        room left. Past ``max_bytes`` or ``maxmemory``: one warning, the newest fills on."""
        self._reload()
        newest = len(self.generations) - 1
        if full is not None and newest + 1 != full:
            return
        capacity = self.generations[newest].capacity
        items = self.engine.newest_items()
        if items < capacity and full is None:
            self._room = math.ceil(capacity - items)
            return
        self._room = 0
        lock = keys.growlock(self.key)
        token = self.locks.new_token()
        if not self.link.call("SET", lock, token, "NX", "PX", GROW_LOCK_TTL_MS):
            return  # another worker is adding it; the generation marker tells us when
        try:
            self._reload()
            if len(self.generations) - 1 != newest:
                return
            try:
                following = sizing.generation(self.sizing, newest + 1)
                self._within_max_bytes(newest + 1)
                # Shards first, then the count: none is used before all its shards exist.
                self.engine.create_shards(newest + 1, following)
            except ConfigError as e:
                self._room = _NO_LIMIT  # no use sending batches in parts
                why = (e.setting, newest + 1)
                if why != self._cannot_grow:
                    self._cannot_grow = why
                    logger.warning("Bloom filter %s is full and cannot grow: %s", self.key, e)
                return
            self.link.call("HSET", keys.meta(self.key), "generations", newest + 2)
            self._set_generations(newest + 2)
            self._room = following.capacity
            self.counters.generations_added += 1
            logger.warning(
                "Bloom filter %s reached the capacity of generation %d (%d items); added "
                "generation %d for %d more at error rate %.2g, %d bytes",
                self.key, newest, self.generations[newest].capacity, newest + 1,
                following.capacity, following.error_rate,
                following.bytes_per_shard * following.shards,
            )
        finally:
            self.locks.release(lock, token)

    def _within_max_bytes(self, generation: int) -> None:
        """:class:`ConfigError` if ``generation`` takes the filter past ``max_bytes``."""
        limit = self.sizing.max_bytes
        if limit is None:
            return
        total = sizing.total_bytes(self.sizing, generation + 1)
        if total > limit:
            added = self.generations[0] if generation == 0 else sizing.generation(
                self.sizing, generation)
            raise ConfigError(
                "BLOOMDUPE_MAX_BYTES", limit,
                f"leaves no room for generation {generation} "
                f"({sizing.human_bytes(added.total_bytes)}: the filter would take "
                f"{sizing.human_bytes(total)}, over {sizing.human_bytes(limit)}); raise "
                "BLOOMDUPE_MAX_BYTES if Redis has the memory, or start a new filter with a "
                "larger BLOOMDUPE_CAPACITY",
            )
