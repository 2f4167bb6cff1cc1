"""``WaitForSharedQueue``: keeps a scrapy-redis worker open while its shared queue may refill.

For the scrapy-redis contender of the benchmarks' crawls (``benchmarks/e2e.py``,
``frontier_crawl.py``, :func:`harness.kill_workers.side_by_side`): scrapy-redis closes
an idle worker as soon as the shared queue is empty, though another worker may be about
to queue the links of the page it is fetching; workers started together would leave
within a fraction of a second. This keeps the worker open (``DontCloseSpider``) until it
has found no work for ``SHARED_QUEUE_IDLE_TIMEOUT`` seconds (default 3), looking at the
queue again every ``SHARED_QUEUE_POLL_INTERVAL`` seconds (default 0.25). This package's
own scheduler stays until the crawl is done by itself (``BLOOMDUPE_DONE_GRACE``).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import DontCloseSpider, NotConfigured
from scrapy.utils.asyncio import call_later

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Request
    from scrapy.spiders import Spider
    from typing_extensions import Self

logger = logging.getLogger(__name__)


class WaitForSharedQueue:
    def __init__(self, crawler: Crawler, timeout: float, poll: float) -> None:
        self.crawler = crawler
        self.timeout = timeout
        self.poll = poll
        self.idle_since: float | None = None
        self.wakeup: Any = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        timeout = crawler.settings.getfloat("SHARED_QUEUE_IDLE_TIMEOUT", 3.0)
        if timeout <= 0:  # close as soon as idle, as plain Scrapy does
            raise NotConfigured  # (with a message, Scrapy would log a warning)
        poll = crawler.settings.getfloat("SHARED_QUEUE_POLL_INTERVAL", 0.25)
        ext = cls(crawler, timeout, poll)
        crawler.signals.connect(ext.request_reached_downloader,
                                signal=signals.request_reached_downloader)
        crawler.signals.connect(ext.spider_idle, signal=signals.spider_idle)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    def request_reached_downloader(self, request: Request, spider: Spider) -> None:
        self.idle_since = None  # this worker found work: restart the clock

    def spider_idle(self, spider: Spider) -> None:
        # Scrapy sends spider_idle only when this worker has nothing in flight
        # and its scheduler (the shared queue) has nothing pending.
        now = time.monotonic()
        if self.idle_since is None:
            self.idle_since = now
        if now - self.idle_since >= self.timeout:
            logger.info("No work in the shared queue for %.1fs: closing this worker",
                        now - self.idle_since, extra={"spider": spider})
            return
        if self.wakeup is None:
            self.wakeup = call_later(self.poll, self._wake)
        raise DontCloseSpider

    def _wake(self) -> None:
        # An idle engine asks its scheduler again only on its 5 s heartbeat: ask now
        # (no public call for it; without one the heartbeat does it, more slowly).
        self.wakeup = None
        slot = getattr(self.crawler.engine, "_slot", None)
        nextcall = getattr(slot, "nextcall", None)
        if nextcall is not None:
            nextcall.schedule()

    def spider_closed(self, spider: Spider) -> None:
        if self.wakeup is not None:
            self.wakeup.cancel()
            self.wakeup = None
