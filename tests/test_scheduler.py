"""The scheduler, built from a crawler as Scrapy builds it: on a single Redis and on the
session's local Redis Cluster (``local_cluster`` in tests/conftest.py)."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import redis
from harness.local_cluster import LocalCluster
from helpers import crawler_for, node_clients, run_python
from redis.cluster import RedisCluster
from scrapy import Request
from scrapy.exceptions import DontCloseSpider

from scrapy_bloomdupe import keys
from scrapy_bloomdupe.bloom.filter import FINISHED_TTL
from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter
from scrapy_bloomdupe.frontier import failed
from scrapy_bloomdupe.frontier.leased import LeasedQueue
from scrapy_bloomdupe.scheduler import Scheduler


def test_scheduler_shares_one_client_with_the_dupefilter(engine_url: str, engine: str) -> None:
    crawler = crawler_for(engine_url, SCHEDULER_PERSIST=True)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    assert isinstance(scheduler.df, RedisBloomDupeFilter)
    assert scheduler.df.bloom.client is scheduler.server
    assert scheduler.df.bloom.engine_name == engine  # BLOOMDUPE_ENGINE = "auto"
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


def test_scrapys_own_dupefilter_closes_a_done_crawl_without_persist(
        redis_url: str, client: redis.Redis) -> None:
    """Scrapy's RFPDupeFilter has no ``clear``: the last worker of a done crawl clears
    the shared queue and closes cleanly (it raised AttributeError in the close job)."""
    crawler = crawler_for(redis_url, BLOOMDUPE_DONE_GRACE=0,
                          DUPEFILTER_CLASS="scrapy.dupefilters.RFPDupeFilter")
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    scheduler.enqueue_request(Request("http://a.example/1"))
    while scheduler.next_request() is not None:
        pass
    scheduler.end.spider_idle(crawler.spider)
    closed = scheduler.close("finished")
    failures: list[Any] = []
    closed.addErrback(failures.append)
    assert failures == []
    assert client.keys("demo:*queue*") == []


def test_scheduler_keeps_scrapy_redis_set_when_persisting(redis_url: str,
                                                         client: redis.Redis) -> None:
    crawler = crawler_for(redis_url, SCHEDULER_PERSIST=True,
                          DUPEFILTER_CLASS="scrapy_redis.dupefilter.RFPDupeFilter")
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    scheduler.enqueue_request(Request("http://a.example/1"))
    scheduler.close("finished")
    assert client.exists("demo:dupefilter")


def test_scheduler_without_persist_clears_queue_and_filter_once_the_crawl_is_done(
        engine_url: str, engine_client: redis.Redis) -> None:
    client = engine_client
    crawler = crawler_for(engine_url, BLOOMDUPE_DONE_GRACE=0)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    scheduler.enqueue_request(Request("http://a.example/1"))
    scheduler.enqueue_request(Request("http://a.example/2"))
    while scheduler.next_request() is not None:
        pass
    scheduler.end.spider_idle(crawler.spider)  # queue empty, no lease: the crawl is done
    scheduler.close("finished")
    # All gone but the mark that tells a worker paused past the end what happened, and
    # the crawl's report, kept for BLOOMDUPE_REPORT_TTL (7 days), then gone.
    assert sorted(client.keys("*")) == [b"demo:bloomdupe:finished", b"demo:bloomdupe:stats",
                                        b"demo:bloomdupe:workers"]
    assert 0 < client.ttl("demo:bloomdupe:finished") <= FINISHED_TTL
    assert 7 * 86_400 - 60 < client.ttl("demo:bloomdupe:stats") <= 7 * 86_400
    assert client.hget("demo:bloomdupe:stats", "new") == b"2"


def test_a_finished_crawl_keeps_its_report_and_a_new_crawl_starts_afresh(
        redis_url: str, client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 49: after a default crawl (SCHEDULER_PERSIST off) ended, its failed requests
    and crawl-wide counters were deleted with the rest, though the worker had said they
    were recorded. They are kept for BLOOMDUPE_REPORT_TTL; the last worker says so in one
    summary line; a new crawl at the key starts afresh, without them."""
    def opened() -> Scheduler:
        crawler = crawler_for(redis_url, BLOOMDUPE_DONE_GRACE=0)
        scheduler = Scheduler.from_crawler(crawler)
        scheduler.open(crawler.spider)
        return scheduler

    scheduler = opened()
    tag = scheduler.df.bloom.key
    for i in range(3):
        assert scheduler.enqueue_request(Request(f"http://a.example/{i}"))
    assert not scheduler.enqueue_request(Request("http://a.example/0"))
    scheduler.record_failed(scheduler.next_request(), "HTTP 404")
    while scheduler.next_request() is not None:
        pass
    scheduler.end.spider_idle(scheduler.spider)
    with caplog.at_level(logging.INFO, logger="scrapy_bloomdupe"):
        scheduler.close("finished")
    summary = [r.getMessage() for r in caplog.records if " is over" in r.getMessage()]
    assert summary == [
        "The crawl demo:bloomdupe is over, over all its workers: ? pages, 3 new, "
        "1 duplicates, 1 failed. SCHEDULER_PERSIST is off: its filter and queue are "
        "deleted; its report, the failed requests (`bloomdupe failed`) and these counters "
        "(`bloomdupe stats`), is kept for 7 days (BLOOMDUPE_REPORT_TTL)"]
    assert not client.exists(keys.meta(tag))
    assert [r.url for r in failed.read(client, tag)] == ["http://a.example/0"]
    assert 7 * 86_400 - 60 < client.ttl(keys.failed(tag)) <= 7 * 86_400
    assert client.hget(keys.stats(tag), "new") == b"3"

    again = opened()  # a new crawl at the finished one's key
    assert failed.count(client, tag) == 0
    assert not client.exists(keys.stats(tag)) and not client.exists(keys.workers(tag))
    assert again.enqueue_request(Request("http://a.example/0"))  # new to this crawl
    again.close("shutdown")


