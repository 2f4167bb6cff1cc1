"""The crawl's Redis calls on Scrapy's asyncio loop, in order, never blocking it.

The same calls as :class:`~.iothread.IOThread`'s, with the same interface, on
Scrapy's asyncio reactor (its default since 2.13) and a link that has a
``redis.asyncio`` twin (:mod:`..transport.asyncnode`: one Redis, not Sentinel, not
a cluster). Each call runs in a greenlet (:func:`~..transport.greenio.run_bridged`):
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

T = TypeVar("T")


class IOLoop:
    """Runs the Redis calls asked by the reactor on its asyncio loop, one at a time."""

    def __init__(self) -> None:
        self._lock: asyncio.Lock | None = None
        self._reactor: Any = None
        #: One Deferred per call asked and not yet answered (see drained).
        self._pending: set[defer.Deferred[None]] = set()

    @property
    def inline(self) -> bool:
        """Whether calls run at once, blocking (not started)."""
        return self._lock is None

    def start(self, reactor: Any) -> None:
        """Run calls on the running loop from now on (the crawl runs)."""
        if self._lock is None:
            self._reactor = reactor
            self._lock = asyncio.Lock()

    def run(self, call: Callable[..., T], *args: Any) -> defer.Deferred[T]:
        """``call(*args)`` on the loop, after the calls asked before it; its answer (or
        error) as a Deferred."""
        lock = self._lock
        if lock is None:
            return defer.maybeDeferred(call, *args)

        async def in_turn() -> T:
            async with lock:
                return await run_bridged(partial(call, *args))

        d: defer.Deferred[T] = defer.Deferred.fromFuture(asyncio.ensure_future(in_turn()))
        done: defer.Deferred[None] = defer.Deferred()
        self._pending.add(done)
        d.addBoth(self._answered, done)
        return d

    def _answered(self, result: T, done: defer.Deferred[None]) -> T:
        # As IOThread's: fired in the reactor's next turn, after the caller's callbacks.
        self._pending.discard(done)
        self._reactor.callLater(0, done.callback, None)
        return result

    def drained(self) -> defer.Deferred[Any]:
        """Fires once every call asked so far is answered and its callbacks have run."""
        return defer.DeferredList(list(self._pending), consumeErrors=True)

    def stop(self) -> None:
        """Later calls run inline (once drained)."""
        self._lock = None
