"""The scheduler, built from a crawler as Scrapy builds it: on a single Redis and on the
session's local Redis Cluster (``local_cluster`` in tests/conftest.py)."""

from __future__ import annotations

import redis
from helpers import crawler_for, node_clients
from redis.cluster import RedisCluster
from scrapy import Request

from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter
from scrapy_bloomdupe.scheduler import Scheduler
from scrapy_bloomdupe.testing_cluster import LocalCluster


def test_scheduler_shares_one_client_with_the_dupefilter(redis_url: str) -> None:
    crawler = crawler_for(redis_url, SCHEDULER_PERSIST=True)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    assert isinstance(scheduler.df, RedisBloomDupeFilter)
    assert scheduler.df.bloom.client is scheduler.server
    assert scheduler.enqueue_request(Request("http://a.example/1"))
    assert not scheduler.enqueue_request(Request("http://a.example/1"))
    assert scheduler.has_pending_requests()
    request = scheduler.next_request()
    assert request is not None and request.url == "http://a.example/1"
    assert crawler.stats.get_value("scheduler/enqueued/redis") == 1
    assert crawler.stats.get_value("scheduler/dequeued/redis") == 1
    assert crawler.stats.get_value("dupefilter/filtered") == 1
    scheduler.close("finished")


def test_scheduler_keeps_a_dupefilter_the_user_chose(redis_url: str) -> None:
    crawler = crawler_for(redis_url, DUPEFILTER_CLASS="scrapy.dupefilters.BaseDupeFilter")
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    assert type(scheduler.df).__name__ == "BaseDupeFilter"


def test_scheduler_keeps_scrapy_redis_set_when_persisting(redis_url: str,
                                                         client: redis.Redis) -> None:
    crawler = crawler_for(redis_url, SCHEDULER_PERSIST=True,
                          DUPEFILTER_CLASS="scrapy_redis.dupefilter.RFPDupeFilter")
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    scheduler.enqueue_request(Request("http://a.example/1"))
    scheduler.close("finished")
    assert client.exists("demo:dupefilter")


def test_scheduler_without_persist_clears_queue_and_filter(redis_url: str,
                                                          client: redis.Redis) -> None:
    crawler = crawler_for(redis_url)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    scheduler.enqueue_request(Request("http://a.example/1"))
    scheduler.enqueue_request(Request("http://a.example/2"))
    scheduler.close("finished")
    assert client.keys("*") == []


def test_the_scheduler_and_the_dupefilter_run_on_a_cluster(
    cluster_url: str, local_cluster: LocalCluster,
) -> None:
    crawler = crawler_for(cluster_url, BLOOMDUPE_REDIS_CLUSTER=True, BLOOMDUPE_SHARDS=6,
                          SCHEDULER_QUEUE_CLASS="scrapy_bloomdupe.cluster.PriorityQueue")
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    assert isinstance(scheduler.server, RedisCluster)
    assert isinstance(scheduler.df, RedisBloomDupeFilter)
    urls = [f"https://a.example/{i}" for i in range(20)]
    for i, url in enumerate(urls):
        assert scheduler.enqueue_request(Request(url, priority=i))
        assert not scheduler.enqueue_request(Request(url))
    popped = [scheduler.next_request() for _ in urls]
    assert [r.url for r in popped if r is not None] == urls[::-1]  # highest priority first
    assert scheduler.next_request() is None
    assert crawler.stats.get_value("dupefilter/filtered") == len(urls)
    scheduler.close("finished")  # SCHEDULER_PERSIST off: queue and filter deleted
    masters = node_clients(local_cluster)
    assert {name: c.dbsize() for name, c in masters.items()} == dict.fromkeys(masters, 0)
    for c in masters.values():
        c.close()
