"""The lease's life on one worker (scheduling/leases.py), without a crawl: the buffer, the
fill and prefetch counts, the hand-out, the acks (sent later, or now when the engine waits
for them), the back-pressure of ``full``, settling, and a request that came back too
often. On a real redis-server and the real leased queue, the Redis jobs run inline (no
reactor started), the time and the delayed calls under the test's control."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from helpers import Calls, Clock, DemoSpider, Engine, crawler_for, in_job
from scrapy import Request
from scrapy.settings import Settings
from scrapy_redis.queue import FifoQueue

from scrapy_bloomdupe.frontier import failed
from scrapy_bloomdupe.frontier.leased import LeasedQueue
from scrapy_bloomdupe.frontier.politeness import OneSlot, SlotPolicy
from scrapy_bloomdupe.scheduling.health import CrawlHealth
from scrapy_bloomdupe.scheduling.jobs import RedisJobs
from scrapy_bloomdupe.scheduling.leases import ACK_DELAY, WAKE_META, Leases
from scrapy_bloomdupe.scheduling.requestpath import LEASE_META, RequestPath
from scrapy_bloomdupe.settings import FrontierConfig
from scrapy_bloomdupe.transport.outage import OutageGuard

TAG = "demo:bloomdupe"
IDLE_POLL = 0.5


def worker_queue(client: redis.Redis, *, lease_timeout: float) -> LeasedQueue:
    """The default queue in "worker" politeness (one slot), as another worker opens it."""
    return LeasedQueue(client, DemoSpider(), "demo:requests", tag=TAG, policy=OneSlot(),
                       lease_timeout=lease_timeout)


class Setup:
    """A worker's leases on the shared queue, with what the test controls."""

    def __init__(self, redis_url: str, client: redis.Redis, *, concurrency: int = 8,
                 acks_early: bool = True, engine: bool = False, max_requeues: int = 3,
                 queue: Any = None) -> None:
        self.crawler = crawler_for(redis_url)
        self.spider = self.crawler.spider
        self.queue = queue if queue is not None else LeasedQueue(
            client, self.spider, "demo:requests", tag=TAG, policy=OneSlot(), lease_timeout=30)
        # No reactor started: the jobs run inline; with an engine, as in a crawl.
        self.jobs = RedisJobs(CrawlHealth(OutageGuard(0, "test")), crawling=engine)
        assert self.jobs.inline
        self.path = RequestPath(None, self.queue, self.jobs, stats=self.crawler.stats,
                                spider=self.spider, queued=lambda count: None)
        self.clock, self.calls = Clock(), Calls()
        self.engine = Engine(self.spider) if engine else None
        self.missed = 0
        self.leases = Leases(
            self.path, frontier=FrontierConfig(lease_timeout=30, done_grace=0,
                                               failed_limit=100, max_requeues=max_requeues),
            concurrency=concurrency, acks_early=acks_early, engine=lambda: self.engine,
            idle_poll=lambda: IDLE_POLL, idle_missed=self._missed, clock=self.clock,
            later=self.calls)

    def _missed(self) -> None:
        self.missed += 1

    def push(self, count: int, start: int = 0) -> list[str]:
        urls = [f"http://a.example/{i}" for i in range(start, start + count)]
        self.queue.push_many([Request(url, priority=-i) for i, url in enumerate(urls)])
        return urls

    def take_all(self) -> list[Request]:
        taken = []
        while (request := self.leases.take()) is not None:
            taken.append(request)
        return taken


@pytest.fixture
def setup(redis_url: str, client: redis.Redis) -> Setup:
    return Setup(redis_url, client, engine=True)


def test_a_fill_takes_the_free_slots_and_a_quarter_more_while_the_queue_is_deep(
        setup: Setup) -> None:
    leases = setup.leases
    setup.push(30)
    assert leases.prefetch_count() == 8  # CONCURRENT_REQUESTS, nothing in hand
    assert leases.low_water() == 0
    first = leases.take()
    assert first is not None and first.url == "http://a.example/0"
    # One round trip leased 8 (all it asked for): one handed out, 7 buffered.
    assert (len(leases.handed), len(leases.buffer)) == (1, 7)
    assert setup.queue.status() == (22, 8)
    # The queue is deep: the next pop goes out while a quarter are still buffered, and
    # takes the free slots the buffer does not cover and a quarter more.
    assert leases.low_water() == 2
    assert leases.prefetch_count() == max(1, 8 - 1 - 7) + 2
    for _ in range(5):
        assert leases.take() is not None
    # The 6th hand-out left 2 buffered: a pop of max(1, 8 - 6 - 2) + 2 = 3 went out.
    assert (len(leases.handed), len(leases.buffer)) == (6, 5)
    assert setup.queue.status() == (19, 11)


