"""Redis Cluster transport: one round trip over several masters, and failover retries.

:class:`ClusterLink` is what :class:`~scrapy_bloomdupe.transport.link.Link` uses
for a ``redis.cluster.RedisCluster`` client. It groups a batch by the master
that owns each command's slot, writes every group on that master's connection
before reading any reply (one round trip, masters in parallel), and retries
through a failover itself, because redis-py's cluster client retries a failed
command without pausing: while a killed master's replica is being promoted
(``cluster-node-timeout`` plus an election, a few seconds) its retries are
spent in milliseconds. :class:`ClusterLink` instead follows the client's
``Retry`` object (``RedisCluster(retry=...)``): the count and the backoff
between attempts. Before each new attempt it reloads the slot map, so the
promoted replica is found as soon as the cluster has elected it. Inside the
outage guard (a crawl's jobs, :func:`~.outage.guarded`) it makes one attempt and
the guard retries (the slot map reloaded all the same): one retry layer.

In a job on Scrapy's asyncio loop (:mod:`.onloop`) each master's share of a
round trip is awaited on a ``redis.asyncio`` connection (:mod:`.onloop`, made
from that master's pool settings), all of them together; the slot map, which
redis-py's blocking cluster client reloads, is reloaded on a thread of the
loop's (it is needed only after a failed attempt), as is a rare ``ASK``.

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
master's group of commands, see :mod:`.wait`) a reply is read only once
``n`` replicas have the write, or the timeout has passed, which closes that
window for the replica that gets promoted (unless the wait timed out), at the
cost of one replication round trip per batch.
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

#: Retries of a cluster client made by :func:`scrapy_bloomdupe.transport.client.build`
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
        """Whether a command goes to a master that ``commands`` go to (by the slot map
        known now; a slot without a known master: no)."""
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
        """Whether the masters' connections have ``redis.asyncio`` twins (redis-py's own
        classes), so that round trips inside a job can be awaited."""
        nodes = self.client.get_nodes()
        return bool(nodes) and AsyncNode.of(
            self.client.get_redis_connection(nodes[0]).connection_pool) is not None

    def execute(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Send ``commands``; return one reply each, error replies as exceptions.

        Raises the last connection or cluster error once the client's retries
        are spent; inside the outage guard (a crawl's jobs) after one attempt, for
        the guard to retry (the slot map is reloaded before the next attempt).
        """
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
        """``attempt()``, retried with the client's ``Retry``, or once inside the outage
        guard (:func:`~.outage.guarded`: a crawl's jobs, on the loop or the Redis
        thread), which is then the one retry layer."""
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
        """Reload the slot map (who is master of what) from any node that answers; in a
        job on a thread of the loop's, awaited (redis-py's cluster client reloads it
        with blocking calls)."""
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
                # Replies not read: those commands may or may not have run. Send again
                # (all of them when a WAIT was pending: their writes are unconfirmed).
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
            # A slot being migrated: let the cluster client follow ASK (rare; in a job on
            # a thread of the loop's, as its calls block).
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
        """Each master's batch written before any reply is read (the masters work in
        parallel), on blocking connections from the client's pools."""
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
        """:meth:`_exchange` on ``redis.asyncio``: the masters' round trips awaited
        together (a failed one's replies are all sent again)."""
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
        """The name of the master of ``key``'s slot (by the slot map known now)."""
        return self._master(self._slot(("GET", key))).name

    def on_masters(self, command: tuple[Any, ...]) -> list[tuple[str, Any]]:
        """A command without a key on every master (one round trip each: in turn, or
        together in a job): each master's name and raw reply, error replies raised;
        retried as :meth:`execute` is, with the slot map reloaded between attempts."""
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
        """Drop the ``redis.asyncio`` connections (the blocking ones go back to the
        client's pools after each round trip)."""
        for twin in self._aio.values():
            twin.close()
        self._aio.clear()
