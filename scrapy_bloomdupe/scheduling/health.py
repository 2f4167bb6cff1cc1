"""The crawl's health, one object a crawler (:func:`for_crawler`): whether this worker stopped
the crawl on an error and why (``failure``), the guard that waits out a Redis outage
(``outage``), and the stop itself (one ERROR line, spider closed, exit status 1). The jobs ask
it; the dupefilter reports to it and explains its errors (:attr:`CrawlHealth.explain`).
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

#: Close reasons of a stop on an error (exit status 1): Redis unavailable past the outage
#: timeout; a command refused (an ACL); the filter's state gone or replaced.
CLOSE_REASON = "bloomdupe_redis_unavailable"
REFUSED_REASON = "bloomdupe_redis_refused"
LOST_REASON = "bloomdupe_filter_lost"
#: A native (RedisBloom) filter whose shard refused items and that may not grow.
FULL_REASON = "bloomdupe_filter_full"
#: Not an error: the crawl finished and its state was deleted while this worker was away.
FINISHED = "finished"

#: What a stop on an error says of the requests in progress on the leased queue.
HELD = "the requests in progress stay leased in Redis and come back to the next workers"
#: What a stop says of the requests in progress on another queue.
NOT_HELD = ("the requests this worker took from its queue and did not finish are in the "
            "filter and in no queue (only the default leased queue keeps them): a later "
            "crawl skips them")


class CrawlHealth:
    """One crawl's health. ``outage`` waits out Redis outages; ``on_outage`` is
    ``BLOOMDUPE_ON_OUTAGE``; ``crawler`` is closed on a stop (without one, only recorded)."""

    def __init__(self, outage: OutageGuard, *, on_outage: str = "close",
                 crawler: Crawler | None = None) -> None:
        self.outage = outage
        self.on_outage = on_outage
        self.crawler = crawler
        #: The close reason once stopped (or :data:`FINISHED`): nothing more goes to Redis.
        self.failure: str | None = None
        #: Redis errors given up on; requests let through (or not queued) unchecked.
        self.redis_errors = 0
        self.unchecked = 0
        #: What a stop says of the requests in progress (set by the queue's owner).
        self.held = NOT_HELD
        #: ``error`` -> (close reason, what to do); the dupefilter sets its own.
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
        """Act on a Redis call's ``error`` (``unchecked`` requests let through): an outage
        does what ``BLOOMDUPE_ON_OUTAGE`` says; anything else stops the crawl."""
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
        """Close the spider with ``reason`` after one ERROR line; ``scrapy crawl`` exits 1."""
        if self.failure is not None:
            return
        self.failure, self._quiet = reason, True
        logger.error("%s. Stopping the crawl (close reason %r, exit status 1); %s.",
                     message.rstrip("."), reason, self.held)
        if self.crawler is not None:
            self.crawler.signals.connect(self._mark_failed, signal=signals.engine_stopped)
            self._close(reason)

    def finished(self, message: str) -> None:
        """The crawl finished while this worker was away: close ("finished") after one INFO."""
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
        # Scrapy exits 1 if a crawler ends without a spider: the only way to fail a crawl.
        if self.crawler is not None:
            self.crawler.spider = None


_health: weakref.WeakKeyDictionary[Crawler, CrawlHealth] = weakref.WeakKeyDictionary()


def for_crawler(crawler: Crawler, make: Callable[[], CrawlHealth]) -> CrawlHealth:
    """The crawl's one health: the first component to ask ``make``s it, the others share it."""
    health = _health.get(crawler)
    if health is None:
        health = _health[crawler] = make()
    return health
