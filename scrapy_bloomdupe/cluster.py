"""Redis Cluster support: the check-and-add round trip, failover retries, shard placement.

Every key of shard ``i`` carries the hash tag ``{K:i}``, so each shard lives in
one slot on one master and its check-and-add script is single-slot; different
shards hash to different slots and so spread over the masters.

:class:`ClusterLink` is what :class:`~scrapy_bloomdupe.transport.Link` uses
for a ``redis.cluster.RedisCluster`` client. It groups a batch by the master
that owns each command's slot, writes every group on that master's connection
before reading any reply (one round trip, masters in parallel), and retries
through a failover itself, because redis-py's cluster client retries a failed
command without pausing: while a killed master's replica is being promoted
(``cluster-node-timeout`` plus an election, a few seconds) its retries are
spent in milliseconds. :class:`ClusterLink` instead follows the client's
``Retry`` object (``RedisCluster(retry=...)``): the count and the backoff
between attempts. Before each new attempt it reloads the slot map, so the
promoted replica is found as soon as the cluster has elected it.

What is retried: connection errors and timeouts (reconnect to the slot's
master, whoever it now is), ``CLUSTERDOWN`` (no master for some slots yet),
``TRYAGAIN``, ``READONLY`` (a stale slot map sent a write to a replica) and a
slot with no known master; ``MOVED`` is followed at once, ``ASK`` through the
cluster client. Only the commands without an answer are sent again. Every
command this package sends is safe to send twice (the check-and-add is
idempotent by op id), so a command that may have run is simply repeated.

Replication is asynchronous. A check-and-add that a master acknowledged but had
not yet passed to its replica is lost if that master dies and the replica takes
over: the URL was reported new once, and will be reported new again (a
duplicate crawl). With ``wait_replicas`` (``WAIT n timeout`` after each
master's group of commands, see :class:`WaitPolicy`) a reply is read only once
``n`` replicas have the write, or the timeout has passed, which closes that
window for the replica that gets promoted (unless the wait timed out), at the
cost of one replication round trip per batch.
"""

from __future__ import annotations

import copy
import logging
import secrets
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.backoff import EqualJitterBackoff
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    ConnectionError,
    MovedError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TimeoutError,
    TryAgainError,
)
from redis.retry import Retry

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import ClusterNode, RedisCluster

    from .filter import BloomFilter

logger = logging.getLogger(__name__)

#: Retries of a cluster client made by :func:`scrapy_bloomdupe.connection.from_settings`
#: (``BLOOMDUPE_REDIS_CLUSTER = True``) unless ``REDIS_PARAMS`` has a ``retry``: pauses of
#: 0.25-0.5 s after the first few, so 40 retries wait 10-19 s in all. A master's
#: failover takes ``cluster-node-timeout`` plus about a second of election.
CLUSTER_RETRIES = 40
CLUSTER_BACKOFF_CAP = 0.5
CLUSTER_BACKOFF_BASE = 0.05
#: How many ``MOVED`` redirections one attempt follows before it counts as failed.
MAX_REDIRECTS = 5

#: Errors after which the commands without an answer are sent again (after a pause).
RETRY_ERRORS: tuple[type[Exception], ...] = (
    ConnectionError,
    TimeoutError,
    ClusterDownError,
    TryAgainError,
    ReadOnlyError,
    SlotNotCoveredError,
    MovedError,
)


#: ``WAIT`` timeout: the longest a round trip waits for replicas (ms).
WAIT_TIMEOUT_MS = 500
#: ``WAIT`` timeout for a node whose last ``WAIT`` came back short (ms). Redis
#: ends a timed-out ``WAIT`` on its server timer, so on an idle server this costs
#: up to ``1000 / hz`` ms (100 ms at the default ``hz 10``).
WAIT_DEGRADED_TIMEOUT_MS = 20
#: After this many short ``WAIT`` replies in a row a node is taken to have no live
#: replica (e.g. the replica just promoted by a failover, until a new one joins):
#: it then gets a ``WAIT`` only once per :data:`WAIT_PROBE_INTERVAL` seconds,
#: instead of costing every round trip the timeout.
WAIT_DEGRADED_TRIES = 10
WAIT_PROBE_INTERVAL = 1.0

