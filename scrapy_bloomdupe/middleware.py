"""Batched dedup: check (and queue) all requests of one callback in one Redis round trip, and
tell the scheduler when a page's output is queued.

``SPIDER_MIDDLEWARES = {"scrapy_bloomdupe.middleware.BloomDupeBatchMiddleware": 10}`` (the
add-on does it; the leased queue needs it). Rather than a round trip a request, it checks a
callback's requests in chunks of ``BLOOMDUPE_BATCH_SIZE`` (one at a time with
``BLOOMDUPE_BATCH = False``) with one pipelined call and drops the duplicates. Under this
package's scheduler with its leased queue the same script queues the new ones (no crash leaves
a request in the filter and in no queue), ``dont_filter`` ones past the filter; once the whole
output is queued (or the callback raised), the page's lease is acked (:meth:`Scheduler.done`),
so no crash falls between a page's ack and the queueing of its links. With a scrapy-redis queue
class the scheduler checks, then pushes
(:meth:`~.scheduling.requestpath.RequestPath.check_and_push`); under another scheduler the new
requests are marked with their fingerprint, and the dupefilter lets them through once unchecked.

At order 10, closest to the engine, it sees a request only after every other spider middleware
(depth, URL length) could drop it: a request dropped after being added would never be crawled.
Off-site requests (Scrapy drops them only when scheduled) are dropped here first
(:mod:`.scheduling.offsite`). Output order is kept.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.http import Response
from scrapy.utils.conf import build_component_list
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.misc import load_object
from scrapy.utils.python import global_object_name

from . import connection
from . import scheduler as scheduler_module
from .scheduling.jobs import Stopped
from .scheduling.offsite import Offsite
from .settings import batch_size

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self

    from .dupefilter import RedisBloomDupeFilter

logger = logging.getLogger(__name__)


def _warn_if_not_last(crawler: Crawler) -> None:
    """One WARNING when a spider middleware sees a callback's output after this one: what it
    drops or changes (``DEPTH_LIMIT``, Referer, a long URL) is crawled as the callback made it."""
    order = build_component_list(crawler.settings.getwithbase("SPIDER_MIDDLEWARES"))
    ours = [i for i, c in enumerate(order) if _is_this(c)]
    if not ours or ours[0] == 0:
        return
    after = [c if isinstance(c, str) else global_object_name(c) for c in order[:ours[0]]]
    logger.warning(
        "SPIDER_MIDDLEWARES has %s below BloomDupeBatchMiddleware's order: they see a "
        "callback's requests only after this one queued them, so what they drop or change "
        "(DEPTH_LIMIT, offsite, URL length, Referer) is crawled as the callback made it. "
        "Give BloomDupeBatchMiddleware the lowest order (10, as the add-on does)",
        ", ".join(after))


def _is_this(component: Any) -> bool:
    cls = load_object(component) if isinstance(component, str) else component
    return isinstance(cls, type) and issubclass(cls, BloomDupeBatchMiddleware)


class BloomDupeBatchMiddleware:
    def __init__(self, crawler: Crawler, batch_size: int) -> None:
        self.crawler = crawler
        self.batch_size = batch_size
        #: The spider's ``allowed_domains``, applied before Redis (:mod:`.scheduling.offsite`).
        self.offsite = Offsite(crawler)
        crawler.signals.connect(self._spider_error, signal=signals.spider_error)

    @classmethod
    @connection.fails_the_crawl
    def from_crawler(cls, crawler: Crawler) -> Self:
        _warn_if_not_last(crawler)
        # BLOOMDUPE_BATCH off: one request a check, still queued here and the page acked.
        return cls(crawler, batch_size(crawler.settings) or 1)

    async def process_spider_output(self, response: Response | None,
                                    result: AsyncIterator[Any]) -> AsyncIterator[Any]:
        # Scrapy 2.16+ hands every callback's output here as an async iterable: each chunk's
        # round trip is one of the scheduler's Redis jobs, awaited while the reactor goes on.
        chunk: list[Any] = []
        try:
            async for o in result:
                chunk.append(o)
                if len(chunk) >= self.batch_size:
                    for kept in await self._filter_async(chunk):
                        yield kept
                    chunk = []
        except Exception:
            # What the callback yielded before it raised.
            for kept in await self._filter_async(chunk):
                yield kept
            raise
        for kept in await self._filter_async(chunk):
            yield kept
        self._done(response)

    async def _filter_async(self, outputs: list[Any]) -> list[Any]:
        # Off-site requests reach neither filter nor queue (Scrapy drops them only when scheduled).
        outputs = self.offsite.kept(outputs)
        scheduler = scheduler_module.for_crawler(self.crawler)
        df = scheduler_module.dupefilter_for(self.crawler)
        path = scheduler.path if scheduler is not None else None
        if path is None or df is None or path.df is not df:
            return await self._filter(outputs, df)
        requests = [o for o in outputs if isinstance(o, Request)]
        if not requests:
            return outputs
        outcomes = await maybe_deferred_to_future(path.queue_output(requests))
        return self._drop(outputs, requests, outcomes, df, leased=True)

    def _done(self, response: Response | None) -> None:
        """Every request of the page's output is queued: its own lease can go."""
        scheduler = scheduler_module.for_crawler(self.crawler)
        if scheduler is not None and response is not None and response.request is not None:
            scheduler.done(response.request)

    def _spider_error(self, failure: Any, response: Any, spider: Any = None) -> None:
        # A callback that raised: what it yielded before is queued (above); it is done.
        if isinstance(response, Response):
            self._done(response)

    async def _filter(self, outputs: list[Any], df: RedisBloomDupeFilter | None
                      ) -> list[Any]:
        """Under another scheduler: requests checked by a job on the dupefilter's runner (marked
        for its own check), ``dont_filter`` ones left alone; none passed on after a stop."""
        requests = [o for o in outputs if isinstance(o, Request) and not o.dont_filter]
        if df is None or not requests:
            return outputs
        outcomes: list[bool | None] = [None] * len(requests)
        try:
            seen: list[bool] = await maybe_deferred_to_future(df.check_later(requests))
            outcomes = list(seen)
        except Stopped:
            pass  # the crawl stops: not passed on
        return self._drop(outputs, requests, outcomes, df, leased=False)

    def _drop(self, outputs: list[Any], requests: list[Request],
              outcomes: Sequence[bool | None], df: RedisBloomDupeFilter, *,
              leased: bool) -> list[Any]:
        """``outputs`` less duplicates (logged, as Scrapy's dupefilter does) and requests not
        queued (None); under the leased queue the queued ones are marked so as not to requeue."""
        if leased:
            for request, outcome in zip(requests, outcomes, strict=True):
                if outcome is False:
                    request.meta[scheduler_module.QUEUED_META] = True
        dropped = {id(r): o for r, o in zip(requests, outcomes, strict=True) if o is not False}
        if not dropped:
            return outputs
        spider = self.crawler.spider
        kept = []
        for o in outputs:
            if id(o) in dropped:
                if dropped[id(o)]:  # a duplicate (None: not queued, said why already)
                    df.log(o, spider)
                self.crawler.signals.send_catch_log(signals.request_dropped, request=o,
                                                    spider=spider)
            else:
                kept.append(o)
        return kept
