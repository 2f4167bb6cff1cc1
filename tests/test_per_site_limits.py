"""frontier/politeness.py's per-site limits, and what a worker says of them (issue 49, item 7):
with ``BLOOMDUPE_POLITENESS = "worker"`` (the default) each worker holds Scrapy's per-site
limits on its own, as one Scrapy process does, so that N workers make up to N times the
requests a site gets. A worker that sees another live one, with such limits set, says so
in one INFO line naming ``BLOOMDUPE_POLITENESS = "crawl"``, once, from its heartbeat's reply
(no round trip of its own). On a real redis-server, with the scheduler's parts (no crawl:
its jobs run inline). The jitter's tests are in test_crawlwide.py and test_slots.py."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import pytest
from helpers import DemoSpider, crawler_for
from scrapy.exceptions import ScrapyDeprecationWarning
from scrapy.settings import Settings

from scrapy_bloomdupe.frontier.politeness import per_site_limits
from scrapy_bloomdupe.scheduler import Scheduler

#: What Scrapy 2.19's ``scrapy startproject`` writes in settings.py.
TEMPLATE = {"CONCURRENT_REQUESTS_PER_DOMAIN": 1, "DOWNLOAD_DELAY": 1}
#: The INFO line's mark.
POINTER = "Set BLOOMDUPE_POLITENESS = 'crawl'"


@pytest.mark.parametrize(("settings", "named"), [
    ({}, []),  # Scrapy's defaults: nothing per site
    (TEMPLATE, ["CONCURRENT_REQUESTS_PER_DOMAIN = 1", "DOWNLOAD_DELAY = 1"]),
    ({"CONCURRENT_REQUESTS_PER_DOMAIN": 8}, []),  # Scrapy's default, set
    ({"CONCURRENT_REQUESTS_PER_DOMAIN": 16}, []),  # above it: not a limit the site sees
    ({"DOWNLOAD_DELAY": 0.25}, ["DOWNLOAD_DELAY = 0.25"]),
    ({"CONCURRENT_REQUESTS_PER_IP": 2}, ["CONCURRENT_REQUESTS_PER_IP = 2"]),
    ({"DOWNLOAD_SLOTS": {"a.test": {"delay": 2}}}, ["DOWNLOAD_SLOTS"]),
])
def test_the_per_site_limits_set(settings: dict[str, Any], named: list[str]) -> None:
    with warnings.catch_warnings():  # Scrapy 2.19 deprecates CONCURRENT_REQUESTS_PER_IP
        warnings.simplefilter("ignore", ScrapyDeprecationWarning)
        assert per_site_limits(Settings(settings)) == named


def test_a_spiders_download_delay_is_a_per_site_limit() -> None:
    spider = DemoSpider()
    spider.download_delay = 2  # type: ignore[attr-defined]
    assert per_site_limits(Settings(), spider) == ["DOWNLOAD_DELAY = 2"]


def opened(redis_url: str, **settings: Any) -> Scheduler:
    crawler = crawler_for(redis_url, **settings)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)  # its first heartbeat, in the opening job
    return scheduler


def pointers(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.INFO and POINTER in r.getMessage()]


def test_a_worker_that_sees_another_says_once_that_it_holds_the_limits_alone(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """The template's limits under "worker" politeness: the first worker, alone, says
    nothing; the second says it at its first heartbeat (the first is live), the first at
    its next one; neither says it again. It was never said: 2 workers doubled both limits
    without a word."""
    caplog.set_level(logging.INFO, logger="scrapy_bloomdupe")
    first = opened(redis_url, **TEMPLATE)
    first.upkeep.tick()
    assert pointers(caplog) == []  # alone in the crawl
    second = opened(redis_url, **TEMPLATE)
    (said,) = pointers(caplog)
    assert said.startswith("1 other worker(s) crawl beside this one")
    assert "each worker holds CONCURRENT_REQUESTS_PER_DOMAIN = 1, DOWNLOAD_DELAY = 1 on its " \
           "own" in said and "up to 2 times as much" in said, said
    first.upkeep.tick()  # its heartbeat's reply counts the second
    assert len(pointers(caplog)) == 2
    first.upkeep.tick()
    second.upkeep.tick()
    assert len(pointers(caplog)) == 2  # once a worker
    first.close("shutdown")
    second.close("shutdown")


@pytest.mark.parametrize("settings", [
    {},  # no per-site limit: nothing each worker holds
    {**TEMPLATE, "BLOOMDUPE_POLITENESS": "crawl"},  # held for the whole crawl
])
def test_nothing_is_said_without_limits_or_with_crawl_wide_ones(
        redis_url: str, caplog: pytest.LogCaptureFixture, settings: dict[str, Any]) -> None:
    caplog.set_level(logging.INFO, logger="scrapy_bloomdupe")
    workers = [opened(redis_url, **settings) for _ in range(2)]
    for worker in workers:
        worker.upkeep.tick()
    assert pointers(caplog) == []
    for worker in workers:
        worker.close("shutdown")
