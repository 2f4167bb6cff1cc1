"""The crawl's Redis calls on Scrapy's asyncio loop, in order, never blocking it.

The same calls as :class:`~.iothread.IOThread`'s, with the same interface, on
Scrapy's asyncio reactor (its default since 2.13) and a link that has a
``redis.asyncio`` twin (:mod:`..transport.asyncnode`: one Redis, a Sentinel master,
each master of a cluster). Each call runs in a greenlet (:func:`~..transport.greenio.run_bridged`):
its round trips are awaited on ``redis.asyncio`` and its pauses are
``asyncio.sleep``, so downloads, callbacks and heartbeats go on meanwhile. One call
at a time, in the order asked (an ack before the pop that carries it): an
``asyncio.Lock`` wakes its waiters first come, first served.

Without a running loop (a tool, a test, the crawl's start and end) a call runs at
once, blocking (:attr:`IOLoop.inline`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from twisted.internet import defer

from ..transport.greenio import run_bridged
from .iothread import IOThread

T = TypeVar("T")


class IOLoop(IOThread):
    """Runs the Redis calls asked by the reactor on its asyncio loop, one at a time (what
    the Redis thread's calls wait for, and :meth:`drained`, as :class:`IOThread`)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock: asyncio.Lock | None = None

    @property
    def inline(self) -> bool:
        """Whether calls run at once, blocking (not started)."""
        return self._lock is None

    def start(self, reactor: Any) -> None:
        """Run calls on the running loop from now on (the crawl runs)."""
        if self._lock is None:
            self._reactor = reactor
            self._lock = asyncio.Lock()

    def _dispatch(self, call: Callable[..., T], *args: Any) -> defer.Deferred[T]:
        lock = self._lock
        assert lock is not None

        async def in_turn() -> T:
            async with lock:  # after the calls asked before it
                return await run_bridged(partial(call, *args))

        d: defer.Deferred[T] = defer.Deferred.fromFuture(asyncio.ensure_future(in_turn()))
        return d

    def stop(self) -> None:
        """Later calls run inline (once drained)."""
        self._lock = None