def test_a_short_answer_ends_the_prefetch(setup: Setup) -> None:
    leases = setup.leases
    setup.push(3)
    assert leases.take() is not None
    assert (len(leases.handed), len(leases.buffer)) == (1, 2)  # asked 8, got 3
    assert leases.low_water() == 0
    assert leases.prefetch_count() == max(1, 8 - 1 - 2)  # no quarter more


def test_a_handed_request_carries_its_lease_until_it_is_acked(setup: Setup) -> None:
    leases = setup.leases
    urls = setup.push(2)
    taken = setup.take_all()
    assert [r.url for r in taken] == urls
    fields = [r.meta[LEASE_META] for r in taken]
    assert sorted(fields) == sorted(leases.handed)
    assert setup.queue.status() == (0, 2)
    leases.ack(fields[0])
    assert list(leases.handed) == [fields[1]]
    assert setup.queue.pending_acks() == 1  # rides on the next round trip...
    assert setup.queue.status() == (0, 2)
    (call,) = setup.calls.pending()  # ...or goes alone after ACK_DELAY
    assert call.delay == ACK_DELAY
    leases.ack(fields[1])
    assert len(setup.calls.pending()) == 1  # one send for both
    setup.calls.run()
    assert setup.queue.pending_acks() == 0
    assert setup.queue.status() == (0, 0)
    leases.ack(fields[1])  # twice, or a lease this worker does not hold: ignored
    assert setup.queue.pending_acks() == 0


def test_without_an_engine_what_was_handed_out_is_settled_at_the_next_take(
        redis_url: str, client: redis.Redis) -> None:
    setup = Setup(redis_url, client)  # a tool, a test: no engine
    leases = setup.leases
    setup.push(2)
    assert leases.take() is not None
    assert leases.take() is not None  # settles the first: whoever took it is done
    assert len(leases.handed) == 1
    # Its ack rode on the round trip of the pop that the empty buffer sent.
    assert setup.queue.pending_acks() == 0
    assert setup.queue.status() == (0, 1)
    assert setup.calls.asked == []  # no delayed send without an engine
    leases.settle()
    assert leases.handed == {}
    assert setup.queue.pending_acks() == 1


def test_with_an_engine_only_an_idle_settle_acks_what_was_handed_out(setup: Setup) -> None:
    leases = setup.leases
    setup.push(2)
    setup.take_all()
    leases.settle()
    assert len(leases.handed) == 2  # the engine may still be working on them
    leases.settle(idle=True)  # spider_idle: nothing downloading or scraping
    assert leases.handed == {}
    assert setup.queue.pending_acks() == 2


def test_a_worker_holding_its_limit_waits_for_its_acks_and_the_answer_wakes_the_engine(
        redis_url: str, client: redis.Redis) -> None:
    setup = Setup(redis_url, client, concurrency=4, engine=True)
    leases = setup.leases
    setup.push(10)
    held = [leases.take() for _ in range(5)]  # CONCURRENT_REQUESTS and a quarter (1)
    assert all(r is not None for r in held)
    assert leases.full()
    assert leases.buffer  # requests are at hand, but not handed out
    assert leases.take() is None
    assert leases.take() is None
    assert setup.crawler.stats.get_value("bloomdupe/held_full") == 1  # once a wait
    assert leases.starved
    # A done page's ack goes at once (the engine waits for it), not after ACK_DELAY;
    # its answer hands the engine a request (engine.crawl, Scrapy's public way).
    leases.ack(held[0].meta[LEASE_META])
    assert setup.calls.pending() == []
    assert setup.queue.pending_acks() == 0
    assert not leases.full() and not leases.starved
    (woken,) = setup.engine.crawled
    assert woken.meta[WAKE_META] and woken is leases.buffer[0].request
    assert leases.take() is woken
    assert WAKE_META not in woken.meta


def test_without_the_batch_middleware_a_worker_is_never_full(
        redis_url: str, client: redis.Redis) -> None:
    setup = Setup(redis_url, client, concurrency=4, acks_early=False, engine=True)
    setup.push(10)
    assert len([setup.leases.take() for _ in range(8)]) == 8
    assert not setup.leases.full()


