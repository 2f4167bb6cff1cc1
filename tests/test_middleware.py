from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from helpers import DemoSpider, EngineWith, crawler_for
from scrapy import Request, Spider, signals
from scrapy.core.scheduler import Scheduler as ScrapyScheduler
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from scrapy_bloomdupe.dupefilter import CHECKED_META, RedisBloomDupeFilter
from scrapy_bloomdupe.exceptions import ConfigError
from scrapy_bloomdupe.middleware import BloomDupeBatchMiddleware


def through(mw: BloomDupeBatchMiddleware, out: list[Any]) -> list[Any]:
    """``out`` through the middleware, as Scrapy (2.16 and later) hands a callback's
    output over: an async iterable, a sync callback's too."""
    async def output() -> AsyncIterator[Any]:
        for o in out:
            yield o

    async def collect() -> list[Any]:
        return [o async for o in mw.process_spider_output(None, output())]

    return asyncio.run(collect())


@pytest.fixture
def parts(redis_url: str) -> tuple[Any, RedisBloomDupeFilter, BloomDupeBatchMiddleware]:
    crawler = crawler_for(redis_url, BLOOMDUPE_BATCH_SIZE=3)
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    # Under Scrapy's own scheduler, which holds the dupefilter.
    crawler.engine = EngineWith(ScrapyScheduler(df, crawler=crawler))
    mw = build_from_crawler(BloomDupeBatchMiddleware, crawler)
    return crawler, df, mw


def test_drops_duplicates_keeps_order_and_items(parts: Any) -> None:
    crawler, df, mw = parts
    dropped: list[Request] = []

    def on_dropped(request: Request, spider: Spider) -> None:
        dropped.append(request)

    crawler.signals.connect(on_dropped, signal=signals.request_dropped)
    df.request_seen(Request("http://a.example/old"))
    out = [
        {"item": 1},
        Request("http://a.example/1"),
        Request("http://a.example/old"),
        Request("http://a.example/1#again"),
        Request("http://a.example/old", dont_filter=True),
        {"item": 2},
        Request("http://a.example/2"),
    ]
    kept = through(mw, out)
    assert kept == [out[0], out[1], out[4], out[5], out[6]]
    assert [r.url for r in dropped] == ["http://a.example/old", "http://a.example/1#again"]
    assert crawler.stats.get_value("dupefilter/filtered") == 2
    # Counted once: 1 earlier check plus 4 in the batches (dont_filter is not checked).
    assert df.bloom.counters.checked == 5
    assert df.bloom.counters.new == 3


def test_marked_requests_pass_the_dupefilter_once_without_a_second_check(parts: Any) -> None:
    _, df, mw = parts
    (request,) = through(mw, [Request("http://a.example/x")])
    assert CHECKED_META in request.meta
    checked = df.bloom.counters.checked
    assert not df.request_seen(request)
    assert df.bloom.counters.checked == checked
    assert CHECKED_META not in request.meta
    # The mark is used up: scheduling the same request again finds it seen.
    assert df.request_seen(request)


def test_a_changed_request_is_checked_again(parts: Any) -> None:
    _, df, mw = parts
    df.request_seen(Request("http://a.example/target"))
    (request,) = through(mw, [Request("http://a.example/from")])
    # A redirect copies meta, mark included, but the URL changed.
    redirected = request.replace(url="http://a.example/target")
    assert df.request_seen(redirected)


def test_async_callbacks(parts: Any) -> None:
    _, _, mw = parts

    async def output() -> AsyncIterator[Any]:
        for url in ["http://a.example/a", "http://a.example/a", "http://a.example/b"]:
            yield Request(url)

    async def collect() -> list[Any]:
        return [o async for o in mw.process_spider_output(None, output())]

    kept = asyncio.run(collect())
    assert [r.url for r in kept] == ["http://a.example/a", "http://a.example/b"]


def test_batching_turned_off_checks_one_request_at_a_time(redis_url: str) -> None:
    """BLOOMDUPE_BATCH = False keeps the middleware (it queues the output and acks the
    page under the leased queue), with chunks of one request, as scrapy-redis checks."""
    crawler = get_crawler(DemoSpider, {"BLOOMDUPE_BATCH": False})
    assert build_from_crawler(BloomDupeBatchMiddleware, crawler).batch_size == 1


def test_without_the_bloom_dupefilter_it_passes_everything(redis_url: str) -> None:
    crawler = get_crawler(DemoSpider, {})
    mw = build_from_crawler(BloomDupeBatchMiddleware, crawler)
    out = [Request("http://a.example/"), Request("http://a.example/")]
    assert through(mw, out) == out


@pytest.mark.parametrize(("setting", "value"), [("BLOOMDUPE_BATCH", "maybe"),
                                                ("BLOOMDUPE_BATCH_SIZE", 0)])
def test_bad_settings_are_config_errors(setting: str, value: object) -> None:
    crawler = get_crawler(DemoSpider, {setting: value})
    with pytest.raises(ConfigError) as info:
        build_from_crawler(BloomDupeBatchMiddleware, crawler)
    assert info.value.setting == setting


@pytest.mark.parametrize(("order", "warned"), [(10, False), (950, True)])
def test_an_order_above_other_spider_middlewares_is_warned(
        order: int, warned: bool, caplog: pytest.LogCaptureFixture) -> None:
    """At 950 the middleware queues a callback's requests before DepthMiddleware (900)
    sees them: DEPTH_LIMIT does not hold (a real crawl with DEPTH_LIMIT = 2 fetched all
    200 pages, 81 at order 10). One WARNING names the middlewares below it."""
    crawler = get_crawler(DemoSpider, {"SPIDER_MIDDLEWARES": {
        "scrapy_bloomdupe.middleware.BloomDupeBatchMiddleware": order}})
    with caplog.at_level("WARNING", logger="scrapy_bloomdupe.middleware"):
        build_from_crawler(BloomDupeBatchMiddleware, crawler)
    lines = [r.getMessage() for r in caplog.records if r.name == "scrapy_bloomdupe.middleware"]
    if not warned:
        assert lines == []
        return
    assert len(lines) == 1
    assert "scrapy.spidermiddlewares.depth.DepthMiddleware" in lines[0]
    assert "Give BloomDupeBatchMiddleware the lowest order (10" in lines[0]
