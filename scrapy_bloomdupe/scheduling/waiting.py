"""The dupefilter's checks when no scheduler of this package runs (under Scrapy's or
scrapy-redis's scheduler): each check is a job on the runner, so the reactor never waits.

``request_seen`` is synchronous: a request the local cache does not know is answered "seen"
and held (:meth:`Waiting.hold`) while held requests go to Redis in one job; a new one is then
marked and given back to ``engine.crawl``, a duplicate logged as Scrapy does. The crawl does
not end while one waits; past :data:`MAX_WAITING` the engine pauses until fewer than half
wait. An outage past ``BLOOMDUPE_OUTAGE_TIMEOUT`` stops the crawl (or, under ``"allow"``,
lets them through unchecked).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from scrapy.exceptions import DontCloseSpider
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from ..exceptions import BloomDupeError
from .jobs import RedisJobs, Stopped

if TYPE_CHECKING:
    from scrapy.core.engine import ExecutionEngine
    from scrapy.crawler import Crawler
    from scrapy.http import Request

logger = logging.getLogger(__name__)

#: Fingerprints asked about, and the Deferred their answer fires.
Ask = tuple[list[bytes], Deferred[list[bool]]]
#: Most requests that wait in memory for Redis's answer before the engine is paused.
MAX_WAITING = 10_000


class Waiting:
    """One dupefilter's checks on ``jobs``' runner: ``check`` checks and adds, ``mark`` lets
    a new request through its next ``request_seen``, ``duplicate`` logs and counts one."""

    def __init__(self, jobs: RedisJobs, check: Callable[[list[bytes]], list[bool]], *,
                 crawler: Crawler | None, mark: Callable[[Request, bytes], None],
                 duplicate: Callable[[Request], None],
                 readmit: Callable[[list[bytes]], None], limit: int = MAX_WAITING) -> None:
        self.jobs, self._check, self._crawler = jobs, check, crawler
        self._mark, self._duplicate, self.limit = mark, duplicate, limit
        self._readmit = readmit
        #: Asks gathered for the next job.
        self._asks: list[Ask] = []
        self._asked = False
        #: Requests held by request_seen until Redis answers (by id).
        self.held: dict[int, Request] = {}
        self._paused = False
        #: Requests Redis answered new once the crawl had closed: not queued, re-admitted.
        self.too_late = 0
        self.closed = False

    def ask(self, fingerprints: list[bytes]) -> Deferred[list[bool]]:
        """Whether each of ``fingerprints`` is new (added), checked with all asks in one job.
        On a Redis failure it fails with :class:`~.jobs.Stopped` (under ``"allow"``: all new)."""
        answer: Deferred[list[bool]] = Deferred()
        self._asks.append((fingerprints, answer))
        if not self._asked:
            self._asked = True
            self.jobs.run(self._drain).addCallbacks(self._answered, self._failed)
        return answer

    def _drain(self) -> tuple[list[Ask], list[bool] | Exception]:
        """On the runner: check every ask gathered, together."""
        asks, self._asks, self._asked = self._asks, [], False
        try:
            return asks, self._check([fp for fps, _ in asks for fp in fps])
        except (RedisError, BloomDupeError) as e:  # acted on back on the reactor
            return asks, e

    def _answered(self, drained: tuple[list[Ask], list[bool] | Exception]) -> None:
        asks, new = drained
        if isinstance(new, Exception):
            health = self.jobs.health
            health.fail(new, sum(len(fps) for fps, _ in asks))
            if health.failed():  # the crawl stops: nothing more is asked or queued
                for _, answer in asks:
                    answer.errback(Stopped("the crawl stopped on an error"))
                return
            new = [True] * sum(len(fps) for fps, _ in asks)  # let through unchecked
        at = 0
        for fps, answer in asks:
            answer.callback(new[at:at + len(fps)])
            at += len(fps)

    def _failed(self, failure: Failure) -> None:
        """The job was not run: the crawl had stopped on an error."""
        if not isinstance(failure.value, Stopped):
            failure.raiseException()
        asks, self._asks, self._asked = self._asks, [], False
        self.jobs.health.unchecked += sum(len(fps) for fps, _ in asks)
        for _, answer in asks:
            answer.errback(failure.value)

    def hold(self, request: Request, fp: bytes) -> None:
        """``request`` waits for Redis's answer (its scheduler dropped it for now)."""
        self.held[id(request)] = request
        self.ask([fp]).addCallbacks(self._settled, self._stopped, callbackArgs=(request, fp),
                                    errbackArgs=(request,))
        if len(self.held) >= self.limit and not self._paused:
            self._paused = True
            logger.warning("%d requests wait for Redis's answer: the engine pauses (no new "
                           "download starts) until fewer than %d do", len(self.held),
                           self.limit // 2)
            self._engine().pause()

    def holds(self, request: Request) -> bool:
        """Whether ``request`` waits for Redis (so it is not a duplicate yet)."""
        return id(request) in self.held

    def _settled(self, new: list[bool], request: Request, fp: bytes) -> None:
        self.held.pop(id(request), None)
        if self._paused and len(self.held) < self.limit // 2:
            self._paused = False
            self._engine().unpause()
        if not new[0]:
            self._duplicate(request)
        elif self.closed:  # Scrapy's scheduler is closed: the next check answers it new
            self.too_late += 1
            self.jobs.run(lambda: self._readmit([fp]), after_stop=True).addErrback(
                self._not_readmitted, request)
        else:
            self._mark(request, fp)
            self._engine().crawl(request)

    @staticmethod
    def _not_readmitted(failure: Failure, request: Request) -> None:
        logger.error("Could not re-admit %s, which Redis took as new after the crawl had "
                     "closed: %s. A later crawl of this filter skips it; `bloomdupe forget "
                     "%s` re-admits it", request, failure.value, request.url)

    def _stopped(self, failure: Failure, request: Request) -> None:
        self.held.pop(id(request), None)
        if not isinstance(failure.value, Stopped):
            failure.raiseException()
        # The crawl stopped on an error: the request goes with it (the stop says so).

    def spider_idle(self) -> None:
        """The crawl does not end while a request waits for Redis's answer."""
        if self.held:
            raise DontCloseSpider

    def close(self) -> None:
        """From now a request answered new is not queued (the scheduler is closed); log them."""
        self.closed = True
        if self.held:
            logger.warning("%d request(s) waited for Redis's answer when the crawl closed: "
                           "they are not queued; those Redis takes as new are re-admitted "
                           "(the filter's next check of each answers it new)",
                           len(self.held))

    def _engine(self) -> ExecutionEngine:
        """The crawl's engine: a request is held only during a crawl."""
        assert self._crawler is not None and self._crawler.engine is not None
        return self._crawler.engine

    def figures(self) -> dict[str, Any]:
        return {"waiting": len(self.held), "too_late": self.too_late}
