"""The scheduler's request queue (scrapy-redis's priority queue, popping in a way a Redis
Cluster accepts): pops replayed after a lost reply, pops on a cluster, its dotted paths."""

from __future__ import annotations

import pytest
from helpers import DemoSpider, crawler_for
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from scrapy import Request
from scrapy_redis.queue import PriorityQueue as ScrapyRedisPriorityQueue

from scrapy_bloomdupe import cluster as old_home
from scrapy_bloomdupe.frontier.queue import PriorityQueue
from scrapy_bloomdupe.scheduler import Scheduler


def test_queue_pop_is_replayed_when_its_reply_was_lost(redis_url: str) -> None:
    crawler = crawler_for(redis_url, SCHEDULER_PERSIST=True)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    for i in range(3):
        scheduler.enqueue_request(Request(f"http://a.example/{i}"))
    queue = scheduler.queue
    first = queue.pop()
    # A retry after a lost reply carries the same pop number (it advances only
    # once a reply is in): it gets the same request, and pops nothing more.
    queue._pop_number -= 1
    again = queue.pop()
    assert again.url == first.url
    assert len(queue) == 2
    assert queue.pop().url != first.url


def test_scrapy_redis_priority_queue_cannot_pop_on_a_cluster(rc: RedisCluster) -> None:
    """Why the cluster needs scrapy_bloomdupe's PriorityQueue."""
    spider = DemoSpider()
    theirs = ScrapyRedisPriorityQueue(rc, spider, "demo:requests")
    theirs.push(Request("https://a.example/"))
    with pytest.raises(RedisClusterException, match="multi"):
        theirs.pop()
    ours = PriorityQueue(rc, spider, "demo:requests")
    request = ours.pop()
    assert request is not None and request.url == "https://a.example/"
    assert len(ours) == 0


def test_the_old_dotted_path_still_names_the_queue(redis_url: str) -> None:
    assert old_home.PriorityQueue is PriorityQueue
    # And the scheduler's default is the queue's own path.
    crawler = crawler_for(redis_url)
    scheduler = Scheduler.from_crawler(crawler)
    assert scheduler.queue_cls == "scrapy_bloomdupe.frontier.queue.PriorityQueue"
