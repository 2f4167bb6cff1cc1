"""Where a crawl's Redis work runs: the filter's and the queue's calls, one job at a
time, on one runner chosen once, when the scheduler opens a crawl (or, without this
package's scheduler, at the dupefilter's first check of the crawl):

* Scrapy's asyncio loop with ``redis.asyncio`` (:class:`IOLoop`: one node, Sentinel
  or a cluster), under the asyncio reactor (Scrapy's default) when the filter's link
  and the queue have ``redis.asyncio`` twins: each job runs in a greenlet
  (:func:`~..transport.onloop.run_bridged`) whose round trips are awaited on
  ``redis.asyncio`` and whose pauses are ``asyncio.sleep``, so downloads, callbacks and
  heartbeats go on meanwhile;
* else a thread of its own (:class:`IOThread`), the one fallback: another
  ``TWISTED_REACTOR`` has no asyncio loop to await on, and a scrapy-redis queue class
  (or a dupefilter of the user's) makes its round trips on redis-py's blocking client,
  which would block the loop. The filter's and the queue's logic is written once,
  blocking; the thread runs it as it is.

Every job of a crawl goes there, its start (:meth:`Scheduler.open`'s join) and its end
(:meth:`Scheduler.close`) included, so that Scrapy's reactor never waits for Redis.
Either runs one job at a time, in the order asked (an ack before the pop that carries
it), and keeps every connection used by one job at a time. Outside a crawl (a tool, a
test that calls the objects directly) no runner is started and a job runs here and at
once (:attr:`RedisJobs.inline`): the same code, its Deferred fired before
:meth:`RedisJobs.run` returns. Either way a part of the scheduler reaches Redis only
inside a job, with :meth:`RedisJobs.call` (which refuses to run anywhere else).

The one place that acts on what a call meets, with the crawl's health
(:class:`~.health.CrawlHealth`): an outage is waited out, a refusal or a lost filter
stops the crawl, and once the crawl has stopped on an error nothing more is sent.
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
#: Whether the running code is inside a job of :meth:`RedisJobs.run` (per thread, per
#: greenlet).
_in_job: ContextVar[bool] = ContextVar("bloomdupe_in_job", default=False)


class IOThread:
    """The fallback runner: one thread that runs the blocking Redis jobs for the reactor,
    in order; the answer (or error) of each fires back on the reactor. Without a running
    reactor (not started) a job runs at once in the caller's thread."""

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


class IOLoop(IOThread):
    """The runner on Scrapy's asyncio loop: each job in a greenlet, one at a time (an
    ``asyncio.Lock`` wakes its waiters first come, first served); what a job's caller
    waits for, and :meth:`drained`, as :class:`IOThread`'s."""

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
    """A Redis job that came up after this worker stopped the crawl on an error: not run.
    Once a crawl stopped, nothing more is sent to Redis (what the job would have
    written stays leased and comes back to the next workers); without this, each job
    already in line would wait out the same outage, one after the other, before the
    worker could close."""


def never_after_stop(failure: Failure) -> Deferred[Any]:
    """An errback: a job not run because the crawl stopped pauses its chain for good
    (a Deferred that never fires); any other failure goes on down the chain."""
    return Deferred() if isinstance(failure.value, Stopped) else defer.fail(failure)


def acted_on(failure: Failure) -> Failure | None:
    """The end of a Redis job's errbacks: a Redis error was acted on (the crawl stops)."""
    return None if isinstance(failure.value, (RedisError, BloomDupeError)) else failure


class RedisJobs:
    """The scheduler's Redis work: :meth:`run` (a job, on the runner during a crawl),
    :meth:`call` (a Redis call within a job), and what a failure does: the crawl's
    ``health`` says. ``later`` asks for a delayed call during a crawl (Scrapy's
    ``call_later``; a test's own)."""

    def __init__(self, health: CrawlHealth, *,
                 later: Callable[[float, Callable[[], None]], Any] = call_later,
                 crawling: bool = False) -> None:
        self.health = health
        self._later = later
        #: Whether these jobs serve a crawl: set when the runner starts, and kept once it
        #: stops at the close (a test models a crawl with ``crawling=True`` and jobs run
        #: inline). Only then are the engine woken, delayed calls made, and leases
        #: acked when Scrapy is done with them; outside a crawl (the command line, a
        #: test of the parts alone) whoever took a request is done with it.
        self.crawling = crawling
        #: Where the jobs run once the scheduler opens a crawl (see start): the asyncio
        #: loop or the Redis thread; outside a crawl, here and at once.
        self.io: IOThread | IOLoop = IOThread()

    def start(self, *, on_loop: bool) -> bool:
        """Run the jobs off the reactor's blocking path from now on, once, if the reactor
        runs (a crawl): on its asyncio loop when it is asyncio's and ``on_loop`` (the
        links have ``redis.asyncio`` twins), else on a thread of their own (the
        fallback). Whether they do (not outside a crawl: a tool, a test)."""
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
        """``job`` on the runner (here and at once outside a crawl), one job at a time:
        the one way to Redis during a crawl, its Redis calls made with :meth:`call`. A
        job that comes up after the crawl stopped is not run (its Deferred fails with
        :class:`Stopped`), unless ``after_stop``: the crawl's start and end, which touch
        only what they may after an error (see :mod:`.shared`). ``quiet``: other
        components' work (live figures, the filter's fill), whose Deferred then never
        fires once the crawl stopped."""
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
        """``fn()``, a Redis call inside a job (:meth:`run`; anywhere else a
        ``RuntimeError``), an outage waited out. Without ``fallback`` an error is raised
        for the job's errback (:meth:`redis_failed`); with one, a refusal or an outage
        past its timeout is acted on at once (the crawl stops, or, for an outage, what
        ``BLOOMDUPE_ON_OUTAGE`` says) and gives ``fallback``, as does any call once the
        crawl has stopped (the engine may still ask while it closes; each ask would
        wait out the outage again)."""
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
        """An errback for a job: a Redis error stops the crawl (as :meth:`call` does);
        anything else is a bug, raised."""
        if not isinstance(failure.value, (RedisError, BloomDupeError)):
            failure.raiseException()
        if not isinstance(failure.value, Stopped):
            self.health.fail(failure.value)


def running_reactor() -> Any:
    """Twisted's reactor while it runs (a crawl), else None (a tool, a test). Imported
    here, not at the top: importing the reactor installs one, and Scrapy installs its
    own (TWISTED_REACTOR) first."""
    if not is_reactor_installed():
        return None
    from twisted.internet import reactor

    return reactor if getattr(reactor, "running", False) else None
