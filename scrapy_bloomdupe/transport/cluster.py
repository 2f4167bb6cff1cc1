"""Redis Cluster transport: one round trip over several masters, and failover retries.

:class:`ClusterLink` is :class:`~scrapy_bloomdupe.transport.link.Link`'s helper for a
``RedisCluster`` client. It groups a batch by the master owning each command's slot and writes
every group before reading any reply (one round trip, masters in parallel). It retries through a
failover itself, because redis-py's cluster client retries without pausing and spends its retries
in milliseconds while a replica is promoted (``cluster-node-timeout`` plus an election). It follows
the client's ``Retry`` (count and backoff) and reloads the slot map before each new attempt, so the
promoted replica is found once elected. Inside the outage guard (:func:`~.outage.guarded`) it makes
one attempt and the guard retries: one retry layer. In a job on Scrapy's loop (:mod:`.onloop`) the
masters' shares are awaited together on ``redis.asyncio`` connections; the slot map reload and a
rare ``ASK`` (blocking redis-py calls) run on a thread of the loop's.

Retried: connection errors and timeouts, ``CLUSTERDOWN``, ``TRYAGAIN``, ``READONLY`` (a stale map
sent a write to a replica) and a slot with no known master; ``MOVED`` is followed at once, ``ASK``
through the cluster client. Only commands without an answer are resent; every command this
package sends is safe to send twice (the check-and-add is idempotent by op id).

Replication is asynchronous: a check-and-add acknowledged by a master that dies before passing it
to its replica is lost, and the URL is reported new again (a duplicate crawl). ``wait_replicas``
(``WAIT n timeout`` after each master's group, see :mod:`.wait`) reads a reply only once ``n``
replicas have the write or the timeout passed, at one replication round trip per batch.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

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

from .onloop import AsyncNode, await_only, bridged
from .outage import guarded
from .wait import WaitPolicy

if TYPE_CHECKING:
    from redis.cluster import ClusterNode, RedisCluster

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Retries of a cluster client from :func:`scrapy_bloomdupe.transport.client.build` without a
#: user ``retry``: pauses up to 0.5 s, 10-19 s in all, to ride out a master's failover.
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
    #: ``MOVED`` replies followed; commands sent through the client after ``ASK``.
    redirects: int = 0
    asks: int = 0
    #: The last error that caused a retry, as text.
    last_error: str = ""


@dataclass
class _Batch:
    """One master's share of a round trip: what goes there, and what came back."""

    node: ClusterNode
    #: The indexes of its commands in the round trip (its WAIT, if any, has none).
    indexes: list[int]
    commands: list[tuple[Any, ...]]
    waited: bool
    replies: list[Any] = field(default_factory=list)
    #: The connection error or timeout that left replies unread.
    failure: Exception | None = None


