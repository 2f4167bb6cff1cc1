"""Send a batch of commands in one round trip, cheaply: retried by the outage guard during a
crawl (its one retry layer), by redis-py's ``Retry`` elsewhere.

``Pipeline.execute`` costs more Python per call than a check-and-add costs Redis, and the filter
sends a batch per scheduled request; so the link holds one pooled connection and writes with its
``pack_commands``, one reply per command. Outside a crawl's jobs the connection's ``Retry``
reconnects and retries; inside them the outage guard (:mod:`.outage`) does: every batch is safe
to send twice. A cluster goes through :class:`~scrapy_bloomdupe.transport.cluster.ClusterLink`;
another client without a pool gets a pipeline. ``wait_replicas`` appends ``WAIT`` (:mod:`.wait`).
Scripts Redis lost (restart, failover) are reloaded here if registered (:meth:`Link.knows`), and
the round trip answered ``NOSCRIPT`` repeated.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, MovedError, NoScriptError, ResponseError
from redis.retry import Retry

from .cluster import ClusterLink, LinkCounters, is_cluster
from .diagnose import describe, not_a_cluster_client
from .onloop import AsyncNode, await_only, bridged
from .outage import guarded
from .sentinel import (
    MAX_MASTER_CHANGES,
    AsyncMaster,
    MasterChanged,
    MasterConnection,
    is_sentinel_client,
)
from .wait import WaitPolicy

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster
    from redis.connection import AbstractConnection

#: Times a round trip is repeated after loading scripts its server lacked (NOSCRIPT).
MAX_SCRIPT_RELOADS = 5
#: One attempt, no pause: a blocking connection's ``Retry`` inside the outage guard.
_ONCE = Retry(NoBackoff(), 0)


class Link:
    """One round trip per :meth:`execute`; error replies come back as exceptions."""

    def __init__(self, client: Redis | RedisCluster, *, wait_replicas: int = 0,
                 wait_timeout_ms: int | None = None) -> None:
        self.client = client
        self._lock = threading.RLock()
        self._pool = getattr(client, "connection_pool", None)
        self._conn: AbstractConnection | None = None
        self._cluster: ClusterLink | None = None
        #: ``redis.asyncio`` twin of the held connection, for round trips on Scrapy's loop.
        self._aio = AsyncNode.of(self._pool) if self._pool is not None else None
        self._master = (AsyncMaster(self._pool, self._aio)
                        if self._aio is not None and is_sentinel_client(client) else None)
        if self._pool is None and is_cluster(client):
            self._cluster = ClusterLink(client,  # type: ignore[arg-type]
                                        wait_replicas=wait_replicas,
                                        wait_timeout_ms=wait_timeout_ms)
        #: When to send ``WAIT`` (``wait_replicas``), and how often it came back short.
        self.wait = (self._cluster.wait if self._cluster is not None
                     else WaitPolicy(wait_replicas, wait_timeout_ms))
        #: The scripts this link's ``EVALSHA`` commands run, by SHA1 (see :meth:`knows`).
        self._scripts: dict[str, str | bytes | memoryview] = {}
        #: Round trips repeated after loading scripts the server lacked (``NOSCRIPT``).
        self.script_reloads = 0
        #: redis-py's reply parsers of the client, by command (see :meth:`calls`).
        self._parsers: Mapping[str, Callable[..., Any]] | None = None

    def knows(self, *scripts: str | bytes | memoryview) -> list[str]:
        """Register ``scripts`` for reloading on ``NOSCRIPT``; returns their SHA1s, in order."""
        shas = []
        for script in scripts:
            text = script.encode() if isinstance(script, str) else bytes(script)
            sha = hashlib.sha1(text, usedforsecurity=False).hexdigest()
            self._scripts[sha] = script
            shas.append(sha)
        return shas

    @property
    def asynchronous(self) -> bool:
        """Whether round trips in :func:`~.onloop.run_bridged` jobs await ``redis.asyncio``."""
        if self._cluster is not None:
            return self._cluster.asynchronous
        return self._aio is not None

    @property
    def counters(self) -> LinkCounters | None:
        """Retry and redirection counts of a cluster link (None for one node)."""
        return self._cluster.counters if self._cluster is not None else None

    def execute(self, commands: Sequence[tuple[Any, ...]], *,
                built_for: int | None = None) -> list[Any]:
        """One reply per command, in order (an error reply as an exception, not raised). Scripts
        Redis lost are reloaded (if registered with :meth:`knows`) and the round trip repeated:
        every command is safe to repeat (op ids). ``built_for``: the Sentinel epoch the batch was
        built for; if the master changed, nothing is sent (:class:`~.sentinel.MasterChanged`)."""
        replies = self._bound_round_trip(commands, built_for)
        for _ in range(MAX_SCRIPT_RELOADS):
            missing = {str(command[1]) for command, reply in zip(commands, replies, strict=True)
                       if isinstance(reply, NoScriptError)}
            known = [self._scripts[sha] for sha in missing if sha in self._scripts]
            if not known:
                break
            self.script_reloads += 1
            # On the held connection: the server that just answered NOSCRIPT.
            self.load_scripts(known)
            replies = self._bound_round_trip(commands, built_for)
        return replies

    def calls(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """:meth:`execute`, each reply parsed as redis-py parses it (``HGETALL`` a dict), the
        first error raised. Used instead of the client so the link carries every command."""
        replies = self.execute(commands)
        callbacks = self._callbacks()
        parsed = []
        for command, reply in zip(commands, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            callback = callbacks.get(str(command[0]))
            parsed.append(reply if callback is None else callback(reply))
        return parsed

    def call(self, *command: Any) -> Any:
        """One command's parsed reply: ``link.call("GET", key)``. Two-word commands are one
        string (``"CONFIG GET"``), so a key is always the second item."""
        return self.calls([command])[0]

    def scan(self, match: str, count: int = 1000) -> list[Any]:
        """Every key matching ``match`` (full ``SCAN``); on a cluster, at the pattern's hash tag."""
        names: list[Any] = []
        cursor = 0
        while True:
            cursor, batch = self.call("SCAN", cursor, "MATCH", match, "COUNT", count)
            names.extend(batch)
            if not int(cursor):
                return names

    def on_masters(self, *command: Any) -> list[tuple[str, Any]]:
        """A keyless command (``TIME``) on every master reached: (where, parsed reply) each."""
        if self._cluster is None:
            return [(describe(self.client), self.call(*command))]
        with self._lock:
            replies = self._cluster.on_masters(command)
        callback = self._callbacks().get(str(command[0]))
        return [(where, reply if callback is None else callback(reply))
                for where, reply in replies]

    def where(self, key: Any) -> str:
        """The server that holds ``key``, as :meth:`on_masters` names it."""
        if self._cluster is None:
            return describe(self.client)
        return self._cluster.where(key)

    def _callbacks(self) -> Mapping[str, Callable[..., Any]]:
        if self._parsers is None:
            client: Any = self.client
            if self._cluster is not None:  # each node's client parses its replies
                nodes = client.get_nodes()
                client = client.get_redis_connection(nodes[0]) if nodes else None
            self._parsers = getattr(client, "response_callbacks", None) or {}
        return self._parsers

    def _bound_round_trip(self, commands: Sequence[tuple[Any, ...]], built_for: int | None
                          ) -> list[Any]:
        # One round trip at a time on the held connection, whichever thread asks.
        with self._lock:
            return self._execute(commands, built_for)

    def execute_bound(self, build: Callable[[], tuple[Sequence[tuple[Any, ...]], int | None]]
                      ) -> list[Any]:
        """:meth:`execute` of ``build()``'s (batch, epoch), rebuilt (dropping the old
        master's acks) each time :class:`~.sentinel.MasterChanged` says the master moved."""
        for _ in range(MAX_MASTER_CHANGES):
            commands, built_for = build()
            try:
                return self.execute(commands, built_for=built_for)
            except MasterChanged:
                continue
        raise ConnectionError(f"the Redis master changed {MAX_MASTER_CHANGES} times while a "
                              "round trip was built")

    def _execute(self, commands: Sequence[tuple[Any, ...]], built_for: int | None = None
                 ) -> list[Any]:
        if self._cluster is not None:
            return self._cluster.execute(commands)
        if self._pool is None:
            pipe = self.client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            return pipe.execute(raise_on_error=False)
        wait = self.wait.command("")  # one node: one key
        if wait is not None:
            commands = [*commands, wait]
        replies = self._on_node(commands, built_for)
        if wait is not None:
            self.wait.answered("", replies.pop())
        if any(isinstance(reply, MovedError) for reply in replies):
            # A single-node client on a Redis Cluster node: say what to set.
            raise not_a_cluster_client(describe(self.client))
        return replies

    def _on_node(self, commands: Sequence[tuple[Any, ...]], built_for: int | None = None
                 ) -> list[Any]:
        """One round trip to the single node: awaited on ``redis.asyncio`` in a
        :func:`~.onloop.run_bridged` job (nothing blocks the loop), else on the held
        connection with the client's ``Retry``, or one attempt inside
        :func:`~.outage.guarded` (the guard retries). ``built_for``: see :meth:`execute`."""
        if self._aio is not None and bridged():
            if self._master is not None:
                return self._master.round_trip(commands, built_for)
            return await_only(self._aio.round_trip(commands))
        conn = self._connection()
        if isinstance(conn, MasterConnection):
            conn.built_for = built_for
        retry = conn.retry
        if guarded():  # the guard retries: one attempt, connecting included
            conn.retry = _ONCE
        try:
            replies: list[Any] = conn.retry.call_with_retry(
                lambda: self._attempt(conn, commands), lambda _error: conn.disconnect()
            )
        finally:
            conn.retry = retry
            if isinstance(conn, MasterConnection):
                conn.built_for = None
        return replies

    def reaches(self, commands: Sequence[tuple[Any, ...]]) -> Callable[[tuple[Any, ...]], bool]:
        """Whether adding a command to ``commands`` costs no round trip (cluster: same master)."""
        if self._cluster is not None:
            return self._cluster.reaches(commands)
        return lambda _command: True

    def refresh_routes(self) -> None:
        """Reload a cluster's slot map (a call met a slot that moved); nothing on one node."""
        if self._cluster is not None:
            with self._lock:
                self._cluster.refresh()

    def load_scripts(self, scripts: Sequence[str | bytes | memoryview]) -> None:
        """``SCRIPT LOAD`` ``scripts`` on the held connection (mid-failover the pool may reach
        another server, leaving this one on ``NOSCRIPT`` for ever); on a cluster, every master."""
        with self._lock:
            self._load_scripts(scripts)

    def _load_scripts(self, scripts: Sequence[str | bytes | memoryview]) -> None:
        if self._cluster is not None:
            for script in scripts:
                self._cluster.on_masters(("SCRIPT", "LOAD", script))
            return
        if self._pool is None:
            for script in scripts:
                self.client.script_load(script)
            return
        for reply in self._on_node([("SCRIPT", "LOAD", script) for script in scripts]):
            if isinstance(reply, Exception):
                raise reply

    def _connection(self) -> AbstractConnection:
        if self._conn is None:
            assert self._pool is not None
            self._conn = self._pool.get_connection()
        return self._conn

    def _attempt(self, conn: AbstractConnection, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        conn.send_packed_command(conn.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except ResponseError as e:
                replies.append(e)
        return replies

    def close(self) -> None:
        with self._lock:
            if self._master is not None:
                self._master.close()
            elif self._aio is not None:
                self._aio.close()
            if self._cluster is not None:
                self._cluster.close()
            if self._conn is not None and self._pool is not None:
                self._pool.release(self._conn)
                self._conn = None


@contextmanager
def link_to(target: Redis | RedisCluster | Link) -> Iterator[Link]:
    """``target`` if a link (a crawl's), else a new link over the client, closed after."""
    if isinstance(target, Link):
        yield target
        return
    link = Link(target)
    try:
        yield link
    finally:
        link.close()
