"""Waiting out a Redis outage: retry with backoff, one error when it starts, one line at the end.

An outage is Redis not answering (dead server, failover) or refusing writes when full (OOM under
``noeviction``): a refused write changed nothing and memory may come back, so both are retried; past
``BLOOMDUPE_OUTAGE_TIMEOUT`` the crawl stops with the reason. A dropped connection (restart, idle
close) is resent at once, silently. Inside :func:`guarded` calls the link makes one attempt a round
trip: this is the crawl's one retry layer. Retrying is safe as every command is idempotent (the
check-and-add by op id). During a crawl pauses run on the loop (:mod:`.onloop`) or the Redis thread,
never blocking Scrapy's reactor; no request is handed out, acked or dropped until Redis answers, so
none is lost. Elsewhere they run on the caller's thread.
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

#: Errors worth waiting out: a failover shows as READONLY (demoted master) or, on a cluster,
#: CLUSTERDOWN/TRYAGAIN, an unowned slot or moving slots (ClusterError); a full Redis gives OOM.
TRANSIENT = (ConnectionError, TimeoutError, ReadOnlyError, ClusterError, TryAgainError,
             SlotNotCoveredError, OutOfMemoryError)
#: Pauses between attempts: short, so the crawl resumes within half a second of Redis's
#: return (failovers take seconds); an attempt costs one round trip or a refused connection.
FIRST_PAUSE = 0.25
MAX_PAUSE = 0.5


#: Whether the running code is inside :meth:`OutageGuard.call` (per thread, per job).
_inside: ContextVar[bool] = ContextVar("bloomdupe_guarded", default=False)


def guarded() -> bool:
    """Whether inside an outage guard's call: then the link makes one attempt a round trip
    and the guard retries; elsewhere it keeps redis-py's ``Retry``."""
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
                # A dropped connection (restart, idle close): resent at once, silently.
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
