"""``bloomdupe forget``: re-admitting items a Bloom filter cannot delete.

Each forgotten item's keyed hash goes into its shard's forgotten set (``keys.forgotten``); every
check-and-add script looks there first, takes the item out, answers it new and adds it again,
atomically: the next check of it, on any worker, is new, once. ``keys.forgets`` counts forgets;
a worker with a local cache reads it and drops the cache when it changed.

The local cache answers only while the last *successful* read of the counter began less than
:data:`FORGET_CHECK_EVERY` ago (monotonic clock), judged after the lookup so that a pause cannot
stretch it; otherwise Redis answers. :meth:`Forgetting.forget_many` returns
:data:`FORGET_SETTLE` after the reply to its ``INCR``: a read begun before the ``INCR`` lets its
cache answer only until before then, one begun later sees the new count, so once it returns no
worker's cache answers for a forgotten item. :data:`FORGET_MARGIN` covers a worker's monotonic
clock running slower than this one's.

:class:`Forgetting` is mixed into :class:`~.filter.BloomFilter`, whose state it uses.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoPermissionError, RedisError

from .. import hashing, keys
from ..transport.cluster import is_cluster
from ..transport.diagnose import describe
from .lua import _pipelined

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

    from ..localcache import LocalCache, TimedCache
    from ..sizing import Sizing
    from ..transport.link import Link

logger = logging.getLogger(__name__)

#: How long (s) a successful read of the forget counter (``keys.forgets``) lets the local cache
#: answer; the counter is read again at most this often, the cache dropped if it changed.
FORGET_CHECK_EVERY = 1.0
#: Added to :data:`FORGET_CHECK_EVERY` (s): room for a worker's clock running slower than ours.
FORGET_MARGIN = 0.5
#: How long after its ``INCR`` :meth:`Forgetting.forget_many` returns (seconds).
FORGET_SETTLE = FORGET_CHECK_EVERY + FORGET_MARGIN
#: How long a forget waits for a replica of each master that has one to hold it (ms).
FORGET_WAIT_MS = 1000


def _has_replicas(client: Redis) -> bool:
    """Whether ``client``'s server has a connected replica (False when its ACL or provider
    denies ``INFO``: the forget is then sent without ``WAIT``)."""
    try:
        return int(client.info("replication").get("connected_slaves", 0)) > 0
    except RedisError as e:
        logger.debug("Could not look for replicas: %s", e)
        return False


class Forgetting:
    """Re-admits items, and keeps the local cache from answering for them (see the module)."""

    if TYPE_CHECKING:
        client: Redis | RedisCluster
        link: Link
        key: str
        seed: int
        sizing: Sizing
        cache: LocalCache | TimedCache
        _forgets: bytes | None
        _forgets_read_at: float | None

    def _cache_may_answer(self) -> bool:
        """Whether the counter's last successful read is recent enough for the cache to answer."""
        read_at = self._forgets_read_at
        return read_at is not None and time.monotonic() - read_at < FORGET_CHECK_EVERY

    def _check_forgets(self) -> None:
        """Read the forget counter and drop the local cache if it changed (a forgotten item must
        reach Redis); a failed read leaves the cache unable to answer until a read succeeds."""
        started = time.monotonic()  # the read may see the counter as of any later moment
        try:
            now: Any = self.link.call("GET", keys.forgets(self.key))
        except RedisError as e:  # the items go to Redis meanwhile (_cache_may_answer)
            logger.debug("Could not look at %s: %s", keys.forgets(self.key), e)
            return
        if now != self._forgets:
            if self._forgets is not None or now is not None:
                self.cache.clear()
            self._forgets = now
        self._forgets_read_at = started

    def forget_many(self, fingerprints: Sequence[bytes]) -> int:
        """Re-admit these items (see the module docstring): the next check of each, by any
        worker, answers new, once. Returns, :data:`FORGET_SETTLE` after raising the counter, how
        many were not already waiting to be re-admitted."""
        added = self._write_forget(self._forget_commands(fingerprints))
        settled = time.monotonic() + FORGET_SETTLE
        self.cache.clear()
        while (left := settled - time.monotonic()) > 0:
            time.sleep(left)
        return sum(int(n) for n in added)

    def readmit(self, fingerprints: Sequence[bytes]) -> None:
        """:meth:`forget_many`'s writes without its wait, for items this worker added but could
        not queue (its crawl had closed); caches drop them within :data:`FORGET_SETTLE`."""
        self.link.calls(self._forget_commands(fingerprints))
        self.cache.clear()

    def _forget_commands(self, fingerprints: Sequence[bytes]) -> list[tuple[Any, ...]]:
        """A forget's writes: a ``SADD`` of keyed hashes a shard, then the counter's ``INCR``."""
        shards = self.sizing.shards
        by_shard: dict[int, list[bytes]] = {}
        for fp in dict.fromkeys(fingerprints):
            h1, h2 = hashing.halves(fp, self.seed)
            by_shard.setdefault(hashing.shard_of(h1, shards), []).append(
                hashing.keyed_item(h1, h2))
        commands: list[tuple[Any, ...]] = [
            ("SADD", keys.forgotten(self.key, shard), *members)
            for shard, members in sorted(by_shard.items())]
        commands.append(("INCR", keys.forgets(self.key)))
        return commands

    def _write_forget(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Send a forget's writes per master, then ``WAIT 1`` where it has replicas, so a
        failover right after a forget promotes a replica that holds it (warned when none does
        within :data:`FORGET_WAIT_MS`). Returns the ``SADD`` replies."""
        groups: list[tuple[Redis, list[tuple[Any, ...]]]] = []
        if is_cluster(self.client):
            cluster: Any = self.client
            by_node: dict[str, tuple[Redis, list[tuple[Any, ...]]]] = {}
            for command in commands:
                node = cluster.get_node_from_key(command[1])
                by_node.setdefault(node.name, (cluster.get_redis_connection(node), []))[1] \
                    .append(command)
            groups = list(by_node.values())
        else:
            single: Any = self.client
            groups = [(single, commands)]
        added: list[Any] = []
        for client, own in groups:
            replicated = _has_replicas(client)
            pipe: Any = client.pipeline(transaction=False)
            for command in own:
                pipe.execute_command(*command)
            if replicated:
                pipe.execute_command("WAIT", 1, FORGET_WAIT_MS)
            replies = pipe.execute()
            if replicated and int(replies.pop()) < 1:
                logger.warning(
                    "The forget is not on a replica of %s yet (WAIT 1 %d ms came back "
                    "short): if that master fails over before its replica catches up, the "
                    "URLs are not re-admitted; run the same forget again then",
                    describe(client), FORGET_WAIT_MS)
            added.extend(r for c, r in zip(own, replies, strict=True) if c[0] == "SADD")
        return added

    def are_forgotten(self, fingerprints: Sequence[bytes]) -> list[bool]:
        """Whether each item waits in its shard's forgotten set (its next check answers it
        new); reads only. All False where the ACL denies ``SISMEMBER`` (logged)."""
        shards = self.sizing.shards
        commands: list[tuple[Any, ...]] = []
        for fp in fingerprints:
            h1, h2 = hashing.halves(fp, self.seed)
            commands.append(("SISMEMBER", keys.forgotten(self.key, hashing.shard_of(h1, shards)),
                             hashing.keyed_item(h1, h2)))
        try:
            return [bool(int(r)) for r in _pipelined(self.client, commands)]
        except NoPermissionError as e:
            logger.debug("Could not look at the forgotten sets of %s: %s", self.key, e)
            return [False] * len(fingerprints)

    def forgotten(self) -> int:
        """Items waiting to be re-admitted (``bloomdupe forget``), every shard."""
        return sum(int(n) for n in _pipelined(
            self.client, [("SCARD", keys.forgotten(self.key, i))
                          for i in range(self.sizing.shards)]))
