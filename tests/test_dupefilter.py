"""The dupefilter, built from a crawler as Scrapy builds it, against a real Redis."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis
from helpers import EngineWith, crawler_for
from scrapy import Request
from scrapy.core.scheduler import Scheduler as ScrapyScheduler
from scrapy.utils.misc import build_from_crawler

from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter
from scrapy_bloomdupe.exceptions import BloomDupeError, ConfigError, FilterMismatchError
from scrapy_bloomdupe.extension import BloomDupeStats
from scrapy_bloomdupe.scheduler import Scheduler, dupefilter_for, for_crawler


def test_dupefilter_from_crawler(redis_url: str) -> None:
    crawler = crawler_for(redis_url)
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    assert df.bloom.key == "demo:bloomdupe"
    assert not df.request_seen(Request("http://a.example/x?b=2&a=1"))
    # Same fingerprint: canonical URL (query order, fragment).
    assert df.request_seen(Request("http://a.example/x?a=1&b=2#frag"))
    assert not df.request_seen(Request("http://a.example/x", method="POST", body=b"1"))
    assert df.request_seen(Request("http://a.example/x", method="POST", body=b"1"))


def test_the_middlewares_reach_the_dupefilter_through_the_scheduler(redis_url: str) -> None:
    """No registry of dupefilters: the scheduler that opened holds it (``df``), and its
    request path (the dupefilter, the queue and their Redis work)."""
    crawler = crawler_for(redis_url)
    assert for_crawler(crawler) is None and dupefilter_for(crawler) is None
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    assert for_crawler(crawler) is scheduler
    assert dupefilter_for(crawler) is scheduler.df
    assert scheduler.path is not None and scheduler.path.df is scheduler.df
    assert scheduler.path.queue is scheduler.queue and scheduler.path.jobs is scheduler.jobs
    scheduler.close("finished")


def test_from_spider_as_scrapy_redis_calls_it(redis_url: str) -> None:
    crawler = crawler_for(redis_url)
    df = RedisBloomDupeFilter.from_spider(crawler.spider)
    assert df.bloom.key == "demo:bloomdupe"


class HostOnlyFingerprinter:
    """Fingerprints by host: two paths on one host are duplicates."""

    @classmethod
    def from_crawler(cls, crawler: Any) -> HostOnlyFingerprinter:
        return cls()

    def fingerprint(self, request: Request) -> bytes:
        return request.url.split("/")[2].encode()


def test_request_fingerprinter_class_is_honoured(redis_url: str) -> None:
    crawler = crawler_for(
        redis_url, REQUEST_FINGERPRINTER_CLASS=f"{__name__}.HostOnlyFingerprinter"
    )
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    assert not df.request_seen(Request("http://a.example/1"))
    assert df.request_seen(Request("http://a.example/2"))


def test_two_workers_share_the_filter(redis_url: str) -> None:
    one = build_from_crawler(RedisBloomDupeFilter, crawler_for(redis_url))
    two = build_from_crawler(RedisBloomDupeFilter, crawler_for(redis_url))
    assert not one.request_seen(Request("http://a.example/"))
    assert two.request_seen(Request("http://a.example/"))


@pytest.mark.parametrize("size", [None, 0], ids=["default", "off"])
def test_local_cache_setting_and_stat(redis_url: str, size: int | None) -> None:
    crawler = crawler_for(redis_url, BLOOMDUPE_LOCAL_CACHE=size)
    one = build_from_crawler(RedisBloomDupeFilter, crawler)
    two = build_from_crawler(RedisBloomDupeFilter, crawler_for(redis_url))
    assert one.bloom.cache.size == (100_000 if size is None else 0)
    assert not one.request_seen(Request("http://a.example/"))
    assert two.request_seen(Request("http://a.example/b")) is False
    for _ in range(3):  # its own repeat: local; another worker's: from Redis
        assert one.request_seen(Request("http://a.example/#top"))
        assert one.request_seen(Request("http://a.example/b"))
    one.update_stats()
    stats = crawler.stats.get_stats()
    assert stats["bloomdupe/duplicates"] == 6
    assert stats["bloomdupe/local_hits"] == (5 if size is None else 0)


def test_log_first_duplicate_only_unless_debug(redis_url: str,
                                              caplog: pytest.LogCaptureFixture) -> None:
    for debug, expected in ((False, 1), (True, 3)):
        crawler = crawler_for(redis_url, DUPEFILTER_DEBUG=debug)
        df = build_from_crawler(RedisBloomDupeFilter, crawler)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="scrapy_bloomdupe"):
            for _ in range(3):
                df.log(Request("http://a.example/"), crawler.spider)
        lines = [r for r in caplog.records if "Filtered duplicate request" in r.getMessage()]
        assert len(lines) == expected
        assert crawler.stats.get_value("dupefilter/filtered") == 3


@pytest.mark.parametrize("persist", [False, True])
def test_close_honours_scheduler_persist(redis_url: str, client: redis.Redis,
                                         persist: bool) -> None:
    crawler = crawler_for(redis_url, SCHEDULER_PERSIST=persist)
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    df.request_seen(Request("http://a.example/"))
    df.close("finished")
    assert bool(client.exists("demo:bloomdupe:meta")) is persist
    stats = crawler.stats.get_stats()
    for name in ("checked", "new", "duplicates", "hit_rate", "redis_errors", "fill_ratio",
                 "estimated_items", "estimated_false_positive_rate", "lock/acquired",
                 "lock/waits", "lock/wait_time", "lock/timeouts", "lock/lost"):
        assert f"bloomdupe/{name}" in stats, name
    assert stats["bloomdupe/estimated_items"] == 1


def test_scrapy_redis_stats_collector_reads_no_rate_back(redis_url: str, client: redis.Redis,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    """``STATS_CLASS = "scrapy_redis.stats.RedisStatsCollector"`` reads every value back
    with ``int()``: the log lines of the dupefilter's close and of the stats extension
    show its own figures, not the stats' (the close raised ValueError on the hit rate,
    before it deleted the filter with SCHEDULER_PERSIST off: the next run fetched
    nothing; the extension's periodic line failed the same way)."""
    crawler = crawler_for(redis_url, STATS_CLASS="scrapy_redis.stats.RedisStatsCollector",
                          DUPEFILTER_CLASS="scrapy_bloomdupe.dupefilter.RedisBloomDupeFilter",
                          SCHEDULER_PRIORITY_QUEUE="scrapy.pqueues.ScrapyPriorityQueue",
                          SCHEDULER_PERSIST=False)
    stats = crawler.stats
    assert type(stats).__name__ == "RedisStatsCollector"
    try:
        scheduler = ScrapyScheduler.from_crawler(crawler)
        scheduler.open(crawler.spider)
        crawler.engine = EngineWith(scheduler)
        for url in ("http://a.example/", "http://a.example/", "http://b.example/"):
            scheduler.enqueue_request(Request(url))
        df = scheduler.df
        assert isinstance(df, RedisBloomDupeFilter)
        with caplog.at_level(logging.INFO):
            build_from_crawler(BloomDupeStats, crawler).log()
            df.close("finished")
        assert "Bloom filter: 3 checked" in caplog.text and "hit rate 33.3%" in caplog.text
        assert "Bloom filter closed: 3 checked, 2 new, 1 duplicates (hit rate 33.3%)" in \
            caplog.text
        assert not client.exists("demo:bloomdupe:meta")  # deleted: SCHEDULER_PERSIST is off
    finally:
        stats.server.close()