_wait_settings: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def set_wait_replicas(client: Any, replicas: int) -> None:
    """Make every :class:`~scrapy_bloomdupe.transport.Link` on ``client`` end each
    master's commands with ``WAIT replicas``. ``0`` (the default) turns it off."""
    if replicas < 0:
        raise ValueError("replicas must be >= 0")
    _wait_settings[client] = replicas


def wait_replicas(client: Any) -> int:
    """What :func:`set_wait_replicas` set for ``client`` (0 if nothing)."""
    try:
        return _wait_settings.get(client, 0)
    except TypeError:  # not weak-referenceable
        return 0


class WaitPolicy:
    """The ``WAIT replicas timeout`` to append to a node's commands, if any.

    ``WAIT`` returns once ``replicas`` replicas acknowledged every write sent
    before it on the connection, or after the timeout. A short count means the
    writes are not (yet) on a replica: a slow replica, or none at all. After a
    short reply the node gets :data:`WAIT_DEGRADED_TIMEOUT_MS`; after
    :data:`WAIT_DEGRADED_TRIES` short replies in a row, one ``WAIT`` per
    :data:`WAIT_PROBE_INTERVAL`; a full reply restores the normal timeout.
    :attr:`short` counts short replies and :attr:`skipped` round trips sent
    without ``WAIT`` meanwhile: the writes a failover could have lost.
    """

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
                "a failover there can lose acknowledged check-and-adds (duplicate crawls)",
                self.replicas, node or "Redis", acked, self.timeout_ms,
            )


def default_retry() -> Retry:
    """The ``Retry`` this package gives a cluster client: rides out a master's failover."""
    return Retry(EqualJitterBackoff(cap=CLUSTER_BACKOFF_CAP, base=CLUSTER_BACKOFF_BASE),
                 CLUSTER_RETRIES)


def is_cluster(client: object) -> bool:
    """True for a ``redis.cluster.RedisCluster`` (or anything that routes by slot like it)."""
    return hasattr(client, "nodes_manager") and not hasattr(client, "connection_pool")


@dataclass
class LinkCounters:
    """What a :class:`ClusterLink` had to do besides the plain round trip."""

    round_trips: int = 0
    #: Attempts that left commands without an answer and were followed by a pause.
    retries: int = 0
    #: Slot map reloads (after a failed attempt).
    refreshes: int = 0
    #: ``MOVED`` replies followed, and commands sent through the client after ``ASK``.
    redirects: int = 0
    asks: int = 0
    #: The last error that caused a retry, as text.
    last_error: str = ""


