"""``WAIT n``: a round trip's writes confirmed on ``n`` replicas before its replies are used.

Replication is asynchronous: a check-and-add a master acknowledged but had not passed on is
lost if its replica takes over, and the URL is reported new twice. So each node's commands
end with ``WAIT n timeout`` (n: ``BLOOMDUPE_WAIT_REPLICAS``, given to :class:`~.link.Link`)."""

from __future__ import annotations

import logging
import time
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

#: ``WAIT`` timeout: the longest a round trip waits for replicas (ms).
WAIT_TIMEOUT_MS = 500
#: ``WAIT`` timeout for a node whose last ``WAIT`` came back short (ms); Redis ends it on
#: its server timer, so it may cost up to ``1000 / hz`` ms.
WAIT_DEGRADED_TIMEOUT_MS = 20
#: After this many short ``WAIT`` replies in a row a node is taken to have no live replica
#: (e.g. just promoted): it gets a ``WAIT`` only once per :data:`WAIT_PROBE_INTERVAL` s.
WAIT_DEGRADED_TRIES = 10
WAIT_PROBE_INTERVAL = 1.0


def replicas_to_wait(configured: int | None, client: Any) -> int:
    """``BLOOMDUPE_WAIT_REPLICAS`` as set, or unset: 1 on a Redis Cluster whose every master
    has a replica, else 0. There a page's links go to their shards' masters and its lease is
    acked on another: a master crashing before passing the links on loses them for good.
    ``WAIT 1`` closes that window (docs/benchmarks.md: its cost)."""
    if configured is not None:
        return configured
    if not isinstance(client, RedisCluster):
        return 0
    try:
        infos: Any = client.info("replication", target_nodes=RedisCluster.PRIMARIES)
    except RedisError as e:
        logger.warning("BLOOMDUPE_WAIT_REPLICAS is unset and the cluster's masters cannot be "
                       "asked for their replicas (%s): not waiting for them, so a master that "
                       "crashes can lose links it had not passed on. Grant +info, or set "
                       "BLOOMDUPE_WAIT_REPLICAS (1, with +wait; or 0)", e)
        return 0
    answers = infos.values() if isinstance(infos, dict) and "role" not in infos else [infos]
    return 1 if all(int(info.get("connected_slaves", 0)) > 0 for info in answers) else 0


class WaitPolicy:
    """The ``WAIT replicas timeout`` to append to a node's commands, if any. After a short
    reply (writes not yet on a replica) the node gets :data:`WAIT_DEGRADED_TIMEOUT_MS`; after
    :data:`WAIT_DEGRADED_TRIES` in a row, one ``WAIT`` per :data:`WAIT_PROBE_INTERVAL`; a full
    reply restores the timeout. :attr:`short` counts short replies and :attr:`skipped` round
    trips sent without ``WAIT``: the writes a failover could have lost."""

    def __init__(self, replicas: int, timeout_ms: int | None = None,
                 degraded_timeout_ms: int | None = None) -> None:
        self.replicas = replicas
        self.timeout_ms = WAIT_TIMEOUT_MS if timeout_ms is None else timeout_ms
        self.degraded_timeout_ms = (WAIT_DEGRADED_TIMEOUT_MS if degraded_timeout_ms is None
                                    else degraded_timeout_ms)
        self.short = 0
        self.skipped = 0
        self._shorts: dict[str, int] = {}
        self._next_probe: dict[str, float] = {}
        self._warned: set[str] = set()

    def command(self, node: str) -> tuple[Any, ...] | None:
        """The ``WAIT`` to send after ``node``'s commands, or None."""
        if not self.replicas:
            return None
        shorts = self._shorts.get(node, 0)
        if not shorts:
            return ("WAIT", self.replicas, self.timeout_ms)
        if shorts >= WAIT_DEGRADED_TRIES and time.monotonic() < self._next_probe.get(node, 0.0):
            self.skipped += 1
            return None
        return ("WAIT", self.replicas, self.degraded_timeout_ms)

    def answered(self, node: str, acked: Any) -> None:
        if not isinstance(acked, int):
            return
        if acked >= self.replicas:
            if self._shorts.pop(node, 0):
                logger.debug("WAIT %d on %s: replicas acknowledge again", self.replicas,
                             node or "Redis")
            return
        self.short += 1
        shorts = self._shorts[node] = self._shorts.get(node, 0) + 1
        if shorts >= WAIT_DEGRADED_TRIES:
            self._next_probe[node] = time.monotonic() + WAIT_PROBE_INTERVAL
        if shorts == 1:
            # Once per node at WARNING (a slow replica can flap), then DEBUG.
            level = logging.DEBUG if node in self._warned else logging.WARNING
            self._warned.add(node)
            logger.log(
                level,
                "WAIT %d on %s: %d replica(s) acknowledged within %d ms; until one does, "
                "a failover there can lose acknowledged writes (pages fetched twice; on a "
                "cluster, links never fetched)",
                self.replicas, node or "Redis", acked, self.timeout_ms,
            )