@pytest.mark.parametrize(("settings", "reason", "kept"), [
    # The dupefilter alone (Scrapy's own scheduler): kept as a JOBDIR's requests.seen...
    ({}, "finished", True),
    # ... but not after a crawl stopped early without JOBDIR: its queue is gone.
    ({}, "shutdown", False),
    ({"JOBDIR": "crawls/1"}, "shutdown", True),
    ({"SCHEDULER_PERSIST": False}, "finished", False),
    ({"SCHEDULER_PERSIST": "True"}, "shutdown", True),
    # A shared queue: SCHEDULER_PERSIST, off by default as in scrapy-redis.
    ({"SCHEDULER": "scrapy_redis.scheduler.Scheduler"}, "finished", False),
])
def test_what_the_dupefilter_alone_keeps(redis_url: str, client: redis.Redis,
                                         caplog: pytest.LogCaptureFixture,
                                         settings: dict[str, object], reason: str,
                                         kept: bool) -> None:
    crawler = crawler_for(redis_url, **settings)
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    df.request_seen(Request("http://a.example/"))
    with caplog.at_level(logging.WARNING):
        df.close(reason)
    assert bool(client.exists("demo:bloomdupe:meta")) is kept
    assert ("Set JOBDIR to resume" in caplog.text) is (reason != "finished" and not kept)
    client.delete(*client.keys("*"))


