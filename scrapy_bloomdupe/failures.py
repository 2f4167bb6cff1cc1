"""Requests that fail for good are recorded in Redis, not lost.

``DOWNLOADER_MIDDLEWARES = {"scrapy_bloomdupe.failures.FailedRequestMiddleware": 50}`` (the
add-on does it). At order 50 it sees a download's outcome after every built-in downloader
middleware, RetryMiddleware (550) and RedirectMiddleware (600) included, so an exception that
reaches it has used up its retries and a response is final. It records
(:mod:`scrapy_bloomdupe.frontier.failed`):

* an exception, unless an ``IgnoreRequest`` (dropped on purpose: robots.txt, offsite);
* a response that Scrapy's HttpErrorMiddleware, when enabled, will drop (its rules decide).

Only a request this package's scheduler handed out (it carries its lease) is recorded; others
(robots.txt, a media pipeline, ``engine.download``) are their owner's. Recording never raises
into Scrapy's download chain (one ERROR line instead), and happens before the lease is acked,
so a worker killed in between loses nothing. Counted as ``bloomdupe/failed``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import IgnoreRequest
from scrapy.spidermiddlewares.httperror import HttpError, HttpErrorMiddleware
from scrapy.utils.conf import build_component_list
from scrapy.utils.misc import load_object

from . import scheduler as scheduler_module
from .scheduling.requestpath import LEASE_META

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

logger = logging.getLogger(__name__)


class FailedRequestMiddleware:
    def __init__(self, crawler: Crawler, http_errors: HttpErrorMiddleware | None) -> None:
        self.crawler = crawler
        #: Scrapy's own judge of which responses are dropped (None: it is disabled).
        self.http_errors = http_errors

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        enabled = [load_object(c) for c in
                   build_component_list(crawler.settings.getwithbase("SPIDER_MIDDLEWARES"))]
        http_errors = None
        if any(isinstance(c, type) and issubclass(c, HttpErrorMiddleware) for c in enabled):
            http_errors = HttpErrorMiddleware.from_crawler(crawler)
        return cls(crawler, http_errors)

    def process_response(self, request: Request, response: Response,
                         spider: Spider | None = None) -> Response:
        if self.http_errors is not None and not 200 <= response.status < 300:
            if response.request is None:
                response.request = request  # as the engine sets it next
            try:
                self.http_errors.process_spider_input(response)
            except HttpError:
                self._record(request, f"HTTP {response.status}")
        return response

    def process_exception(self, request: Request, exception: Exception,
                          spider: Spider | None = None) -> Any:
        if not isinstance(exception, IgnoreRequest):
            self._record(request, f"{type(exception).__name__}: {exception}".rstrip(": "))
        # Recorded or dropped on purpose: done (an errback's output skips the spider middlewares).
        scheduler = scheduler_module.for_crawler(self.crawler)
        if scheduler is not None:
            scheduler.done(request)
        return None

    def _record(self, request: Request, reason: str) -> None:
        # No shared queue under another scheduler; a request without a lease is not the crawl's.
        scheduler = scheduler_module.for_crawler(self.crawler)
        if scheduler is None or LEASE_META not in request.meta:
            return
        try:
            scheduler.record_failed(request, reason)
        except Exception as e:  # never into the download chain: one line, not a traceback
            logger.error("Could not record %s, which failed for good (%s), in Redis: %s: %s",
                         request, reason, type(e).__name__, e,
                         extra={"spider": self.crawler.spider})