def test_a_report_ttl_of_0_deletes_the_report_with_the_rest(redis_url: str,
                                                             client: redis.Redis) -> None:
    crawler = crawler_for(redis_url, BLOOMDUPE_DONE_GRACE=0, BLOOMDUPE_REPORT_TTL=0)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    assert scheduler.enqueue_request(Request("http://a.example/1"))
    scheduler.record_failed(scheduler.next_request(), "HTTP 500")
    scheduler.end.spider_idle(crawler.spider)
    scheduler.close("finished")
    assert client.keys("*") == [b"demo:bloomdupe:finished"]


def test_scheduler_without_persist_keeps_everything_when_it_leaves_early(
        redis_url: str, client: redis.Redis) -> None:
    crawler = crawler_for(redis_url)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    scheduler.enqueue_request(Request("http://a.example/1"))
    scheduler.enqueue_request(Request("http://a.example/2"))
    assert scheduler.next_request() is not None
    scheduler.close("shutdown")  # stopped before the crawl was done
    # Without an engine, the request it handed out counts as done (acked); the other
    # stays queued for the workers still crawling.
    assert scheduler.queue.status() == (1, 0)
    assert client.exists(keys.meta(scheduler.df.bloom.key))


def test_a_worker_says_whether_it_joins_a_crawl_under_way_or_resumes_one(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """The second worker of a brand-new crawl said "Resuming crawl (1 requests
    scheduled)" (issue 49): it joins a crawl under way; a crawl resumes only when no
    worker is at work."""
    def opened() -> Scheduler:
        crawler = crawler_for(redis_url, SCHEDULER_PERSIST=True)
        scheduler = Scheduler.from_crawler(crawler)
        scheduler.open(crawler.spider)
        return scheduler

    first = opened()
    assert first.enqueue_request(Request("http://a.example/1"))
    with caplog.at_level(logging.INFO, logger="scrapy_bloomdupe"):
        second = opened()
    assert "Joining the crawl under way: 1 other worker(s) at work, 1 request(s) queued" \
        in caplog.text
    assert "Resuming" not in caplog.text
    first.close("shutdown")
    second.close("shutdown")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="scrapy_bloomdupe"):
        third = opened()  # the next run of the crawl SCHEDULER_PERSIST kept
    assert "Resuming the crawl: 1 request(s) left queued by an earlier run (no other " \
        "worker at work)" in caplog.text
    third.close("shutdown")


def test_the_scheduler_stays_while_work_may_come_and_clears_only_when_done(
        redis_url: str) -> None:
    crawler = crawler_for(redis_url, SCHEDULER_PERSIST=False, BLOOMDUPE_DONE_GRACE=0.2)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    other = crawler_for(redis_url, SCHEDULER_PERSIST=False, BLOOMDUPE_DONE_GRACE=0.2)
    peer = Scheduler.from_crawler(other)
    peer.open(other.spider)
    assert scheduler.enqueue_request(Request("http://a.example/1"))
    taken = peer.next_request()  # another worker holds it
    assert taken is not None
    with pytest.raises(DontCloseSpider):
        scheduler.end.spider_idle(crawler.spider)  # a lease is held: stay
    peer.leases.settle()  # the peer's engine is done with it (no engine here: done)
    peer.upkeep.tick()
    with pytest.raises(DontCloseSpider):
        scheduler.end.spider_idle(crawler.spider)  # empty, but not for the grace yet
    time.sleep(0.25)
    scheduler.end.spider_idle(crawler.spider)  # done
    assert scheduler.crawl_done
    assert not peer.crawl_done
    peer.close("shutdown")  # left early: clears nothing
    client = redis.Redis.from_url(redis_url)
    assert client.exists(keys.meta(scheduler.df.bloom.key))
    scheduler.close("finished")
    assert not client.exists(keys.meta(scheduler.df.bloom.key))
    client.close()



