"""Scrapy stats and a periodic log line for the Bloom filter.

Enabled by the add-on. Every ``BLOOMDUPE_LOG_INTERVAL`` seconds (0: never) it copies the
dupefilter's counters into the stats, reads the filter's fill and logs one line.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import redis
from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.asyncio import AsyncioLoopingCall, create_looping_call
from scrapy.utils.misc import load_object

from . import connection
from . import dupefilter as dupefilter_module
from . import scheduler as scheduler_module
from .settings import BloomDupeConfig

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.spiders import Spider
    from twisted.internet.task import LoopingCall
    from twisted.python.failure import Failure
    from typing_extensions import Self

    from .bloom.info import FilterInfo
    from .dupefilter import RedisBloomDupeFilter

logger = logging.getLogger(__name__)


class BloomDupeStats:
    def __init__(self, crawler: Crawler, interval: float) -> None:
        self.crawler = crawler
        self.interval = interval
        self.task: AsyncioLoopingCall | LoopingCall | None = None
        self._last_checked = 0
        self._last_time = 0.0

    @classmethod
    @connection.fails_the_crawl
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = BloomDupeConfig.from_settings(crawler.settings)
        if not _is_bloom_dupefilter(crawler.settings.get("DUPEFILTER_CLASS")):
            raise NotConfigured("DUPEFILTER_CLASS is not scrapy_bloomdupe's RedisBloomDupeFilter")
        ext = cls(crawler, config.log_interval)
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    def spider_opened(self, spider: Spider) -> None:
        self._last_time = time.monotonic()
        if self.interval:
            self.task = create_looping_call(self.log)
            self.task.start(self.interval, now=False)

    def log(self) -> None:
        df = scheduler_module.dupefilter_for(self.crawler)
        if df is None:
            return
        sched = scheduler_module.for_crawler(self.crawler)
        jobs = sched.jobs if sched is not None and sched.df is df else df.jobs
        # The fill read in a job of the crawl's runner: Scrapy's reactor never waits.
        jobs.run(df.bloom.info, quiet=True).addCallbacks(
            lambda info: self._log(df, info), self._no_figures)

    def _no_figures(self, failure: Failure) -> Failure | None:
        if not isinstance(failure.value, redis.RedisError):
            return failure
        # Redis away: the dupefilter says so; skip this line.
        logger.debug("No Bloom filter figures this time: %s", failure.getErrorMessage())
        return None

    def _log(self, df: RedisBloomDupeFilter, info: FilterInfo | None = None) -> None:
        if info is not None:
            df.update_stats(info=info)
        counters = df.bloom.counters
        now = time.monotonic()
        rate = (counters.checked - self._last_checked) / max(now - self._last_time, 1e-9) * 60
        self._last_checked, self._last_time = counters.checked, now
        figures = df.figures  # not read back from the stats (see RedisBloomDupeFilter.figures)
        logger.info(
            "Bloom filter: %(checked)d checked (%(rate)d/min), hit rate %(hit).1f%%, "
            "fill %(fill).2f%%, est. %(items)d items of %(capacity)d, est. FPR %(fpr).2g",
            {
                "checked": counters.checked,
                "rate": rate,
                "hit": 100 * figures.get("bloomdupe/hit_rate", 0.0),
                "fill": 100 * figures.get("bloomdupe/fill_ratio", 0.0),
                "items": figures.get("bloomdupe/estimated_items", 0),
                "capacity": df.bloom.sizing.capacity,
                "fpr": figures.get("bloomdupe/estimated_false_positive_rate", 0.0),
            },
            extra={"spider": self.crawler.spider},
        )

    def spider_closed(self, spider: Spider, reason: str) -> None:
        if self.task is not None and self.task.running:
            self.task.stop()


def _is_bloom_dupefilter(path: object) -> bool:
    """Whether ``DUPEFILTER_CLASS`` is :class:`RedisBloomDupeFilter` or a subclass."""
    try:
        cls = load_object(path) if isinstance(path, str) else path
    except (ImportError, AttributeError, NameError, ValueError):
        return "RedisBloomDupeFilter" in str(path)
    return isinstance(cls, type) and issubclass(cls, dupefilter_module.RedisBloomDupeFilter)
