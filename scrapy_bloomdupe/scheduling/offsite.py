"""The spider's ``allowed_domains``, applied before a request reaches Redis.

Scrapy (2.16+) drops off-site requests only in a downloader middleware, ``OffsiteMiddleware``,
after the batch middleware has already put them in the filter and shared queue (each costing a
lease and a round trip, then ignored). :class:`Offsite` asks the very instance Scrapy's downloader
runs (a user's subclass included) first, so Scrapy's handling happens once: ``dont_filter`` and
``allow_offsite`` pass, and it logs and counts ``offsite/*``. With it disabled nothing is filtered.
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
        """Whether ``request`` may go on as Scrapy would let it (which logs and counts)."""
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
        """The downloader's ``OffsiteMiddleware`` (or subclass), if enabled and running."""
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
