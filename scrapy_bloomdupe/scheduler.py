"""``SCHEDULER = "scrapy_bloomdupe.scheduler.Scheduler"``: scrapy-redis's scheduler, deduplicated
by the Bloom filter.

It keeps everything of scrapy-redis's :class:`scrapy_redis.scheduler.Scheduler`
(the shared request queue and its classes, ``SCHEDULER_PERSIST``,
``SCHEDULER_FLUSH_ON_START``, ``SCHEDULER_IDLE_BEFORE_CLOSE``,
``SCHEDULER_QUEUE_KEY``, ``SCHEDULER_SERIALIZER``) and changes what Scrapy 2.13+
and a shared crawl need: it is built from the crawler, shares the crawler's one
Redis client with the dupefilter, counts stats without the deprecated
``spider=`` argument, and closes the dupefilter so its figures reach the stats.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from scrapy.utils.misc import build_from_crawler, load_object
from scrapy_redis import defaults
from scrapy_redis.scheduler import Scheduler as RedisScheduler

from . import connection
from .dupefilter import RedisBloomDupeFilter
from .transport.diagnose import check
from .transport.outage import RedisUnavailable

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Request
    from scrapy.spiders import Spider
    from typing_extensions import Self

logger = logging.getLogger(__name__)

T = TypeVar("T")

DUPEFILTER_CLASS = "scrapy_bloomdupe.dupefilter.RedisBloomDupeFilter"
QUEUE_CLASS = "scrapy_bloomdupe.frontier.queue.PriorityQueue"


class Scheduler(RedisScheduler):  # type: ignore[misc]
    """A scrapy-redis scheduler whose dupefilter is, by default, the Bloom filter."""

    crawler: Crawler
    df: Any

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        settings = crawler.settings
        idle = settings.getint("SCHEDULER_IDLE_BEFORE_CLOSE")
        kwargs: dict[str, Any] = {
            "persist": settings.getbool("SCHEDULER_PERSIST"),
            "flush_on_start": settings.getbool("SCHEDULER_FLUSH_ON_START"),
            "idle_before_close": idle,
            "queue_key": settings.get("SCHEDULER_QUEUE_KEY") or defaults.SCHEDULER_QUEUE_KEY,
            # scrapy-redis's priority queue, popping in a way a Redis Cluster accepts too.
            "queue_cls": settings.get("SCHEDULER_QUEUE_CLASS") or QUEUE_CLASS,
            "dupefilter_cls": DUPEFILTER_CLASS,
        }
        # Scrapy's default DUPEFILTER_CLASS is in-memory, one per worker: it would
        # let every worker fetch every page. Only a dupefilter the user chose wins.
        if settings.getpriority("DUPEFILTER_CLASS") not in (None, 0):
            kwargs["dupefilter_cls"] = settings["DUPEFILTER_CLASS"]
        if settings.get("SCHEDULER_DUPEFILTER_KEY"):
            kwargs["dupefilter_key"] = settings.get("SCHEDULER_DUPEFILTER_KEY")
        serializer = settings.get("SCHEDULER_SERIALIZER")
        if isinstance(serializer, str):
            serializer = importlib.import_module(serializer)
        if serializer:
            kwargs["serializer"] = serializer
        server = connection.get_client(crawler)
        check(server)  # fail here, before the engine opens anything
        instance = cls(server=server, **kwargs)
        instance.crawler = crawler
        instance.stats = crawler.stats
        return instance

    def open(self, spider: Spider) -> None:
        if self.df is None:
            dupefilter_cls = load_object(self.dupefilter_cls)
            if issubclass(dupefilter_cls, RedisBloomDupeFilter) or not hasattr(
                dupefilter_cls, "from_spider"
            ):
                self.df = build_from_crawler(dupefilter_cls, self.crawler)
            else:
                self.df = dupefilter_cls.from_spider(spider)
        # What scrapy-redis's open() does, without its deprecated spider.log().
        self.spider = spider
        try:
            self.queue = load_object(self.queue_cls)(
                server=self.server,
                spider=spider,
                key=self.queue_key % {"spider": spider.name},
                serializer=self.serializer,
            )
        except TypeError as e:
            raise ValueError(f"Failed to instantiate queue class '{self.queue_cls}': {e}") from e
        if self.flush_on_start:
            self.flush()
        pending = self._guarded(lambda: len(self.queue), 0)
        if pending:
            logger.info("Resuming crawl (%d requests scheduled)", pending,
                        extra={"spider": spider})

    def close(self, reason: str) -> None:
        if self.df is None:  # open() failed; nothing to close
            return
        if not self.persist:
            self._guarded(self.queue.clear, None)
        close_queue = getattr(self.queue, "close", None)
        if close_queue is not None:
            self._guarded(close_queue, None)
        if isinstance(self.df, RedisBloomDupeFilter):
            self.df.close(reason)  # honours SCHEDULER_PERSIST, writes the final stats
        elif not self.persist:
            self.df.clear()  # as scrapy-redis does; its close() would clear even when persisting

    def enqueue_request(self, request: Request) -> bool:
        if not request.dont_filter and self.df.request_seen(request):
            self.df.log(request, self.spider)
            return False
        if self._guarded(lambda: self.queue.push(request) or True, False):
            self.stats.inc_value("scheduler/enqueued/redis")
            return True
        logger.error("Could not queue %s: Redis is unavailable", request)
        return False

    def next_request(self) -> Request | None:
        request: Request | None = self._guarded(
            lambda: self.queue.pop(self.idle_before_close), None)
        if request is not None:
            self.stats.inc_value("scheduler/dequeued/redis")
        return request

    def has_pending_requests(self) -> bool:
        # Unknown while Redis is away: say yes, so the spider is not closed as idle.
        return bool(self._guarded(lambda: len(self.queue) > 0, True))

    def _guarded(self, call: Callable[[], T], fallback: T) -> T:
        """Queue calls wait out Redis outages like the dupefilter's checks."""
        if not isinstance(self.df, RedisBloomDupeFilter):
            return call()
        try:
            return self.df.outage.call(call)
        except RedisUnavailable as e:
            self.df.give_up(e)
            return fallback
