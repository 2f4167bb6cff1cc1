"""A crawl's Redis work on Scrapy's asyncio loop: the filter's and queue's logic, written
once on plain calls, runs in a greenlet that suspends at each round trip.

The scheduler runs each Redis job with :func:`run_bridged`: at a round trip the link hands
its coroutine to :func:`await_only`, which switches to the job's starter to await it on the
loop, then back with the answer or error; :func:`pause` sleeps likewise. Outside a job
(:func:`bridged` false) the same code blocks. As SQLAlchemy's asyncio extension does, this
spares rewriting every caller as a generator of round trips.

A :class:`~.link.Link` holds an :class:`AsyncNode` beside each blocking connection, built
from the same pool settings. It does not retry: the outage guard repeats a failed round trip
after a pause (every command is safe to repeat).
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
    """Whether in a :func:`run_bridged` job (round trips must go through :func:`await_only`)."""
    return isinstance(getcurrent(), _Bridged)


def await_only(awaitable: Awaitable[T]) -> T:
    """``awaitable``'s result, awaited by the job's starter on the loop (in a job only)."""
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
    """Sleep on the loop inside a :func:`run_bridged` job, else ``time.sleep``."""
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
#: Blocking pool settings not carried over (its blocking ``Retry``: the outage guard waits).
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
        """The async twin of ``pool``'s connections, or None (a user's class). Our classes
        name theirs in ``async_twin`` (a Sentinel master's gets its address per round trip)."""
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
        """One reply per command, error replies returned as exceptions; a failed connection
        is dropped. ``address``: (host, port) to send to, reconnecting if it changed."""
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
        """Drop the connection, closing it on the running loop if any (see :meth:`closing`)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self.closing(conn.disconnect(nowait=True))

    @staticmethod
    def closing(closed: Coroutine[Any, Any, Any]) -> None:
        """Run ``closed`` on the running loop, held until done; without one, drop it."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            closed.close()
            return
        task = loop.create_task(closed)
        _closing.add(task)  # held until done (the loop keeps only a weak reference)
        task.add_done_callback(_closing.discard)


_closing: set[asyncio.Task[Any]] = set()
