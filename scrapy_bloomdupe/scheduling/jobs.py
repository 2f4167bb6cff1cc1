"""Where a crawl's Redis work runs: the filter's and the queue's calls, one job at a time, on a
runner chosen when the scheduler opens a crawl (or at the dupefilter's first check):

* Scrapy's asyncio loop (:class:`IOLoop`), under the asyncio reactor when the filter's link and
  the queue have ``redis.asyncio`` twins: each job runs in a greenlet
  (:func:`~..transport.onloop.run_bridged`) whose round trips and pauses are awaited, so
  downloads, callbacks and heartbeats go on meanwhile;
* else a thread of its own (:class:`IOThread`), for another ``TWISTED_REACTOR`` or a
  scrapy-redis queue class (or the user's dupefilter) on redis-py's blocking client.

Every job of a crawl goes there, so Scrapy's reactor never waits for Redis; jobs run in the
order asked (an ack before the pop that carries it), a connection serving one job at a time.
Outside a crawl a job runs here and at once (:attr:`RedisJobs.inline`). Redis is reached only
inside a job, with :meth:`RedisJobs.call`, which acts on what a call meets with the crawl's
health (:class:`~.health.CrawlHealth`): an outage is waited out, a refusal or a lost filter
stops the crawl, and after such a stop nothing more is sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextvars import ContextVar
from functools import partial
from typing import Any, TypeVar

from redis.exceptions import RedisError
from scrapy.utils.asyncio import CallLaterResult, call_later
from scrapy.utils.reactor import is_asyncio_reactor_installed, is_reactor_installed
from twisted.internet import defer, threads
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from ..exceptions import BloomDupeError
from ..transport.onloop import run_bridged
from ..transport.outage import RedisUnavailable
from .health import CrawlHealth

T = TypeVar("T")

#: :meth:`RedisJobs.call` without a fallback: errors are raised.
RAISE: Any = object()
#: Whether the running code is inside a job of :meth:`RedisJobs.run` (per thread, greenlet).
_in_job: ContextVar[bool] = ContextVar("bloomdupe_in_job", default=False)


class IOThread:
    """The fallback runner: one thread that runs the blocking Redis jobs in order, each answer
    (or error) fired back on the reactor; not started, a job runs at once in the caller's."""

    def __init__(self, name: str = "bloomdupe-redis") -> None:
        self._name = name
        self._pool: ThreadPool | None = None
        self._reactor: Any = None
        #: A Deferred per call asked and not yet answered back on the reactor (see drained).
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
        # Fired in the reactor's next turn, after the caller's callbacks and what they do; not at
        # the end of the caller's chain, which may pause for good (a job not run after a stop):
        # drained() would wait for ever and a worker stopping on an error never close.
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


class IOLoop(IOThread):
    """The runner on Scrapy's asyncio loop: each job in a greenlet, one at a time (an
    ``asyncio.Lock`` wakes waiters in order); otherwise as :class:`IOThread`."""

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


class Stopped(BloomDupeError):
    """A Redis job that came up after this worker stopped the crawl on an error: not run, so
    the jobs in line do not each wait out the same outage before the worker can close (what
    they would have written stays leased and comes back to the next workers)."""


def never_after_stop(failure: Failure) -> Deferred[Any]:
    """An errback: a job not run after a stop pauses its chain for good; others go on."""
    return Deferred() if isinstance(failure.value, Stopped) else defer.fail(failure)


def acted_on(failure: Failure) -> Failure | None:
    """The end of a Redis job's errbacks: a Redis error was acted on (the crawl stops)."""
    return None if isinstance(failure.value, (RedisError, BloomDupeError)) else failure