def test_warns_when_persisting_into_a_redis_without_persistence(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        build_from_crawler(RedisBloomDupeFilter, crawler_for(redis_url, SCHEDULER_PERSIST=True))
    assert "keeps nothing on disk" in caplog.text


def test_warns_past_capacity(redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    crawler = crawler_for(redis_url, BLOOMDUPE_CAPACITY=100, BLOOMDUPE_GROWTH=False)
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    for i in range(300):
        df.request_seen(Request(f"http://a.example/{i}"))
    with caplog.at_level(logging.WARNING):
        df.update_stats(with_fill=True)
        df.update_stats(with_fill=True)
    assert caplog.text.count("past its capacity of 100") == 1


@pytest.mark.parametrize("growth", [True, False], ids=["growth", "no-growth"])
def test_warns_past_a_window_slice_s_capacity_only_when_slices_cannot_grow(
        redis_url: str, caplog: pytest.LogCaptureFixture, growth: bool) -> None:
    crawler = crawler_for(redis_url, BLOOMDUPE_CAPACITY=800, BLOOMDUPE_WINDOW=3600,
                          BLOOMDUPE_GROWTH=growth, BLOOMDUPE_SHARDS=1)
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    for i in range(400):  # a slice's share is 800 / 8 to 12
        df.request_seen(Request(f"http://a.example/{i}"))
    with caplog.at_level(logging.WARNING):
        df.update_stats(with_fill=True)
        df.update_stats(with_fill=True)
    warned = caplog.text.count("current time slice holds about")
    assert warned == (0 if growth else 1)
    if not growth:
        assert "each time slice then grows" in caplog.text
    df.clear()


def test_bad_setting_fails_at_start(redis_url: str) -> None:
    with pytest.raises(ConfigError, match="BLOOMDUPE_ERROR_RATE=2"):
        build_from_crawler(RedisBloomDupeFilter, crawler_for(redis_url, BLOOMDUPE_ERROR_RATE=2))


def test_mismatch_between_workers_fails_at_start(redis_url: str) -> None:
    build_from_crawler(RedisBloomDupeFilter, crawler_for(redis_url))
    with pytest.raises(FilterMismatchError, match="BLOOMDUPE_CAPACITY"):
        build_from_crawler(RedisBloomDupeFilter,
                           crawler_for(redis_url, BLOOMDUPE_CAPACITY=20_000))
    # Error rates are shown as configured (growth keeps part of the rate back).
    with pytest.raises(FilterMismatchError,
                       match=r"BLOOMDUPE_ERROR_RATE: stored 0\.001, this worker 0\.01"):
        build_from_crawler(RedisBloomDupeFilter,
                           crawler_for(redis_url, BLOOMDUPE_ERROR_RATE=0.01))


def test_unreachable_redis_is_one_clear_error() -> None:
    from scrapy_bloomdupe.testing import free_port

    crawler = crawler_for(f"redis://127.0.0.1:{free_port()}/0",
                          REDIS_PARAMS={"retry": None, "socket_connect_timeout": 1})
    with pytest.raises(BloomDupeError, match=r"Cannot reach Redis at 127\.0\.0\.1"):
        build_from_crawler(RedisBloomDupeFilter, crawler)


def test_works_under_scrapys_own_scheduler(redis_url: str) -> None:
    # The plain priority queue: the default one needs a running engine.
    crawler = crawler_for(redis_url,
                          DUPEFILTER_CLASS="scrapy_bloomdupe.dupefilter.RedisBloomDupeFilter",
                          SCHEDULER_PRIORITY_QUEUE="scrapy.pqueues.ScrapyPriorityQueue")
    scheduler = ScrapyScheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    assert scheduler.enqueue_request(Request("http://a.example/"))
    assert not scheduler.enqueue_request(Request("http://a.example/"))
    assert scheduler.enqueue_request(Request("http://a.example/", dont_filter=True))
    scheduler.close("finished")


@pytest.mark.parametrize("mode", ["scrapy", "scrapy-redis"])
def test_odd_requests_are_deduplicated(redis_url: str, mode: str) -> None:
    df = build_from_crawler(RedisBloomDupeFilter,
                            crawler_for(redis_url, BLOOMDUPE_FINGERPRINT=mode))
    long_url = "http://a.example/" + "x" * 100_000
    odd = [
        Request(long_url),
        Request(long_url + "y"),
        Request("http://a.example/caf\u00e9?q=\u00fc\u00df"),
        Request("http://\u4f8b\u3048.jp/\u30da\u30fc\u30b8"),
        Request("http://a.example/upload", method="POST", body=bytes(range(256)) * 40),
        Request("http://a.example/upload", method="POST", body=bytes(range(256)) * 40 + b"\0"),
    ]
    assert not any(df.request_seen(r) for r in odd)
    assert all(df.request_seen(r.replace()) for r in odd)
    # The same resource spelled another way is the same request.
    assert df.request_seen(Request("http://a.example/caf%C3%A9?q=%C3%BC%C3%9F"))
    assert df.request_seen(Request("http://xn--r8jz45g.jp/%E3%83%9A%E3%83%BC%E3%82%B8"))
    assert df.bloom.fingerprint == mode


def test_fingerprint_mode_must_match_between_workers(redis_url: str) -> None:
    build_from_crawler(RedisBloomDupeFilter, crawler_for(redis_url))
    with pytest.raises(FilterMismatchError, match="BLOOMDUPE_FINGERPRINT"):
        build_from_crawler(RedisBloomDupeFilter,
                           crawler_for(redis_url, BLOOMDUPE_FINGERPRINT="scrapy-redis"))


def test_scrapy_redis_mode_stores_scrapy_redis_fingerprints(redis_url: str) -> None:
    from scrapy_redis.dupefilter import RFPDupeFilter

    df = build_from_crawler(RedisBloomDupeFilter,
                            crawler_for(redis_url, BLOOMDUPE_FINGERPRINT="scrapy-redis"))
    request = Request("http://a.example/page?b=1&a=2")
    member = RFPDupeFilter.request_fingerprint(None, request).encode()
    assert not df.bloom.contains(member)
    df.request_seen(request)
    assert df.bloom.contains(member)


def test_stats_fill_and_false_positive_rate_on_both_engines(engine: str,
                                                             engine_url: str) -> None:
    """The stats extension's figures (fill, items, false-positive rate, memory) come from
    the filter's info: BITCOUNT on the Lua engine, BF.INFO's item count on RedisBloom."""
    crawler = crawler_for(engine_url, BLOOMDUPE_CAPACITY=1000, BLOOMDUPE_LOCAL_CACHE=0)
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    assert df.bloom.engine_name == engine
    seen = [df.request_seen(Request(f"http://a.example/{i}")) for i in range(500)]
    # False positives of a 1,000-item filter half full: measured over 25,000 runs of 500
    # new items, one in 33 runs on RedisBloom (its probes go modulo a composite size)
    # and in 6 on Lua (its ideal rate: 2.2e-4 a run), never two. Up to 2.
    assert seen.count(True) <= 2, seen.count(True)
    assert df.request_seen(Request("http://a.example/7"))
    df.update_stats(with_fill=True)
    stats = crawler.stats.get_stats()
    assert stats["bloomdupe/estimated_items"] == pytest.approx(500, rel=0.05)
    assert 0.2 < stats["bloomdupe/fill_ratio"] < 0.5
    assert 1e-6 < stats["bloomdupe/estimated_false_positive_rate"] < 0.001
    assert stats["bloomdupe/memory_bytes"] > 1000 * 1.7
    df.close("finished")