class _Attempt(Exception):
    """Some commands are still without an answer; ``error`` is the first reason."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class ClusterLink:
    """One round trip per :meth:`execute` on a cluster client; replies as :class:`Link`'s.

    ``wait_replicas`` > 0 appends ``WAIT wait_replicas wait_timeout_ms`` to each
    master's commands (see the module docstring).
    """

    def __init__(self, client: RedisCluster, *, wait_replicas: int = 0,
                 wait_timeout_ms: int | None = None) -> None:
        # redis-py's cluster and connection internals carry no annotations.
        self.client: Any = client
        self.wait = WaitPolicy(wait_replicas, wait_timeout_ms)
        self.counters = LinkCounters()
        retry = getattr(client, "retry", None)
        self._retry = copy.copy(retry) if isinstance(retry, Retry) else default_retry()
        self._retry.update_supported_errors([_Attempt])
        self._refresh_due = False
        self._failed_node: str | None = None
        self._slots: dict[Any, int] = {}

    # -- routing --------------------------------------------------------------

    def _slot(self, command: Sequence[Any]) -> int:
        """The slot of the command's first key (every key of one command shares it)."""
        name = str(command[0]).upper()
        if name in ("EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO", "FCALL", "FCALL_RO"):
            if int(command[2]) < 1:
                raise RedisClusterException(f"{name} without keys cannot be routed")
            key = command[3]
        else:
            key = command[1]
        slot = self._slots.get(key)
        if slot is None:
            slot = key_slot(self.client.encoder.encode(key))
            if len(self._slots) < 100_000:
                self._slots[key] = slot
        return slot

    def _master(self, slot: int) -> ClusterNode:
        node: ClusterNode = self.client.nodes_manager.get_node_from_slot(slot)
        return node

    # -- the round trip -------------------------------------------------------

    def execute(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Send ``commands``; return one reply each, error replies as exceptions.

        Raises the last connection or cluster error once the client's retries
        are spent.
        """
        results: list[Any] = [None] * len(commands)
        pending: list[int] = list(range(len(commands)))

        def attempt() -> list[Any]:
            nonlocal pending
            if self._refresh_due:
                self._refresh()
            pending = self._attempt(commands, pending, results)
            return results

        try:
            return self._retry.call_with_retry(attempt, self._failed)
        except _Attempt as e:
            raise e.error from None

    def _failed(self, error: Exception) -> None:
        self.counters.retries += 1
        cause = error.error if isinstance(error, _Attempt) else error
        self.counters.last_error = f"{type(cause).__name__}: {cause}"
        self._refresh_due = True
        logger.debug("Cluster round trip incomplete, will retry: %s", self.counters.last_error)

    def _refresh(self) -> None:
        """Reload the slot map (who is master of what) from any node that answers."""
        self._refresh_due = False
        self.counters.refreshes += 1
        try:
            self.client.nodes_manager.initialize(last_failed_node_name=self._failed_node)
        except (RedisError, RedisClusterException) as e:
            # No node answered, or the map has holes: the next attempt fails and retries.
            logger.debug("Cluster slot map reload failed: %s", e)
        self._failed_node = None

    def _attempt(self, commands: Sequence[tuple[Any, ...]], pending: list[int],
                 results: list[Any]) -> list[int]:
        """Send the pending commands; fill ``results``; raise :class:`_Attempt` if any
        are left without an answer (returning them is never needed: on success none are)."""
        first_error: Exception | None = None
        for _ in range(1 + MAX_REDIRECTS):
            left, error, moved = self._send(commands, pending, results)
            if error is not None and first_error is None:
                first_error = error
            pending = left
            if not pending or not moved or first_error is not None:
                break
            self.counters.redirects += 1
        if pending:
            raise _Attempt(first_error or ClusterError(
                f"MOVED more than {MAX_REDIRECTS} times in one round trip"))
        return pending

    def _send(self, commands: Sequence[tuple[Any, ...]], pending: list[int],
              results: list[Any]) -> tuple[list[int], Exception | None, bool]:
        """One pass: (indexes still without an answer, first retryable error, moved?)."""
        groups: dict[str, tuple[ClusterNode, list[int]]] = {}
        left: list[int] = []
        error: Exception | None = None
        for i in pending:
            try:
                node = self._master(self._slot(commands[i]))
            except SlotNotCoveredError as e:
                left.append(i)
                error = error or e
                continue
            groups.setdefault(node.name, (node, []))[1].append(i)
        sent: list[tuple[ClusterNode, Any, Any, list[int], bool]] = []
        for node, indexes in groups.values():
            redis_node = self.client.get_redis_connection(node)
            batch: list[tuple[Any, ...]] = [commands[i] for i in indexes]
            wait = self.wait.command(node.name)
            if wait is not None:
                batch.append(wait)
            conn: Any = None
            try:
                conn = redis_node.connection_pool.get_connection()
                conn.send_packed_command(conn.pack_commands(batch))
            except (ConnectionError, TimeoutError) as e:
                if conn is not None:
                    conn.disconnect()
                    redis_node.connection_pool.release(conn)
                self._failed_node = node.name
                left.extend(indexes)
                error = error or e
                continue
            sent.append((node, redis_node, conn, indexes, wait is not None))
        moved = False
        asks: list[int] = []
        self.counters.round_trips += 1
        for node, redis_node, conn, indexes, waited in sent:
            read = 0
            try:
                for i in indexes:
                    try:
                        reply = conn.read_response()
                    except ResponseError as e:
                        reply = e
                    read += 1
                    if isinstance(reply, MovedError):
                        self.client.nodes_manager.move_slot(reply)
                        moved = True
                        left.append(i)
                    elif isinstance(reply, AskError):
                        asks.append(i)
                    elif isinstance(reply, (ClusterDownError, TryAgainError, ReadOnlyError)):
                        left.append(i)
                        error = error or reply
                    else:
                        results[i] = reply
                if waited:
                    self.wait.answered(node.name, conn.read_response())
            except (ConnectionError, TimeoutError) as e:
                # Replies not read: those commands may or may not have run. Send again
                # (all of them when a WAIT was pending: their writes are unconfirmed).
                conn.disconnect()
                self._failed_node = node.name
                unanswered = indexes if waited else indexes[read:]
                for i in unanswered:
                    results[i] = None
                left.extend(unanswered)
                error = error or e
            except ResponseError as e:
                # Only WAIT can get here (a replica cannot WAIT): keep the replies.
                logger.debug("WAIT failed on %s: %s", node.name, e)
            finally:
                redis_node.connection_pool.release(conn)
        for i in asks:
            # A slot being migrated: let the cluster client follow ASK (rare).
            self.counters.asks += 1
            try:
                results[i] = self.client.execute_command(*commands[i])
            except RETRY_ERRORS as e:
                left.append(i)
                error = error or e
            except RedisError as e:
                results[i] = e
        left.sort()
        return left, error, moved and error is None

    def close(self) -> None:
        """Nothing is held between round trips."""


# -- placement ------------------------------------------------------------------


def shard_keys(bloom: BloomFilter, index: int) -> list[str]:
    """The fixed keys of shard ``index``: every generation's bits, lock, generation marker.

    (Its op logs, ``{K:i}:ops:<client>``, carry the same hash tag.)
    """
    keys = [bloom.shard_key(index, g) for g in range(len(bloom.generations))]
    keys.append(bloom.lock_key(index))
    keys.append(f"{{{bloom.key}:{index}}}:gen")
    keys.append(f"{{{bloom.key}:{index}}}:ops:{bloom.client_id}")
    return keys


def shard_slots(bloom: BloomFilter) -> list[int]:
    """The Redis Cluster slot of each shard, in shard order."""
    return [key_slot(bloom.shard_key(i).encode()) for i in range(bloom.sizing.shards)]


def shard_nodes(client: Redis | RedisCluster, bloom: BloomFilter) -> dict[str, list[int]]:
    """Which master holds which shards: ``{"host:port": [shard index, ...]}``.

    Masters that hold no shard are listed with an empty list, so an uneven
    spread shows. A single-node client gives one entry with every shard.
    """
    shards = range(bloom.sizing.shards)
    if not is_cluster(client):
        from .connection import describe

        return {describe(client): list(shards)}
    cluster: Any = client
    spread: dict[str, list[int]] = {n.name: [] for n in cluster.get_primaries()}
    for index, slot in zip(shards, shard_slots(bloom), strict=True):
        node = cluster.nodes_manager.get_node_from_slot(slot)
        spread.setdefault(node.name, []).append(index)
    return {name: spread[name] for name in sorted(spread)}


def spread_summary(spread: dict[str, list[int]]) -> str:
    """One line for logs and the CLI: ``3 masters: 127.0.0.1:7000 [0, 3], ...``."""
    parts = [f"{name} {indexes}" for name, indexes in spread.items()]
    return f"{len(spread)} master(s): " + ", ".join(parts)


# -- the scheduler's queue ----------------------------------------------------------


#: How long the queue's push and pop records outlive their last write; a retry
#: must come before this.
RECORD_TTL_MS = 3_600_000


def _priority_queue_class() -> type:
    """Build :class:`PriorityQueue` (imports scrapy-redis, so only when asked for)."""
    from scrapy_redis.queue import PriorityQueue as RedisPriorityQueue

    class PriorityQueue(RedisPriorityQueue):  # type: ignore[misc]
        """scrapy-redis's priority queue, with a push and a pop that survive a lost
        reply, and that work on a Redis Cluster.

        scrapy-redis pops with MULTI (ZRANGE, ZREMRANGEBYRANK): if Redis runs it
        and the reply is lost (a crash, a reset connection), a retry pops the
        next request and the first is never crawled. And it pushes with a plain
        ZADD: if that reply is lost and another worker pops the request before
        the retry, the retry queues it again and it is crawled twice (seen in a
        real crawl whose Redis was killed: ``tests/test_crawl_outage.py``).

        Here each is a script that records its work under this client's push or
        pop number; a retry carries the same number and is answered from the
        record instead of doing the work again. A pop's number advances once a
        pop has come back; a push's advances with every new request, and is
        kept while the same request is pushed again after a failure (a retry).
        Both records share the queue's slot (hash tag), so the scripts are
        single-slot on a cluster, where scrapy-redis's ``multi()`` is refused.
        ``SCHEDULER_QUEUE_CLASS = "scrapy_bloomdupe.cluster.PriorityQueue"`` (the
        scheduler's default).
        """

        # KEYS[1] the queue (a sorted set), KEYS[2] this client's pop record.
        # ARGV[1] this pop's number, ARGV[2] the record's TTL in ms.
        # Returns the popped request, or false when the queue is empty; a pop
        # already run (its number recorded) returns what it popped then.
        POP_SCRIPT = """
local prefix = ARGV[1] .. ':'
local done = redis.call('GET', KEYS[2])
if done and string.sub(done, 1, #prefix) == prefix then
  return string.sub(done, #prefix + 1)
end
local item = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
if not item then return false end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, 0)
redis.call('SET', KEYS[2], prefix .. item, 'PX', ARGV[2])
return item
"""

        # KEYS[1] the queue, KEYS[2] this client's push record. ARGV[1] this push's
        # number, ARGV[2] the score, ARGV[3] the request, ARGV[4] the record's TTL
        # in ms. Returns 1 when it queued the request, 0 when this push already ran.
        PUSH_SCRIPT = """
if redis.call('GET', KEYS[2]) == ARGV[1] then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[4])
return 1
"""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            client = secrets.token_hex(6)
            self._pop_script = self.server.register_script(self.POP_SCRIPT)
            self._pop_record = f"{{{self.key}}}:pop:{client}"
            self._pop_number = 1
            self._push_script = self.server.register_script(self.PUSH_SCRIPT)
            self._push_record = f"{{{self.key}}}:push:{client}"
            self._push_number = 0
            self._unanswered_push: bytes | None = None

        def push(self, request: Any) -> None:
            data = self._encode_request(request)
            if data != self._unanswered_push:  # a new push, not a retry of the last
                self._push_number += 1
                self._unanswered_push = data
            self._push_script(keys=[self.key, self._push_record],
                              args=[self._push_number, -request.priority, data, RECORD_TTL_MS])
            self._unanswered_push = None

        def pop(self, timeout: int = 0) -> Any:
            item = self._pop_script(keys=[self.key, self._pop_record],
                                    args=[self._pop_number, RECORD_TTL_MS])
            self._pop_number += 1  # only once the reply is in: a retry replays
            if item:
                return self._decode_request(item)
            return None

        def close(self) -> None:
            """Forget this client's records (no push or pop is under way at close)."""
            self.server.delete(self._pop_record, self._push_record)

        def clear(self) -> None:
            super().clear()
            self.close()

    PriorityQueue.__module__ = __name__
    return PriorityQueue


def __getattr__(name: str) -> Any:
    # ``PriorityQueue`` is made on first use: scrapy-redis imports Scrapy, which
    # the filter itself (which imports this module) does not need.
    if name == "PriorityQueue":
        cls = _priority_queue_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
