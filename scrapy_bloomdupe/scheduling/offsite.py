"""The spider's ``allowed_domains``, applied before a request reaches Redis.

In the Scrapy versions this package supports (2.16 and later) off-site requests are
dropped by a downloader middleware only,
:class:`scrapy.downloadermiddlewares.offsite.OffsiteMiddleware`, which the engine
asks when a request is scheduled (``request_scheduled``) and again before its
download. A callback's output that the batch middleware queues went to Redis before
either: each off-site link took a place in the Bloom filter and the shared queue, a
lease and a round trip, and was then ignored by the worker that popped it (the
Debian Python docs: 765 filter items for 528 pages, 114 ``IgnoreRequest`` a
worker). :class:`Offsite` asks the crawl's own ``OffsiteMiddleware`` first, the very
instance Scrapy's downloader runs (a subclass of the user's with its own
``should_follow`` included), so everything Scrapy does for an off-site request is
done, once: ``dont_filter`` and ``allow_offsite`` pass, the first request to each
domain is logged (DEBUG, "Filtered offsite request to ..."), and ``offsite/domains``
and ``offsite/filtered`` are counted. With that middleware disabled
(``DOWNLOADER_MIDDLEWARES``), nothing is filtered, as in Scrapy.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from scrapy.downloadermiddlewares.offsite import OffsiteMiddleware
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Request

if TYPE_CHECKING:
    from scrapy.crawler import Crawler


class Offsite:
    """Scrapy's ``OffsiteMiddleware`` of ``crawler``'s downloader, asked before Redis."""

    def __init__(self, crawler: Crawler | None) -> None:
        self._crawler = crawler
        #: The engine the middleware was found in (looked up again for another engine).
        self._engine: Any = None
        self._middleware: OffsiteMiddleware | None = None

    def allows(self, request: Request) -> bool:
        """Whether ``request`` may go on: not off-site, or let through as Scrapy lets it.
        An off-site one is logged and counted by Scrapy's middleware itself."""
        middleware = self.middleware()
        if middleware is None:
            return True
        try:
            answer = middleware.process_request(request)
        except IgnoreRequest:
            return False
        if inspect.isawaitable(answer):  # a subclass's own async process_request
            close = getattr(answer, "close", None)
            if close is not None:
                close()
        return True

    def kept(self, outputs: list[Any]) -> list[Any]:
        """``outputs`` (a callback's, items and requests) less the off-site requests."""
        if self.middleware() is None:
            return outputs
        return [o for o in outputs if not isinstance(o, Request) or self.allows(o)]

    def middleware(self) -> OffsiteMiddleware | None:
        """The crawl's downloader's ``OffsiteMiddleware`` (or a subclass), if enabled
        and the engine runs."""
        engine = _engine_of(self._crawler)
        if engine is not self._engine:
            self._engine = engine
            self._middleware = None
            manager = getattr(getattr(engine, "downloader", None), "middleware", None)
            for middleware in getattr(manager, "middlewares", ()):
                if isinstance(middleware, OffsiteMiddleware):
                    self._middleware = middleware
                    break
        return self._middleware


def _engine_of(crawler: Crawler | None) -> Any:
    if crawler is None:
        return None
    try:
        return crawler.engine
    except RuntimeError:  # Scrapy's answer when the crawler is not crawling
        return None