def test_the_scheduler_and_the_dupefilter_run_on_a_cluster(
    cluster_url: str, local_cluster: LocalCluster,
) -> None:
    crawler = crawler_for(cluster_url, BLOOMDUPE_REDIS_CLUSTER=True, BLOOMDUPE_SHARDS=6,
                          BLOOMDUPE_DONE_GRACE=0,
                          SCHEDULER_QUEUE_CLASS="scrapy_bloomdupe.cluster.PriorityQueue")
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    assert isinstance(scheduler.server, RedisCluster)
    assert isinstance(scheduler.df, RedisBloomDupeFilter)
    urls = [f"https://a.example/{i}" for i in range(20)]
    for i, url in enumerate(urls):
        assert scheduler.enqueue_request(Request(url, priority=i))
        assert not scheduler.enqueue_request(Request(url))
    popped: dict[int, list[str]] = {}  # by queue shard
    for _ in urls:
        request = scheduler.next_request()
        assert request is not None
        lease = list(scheduler.leases.handed.values())[-1]
        popped.setdefault(lease.shard, []).append(request.url)
    assert scheduler.next_request() is None
    assert sorted(u for shard in popped.values() for u in shard) == sorted(urls)
    assert len(popped) > 1  # the queue spreads over the shards
    # ... each in the download slots' layout (frontier/slots.py), one slot a shard: the
    # shards popped from count their slots' leases.
    tag = scheduler.df.bloom.key
    assert isinstance(scheduler.leases.queue, LeasedQueue)
    assert all(scheduler.server.exists(keys.slot_leased(tag, shard)) for shard in popped)
    for shard_urls in popped.values():  # highest priority first, within a shard
        assert shard_urls == sorted(shard_urls, key=lambda u: -int(u.rsplit("/", 1)[1]))
    assert crawler.stats.get_value("dupefilter/filtered") == len(urls)
    scheduler.end.spider_idle(crawler.spider)  # the crawl is done (BLOOMDUPE_DONE_GRACE 0)
    scheduler.close("finished")  # SCHEDULER_PERSIST off: queue and filter deleted
    masters = node_clients(local_cluster)
    left = {name: c.ttl(name) for c in masters.values() for name in c.keys("*")}
    # The mark of the finished crawl, and its report (BLOOMDUPE_REPORT_TTL), expiring.
    assert set(left) == {b"demo:bloomdupe:finished", b"demo:bloomdupe:stats",
                         b"demo:bloomdupe:workers"}
    assert all(0 < ttl <= FINISHED_TTL for ttl in left.values())
    for c in masters.values():
        c.close()


@pytest.mark.parametrize("queue_cls", ["scrapy_redis.queue.FifoQueue",
                                       "scrapy_redis.queue.LifoQueue",
                                       "scrapy_redis.queue.PriorityQueue"])
def test_scrapy_redis_queue_classes_still_work(redis_url: str, client: redis.Redis,
                                               queue_cls: str) -> None:
    """Without leases (README: they lack those guarantees), as in scrapy-redis."""
    crawler = crawler_for(redis_url, SCHEDULER_QUEUE_CLASS=queue_cls, BLOOMDUPE_DONE_GRACE=0)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    assert not scheduler.leased
    urls = [f"http://a.example/{i}" for i in range(3)]
    for url in urls:
        assert scheduler.enqueue_request(Request(url))
        assert not scheduler.enqueue_request(Request(url))
    assert client.exists("demo:requests")  # scrapy-redis's own key
    assert scheduler.has_pending_requests()
    popped = [scheduler.next_request() for _ in urls]
    assert sorted(r.url for r in popped if r is not None) == urls
    assert scheduler.next_request() is None
    scheduler.end.spider_idle(crawler.spider)  # queue empty: the crawl is done
    assert scheduler.crawl_done
    scheduler.close("finished")
    # SCHEDULER_PERSIST off, and done: all gone but the mark of the finished crawl and
    # its report (BLOOMDUPE_REPORT_TTL).
    assert sorted(client.keys("*")) == [b"demo:bloomdupe:finished", b"demo:bloomdupe:stats",
                                        b"demo:bloomdupe:workers"]


