"""The crawl's health (``scheduling/health.py``): one object a crawler has, owned by the
scheduler (or made by the dupefilter when it runs alone), which the dupefilter reports
to and the scheduler's jobs ask."""

from __future__ import annotations

import logging

import pytest
import redis
from helpers import crawler_for
from scrapy.http import Request
from scrapy.utils.misc import build_from_crawler

from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter
from scrapy_bloomdupe.exceptions import BloomDupeError, FilterLostError
from scrapy_bloomdupe.scheduler import Scheduler
from scrapy_bloomdupe.scheduling.health import (
    CLOSE_REASON,
    HELD,
    LOST_REASON,
    NOT_HELD,
    REFUSED_REASON,
    CrawlHealth,
)
from scrapy_bloomdupe.transport.outage import OutageGuard, RedisUnavailable


def test_the_scheduler_and_its_dupefilter_share_the_crawls_health(redis_url: str) -> None:
    crawler = crawler_for(redis_url)
    scheduler = Scheduler.from_crawler(crawler)
    assert isinstance(scheduler.df, RedisBloomDupeFilter)
    assert scheduler.df.health is scheduler.health is scheduler.jobs.health
    # What the filter meets stops the crawl for the scheduler's jobs too.
    scheduler.df.health.fail(BloomDupeError("refused"))
    assert scheduler.jobs.failed() and scheduler.df.failure == REFUSED_REASON
    scheduler.df.bloom.close()


def test_the_dupefilter_alone_has_a_health_of_its_own(redis_url: str) -> None:
    df = build_from_crawler(RedisBloomDupeFilter, crawler_for(redis_url))
    assert df.health.held == NOT_HELD
    assert df.request_seen(Request("http://a.example/")) is False
    assert not df.health.failed()
    df.bloom.close()


def test_the_dupefilter_explains_its_own_errors(redis_url: str) -> None:
    """A lost filter is the dupefilter's to name (the health knows Redis only)."""
    df = build_from_crawler(RedisBloomDupeFilter, crawler_for(redis_url))
    df.health.fail(FilterLostError("the filter's shard 0 is gone"))
    assert df.failure == LOST_REASON and df.redis_errors == 1
    df.bloom.close()


def test_an_outage_past_its_timeout_stops_or_lets_through(caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    closing = CrawlHealth(OutageGuard(1, "here"))
    closing.held = HELD
    with caplog.at_level(logging.ERROR):
        closing.fail(RedisUnavailable("Redis at here stayed unavailable"), unchecked=3)
    assert closing.failure == CLOSE_REASON and closing.unchecked == 3
    assert HELD in caplog.text  # what the owner of the queue says of its requests
    allowing = CrawlHealth(OutageGuard(1, "here"), on_outage="allow")
    allowing.fail(RedisUnavailable("Redis at here stayed unavailable"), unchecked=1)
    assert not allowing.failed() and allowing.unchecked == 1


def test_a_refusal_is_named_without_a_dupefilter() -> None:
    health = CrawlHealth(OutageGuard(1, "redis://here"))
    health.fail(redis.exceptions.NoPermissionError("NOPERM no permissions"))
    assert health.failure == REFUSED_REASON
