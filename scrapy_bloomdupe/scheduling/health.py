"""The crawl's health, in one object a crawler has (:func:`for_crawler`): whether this
worker stopped the crawl on an error and why (``failure``), the guard that waits out a
Redis outage (``outage``), and the stop itself (one ERROR line, the spider closed,
``scrapy crawl`` exits with status 1).

The scheduler's jobs ask it (:meth:`CrawlHealth.failed`, :meth:`CrawlHealth.call`);
the dupefilter reports to it, and tells it how to explain an error of its filter
(:attr:`CrawlHealth.explain`); under the leased queue the scheduler says what becomes
of the requests in progress (:attr:`CrawlHealth.held`). Nothing here knows which
component reports.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from scrapy import signals
from scrapy.utils.defer import deferred_from_coro

from ..exceptions import BloomDupeError
from ..transport.diagnose import refusal
from ..transport.outage import OutageGuard, RedisUnavailable

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Close reasons of a crawl this package stops on an error (``scrapy crawl`` then exits
#: with status 1): Redis stayed unavailable (or full) past ``BLOOMDUPE_OUTAGE_TIMEOUT``
#: (with ``BLOOMDUPE_ON_OUTAGE = "close"``); Redis refused a command (an ACL); the
#: filter's state in Redis is gone or was replaced.
CLOSE_REASON = "bloomdupe_redis_unavailable"
REFUSED_REASON = "bloomdupe_redis_refused"
LOST_REASON = "bloomdupe_filter_lost"
#: A native (RedisBloom) filter whose shard refused items and that may not grow.
FULL_REASON = "bloomdupe_filter_full"
#: Not an error: the crawl finished and its last worker deleted its state while this
#: worker was away (the dupefilter's explanation of a lost filter, then).
FINISHED = "finished"

#: What a stop on an error says of the requests in progress on the leased queue.
HELD = "the requests in progress stay leased in Redis and come back to the next workers"
#: What a stop says of the requests in progress, but under the leased queue.
NOT_HELD = ("the requests this worker took from its queue and did not finish are in the "
            "filter and in no queue (only the default leased queue keeps them): a later "
            "crawl skips them")


class CrawlHealth:
    """One crawl's health. ``outage`` waits out Redis outages (its timeout and what it
    names); ``on_outage`` is ``BLOOMDUPE_ON_OUTAGE``; ``crawler`` is closed on a stop
    (without one, a tool's or a test's, the failure is only recorded)."""

    def __init__(self, outage: OutageGuard, *, on_outage: str = "close",
                 crawler: Crawler | None = None) -> None:
        self.outage = outage
        self.on_outage = on_outage
        self.crawler = crawler
        #: The close reason once this worker stopped the crawl on an error (or
        #: :data:`FINISHED`), else None: nothing more is sent to Redis then.
        self.failure: str | None = None
        #: Redis errors given up on; requests let through (or not queued) unchecked.
        self.redis_errors = 0
        self.unchecked = 0
        #: What a stop says becomes of the requests in progress (the queue's owner says).
        self.held = NOT_HELD
        #: ``error`` as a close reason and the line that says what to do (the
        #: dupefilter's, which knows its filter; this default knows Redis only).
        self.explain: Callable[[Exception], tuple[str, str]] = self._explain
        #: Set once the worker closes or said it lets requests through: log no more.
        self._quiet = False

    def failed(self) -> bool:
        """Whether this worker stopped the crawl on an error."""
        return self.failure is not None

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` with Redis outages waited out (inside a job)."""
        return self.outage.call(fn)

    def fail(self, error: Exception, unchecked: int = 0) -> None:
        """Act on ``error``, which a Redis call met (``unchecked`` requests went
        unchecked for it): an outage past its timeout does what ``BLOOMDUPE_ON_OUTAGE``
        says; anything else (a refusal, a lost or full filter) stops the crawl."""
        self.unchecked += unchecked
        self.redis_errors += 1
        if isinstance(error, RedisUnavailable):
            self._give_up(error)
            return
        reason, message = self.explain(error)
        if reason == FINISHED:
            self.finished(message)
        else:
            self.stop(reason, message)

    def _give_up(self, error: RedisUnavailable) -> None:
        if self._quiet:
            return
        if self.on_outage == "close":
            self.stop(CLOSE_REASON, f"{error}. Stopping the crawl (BLOOMDUPE_ON_OUTAGE = "
                      "'close')")
        elif self.unchecked:
            self._quiet = True
            logger.error("%s. Letting requests through unchecked (BLOOMDUPE_ON_OUTAGE = "
                         "'allow'); duplicates are possible.", error)

    def _explain(self, error: Exception) -> tuple[str, str]:
        if isinstance(error, BloomDupeError):
            return REFUSED_REASON, str(error)
        return REFUSED_REASON, refusal(self.outage.where, error)

    def stop(self, reason: str, message: str) -> None:
        """Close the spider with ``reason`` after one ERROR line (``message`` says what
        happened and what to do), and make ``scrapy crawl`` exit with status 1."""
        if self.failure is not None:
            return
        self.failure, self._quiet = reason, True
        logger.error("%s. Stopping the crawl (close reason %r, exit status 1); %s.",
                     message.rstrip("."), reason, self.held)
        if self.crawler is not None:
            self.crawler.signals.connect(self._mark_failed, signal=signals.engine_stopped)
            self._close(reason)

    def finished(self, message: str) -> None:
        """The crawl this worker belonged to finished while it was away, and its last
        worker deleted the shared state: close ("finished", exit status 0) after one
        INFO line, and send nothing more to Redis."""
        if self.failure is not None:
            return
        self.failure, self._quiet = FINISHED, True
        logger.info("%s", message)
        self._close(FINISHED)

    def _close(self, reason: str) -> None:
        try:
            engine = self.crawler.engine if self.crawler is not None else None
        except RuntimeError:  # Scrapy's answer when the crawler is not crawling
            engine = None
        if engine is not None:
            deferred_from_coro(engine.close_spider_async(reason=reason))

    def _mark_failed(self) -> None:
        # Scrapy marks a crawl failed (``scrapy crawl`` exits with status 1) when its
        # crawler has no spider at the end (CrawlerProcess's bootstrap_failed); there
        # is no public way to fail a crawl that ran. tests/e2e/test_operator.py checks
        # the exit status.
        if self.crawler is not None:
            self.crawler.spider = None


_health: weakref.WeakKeyDictionary[Crawler, CrawlHealth] = weakref.WeakKeyDictionary()


def for_crawler(crawler: Crawler, make: Callable[[], CrawlHealth]) -> CrawlHealth:
    """The crawl's one health: the first component built asks for it (the scheduler,
    or the dupefilter when it runs alone) and ``make``s it; the others get the same."""
    health = _health.get(crawler)
    if health is None:
        health = _health[crawler] = make()
    return health