OPEN_AND_CLOSE_AS_JOBS = '''
import sys, threading
import greenlet
REACTOR
from twisted.internet import reactor
sys.path.insert(0, "tests")
from helpers import crawler_for
from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter
from scrapy_bloomdupe.scheduler import Scheduler
from scrapy_bloomdupe.scheduling.shared import SharedCrawl

seen = {}

def where(name, method):
    def wrapped(self, *args, **kwargs):
        in_greenlet = greenlet.getcurrent().parent is not None
        seen[name] = (threading.current_thread().name, in_greenlet)
        return method(self, *args, **kwargs)
    return wrapped

SharedCrawl.join = where("join", SharedCrawl.join)
SharedCrawl.close = where("leave", SharedCrawl.close)
RedisBloomDupeFilter.close_now = where("filter closed", RedisBloomDupeFilter.close_now)

def main():
    crawler = crawler_for("URL", SCHEDULER_PERSIST=True)
    scheduler = Scheduler.from_crawler(crawler)
    def answered_at_once(d):
        answer = []
        d.addBoth(lambda result: answer.append(result) or result)
        return bool(answer)
    opened = scheduler.open(crawler.spider)
    print("runner", type(scheduler.jobs.io).__name__, "waited", answered_at_once(opened))
    def close(_):
        closed = scheduler.close("finished")
        print("close waited", answered_at_once(closed))
        return closed
    def done(_):
        print("stopped", scheduler.jobs.inline)
        print(sorted(seen.items()))
        reactor.stop()
    opened.addCallback(close).addCallback(done)
    opened.addErrback(lambda f: (print(f), reactor.stop()))

reactor.callWhenRunning(main)
reactor.callLater(20, reactor.stop)
reactor.run()
'''


@pytest.mark.parametrize("reactor", ["asyncio", "epoll"])
def test_the_crawls_start_and_end_are_jobs_on_the_runner_chosen_when_it_opens(
        redis_url: str, reactor: str) -> None:
    """With the reactor running (a crawl), ``open`` starts the runner (the loop under
    asyncio's reactor, the thread under another) and returns its job's Deferred, not
    fired yet: the reactor did not wait for the join. ``close`` too, and stops the
    runner once its last job is answered."""
    install = ("from twisted.internet import asyncioreactor; asyncioreactor.install()"
               if reactor == "asyncio" else
               "from twisted.internet import epollreactor; epollreactor.install()")
    out = run_python(OPEN_AND_CLOSE_AS_JOBS.replace("REACTOR", install)
                     .replace('"URL"', repr(redis_url)))
    runner, where = ("IOLoop", ("MainThread", True)) if reactor == "asyncio" else (
        "IOThread", ("PoolThread-bloomdupe-redis-0", False))
    assert f"runner {runner} waited False" in out, out
    assert "close waited False" in out and "stopped True" in out, out
    assert str(sorted({"join": where, "leave": where, "filter closed": where}.items())) in out, out


@pytest.mark.parametrize("window", [None, 3600])
def test_crawl_wide_politeness_with_either_engine_and_a_window(
        engine_url: str, engine: str, window: int | None) -> None:
    """``BLOOMDUPE_POLITENESS = "crawl"`` whatever the filter: the engine's (and a
    window's) check-and-queue feeds the intake, the scheduler's pops move it into the
    download slots, and a host at its limit (1) is not handed out twice at once."""
    settings: dict[str, Any] = {"BLOOMDUPE_POLITENESS": "crawl",
                                "CONCURRENT_REQUESTS_PER_DOMAIN": 1, "DOWNLOAD_DELAY": 0,
                                "BLOOMDUPE_DONE_GRACE": 0}
    if window:
        settings["BLOOMDUPE_WINDOW"] = window
    crawler = crawler_for(engine_url, **settings)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    assert scheduler.df.bloom.engine_name == engine
    urls = [f"http://{host}.example/{n}" for n in range(2) for host in ("a", "b")]
    for url in urls:
        assert scheduler.enqueue_request(Request(url))
        assert not scheduler.enqueue_request(Request(url))
    first = [scheduler.next_request() for _ in range(4)]
    handed = sorted(r.url.split("/")[2] for r in first if r is not None)
    assert handed == ["a.example", "b.example"]  # one a host: each at its limit
    scheduler.close("finished")
