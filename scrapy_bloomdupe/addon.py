"""One-line activation: ``ADDONS = {"scrapy_bloomdupe.addon.BloomDupeAddon": 100}``."""

from __future__ import annotations

from typing import TYPE_CHECKING

# Imported for its side effect too: a crawl that cannot start says so in one line.
from . import connection
from .exceptions import BloomDupeError
from .settings import use_scheduler

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings
    from typing_extensions import Self


class BloomDupeAddon:
    """Sets the scheduler, dupefilter, batch and failed-request middlewares, the stats extension
    and ``WorkerMetrics``, at "addon" priority so a project's ``settings.py`` still wins. With
    ``BLOOMDUPE_SCHEDULER = False`` Scrapy's scheduler is kept (one machine, shared filter)."""

    def __init__(self, crawler: Crawler | None = None) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def update_settings(self, settings: BaseSettings) -> None:
        settings.set("DUPEFILTER_CLASS", "scrapy_bloomdupe.dupefilter.RedisBloomDupeFilter",
                     "addon")
        try:
            scheduler = use_scheduler(settings)
        except BloomDupeError as e:
            connection.mark_failed(self.crawler, e)
            raise
        if scheduler:
            settings.set("SCHEDULER", "scrapy_bloomdupe.scheduler.Scheduler", "addon")
        settings["EXTENSIONS"]["scrapy_bloomdupe.extension.BloomDupeStats"] = 500
        settings["EXTENSIONS"]["scrapy_bloomdupe.workermetrics.WorkerMetrics"] = 510
        settings["SPIDER_MIDDLEWARES"]["scrapy_bloomdupe.middleware.BloomDupeBatchMiddleware"] = 10
        settings["DOWNLOADER_MIDDLEWARES"]["scrapy_bloomdupe.failures.FailedRequestMiddleware"] = 50
        # Not configured unless BLOOMDUPE_POLITENESS = "crawl"; before RetryMiddleware (550).
        settings["DOWNLOADER_MIDDLEWARES"]["scrapy_bloomdupe.backoff.CrawlBackoffMiddleware"] = 560
