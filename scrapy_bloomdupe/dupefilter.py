"""``DUPEFILTER_CLASS = "scrapy_bloomdupe.dupefilter.RedisBloomDupeFilter"``.

A thin Scrapy component: it turns requests into fingerprints with the
crawler's own ``request_fingerprinter`` (so ``REQUEST_FINGERPRINTER_CLASS`` is
honoured) and asks the shared :class:`~scrapy_bloomdupe.filter.BloomFilter`.
Works under Scrapy's own scheduler (one machine) and under
:class:`scrapy_bloomdupe.scheduler.Scheduler` (many workers).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy.dupefilters import BaseDupeFilter
from scrapy.utils.request import referer_str

from . import connection
from .filter import BloomFilter
from .settings import BloomDupeConfig

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Request
    from scrapy.spiders import Spider
    from scrapy.statscollectors import StatsCollector
    from scrapy.utils.request import RequestFingerprinterProtocol
    from typing_extensions import Self

logger = logging.getLogger(__name__)


class RedisBloomDupeFilter(BaseDupeFilter):
    """Duplicate filter backed by a sharded Bloom filter in Redis."""

    def __init__(
        self,
        bloom: BloomFilter,
        fingerprinter: RequestFingerprinterProtocol,
        *,
        debug: bool = False,
        persist: bool = False,
        stats: StatsCollector | None = None,
    ) -> None:
        self.bloom = bloom
        self.fingerprinter = fingerprinter
        self.debug = debug
        self.persist = persist
        self.stats = stats
        self.logdupes = True

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = BloomDupeConfig.from_settings(crawler.settings)
        client = connection.get_client(crawler)
        connection.check(client)
        assert crawler.spider is not None, "the dupefilter is built once the spider exists"
        bloom = BloomFilter.open(
            client,
            config.key_for(crawler.spider.name),
            config.plan,
            use_lock=config.lock,
            lock_ttl=config.lock_ttl,
            lock_wait=config.lock_wait,
        )
        return cls(
            bloom,
            crawler.request_fingerprinter,
            debug=crawler.settings.getbool("DUPEFILTER_DEBUG"),
            persist=crawler.settings.getbool("SCHEDULER_PERSIST"),
            stats=crawler.stats,
        )

    @classmethod
    def from_spider(cls, spider: Spider) -> Self:
        """What scrapy-redis's scheduler calls."""
        return cls.from_crawler(spider.crawler)

    def request_seen(self, request: Request) -> bool:
        return not self.bloom.add(self.fingerprinter.fingerprint(request))

    def log(self, request: Request, spider: Spider) -> None:
        if self.debug:
            msg = "Filtered duplicate request: %(request)s (referer: %(referer)s)"
            args = {"request": request, "referer": referer_str(request)}
            logger.debug(msg, args, extra={"spider": spider})
        elif self.logdupes:
            msg = (
                "Filtered duplicate request: %(request)s"
                " - no more duplicates will be shown"
                " (see DUPEFILTER_DEBUG to show all duplicates)"
            )
            logger.debug(msg, {"request": request}, extra={"spider": spider})
            self.logdupes = False
        if self.stats is not None:
            self.stats.inc_value("dupefilter/filtered")

    def clear(self) -> None:
        """Delete the filter in Redis (every worker's)."""
        self.bloom.clear()

    def close(self, reason: str = "") -> None:
        if not self.persist:
            self.clear()