def test_an_empty_queue_is_asked_again_only_once_the_idle_poll_is_due(setup: Setup) -> None:
    leases = setup.leases
    assert leases.take() is None  # the pop found the queue empty
    assert setup.missed == 1  # the crawl's end hears the fill is over
    setup.push(1)
    assert leases.take() is None  # not asked again: the engine asks once a download
    setup.clock.now += IDLE_POLL
    request = leases.take()
    assert request is not None and request.url == "http://a.example/0"


def test_work_seen_makes_the_next_ask_go_to_redis_at_once(setup: Setup) -> None:
    leases = setup.leases
    assert leases.take() is None
    setup.push(1)
    leases.work_came()  # this worker queued something
    assert leases.take() is not None


def test_the_idle_poll_always_looks_and_says_when_it_is_over(setup: Setup) -> None:
    leases = setup.leases
    assert leases.take() is None
    setup.push(1)
    over: list[str] = []
    looked: list[Any] = []
    # The look runs on the Redis thread only: inline, none is asked for.
    leases.fill(poll=True, then=lambda: over.append("then"), look=lambda: lambda: "look",
                looked=looked.append)
    assert over == ["then"] and looked == []
    assert len(leases.buffer) == 1


def test_a_request_whose_lease_expired_too_often_is_recorded_as_failed_and_not_handed_out(
        redis_url: str, client: redis.Redis) -> None:
    setup = Setup(redis_url, client, max_requeues=1)
    setup.push(1)
    # Its first holder stops heartbeating: its lease expires, a live worker puts it back.
    dead = worker_queue(client, lease_timeout=0.1)
    assert len(dead.pop_leases(1)) == 1
    time.sleep(0.15)
    reaper = worker_queue(client, lease_timeout=0.1)
    assert [n for n, _ in reaper.reap()] == [1]
    setup.push(1, start=1)
    request = setup.leases.take()
    assert request is not None and request.url == "http://a.example/1"
    (record,) = failed.read(client, TAG)
    assert record.url == "http://a.example/0"
    assert "its lease expired 1 times" in record.reason
    assert setup.crawler.stats.get_value("bloomdupe/failed") == 1
    setup.leases.settle()
    setup.queue.send_acks()
    assert setup.queue.status() == (0, 0)  # its lease acked once the record was in


def test_all_a_pop_took_came_back_too_often_so_it_pops_again(
        redis_url: str, client: redis.Redis) -> None:
    setup = Setup(redis_url, client, max_requeues=1)
    setup.push(1)
    dead = worker_queue(client, lease_timeout=0.1)
    dead.pop_leases(1)
    time.sleep(0.15)
    worker_queue(client, lease_timeout=0.1).reap()
    # Only the request that came back too often is queued: the pop takes it, records
    # it, and pops again at once (finding the queue empty).
    assert setup.leases.take() is None
    assert setup.leases.buffer == []
    assert len(failed.read(client, TAG)) == 1
    setup.push(1, start=1)
    setup.clock.now += IDLE_POLL
    assert setup.leases.take() is not None


def test_a_scrapy_redis_queue_pops_one_by_one_and_gives_back_what_was_not_handed_out(
        redis_url: str, client: redis.Redis) -> None:
    queue = FifoQueue(client, DemoSpider(), "demo:requests")
    setup = Setup(redis_url, client, concurrency=3, queue=queue)
    assert not setup.leases.leased
    for i in range(5):
        queue.push(Request(f"http://a.example/{i}"))
    request = setup.leases.take()
    assert request is not None and LEASE_META not in request.meta
    assert setup.leases.handed == {}  # nothing leased: nothing to ack
    assert len(setup.leases.buffer) == 2  # its free download slots: 3
    assert len(queue) == 2
    assert not setup.leases.full()
    # The spider closed: back before the queue is judged empty.
    in_job(setup.jobs, setup.leases.give_back)
    assert setup.leases.buffer == []
    assert len(queue) == 4