class RedisJobs:
    """The scheduler's Redis work: :meth:`run` (a job, on the runner during a crawl),
    :meth:`call` (a Redis call within a job), and what a failure does (``health`` says).
    ``later`` asks for a delayed call during a crawl (Scrapy's ``call_later``; a test's own)."""

    def __init__(self, health: CrawlHealth, *,
                 later: Callable[[float, Callable[[], None]], Any] = call_later,
                 crawling: bool = False) -> None:
        self.health = health
        self._later = later
        #: Whether these jobs serve a crawl (set when the runner starts, kept after it stops; a
        #: test may pass True with inline jobs). Only then is the engine woken, delayed calls
        #: made, and leases acked when Scrapy is done; outside a crawl the taker is done.
        self.crawling = crawling
        #: Where the jobs run (see start): the asyncio loop, the Redis thread, or inline.
        self.io: IOThread | IOLoop = IOThread()

    def start(self, *, on_loop: bool) -> bool:
        """Run the jobs off the reactor's blocking path from now on, once, if the reactor runs:
        on its asyncio loop when it is asyncio's and ``on_loop`` (the links have
        ``redis.asyncio`` twins), else on a thread of their own. Whether they do."""
        if self.io.inline:
            reactor = running_reactor()
            if reactor is None:
                return False
            if on_loop and is_asyncio_reactor_installed():
                self.io = IOLoop()
            self.io.start(reactor)
        self.crawling = True
        return True

    def stop(self) -> None:
        """Later jobs run here and at once (the runner's last job is answered)."""
        self.io.stop()

    @property
    def inline(self) -> bool:
        """Whether jobs run here and at once (no runner started: outside a crawl)."""
        return self.io.inline

    def later(self, delay: float, call: Callable[[], None]) -> CallLaterResult | None:
        """``call`` on the reactor in ``delay`` seconds, during a crawl (what a job may
        wait for, to go with others: the outbox's gathering); outside one, at once."""
        if self.inline:
            call()
            return None
        later: CallLaterResult = self._later(delay, call)
        return later

    def failed(self) -> bool:
        """Whether this worker stopped the crawl on an error."""
        return self.health.failed()

    def run(self, job: Callable[[], T], *, after_stop: bool = False, quiet: bool = False
            ) -> Deferred[T]:
        """``job`` on the runner (here and at once outside a crawl), one at a time: the one way
        to Redis during a crawl, its calls made with :meth:`call`. A job that comes up after the
        crawl stopped is not run (its Deferred fails with :class:`Stopped`) unless ``after_stop``
        (the crawl's start and end: see :mod:`.shared`). ``quiet``: other components' work
        (live figures, the filter's fill), whose Deferred then never fires after a stop."""
        def in_job() -> T:
            if not after_stop and self.failed():
                raise Stopped("the crawl stopped on an error")
            token = _in_job.set(True)
            try:
                return job()
            finally:
                _in_job.reset(token)
        d: Deferred[T] = self.io.run(in_job)
        return d.addErrback(never_after_stop) if quiet else d

    def call(self, fn: Callable[[], T], fallback: Any = RAISE) -> T:
        """``fn()``, a Redis call inside a job (:meth:`run`; elsewhere a ``RuntimeError``), an
        outage waited out. Without ``fallback`` an error is raised for the job's errback
        (:meth:`redis_failed`); with one, a refusal or an outage past its timeout is acted on at
        once (the crawl stops, or what ``BLOOMDUPE_ON_OUTAGE`` says) and gives ``fallback``, as
        does any call after the crawl stopped (each would wait out the outage again)."""
        if not _in_job.get():
            raise RuntimeError("a Redis call outside a job: run it with RedisJobs.run")
        if fallback is RAISE:
            return self.health.call(fn)
        if self.health.failed():
            answer: T = fallback
            return answer
        try:
            return self.health.call(fn)
        except (RedisUnavailable, RedisError, BloomDupeError) as e:
            self.health.fail(e)
            answer = fallback
            return answer

    def redis_failed(self, failure: Failure) -> None:
        """An errback for a job: a Redis error stops the crawl (as :meth:`call`); a bug raises."""
        if not isinstance(failure.value, (RedisError, BloomDupeError)):
            failure.raiseException()
        if not isinstance(failure.value, Stopped):
            self.health.fail(failure.value)


def running_reactor() -> Any:
    """Twisted's reactor while it runs (a crawl), else None. Imported here: importing the reactor
    installs one, and Scrapy installs its own (TWISTED_REACTOR) first."""
    if not is_reactor_installed():
        return None
    from twisted.internet import reactor

    return reactor if getattr(reactor, "running", False) else None
