"""``FailedRequestMiddleware`` (scrapy_bloomdupe/failures.py) without a crawl: what it
records in Redis, and what it leaves alone."""

from __future__ import annotations

import redis
from helpers import crawler_for
from scrapy import Request
from scrapy.http import Response
from scrapy.http.request import NO_CALLBACK

from scrapy_bloomdupe.failures import FailedRequestMiddleware
from scrapy_bloomdupe.frontier import failed
from scrapy_bloomdupe.scheduler import Scheduler


def test_only_requests_the_scheduler_handed_out_are_recorded(redis_url: str,
                                                            client: redis.Redis) -> None:
    """Issue 49: robots.txt answering 404 (Scrapy's template obeys it) was recorded as
    failed, and its NO_CALLBACK could not be serialized: an ERROR and a traceback in
    every worker. A request that did not come from the scheduler (robots.txt, a media
    pipeline, ``engine.download``) is neither recorded nor an error."""
    crawler = crawler_for(redis_url, SCHEDULER_PERSIST=True)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    middleware = FailedRequestMiddleware.from_crawler(crawler)
    robots = Request("http://a.example/robots.txt", callback=NO_CALLBACK,
                     meta={"dont_obey_robotstxt": True})
    response = Response(robots.url, status=404, request=robots)
    assert middleware.process_response(robots, response) is response
    assert middleware.process_exception(robots, ConnectionRefusedError("refused")) is None
    assert scheduler.enqueue_request(Request("http://a.example/gone"))
    handed = scheduler.next_request()
    assert handed is not None
    middleware.process_response(handed, Response(handed.url, status=404, request=handed))
    records = failed.read(client, scheduler.df.bloom.key)
    assert [(r.url, r.reason) for r in records] == [("http://a.example/gone", "HTTP 404")]
    scheduler.close("shutdown")
