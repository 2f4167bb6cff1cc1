"""Where the scheduler's Redis work runs: the filter's and the queue's calls, one job at a
time, under one lock, on one runner chosen once, when the scheduler opens a crawl:

* Scrapy's asyncio loop with ``redis.asyncio`` (:mod:`..frontier.ioloop`: one node,
  Sentinel or a cluster), under the asyncio reactor (Scrapy's default) when the filter's
  link and the queue have ``redis.asyncio`` twins;
* else a thread of its own (:mod:`..frontier.iothread`), the one fallback: another
  ``TWISTED_REACTOR`` has no asyncio loop to await on, and a scrapy-redis queue class
  (or a dupefilter of the user's) makes its round trips on redis-py's blocking client,
  which would block the loop. The filter's and the queue's logic is written once,
  blocking; the thread runs it as it is.

Every job of a crawl goes there, its start (:meth:`Scheduler.open`'s join) and its end
(:meth:`Scheduler.close`) included, so that Scrapy's reactor never waits for Redis.
Outside a crawl (a tool, a test that calls the objects directly) no runner is started
and a job runs here and at once (:attr:`RedisJobs.inline`): the same code, its
Deferred fired before :meth:`RedisJobs.run` returns.

The one place that acts on what a call meets: an outage is waited out (the
dupefilter's :class:`~scrapy_bloomdupe.transport.outage.OutageGuard`), a refusal or a
lost filter stops the crawl (``RedisBloomDupeFilter.fail``), and once the crawl has
stopped on an error nothing more is sent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from redis.exceptions import RedisError
from scrapy.utils.asyncio import CallLaterResult, call_later
from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from ..dupefilter import RedisBloomDupeFilter
from ..exceptions import BloomDupeError
from ..frontier.ioloop import IOLoop
from ..frontier.iothread import IOThread
from ..transport.outage import RedisUnavailable

T = TypeVar("T")


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
    :meth:`guarded` (a call within a job), and what a failure does.
    ``dupefilter`` gives the crawl's dupefilter (set once the scheduler opens); with
    one that is not this package's, calls run unguarded, as scrapy-redis runs them.
    ``later`` asks for a delayed call during a crawl (Scrapy's ``call_later``; a
    test's own)."""

    def __init__(self, dupefilter: Callable[[], Any], *,
                 later: Callable[[float, Callable[[], None]], Any] = call_later) -> None:
        self._dupefilter = dupefilter
        self._later = later
        #: Where the jobs run once the scheduler opens a crawl (see start): the asyncio
        #: loop or the Redis thread; outside a crawl, here and at once.
        self.io: IOThread | IOLoop = IOThread()
        #: Serializes the Redis work: a job and what a tool runs here and now never
        #: interleave.
        self.lock = threading.RLock()

    def start(self, reactor: Any, *, on_loop: bool) -> None:
        """Run the jobs off the reactor's blocking path from now on (the scheduler opens a
        crawl; once): on its asyncio loop (``on_loop``: the reactor is asyncio's and the
        links have ``redis.asyncio`` twins) or on the Redis thread (the fallback)."""
        if self.io.inline and on_loop:
            self.io = IOLoop()
        self.io.start(reactor)

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

    def _df(self) -> RedisBloomDupeFilter | None:
        df = self._dupefilter()
        return df if isinstance(df, RedisBloomDupeFilter) else None

    def failed(self) -> bool:
        """Whether this worker stopped the crawl on an error."""
        df = self._df()
        return df is not None and df.failure is not None

    def run(self, call: Callable[[], T], *, after_stop: bool = False) -> Deferred[T]:
        """``call`` under the lock, on the runner (here and at once outside a crawl). A
        job that comes up after the crawl stopped is not run (its Deferred fails with
        :class:`Stopped`), unless ``after_stop``: the crawl's start and end, which touch
        only what they may after an error (see :mod:`.shared`)."""
        def locked() -> T:
            with self.lock:
                if not after_stop and self.failed():
                    raise Stopped("the crawl stopped on an error")
                return call()
        return self.io.run(locked)

    def in_redis_thread(self, call: Callable[[], T]) -> Deferred[T]:
        """``call`` on the runner during a crawl (here and at once otherwise), in
        turn with the filter's and the queue's work: the Redis work of other components
        (live figures, the filter's fill) keeps off Scrapy's reactor too. Once the crawl
        stopped on an error the call is not run, and the Deferred never fires."""
        d: Deferred[T] = self.run(call).addErrback(never_after_stop)
        return d

    def outage_call(self, call: Callable[[], T]) -> T:
        """``call`` with Redis outages waited out (inside a job: see :meth:`run`)."""
        df = self._df()
        return call() if df is None else df.outage.call(call)

    def guarded(self, call: Callable[[], T], fallback: T) -> T:
        """``call`` within the job that runs it (or here and now outside a crawl), an
        outage waited out. A refusal or an outage past its
        timeout stops the crawl (or, for an outage, does what ``BLOOMDUPE_ON_OUTAGE``
        says) and gives ``fallback``; once the crawl has stopped, nothing more is sent
        (the engine may still ask while it closes; each ask would wait out the outage
        again)."""
        df = self._df()
        if df is None:
            return call()
        if df.failure is not None:
            return fallback
        try:
            with self.lock:
                return df.outage.call(call)
        except (RedisUnavailable, RedisError, BloomDupeError) as e:
            df.fail(e)
            return fallback

    def redis_failed(self, failure: Failure) -> None:
        """An errback for a job: a Redis error stops the crawl (as :meth:`guarded` does);
        anything else is a bug, raised."""
        if not isinstance(failure.value, (RedisError, BloomDupeError)):
            failure.raiseException()
        df = self._df()
        if not isinstance(failure.value, Stopped) and df is not None:
            df.fail(failure.value)
