"""``bloomdupe forget``: re-admitting items a Bloom filter cannot delete.

Each forgotten item's keyed hash goes into its shard's forgotten set
(``keys.forgotten``); every check-and-add script looks there first, takes the
item out, answers it new and adds it again, atomically: the next check of it,
on any worker, is new, once. ``keys.forgets`` counts forgets: a worker with a
local cache reads it at most every :data:`FORGET_CHECK_EVERY` seconds and drops
the cache when it changed, so the cache does not answer for a forgotten item.

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

#: How often (seconds) a worker with a local cache looks whether ``bloomdupe forget`` ran
#: (``keys.forgets``), and drops its cache if so.
FORGET_CHECK_EVERY = 1.0


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
        _next_forget_check: float

    def _check_forgets(self) -> None:
        """Drop the local cache when ``bloomdupe forget`` ran since the last look: a
        forgotten item must reach Redis (which answers it new, once)."""
        self._next_forget_check = time.monotonic() + FORGET_CHECK_EVERY
        try:
            now: Any = self.client.get(keys.forgets(self.key))
        except RedisError as e:  # no forget can be done while Redis is away: the cache holds
            logger.debug("Could not look at %s: %s", keys.forgets(self.key), e)
            return
        if now != self._forgets:
            if self._forgets is not None or now is not None:
                self.cache.clear()
            self._forgets = now

    def forget_many(self, fingerprints: Sequence[bytes]) -> int:
        """Re-admit these items: the next check of each, by any worker, answers new (once),
        and adds it again. A Bloom filter cannot delete, so each item's keyed hash goes
        into its shard's forgotten set, which the check-and-add script looks at first;
        the forget counter tells workers to drop their local caches (they look every
        :data:`FORGET_CHECK_EVERY` seconds). Returns how many were not already waiting
        to be re-admitted."""
        shards = self.sizing.shards
        by_shard: dict[int, list[bytes]] = {}
        for fp in dict.fromkeys(fingerprints):
            h1, h2 = hashing.halves(fp, self.seed)
            by_shard.setdefault(hashing.shard_of(h1, shards), []).append(
                hashing.keyed_item(h1, h2))
        added = _pipelined(self.client, [("SADD", keys.forgotten(self.key, shard), *members)
                                         for shard, members in sorted(by_shard.items())])
        self.client.incr(keys.forgets(self.key))
        self.cache.clear()
        return sum(int(n) for n in added)

    def forgotten(self) -> int:
        """Items waiting to be re-admitted (``bloomdupe forget``), every shard."""
        return sum(int(n) for n in _pipelined(
            self.client, [("SCARD", keys.forgotten(self.key, i))
                          for i in range(self.sizing.shards)]))
