"""The crawl's Redis calls, off Scrapy's reactor: one thread of their own, in order.

The filter's and the queue's logic (scripts, op ids, growth, lost-state checks,
lock waits, outage waits) is written once, on redis-py's synchronous client.
During a crawl the scheduler runs every call of it here, so that no round trip,
lock wait or outage wait blocks downloads, callbacks and heartbeats: the
reactor asks (:meth:`IOThread.run`) and gets a ``Deferred`` that fires back on
the reactor with the answer or the error. One thread keeps the calls in the
order they were asked (an ack before the pop that carries it) and keeps every
connection used by one thread at a time.

Without a running reactor (a tool, a test, the crawl's start and end) the call
runs at once, in the caller's thread (:attr:`IOThread.inline`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet import defer, threads
from twisted.python.threadpool import ThreadPool

T = TypeVar("T")


class IOThread:
    """One thread that runs blocking Redis calls for the reactor, in order."""

    def __init__(self, name: str = "bloomdupe-redis") -> None:
        self._name = name
        self._pool: ThreadPool | None = None
        self._reactor: Any = None
        #: One Deferred of this thread's own per call asked and not yet answered back
        #: on the reactor (see drained).
        self._pending: set[defer.Deferred[None]] = set()

    @property
    def inline(self) -> bool:
        """Whether calls run at once in the caller's thread (no thread started)."""
        return self._pool is None

    def start(self, reactor: Any) -> None:
        """Run calls on a thread of their own from now on (the crawl runs)."""
        if self._pool is None:
            self._reactor = reactor
            self._pool = ThreadPool(1, 1, self._name)
            self._pool.start()

    def run(self, call: Callable[..., T], *args: Any) -> defer.Deferred[T]:
        """``call(*args)`` on the thread; its answer (or error) back on the reactor."""
        if self.inline:
            return defer.maybeDeferred(call, *args)
        d = self._dispatch(call, *args)
        done: defer.Deferred[None] = defer.Deferred()
        self._pending.add(done)
        d.addBoth(self._answered, done)
        return d

    def _dispatch(self, call: Callable[..., T], *args: Any) -> defer.Deferred[T]:
        """``call(*args)`` where the calls run (here: the thread), as a Deferred."""
        assert self._pool is not None
        d: defer.Deferred[T] = threads.deferToThreadPool(self._reactor, self._pool, call, *args)
        return d

    def _answered(self, result: T, done: defer.Deferred[None]) -> T:
        # Fired in the reactor's next turn: after the caller's callbacks, which run now,
        # and whatever they do. Not at the end of the caller's chain, which may pause for
        # good (a job not run once the crawl stopped): drained() waited on it, and a
        # worker stopping on an error never closed.
        self._pending.discard(done)
        self._reactor.callLater(0, done.callback, None)
        return result

    def drained(self) -> defer.Deferred[Any]:
        """Fires once every call asked so far is answered and its callbacks have run (up
        to a Deferred they wait for, if any)."""
        return defer.DeferredList(list(self._pending), consumeErrors=True)

    def stop(self) -> None:
        """Stop the thread (once drained); later calls run inline."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()
