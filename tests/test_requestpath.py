"""The request path's start requests (``BLOOMDUPE_START_ONCE``) and its off-site check,
through the scheduler's ``enqueue_request`` as Scrapy calls it, on a real Redis: a
scheduler is a worker, two on one Redis are two workers of one crawl."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import crawler_for
from scrapy import Request

from scrapy_bloomdupe.exceptions import ConfigError
from scrapy_bloomdupe.scheduler import Scheduler
from scrapy_bloomdupe.settings import FrontierConfig

#: Scrapy's mark of a start request (its StartSpiderMiddleware, Scrapy 2.13 and later).
IS_START_META = "is_start_request"
HOME = "http://a.example/"


def worker(redis_url: str, **settings: Any) -> Scheduler:
    crawler = crawler_for(redis_url, SCHEDULER_PERSIST=True, **settings)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    return scheduler


def start_request(url: str = HOME) -> Request:
    """What Scrapy's default ``start()`` yields for a start URL, once its
    ``StartSpiderMiddleware`` has marked it."""
    return Request(url, dont_filter=True, meta={IS_START_META: True})


def test_a_start_request_is_queued_by_one_worker_of_the_crawl(redis_url: str) -> None:
    first, second = worker(redis_url), worker(redis_url)
    assert first.enqueue_request(start_request())
    # Every other worker (started with it, or joining later) finds it in the crawl.
    assert not second.enqueue_request(start_request())
    assert not first.enqueue_request(start_request())
    assert second.crawler.stats.get_value("dupefilter/filtered") == 1
    # Once queued, the filter knows it: a link back to it is a duplicate.
    assert not second.enqueue_request(Request(HOME))
    assert first.queue.status()[0] == 1
    first.close("shutdown")
    second.close("shutdown")


def test_a_resumed_crawl_does_not_queue_its_start_requests_again(redis_url: str) -> None:
    before = worker(redis_url)
    assert before.enqueue_request(start_request())
    request = before.next_request()
    assert request is not None and request.meta[IS_START_META]
    before.close("shutdown")  # SCHEDULER_PERSIST: the filter stays
    resumed = worker(redis_url)
    assert not resumed.enqueue_request(start_request())
    resumed.close("shutdown")


def test_a_copy_of_a_start_request_goes_past_the_filter_as_scrapy_sends_it(
        redis_url: str) -> None:
    """A retry (``request.copy()``) or a redirect of a start request keeps its meta, the
    mark of its check included: it is queued as its ``dont_filter`` says, never taken
    for the start request seen again."""
    scheduler = worker(redis_url)
    assert scheduler.enqueue_request(start_request())
    taken = scheduler.next_request()
    assert taken is not None
    assert scheduler.enqueue_request(taken.copy())  # RetryMiddleware's copy
    assert scheduler.enqueue_request(taken.replace(url=HOME + "moved"))  # a redirect
    assert scheduler.queue.status()[0] == 2
    scheduler.close("shutdown")


def test_start_once_off_queues_each_workers_start_requests_as_scrapy_does(
        redis_url: str) -> None:
    first = worker(redis_url, BLOOMDUPE_START_ONCE=False)
    second = worker(redis_url, BLOOMDUPE_START_ONCE=False)
    assert first.enqueue_request(start_request())
    assert second.enqueue_request(start_request())
    assert first.queue.status()[0] == 2
    # Past the filter: a link to it is new (Scrapy's own behaviour with dont_filter).
    assert first.enqueue_request(Request(HOME))
    first.close("shutdown")
    second.close("shutdown")


def test_only_marked_dont_filter_start_requests_change(redis_url: str) -> None:
    """A start request without ``dont_filter`` was checked already; a ``dont_filter``
    request that is not a start request (a user's own, a retry) is queued past the
    filter as before."""
    scheduler = worker(redis_url)
    assert scheduler.enqueue_request(Request(HOME + "a", dont_filter=True))
    assert scheduler.enqueue_request(Request(HOME + "a", dont_filter=True))
    assert scheduler.enqueue_request(Request(HOME + "b", meta={IS_START_META: True}))
    assert not scheduler.enqueue_request(Request(HOME + "b", meta={IS_START_META: True}))
    # A start request its spider marked otherwise goes as Scrapy sends it (docs/usage.md).
    for _ in range(2):
        assert scheduler.enqueue_request(
            Request(HOME + "c", dont_filter=True, meta={IS_START_META: False}))
    scheduler.close("shutdown")


@pytest.mark.parametrize(("value", "expected"), [(None, True), (True, True), ("False", False),
                                                 (0, False)])
def test_start_once_setting(value: object, expected: bool) -> None:
    crawler = crawler_for("redis://127.0.0.1:1", BLOOMDUPE_START_ONCE=value)
    assert FrontierConfig.from_settings(crawler.settings).start_once is expected


def test_a_bad_start_once_value_names_the_setting() -> None:
    crawler = crawler_for("redis://127.0.0.1:1", BLOOMDUPE_START_ONCE="maybe")
    with pytest.raises(ConfigError, match="BLOOMDUPE_START_ONCE"):
        FrontierConfig.from_settings(crawler.settings)
