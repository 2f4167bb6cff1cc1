"""Off-site requests dropped before Redis (:mod:`scrapy_bloomdupe.scheduling.offsite`) by
the crawl's own ``OffsiteMiddleware``: in the batch middleware and in the scheduler's
``enqueue_request``, on a real Redis. (A real crawl of a ``scrapy startproject``
project: tests/e2e/test_start_and_offsite.py.)"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from helpers import EngineWith, crawler_for
from scrapy import Request, Spider
from scrapy.core.downloader.middleware import DownloaderMiddlewareManager
from scrapy.core.scheduler import Scheduler as ScrapyScheduler
from scrapy.downloadermiddlewares.offsite import OffsiteMiddleware
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler
from test_middleware import through

from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter
from scrapy_bloomdupe.middleware import BloomDupeBatchMiddleware
from scrapy_bloomdupe.scheduler import Scheduler


class OnSiteSpider(Spider):
    name = "onsite"
    allowed_domains = ["a.example"]


class RootOnly(OffsiteMiddleware):
    """Scrapy's documented example of another policy: no subdomains."""

    def should_follow(self, request: Request, spider: Spider) -> bool:
        return urlparse_cached(request).hostname in spider.allowed_domains


class Engine(EngineWith):
    """The scheduler, and the downloader's middlewares as Scrapy builds them."""

    def __init__(self, scheduler: Any, crawler: Any) -> None:
        super().__init__(scheduler)
        self.downloader = type("Downloader", (), {})()
        self.downloader.middleware = DownloaderMiddlewareManager.from_crawler(crawler)


def open_crawl(crawler: Any, scheduler: Any) -> None:
    crawler.engine = Engine(scheduler, crawler)
    # Its spider_opened (Scrapy 2.16 makes the host regex there), the others' not: no
    # reactor here.
    for mw in crawler.engine.downloader.middleware.middlewares:
        if isinstance(mw, OffsiteMiddleware):
            mw.spider_opened(crawler.spider)


OUTPUT = [
    Request("http://a.example/1"),
    Request("http://other.example/x"),
    {"item": 1},
    Request("http://other.example/y"),
    Request("http://sub.a.example/2"),
    Request("http://other.example/z", dont_filter=True),
    Request("http://third.example/", meta={"allow_offsite": True}),
]


def test_the_batch_middleware_drops_off_site_requests_before_the_filter(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    crawler = crawler_for(redis_url, OnSiteSpider)
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    open_crawl(crawler, ScrapyScheduler(df, crawler=crawler))
    mw = build_from_crawler(BloomDupeBatchMiddleware, crawler)
    with caplog.at_level(logging.DEBUG, logger="scrapy.downloadermiddlewares.offsite"):
        kept = through(mw, list(OUTPUT))
    assert kept == [OUTPUT[0], OUTPUT[2], OUTPUT[4], OUTPUT[5], OUTPUT[6]]
    # Scrapy's own figures and log line (the first request to each domain).
    assert crawler.stats.get_value("offsite/filtered") == 2
    assert crawler.stats.get_value("offsite/domains") == 1
    assert [r.getMessage() for r in caplog.records if "offsite" in r.name] == [
        "Filtered offsite request to 'other.example': <GET http://other.example/x>"]
    # Nothing off-site in the filter: the two on-site ones and the allowed one.
    assert df.bloom.counters.checked == 3
    assert df.bloom.counters.new == 3


def test_a_subclass_policy_of_the_user_is_the_one_asked(redis_url: str) -> None:
    crawler = crawler_for(redis_url, OnSiteSpider, DOWNLOADER_MIDDLEWARES={
        "scrapy.downloadermiddlewares.offsite.OffsiteMiddleware": None,
        f"{__name__}.RootOnly": 50})
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    open_crawl(crawler, ScrapyScheduler(df, crawler=crawler))
    mw = build_from_crawler(BloomDupeBatchMiddleware, crawler)
    kept = through(mw, [Request("http://a.example/1"), Request("http://sub.a.example/2")])
    assert [r.url for r in kept] == ["http://a.example/1"]


def test_with_offsite_disabled_nothing_is_dropped(redis_url: str) -> None:
    crawler = crawler_for(redis_url, OnSiteSpider, DOWNLOADER_MIDDLEWARES={
        "scrapy.downloadermiddlewares.offsite.OffsiteMiddleware": None})
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    open_crawl(crawler, ScrapyScheduler(df, crawler=crawler))
    mw = build_from_crawler(BloomDupeBatchMiddleware, crawler)
    assert through(mw, list(OUTPUT)) == OUTPUT
    assert crawler.stats.get_value("offsite/filtered") is None


def test_enqueue_request_drops_an_off_site_request_before_redis(redis_url: str) -> None:
    crawler = crawler_for(redis_url, OnSiteSpider, SCHEDULER_PERSIST=True)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    open_crawl(crawler, scheduler)
    assert not scheduler.enqueue_request(Request("http://other.example/x"))
    assert scheduler.enqueue_request(Request("http://other.example/y", dont_filter=True))
    assert scheduler.enqueue_request(Request("http://a.example/1"))
    assert crawler.stats.get_value("offsite/filtered") == 1
    assert scheduler.queue.status()[0] == 2
    assert scheduler.df.bloom.counters.checked == 1
    scheduler.close("shutdown")