class _Attempt(Exception):
    """Some commands are still without an answer; ``error`` is the first reason."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class ClusterLink:
    """One round trip per :meth:`execute` on a cluster client; replies as :class:`Link`'s.
    ``wait_replicas`` > 0 appends ``WAIT`` to each master's commands (see the module)."""

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
        #: The ``redis.asyncio`` connection to each master (by name), made on first use.
        self._aio: dict[str, AsyncNode] = {}

    # -- routing --------------------------------------------------------------

    def _slot(self, command: Sequence[Any]) -> int:
        """The slot of the command's first key (every key of one command shares it)."""
        name = str(command[0]).upper()
        if name in ("EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO", "FCALL", "FCALL_RO"):
            if int(command[2]) < 1:
                raise RedisClusterException(f"{name} without keys cannot be routed")
            key = command[3]
        elif name == "SCAN":  # ("SCAN", cursor, "MATCH", pattern): the pattern's hash tag,
            key = re.sub(r"\\(.)", r"\1", str(command[3]))  # its escapes undone
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

    def reaches(self, commands: Sequence[tuple[Any, ...]]) -> Callable[[tuple[Any, ...]], bool]:
        """Whether a command goes to a master that ``commands`` go to (by the current map)."""
        def master(command: tuple[Any, ...]) -> str | None:
            try:
                return self._master(self._slot(command)).name
            except RedisClusterException:  # no known master for its slot (yet)
                return None
        names = {master(command) for command in commands} - {None}
        return lambda command: master(command) in names

    # -- the round trip -------------------------------------------------------

    @property
    def asynchronous(self) -> bool:
        """Whether the masters' connections have ``redis.asyncio`` twins (awaitable in jobs)."""
        nodes = self.client.get_nodes()
        return bool(nodes) and AsyncNode.of(
            self.client.get_redis_connection(nodes[0]).connection_pool) is not None

    def execute(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Send ``commands``; return one reply each, error replies as exceptions. Raises the
        last connection or cluster error once retries are spent (in the outage guard: after one
        attempt, for the guard to retry)."""
        results: list[Any] = [None] * len(commands)
        pending: list[int] = list(range(len(commands)))

        def attempt() -> list[Any]:
            nonlocal pending
            if self._refresh_due:
                self.refresh()
            pending = self._attempt(commands, pending, results)
            return results

        return self._retried(attempt)

    def _retried(self, attempt: Callable[[], T]) -> T:
        """``attempt()`` retried by the client's ``Retry``; once inside the outage guard."""
        try:
            if bridged() or guarded():
                try:
                    return attempt()
                except (_Attempt, ConnectionError, TimeoutError) as e:
                    self._failed(e)
                    raise
            result: T = self._retry.call_with_retry(attempt, self._failed)
            return result
        except _Attempt as e:
            raise e.error from None

    def _failed(self, error: Exception) -> None:
        self.counters.retries += 1
        cause = error.error if isinstance(error, _Attempt) else error
        self.counters.last_error = f"{type(cause).__name__}: {cause}"
        self._refresh_due = True
        logger.debug("Cluster round trip incomplete, will retry: %s", self.counters.last_error)

    def refresh(self) -> None:
        """Reload the slot map from any node that answers (in a job: on a loop thread)."""
        self._refresh_due = False
        self.counters.refreshes += 1
        try:
            if bridged():
                await_only(asyncio.to_thread(self._reload))
            else:
                self._reload()
        except (RedisError, RedisClusterException) as e:
            # No node answered, or the map has holes: the next attempt fails and retries.
            logger.debug("Cluster slot map reload failed: %s", e)
        self._failed_node = None

    def _reload(self) -> None:
        self.client.nodes_manager.initialize(last_failed_node_name=self._failed_node)

    def _attempt(self, commands: Sequence[tuple[Any, ...]], pending: list[int],
                 results: list[Any]) -> list[int]:
        """Send the pending commands, fill ``results``; :class:`_Attempt` if any go unanswered."""
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
        batches: list[_Batch] = []
        for node, indexes in groups.values():
            batch: list[tuple[Any, ...]] = [commands[i] for i in indexes]
            wait = self.wait.command(node.name)
            if wait is not None:
                batch.append(wait)
            batches.append(_Batch(node, indexes, batch, wait is not None))
        self.counters.round_trips += 1
        if bridged():
            await_only(self._exchange_async(batches))
        else:
            self._exchange(batches)
        moved = False
        asks: list[int] = []
        for sent in batches:
            answered = sent.replies[:len(sent.indexes)]
            if sent.failure is not None:
                # Unread replies may or may not have run: resend (all, if a WAIT was pending).
                self._failed_node = sent.node.name
                error = error or sent.failure
                if sent.waited:
                    answered = []
            for i, reply in zip(sent.indexes, answered, strict=False):
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
            left.extend(sent.indexes[len(answered):])
            if sent.waited and sent.failure is None:
                reply = sent.replies[-1]
                if isinstance(reply, ResponseError):  # a replica cannot WAIT: keep the replies
                    logger.debug("WAIT failed on %s: %s", sent.node.name, reply)
                else:
                    self.wait.answered(sent.node.name, reply)
        for i in asks:
            # A migrating slot: the cluster client follows ASK (in a job on a loop thread).
            self.counters.asks += 1
            try:
                results[i] = (await_only(asyncio.to_thread(self.client.execute_command,
                                                           *commands[i]))
                              if bridged() else self.client.execute_command(*commands[i]))
            except RETRY_ERRORS as e:
                left.append(i)
                error = error or e
            except RedisError as e:
                results[i] = e
        left = sorted(set(left))
        return left, error, moved and error is None

    def _exchange(self, batches: list[_Batch]) -> None:
        """Write every master's batch, then read replies (masters work in parallel)."""
        sent: list[tuple[_Batch, Any, Any]] = []
        for batch in batches:
            redis_node = self.client.get_redis_connection(batch.node)
            conn: Any = None
            try:
                conn = redis_node.connection_pool.get_connection()
                conn.send_packed_command(conn.pack_commands(batch.commands))
            except (ConnectionError, TimeoutError) as e:
                if conn is not None:
                    conn.disconnect()
                    redis_node.connection_pool.release(conn)
                batch.failure = e
                continue
            sent.append((batch, redis_node, conn))
        for batch, redis_node, conn in sent:
            try:
                for _ in batch.commands:
                    try:
                        batch.replies.append(conn.read_response())
                    except ResponseError as e:
                        batch.replies.append(e)
            except (ConnectionError, TimeoutError) as e:
                conn.disconnect()
                batch.failure = e
            finally:
                redis_node.connection_pool.release(conn)

    async def _exchange_async(self, batches: list[_Batch]) -> None:
        """:meth:`_exchange` on ``redis.asyncio``, the masters' round trips awaited together."""
        async def one(batch: _Batch) -> None:
            try:
                batch.replies = await self._async_node(batch.node).round_trip(batch.commands)
            except (ConnectionError, TimeoutError) as e:
                batch.failure = e
        await asyncio.gather(*(one(batch) for batch in batches))

    def _async_node(self, node: ClusterNode) -> AsyncNode:
        """The ``redis.asyncio`` connection to ``node`` (made from its pool's settings)."""
        twin = self._aio.get(node.name)
        if twin is None:
            twin = AsyncNode.of(self.client.get_redis_connection(node).connection_pool)
            if twin is None:
                raise RedisClusterException(f"no redis.asyncio twin for {node.name}'s "
                                            "connection class")
            self._aio[node.name] = twin
        return twin

    def where(self, key: Any) -> str:
        """The name of the master of ``key``'s slot (by the current map)."""
        return self._master(self._slot(("GET", key))).name

    def on_masters(self, command: tuple[Any, ...]) -> list[tuple[str, Any]]:
        """A keyless command on every master: [(master name, raw reply)], error replies
        raised; retried as :meth:`execute` is."""
        def attempt() -> list[tuple[str, Any]]:
            if self._refresh_due:
                self.refresh()
            batches = [_Batch(node, [0], [command], False)
                       for node in self.client.get_primaries()]
            if bridged():
                await_only(self._exchange_async(batches))
            else:
                self._exchange(batches)
            for batch in batches:
                if batch.failure is not None:
                    self._failed_node = batch.node.name
                    raise batch.failure
            replies = [(batch.node.name, batch.replies[0]) for batch in batches]
            for _, reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            return replies

        return self._retried(attempt)

    def close(self) -> None:
        """Drop the ``redis.asyncio`` connections (blocking ones are back in the pools)."""
        for twin in self._aio.values():
            twin.close()
        self._aio.clear()
