"""Waiting out a Redis outage: retry with backoff, one error when it starts, one line at the end.

An outage is Redis not answering (a dead server, a failover), and also Redis
refusing writes because it is full (``OOM command not allowed when used memory >
'maxmemory'`` under the ``noeviction`` policy): memory may come back (the queue
drains, an operator raises ``maxmemory``), and a refused write changed nothing,
so it is retried like a lost connection; when it lasts, the crawl stops with
the reason.

A dropped connection is sent again at once, in silence: a Redis restarted since the
last round trip, an idle connection the server closed. Inside a guard's call
(:func:`guarded`: a crawl's Redis jobs, on the loop or the Redis thread) the link
makes one attempt a round trip, without redis-py's ``Retry`` or the cluster link's
failover retries: this module is the crawl's one retry layer (the command line and
other callers without a guard keep those). What outlasts the silent resend reaches
this module's wait, which keeps retrying with short pauses for up to
``BLOOMDUPE_OUTAGE_TIMEOUT`` seconds, logging one ERROR when the outage starts and
one INFO when Redis is back, and counting both. Retrying is safe because every
command this package sends is idempotent (the check-and-add by op id).

During a crawl the pauses run on the loop (``asyncio.sleep``, :mod:`.onloop`) or
on the scheduler's Redis thread, never blocking Scrapy's reactor: downloads already
started finish, and their callbacks' outputs wait for Redis with the rest of its
work; no request is handed out, acked or dropped until Redis answers, so every
request stays in hand (or leased in Redis). Elsewhere (the command line, a
crawl's start and end) they run on the caller's thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import TypeVar

from redis.exceptions import (
    ClusterError,
    ConnectionError,
    OutOfMemoryError,
    ReadOnlyError,
    SlotNotCoveredError,
    TimeoutError,
    TryAgainError,
)

from ..exceptions import BloomDupeError
from .onloop import pause

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Errors that mean "Redis is not (fully) there", worth waiting out. A
#: failover shows as READONLY from a demoted master, and on a cluster mid-election
#: as CLUSTERDOWN/TRYAGAIN, a slot without a known master, or slots still moving
#: (ClusterError covers CLUSTERDOWN and too many MOVED in one round trip). A full
#: Redis refuses writes with OOM (nothing written).
TRANSIENT = (ConnectionError, TimeoutError, ReadOnlyError, ClusterError, TryAgainError,
             SlotNotCoveredError, OutOfMemoryError)
#: The pauses between attempts: 0.25 s, then 0.5 s. Short, so that the crawl resumes
#: within half a second of Redis coming back (a cluster's or Sentinel's failover is
#: over in a few seconds: the cluster link's own retries used the same pauses,
#: measured in tests/faults/test_cluster_failover.py); an attempt costs Redis one
#: round trip, or a refused connection.
FIRST_PAUSE = 0.25
MAX_PAUSE = 0.5


#: Whether the running code is inside :meth:`OutageGuard.call` (per thread, per job).
_inside: ContextVar[bool] = ContextVar("bloomdupe_guarded", default=False)


def guarded() -> bool:
    """Whether the running code is inside an outage guard's call: then the link makes
    one attempt a round trip and leaves every retry to the guard (one retry layer);
    elsewhere (the command line, a tool) it keeps redis-py's ``Retry``."""
    return _inside.get()


class RedisUnavailable(BloomDupeError):
    """Redis stayed unreachable for ``BLOOMDUPE_OUTAGE_TIMEOUT`` seconds."""


class OutageGuard:
    """Runs Redis calls, waiting out outages for up to ``timeout`` seconds."""

    def __init__(self, timeout: float, where: str, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = pause) -> None:
        self.timeout = timeout
        self.where = where
        self.outages = 0
        self.outage_time = 0.0
        self._clock = clock
        self._sleep = sleep

    def call(self, fn: Callable[[], T]) -> T:
        token = _inside.set(True)
        try:
            return self._call(fn)
        finally:
            _inside.reset(token)

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except TRANSIENT as error:
            if type(error) is ConnectionError:  # not a refused password, not a timeout
                # A dropped connection (a restart since the last round trip, an idle
                # one the server closed): sent again at once, on a new one, in silence.
                try:
                    return fn()
                except TRANSIENT as again:
                    error = again
            return self._wait_out(fn, error)

    def _wait_out(self, fn: Callable[[], T], error: Exception) -> T:
        self.outages += 1
        started = self._clock()
        deadline = started + self.timeout
        logger.error(
            "Redis at %s is %s (%s: %s); retrying for up to %ss "
            "(BLOOMDUPE_OUTAGE_TIMEOUT). The crawl waits meanwhile; no request is dropped.",
            self.where, _state(error), type(error).__name__, error, self.timeout,
        )
        pause = FIRST_PAUSE
        try:
            while True:
                left = deadline - self._clock()
                if left <= 0:
                    raise RedisUnavailable(
                        f"Redis at {self.where} stayed {_state(error)} for {self.timeout}s "
                        f"(BLOOMDUPE_OUTAGE_TIMEOUT); last error: {type(error).__name__}: "
                        f"{error}{_advice(error)}"
                    ) from None
                self._sleep(min(pause, left))
                pause = min(pause * 2, MAX_PAUSE)
                try:
                    result = fn()
                except TRANSIENT as again:
                    error = again
                    continue
                logger.info("Redis at %s is back after %.1fs; resuming", self.where,
                            self._clock() - started)
                return result
        finally:
            self.outage_time += self._clock() - started


def _state(error: Exception) -> str:
    return ("out of memory, refusing writes" if isinstance(error, OutOfMemoryError)
            else "unavailable")


def _advice(error: Exception) -> str:
    if isinstance(error, OutOfMemoryError):
        return (". Give Redis more memory (CONFIG SET maxmemory), or free some (`bloomdupe "
                "info` shows the filter's share), then start the workers again: the requests "
                "in progress are leased and come back")
    return ""
