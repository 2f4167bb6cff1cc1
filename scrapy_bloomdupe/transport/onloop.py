"""A crawl's Redis work on Scrapy's asyncio loop: the filter's and the queue's logic,
written once on plain calls, run in a greenlet that suspends at each round trip, and
each node's round trips on a ``redis.asyncio`` connection (:class:`AsyncNode`).

During a crawl on Scrapy's asyncio reactor the scheduler runs each of its Redis
jobs with :func:`run_bridged`: the job's code runs in a greenlet of its own; when
it reaches a round trip, the link hands the round trip's coroutine (on a
``redis.asyncio`` connection) to :func:`await_only`, which switches back to the
coroutine that started the job; that one awaits it on the loop, without blocking
it, and switches back into the job with the answer (or the error, raised where the
job waits). A pause (a lock wait, an outage wait) is an ``asyncio.sleep`` the same
way (:func:`pause`). Outside such a job (a tool, a test, the crawl's start and end)
:func:`bridged` is false and the same code makes blocking calls.

This is how SQLAlchemy's asyncio extension runs its synchronous core; the
``greenlet`` package is the one it uses. The alternative, each operation written
as a generator of round trips, would touch every caller of the filter and the
queue.

A :class:`~.link.Link` on a single Redis or a Sentinel master holds an
:class:`AsyncNode` beside its blocking connection (a cluster's link, one for each
master). Inside a job of :func:`run_bridged` the link awaits
:meth:`AsyncNode.round_trip` instead of writing on the blocking connection:
the same packed commands, one reply read per command, error replies returned, not
raised. The connection is made from the client's own pool settings (address, TLS,
credentials, timeouts, protocol), as redis-py's asynchronous class of the same kind.
It does not retry: a failed round trip reaches the outage guard, which sends it
again after a pause (every command this package sends is safe to repeat), without
blocking the loop.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import redis.asyncio.connection as aio
import redis.connection as blocking
from greenlet import getcurrent, greenlet  # type: ignore[import-untyped]
from redis.exceptions import ResponseError

T = TypeVar("T")


class _Bridged(greenlet):  # type: ignore[misc]  # greenlet has no annotations
    """The greenlet of one job run by :func:`run_bridged`."""


def bridged() -> bool:
    """Whether this code runs in a job of :func:`run_bridged` (then a round trip must
    be awaited with :func:`await_only`, never made blocking)."""
    return isinstance(getcurrent(), _Bridged)


def await_only(awaitable: Awaitable[T]) -> T:
    """The result of ``awaitable``, awaited on the loop by the job's starter while this
    job is suspended; only inside :func:`run_bridged`."""
    current = getcurrent()
    if not isinstance(current, _Bridged):
        if isinstance(awaitable, Coroutine):
            awaitable.close()  # never to be awaited: no "never awaited" warning
        raise RuntimeError("await_only() outside a job of run_bridged()")
    result: T = current.parent.switch(awaitable)
    return result


async def run_bridged(call: Callable[[], T]) -> T:
    """``call()``, each :func:`await_only` of it awaited here, on the running loop."""
    job = _Bridged(call, getcurrent())
    result: Any = job.switch()
    while not job.dead:
        try:
            value = await result
        except BaseException as error:  # raised in the job, where it awaits
            result = job.throw(error)
        else:
            result = job.switch(value)
    answer: T = result
    return answer


def pause(seconds: float) -> None:
    """Sleep: on the loop inside a job of :func:`run_bridged` (the reactor goes on),
    else ``time.sleep``."""
    if bridged():
        await_only(asyncio.sleep(seconds))
    else:
        time.sleep(seconds)


#: The blocking connection classes whose asynchronous twins redis-py has.
_TWINS: dict[type, type[aio.AbstractConnection]] = {
    blocking.Connection: aio.Connection,
    blocking.SSLConnection: aio.SSLConnection,
    blocking.UnixDomainSocketConnection: aio.UnixDomainSocketConnection,
}
#: Settings of the blocking pool that do not carry over: its ``Retry`` (blocking;
#: the outage guard waits instead) and what redis-py's blocking client adds itself.
_DROPPED = frozenset({"retry", "retry_on_error", "retry_on_timeout", "redis_connect_func"})


def _accepted(cls: type) -> frozenset[str]:
    """The keyword arguments ``cls`` (and its bases) take."""
    names: set[str] = set()
    for base in cls.__mro__:
        init = base.__dict__.get("__init__")
        if init is not None:
            names.update(inspect.signature(init).parameters)
    return frozenset(names - {"self", "args", "kwargs"})


_ACCEPTED = {twin: _accepted(twin) for twin in _TWINS.values()}


class AsyncNode:
    """One ``redis.asyncio`` connection to the node of a blocking pool, made on first use."""

    def __init__(self, cls: type[aio.AbstractConnection], kwargs: dict[str, Any]) -> None:
        self._cls = cls
        self._kwargs = kwargs
        self._conn: aio.AbstractConnection | None = None

    @classmethod
    def of(cls, pool: Any) -> AsyncNode | None:
        """The asynchronous twin of ``pool``'s connections; None when redis-py has none
        (a class of the user's). A connection class of this package names its twin in
        ``async_twin`` (a Sentinel master's: its address is given by each round trip)."""
        connection_class = getattr(pool, "connection_class", None)
        twin = _TWINS.get(connection_class)  # type: ignore[arg-type]
        if twin is None:
            twin = connection_class.__dict__.get("async_twin") if connection_class else None
            if twin is None:
                return None
        accepted = _ACCEPTED[twin]
        kwargs = {name: value for name, value in pool.connection_kwargs.items()
                  if name in accepted and name not in _DROPPED}
        return cls(twin, kwargs)

    @property
    def connected(self) -> bool:
        """Whether a connection is held (None yet, or dropped after a failure)."""
        return self._conn is not None

    async def round_trip(self, commands: Sequence[tuple[Any, ...]],
                         address: tuple[str, int] | None = None) -> list[Any]:
        """One reply per command, error replies as exceptions (returned, not raised). A
        connection that failed mid-way is dropped (the next round trip reconnects).
        ``address``: where to send them (host, port); a connection to another address
        is dropped first."""
        if address is not None and (self._kwargs.get("host"), self._kwargs.get("port")) \
                != address:
            self._kwargs = {**self._kwargs, "host": address[0], "port": address[1]}
            self.close()
        if self._conn is None:
            self._conn = self._cls(**self._kwargs)
        conn = self._conn
        try:
            await conn.send_packed_command(conn.pack_commands(commands))
            replies: list[Any] = []
            for _ in commands:
                try:
                    replies.append(await conn.read_response())
                except ResponseError as e:
                    replies.append(e)
            return replies
        except BaseException:  # a lost connection, a timeout, a cancelled job
            self._conn = None
            await conn.disconnect(nowait=True)
            raise

    def close(self) -> None:
        """Drop the connection: closed on the running loop, if any (a crawl's end);
        without one, the loop that held it is gone and its transports with it."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self.closing(conn.disconnect(nowait=True))

    @staticmethod
    def closing(closed: Coroutine[Any, Any, Any]) -> None:
        """Run ``closed`` (a connection's or a client's close) on the running loop, held
        until done; without a running loop it is dropped (its loop is gone)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            closed.close()
            return
        task = loop.create_task(closed)
        _closing.add(task)  # held until done (the loop keeps only a weak reference)
        task.add_done_callback(_closing.discard)


_closing: set[asyncio.Task[Any]] = set()