def test_pending_is_what_the_worker_knows_until_a_pop_finds_the_queue_empty(
        setup: Setup) -> None:
    """Scrapy's ``has_pending_requests``, asked whenever the engine looks idle, is answered
    from local state: requests buffered, or queued by this worker since a pop last found
    the queue empty (another worker may have taken them: the next pop says)."""
    leases = setup.leases
    assert not leases.pending()
    setup.push(1)
    leases.queued()  # what the request path says once Redis queued them
    assert leases.pending()
    assert not leases.filling and leases.pending()  # no pop has found it empty yet
    assert leases.take() is not None
    # The buffer emptied, the next pop went out (inline: at once) and found the queue
    # empty: nothing pending, as far as this worker knows.
    assert not leases.pending()
    assert leases.take() is None


def crawl_wide(redis_url: str, client: redis.Redis, per_domain: int, delay: float
               ) -> tuple[LeasedQueue, Setup]:
    """A crawl-wide queue whose one site (a.example) allows ``per_domain`` requests at
    once, ``delay`` seconds apart, and the leases over it, with an engine."""
    policy = SlotPolicy(Settings({"CONCURRENT_REQUESTS_PER_DOMAIN": per_domain,
                                  "DOWNLOAD_DELAY": delay, "RANDOMIZE_DOWNLOAD_DELAY": False}))
    queue = LeasedQueue(client, DemoSpider(), "demo:requests", tag=TAG, policy=policy,
                           lease_timeout=30)
    return queue, Setup(redis_url, client, engine=True, queue=queue)


def test_crawl_wide_a_lease_taken_ahead_is_handed_out_only_at_its_start(
        redis_url: str, client: redis.Redis) -> None:
    queue, setup = crawl_wide(redis_url, client, per_domain=2, delay=3)
    queue.horizon = 5.0  # seconds on Redis's clock: whatever this machine's pace
    leases = setup.leases
    setup.push(2)
    first = leases.take()  # due now: at once
    assert first is not None and first.url == "http://a.example/0"
    assert leases.take() is None  # the next pop waits for the slot's next start...
    setup.clock.now += 1.3  # ...to come within the horizon (and its jitter): taken ahead
    assert leases.take() is None
    (ahead,) = leases.buffer
    assert 2 < ahead.start_in <= 3 and leases.starved
    # Not handed out before its start, whatever the engine asks; a call wakes it then.
    (call,) = [c for c in setup.calls.pending() if c.func == leases._start_due]
    assert call.delay == pytest.approx(ahead.start_in)
    setup.clock.now += call.delay / 2
    assert leases.take() is None and leases.buffer == [ahead]
    # (a microsecond past it: half the delay twice can sum to one float step short of
    # the start, which then waits for one more call: failed once in CI so)
    setup.clock.now += call.delay / 2 + 1e-6
    call.func()
    (woken,) = setup.engine.crawled
    assert woken is ahead.request and leases.take() is ahead.request


def test_crawl_wide_a_slot_at_its_limit_is_asked_again_by_the_pop_that_acks(
        redis_url: str, client: redis.Redis) -> None:
    queue, setup = crawl_wide(redis_url, client, per_domain=1, delay=0)
    leases = setup.leases
    setup.push(2)
    first = leases.take()
    assert first is not None and queue.slots_waiting  # the other waits for room
    pops = queue._pop_number
    # The engine's asks, and the hand-out's "busy", do not go to Redis: room comes
    # back with an ack, and the pop that carries it takes what it frees.
    assert leases.take() is None and leases.take() is None
    assert queue._pop_number == pops
    leases.ack(first.meta[LEASE_META])
    (send,) = [c for c in setup.calls.pending() if c.func == leases._send_acks]
    send.func()
    assert queue._pop_number == pops + 1 and queue.pending_acks() == 0
    (woken,) = setup.engine.crawled
    assert woken.url == "http://a.example/1" and leases.take() is woken


def test_crawl_wide_an_ack_is_sent_at_once_not_after_the_ack_delay(
        redis_url: str, client: redis.Redis) -> None:
    """A slot's room comes back only with its ack: crawl-wide, the ack's send is called
    at once (the acks of one turn of the reactor together), not after ACK_DELAY as in
    "worker" mode (test_a_handed_request_carries_its_lease_until_it_is_acked)."""
    _, setup = crawl_wide(redis_url, client, per_domain=2, delay=0)
    leases = setup.leases
    setup.push(2)
    first = leases.take()
    assert first is not None and leases.buffer  # the second, not yet asked for
    leases.ack(first.meta[LEASE_META])
    (send,) = [c for c in setup.calls.pending() if c.func == leases._send_acks]
    assert send.delay == 0
