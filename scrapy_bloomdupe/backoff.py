"""``BLOOMDUPE_POLITENESS = "crawl"``: a site that answers "slow down" is backed off by every
worker, not only the one that heard it.

A status in ``BLOOMDUPE_BACKOFF_CODES`` (429, 503) pauses its download slot in Redis
(:meth:`~.frontier.leased.LeasedQueue.backoff`, Redis's clock) for what ``Retry-After`` asks,
else 1 s doubling with each such answer in a row (forgotten after ``BLOOMDUPE_BACKOFF_MAX`` s
without one); at most ``BLOOMDUPE_BACKOFF_MAX``. The response goes on to ``RetryMiddleware``,
whose retry waits in the slot until the pause ends. With ``ROBOTSTXT_OBEY``, robots.txt's
``Crawl-delay`` raises the slot's delay for every worker (same cap).

The add-on enables it at order 560 (before ``RetryMiddleware``); not configured in ``"worker"``
politeness.
"""

from __future__ import annotations

import email.utils
import logging
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from protego import Protego
from scrapy.exceptions import NotConfigured

from . import keys
from .frontier.leased import LeasedQueue
from .scheduler import for_crawler
from .scheduling.jobs import acted_on
from .settings import FrontierConfig

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Request, Response
    from typing_extensions import Self

logger = logging.getLogger(__name__)

#: The first pause of a slot answered without Retry-After (s); each next one doubles.
FIRST_PAUSE = 1.0


def retry_after(value: bytes | str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header (a number or HTTP date) asks for, or None."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    text = text.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class CrawlBackoffMiddleware:
    """Pauses a download slot crawl-wide on a "slow down" answer (see the module)."""

    def __init__(self, crawler: Crawler, frontier: FrontierConfig) -> None:
        self.crawler = crawler
        self.codes = frozenset(frontier.backoff_codes)
        self.longest = frontier.backoff_max
        settings = crawler.settings
        self.robots = settings.getbool("ROBOTSTXT_OBEY")
        self.agent = str(settings.get("ROBOTSTXT_USER_AGENT") or settings.get("USER_AGENT")
                         or "*")

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        frontier = FrontierConfig.from_settings(crawler.settings)
        if frontier.politeness != "crawl":
            raise NotConfigured  # (a message would be a WARNING in every worker's log)
        return cls(crawler, frontier)

    def process_response(self, request: Request, response: Response,
                         spider: Any = None) -> Response:
        if self.robots and response.status == 200 and \
                urlparse(request.url).path == "/robots.txt":
            self._crawl_delay(request, response)
        if response.status not in self.codes:
            return response
        scheduler = for_crawler(self.crawler)
        queue = getattr(scheduler, "queue", None)
        if scheduler is None or not isinstance(queue, LeasedQueue):
            return response
        slot = queue.policy.key(request)
        asked = retry_after(response.headers.get(b"Retry-After"))
        longest = self.longest

        def pause() -> tuple[float, int]:
            now = queue.redis_time_ms()
            if asked is not None:
                seconds = min(asked, longest)
            else:
                seconds = _strike(queue, slot, now, longest)
            return seconds, queue.backoff(slot, now + round(seconds * 1000))

        def paused(answer: tuple[float, int]) -> None:
            seconds, _ = answer
            self.crawler.stats.inc_value("bloomdupe/backoff")
            logger.info("%s answered %d: its download slot %r is paused for %.1f s for "
                        "every worker (%s)", request, response.status, slot, seconds,
                        "Retry-After" if asked is not None else "no Retry-After: doubling")

        scheduler.jobs.run(pause).addCallbacks(paused, acted_on)
        return response


    def _crawl_delay(self, request: Request, response: Response) -> None:
        """robots.txt's ``Crawl-delay`` for this crawl's user agent, crawl-wide."""
        delay = crawl_delay(response.body, self.agent)
        scheduler = for_crawler(self.crawler)
        queue = getattr(scheduler, "queue", None)
        if not delay or scheduler is None or not isinstance(queue, LeasedQueue):
            return
        slot, seconds = queue.policy.key(request), min(delay, self.longest)

        def said(_: None) -> None:
            logger.info("%s asks for %.1f s between two requests (Crawl-delay): its download "
                        "slot %r keeps that delay for every worker", request, seconds, slot)

        scheduler.jobs.run(lambda: queue.robots_delay(slot, round(seconds * 1000))
                           ).addCallbacks(said, acted_on)


def crawl_delay(body: bytes, agent: str) -> float | None:
    """The ``Crawl-delay`` a robots.txt ``body`` gives ``agent``, or None."""
    try:
        delay = Protego.parse(body.decode("utf-8", errors="replace")).crawl_delay(agent)
    except Exception:  # a robots.txt Protego cannot read: Scrapy's middleware says so
        return None
    return float(delay) if delay else None


def _strike(queue: LeasedQueue, slot: str, now_ms: int, longest: float) -> float:
    """One more "slow down" for ``slot`` without Retry-After: its pause (s), doubled each
    time in a row (forgotten after ``longest`` s without one)."""
    name = keys.slot_name(slot)
    strikes = queue.k[queue.home(name)].strikes
    found = queue.link.call("HGET", strikes, name)
    count = 0
    if found:
        text = found.decode() if isinstance(found, bytes) else str(found)
        before, _, last = text.partition("|")
        if now_ms - int(last or 0) <= longest * 1000:
            count = int(before or 0)
    count += 1
    queue.link.call("HSET", strikes, name, f"{count}|{now_ms}")
    return float(min(longest, FIRST_PAUSE * 2 ** min(count - 1, 30)))
