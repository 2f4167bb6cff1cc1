"""``bloomdupe forget``: re-admitting items a Bloom filter cannot delete.

Each forgotten item's keyed hash goes into its shard's forgotten set
(``keys.forgotten``); every check-and-add script looks there first, takes the
item out, answers it new and adds it again, atomically: the next check of it,
on any worker, is new, once. ``keys.forgets`` counts forgets: a worker with a
local cache reads it and drops the cache when it changed.

The local cache answers only while the last *successful* read of the counter
began less than :data:`FORGET_CHECK_EVERY` seconds ago (this worker's monotonic
clock), judged after the lookup, so a pause between the read and the lookup
cannot stretch it; otherwise (a failed read too) the items go to Redis, which
answers for them. :meth:`Forgetting.forget_many` returns only
:data:`FORGET_SETTLE` seconds after the reply to its ``INCR``. A read that began
before the ``INCR`` ran lets the cache answer until at most
:data:`FORGET_CHECK_EVERY` after it began, so before then; a read that began
later sees the new count and drops the cache. So once ``forget_many`` has
returned, no worker's cache answers for a forgotten item. :data:`FORGET_MARGIN`
covers a worker's clock running slower than this one's (a difference of rate:
monotonic clocks share no origin, and their rates differ by far less).

:class:`Forgetting` is mixed into :class:`~.filter.BloomFilter`, whose state it uses.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from .. import hashing, keys
from .lua import _pipelined

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

    from ..localcache import LocalCache, TimedCache
    from ..sizing import Sizing

logger = logging.getLogger(__name__)

#: How long (seconds) a successful read of the forget counter (``keys.forgets``) lets a
#: worker's local cache answer: at most this often it reads the counter again, and drops
#: its cache if the counter changed.
FORGET_CHECK_EVERY = 1.0
#: What :meth:`Forgetting.forget_many` waits beyond :data:`FORGET_CHECK_EVERY` after its
#: ``INCR`` (seconds): room for a worker's clock running slower than this one's.
FORGET_MARGIN = 0.5
#: How long after its ``INCR`` :meth:`Forgetting.forget_many` returns (seconds).
FORGET_SETTLE = FORGET_CHECK_EVERY + FORGET_MARGIN


class Forgetting:
    """Re-admits items, and keeps the local cache from answering for them (see the
    module's docstring)."""

    if TYPE_CHECKING:
        client: Redis | RedisCluster
        key: str
        seed: int
        sizing: Sizing
        cache: LocalCache | TimedCache
        _forgets: bytes | None
        _forgets_read_at: float | None

    def _cache_may_answer(self) -> bool:
        """Whether the last successful read of the forget counter is recent enough
        (:data:`FORGET_CHECK_EVERY`) for the local cache to answer."""
        read_at = self._forgets_read_at
        return read_at is not None and time.monotonic() - read_at < FORGET_CHECK_EVERY

    def _check_forgets(self) -> None:
        """Read the forget counter; drop the local cache when ``bloomdupe forget`` ran
        since the last read (a forgotten item must reach Redis, which answers it new,
        once). A failed read leaves the cache unable to answer until a read succeeds."""
        started = time.monotonic()  # the read may see the counter as of any later moment
        try:
            now: Any = self.client.get(keys.forgets(self.key))
        except RedisError as e:  # the items go to Redis meanwhile (_cache_may_answer)
            logger.debug("Could not look at %s: %s", keys.forgets(self.key), e)
            return
        if now != self._forgets:
            if self._forgets is not None or now is not None:
                self.cache.clear()
            self._forgets = now
        self._forgets_read_at = started

    def forget_many(self, fingerprints: Sequence[bytes]) -> int:
        """Re-admit these items: the next check of each, by any worker, answers new (once),
        and adds it again. A Bloom filter cannot delete, so each item's keyed hash goes
        into its shard's forgotten set, which the check-and-add script looks at first;
        the forget counter tells workers to drop their local caches. It sleeps until
        :data:`FORGET_SETTLE` seconds after raising the counter, when no worker's cache
        can answer for these items any more (see the module's docstring), then returns
        how many were not already waiting to be re-admitted."""
        shards = self.sizing.shards
        by_shard: dict[int, list[bytes]] = {}
        for fp in dict.fromkeys(fingerprints):
            h1, h2 = hashing.halves(fp, self.seed)
            by_shard.setdefault(hashing.shard_of(h1, shards), []).append(
                hashing.keyed_item(h1, h2))
        added = _pipelined(self.client, [("SADD", keys.forgotten(self.key, shard), *members)
                                         for shard, members in sorted(by_shard.items())])
        self.client.incr(keys.forgets(self.key))
        settled = time.monotonic() + FORGET_SETTLE
        self.cache.clear()
        while (left := settled - time.monotonic()) > 0:
            time.sleep(left)
        return sum(int(n) for n in added)

    def forgotten(self) -> int:
        """Items waiting to be re-admitted (``bloomdupe forget``), every shard."""
        return sum(int(n) for n in _pipelined(
            self.client, [("SCARD", keys.forgotten(self.key, i))
                          for i in range(self.sizing.shards)]))
