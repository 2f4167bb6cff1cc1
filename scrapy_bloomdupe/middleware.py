"""Batched dedup: check all requests of one callback in one Redis round trip.

``SPIDER_MIDDLEWARES = {"scrapy_bloomdupe.middleware.BloomDupeBatchMiddleware": 10}``
(the add-on does it). Scrapy asks the dupefilter one request at a time, on its
reactor thread, each a full Redis round trip. This middleware collects the
requests a callback produced (in chunks of ``BLOOMDUPE_BATCH_SIZE``), checks
them all with one pipelined call, drops the duplicates and marks the new ones
with their fingerprint; the dupefilter then lets a marked request through
without a second check. Under this package's scheduler with its leased queue,
the same call also queues the new ones (one script checks and queues, so no
crash leaves a request in the filter and in no queue), and the scheduler only
counts them. The mark holds a fingerprint and is used once, so a
request changed later (a redirect) or scheduled again is checked as usual.

It sits at order 10, closest to the engine, so it sees a request only after
every other spider middleware (offsite, depth, URL length) has had the chance
to drop it: a request dropped after being added would never be crawled.
Output order is kept; ``dont_filter`` requests are not checked.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.exceptions import NotConfigured

from . import dupefilter as dupefilter_module
from . import scheduler as scheduler_module
from .settings import batch_size

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

logger = logging.getLogger(__name__)


class BloomDupeBatchMiddleware:
    def __init__(self, crawler: Crawler, batch_size: int) -> None:
        self.crawler = crawler
        self.batch_size = batch_size

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        size = batch_size(crawler.settings)
        if size is None:
            raise NotConfigured  # no message: Scrapy would log a message as a warning
        return cls(crawler, size)

    def process_spider_output(self, response: Response | None,
                              result: Iterable[Any]) -> Iterator[Any]:
        chunk: list[Any] = []
        for o in result:
            chunk.append(o)
            if len(chunk) >= self.batch_size:
                yield from self._filter(chunk)
                chunk = []
        yield from self._filter(chunk)

    async def process_spider_output_async(self, response: Response | None,
                                          result: AsyncIterator[Any]) -> AsyncIterator[Any]:
        chunk: list[Any] = []
        async for o in result:
            chunk.append(o)
            if len(chunk) >= self.batch_size:
                for kept in self._filter(chunk):
                    yield kept
                chunk = []
        for kept in self._filter(chunk):
            yield kept

    def _filter(self, outputs: list[Any]) -> list[Any]:
        df = dupefilter_module.for_crawler(self.crawler)
        requests = [o for o in outputs if isinstance(o, Request) and not o.dont_filter]
        if df is None or not requests:
            return outputs
        scheduler = scheduler_module.for_crawler(self.crawler)
        outcomes: list[bool | None]
        if scheduler is not None and scheduler.df is df:
            # Checked (and, on the leased queue, queued) in one round trip; a request
            # that cannot be stored is reported there and costs only itself.
            outcomes = scheduler.check_and_queue(requests)
            if scheduler.leased:  # queued: marked so the scheduler does not queue them again
                for request, outcome in zip(requests, outcomes, strict=True):
                    if outcome is False:
                        request.meta[scheduler_module.QUEUED_META] = True
        else:
            outcomes = list(df.requests_seen(requests))
        dropped = {id(r): o for r, o in zip(requests, outcomes, strict=True) if o is not False}
        if not dropped:
            return outputs
        spider = self.crawler.spider
        kept = []
        for o in outputs:
            if id(o) in dropped:
                if dropped[id(o)]:  # a duplicate (None: not storable, reported already)
                    df.log(o, spider)
                self.crawler.signals.send_catch_log(signals.request_dropped, request=o,
                                                    spider=spider)
            else:
                kept.append(o)
        return kept
