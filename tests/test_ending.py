"""The crawl's end as one worker sees it (scheduling/ending.py), without a crawl: the idle
look at the shared queue, stay or done with its grace, the idle poll and its back-off, and
the idle round the poll runs. On a real redis-server, the real leased queue and this
package's dupefilter; the Redis jobs run inline (no reactor started), the time and the
delayed calls under the test's control."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from helpers import Calls, Clock, DemoSpider, Engine, HeldRunner, crawler_for, in_job
from scrapy import Request, signals
from scrapy.exceptions import DontCloseSpider
from scrapy.utils.misc import build_from_crawler

from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter
from scrapy_bloomdupe.frontier.leased import LeasedQueue
from scrapy_bloomdupe.frontier.politeness import OneSlot
from scrapy_bloomdupe.scheduling.ending import IDLE_POLL, MAX_IDLE_POLL, CrawlEnd
from scrapy_bloomdupe.scheduling.jobs import RedisJobs
from scrapy_bloomdupe.scheduling.leases import WAKE_META, Leases
from scrapy_bloomdupe.scheduling.requestpath import RequestPath
from scrapy_bloomdupe.scheduling.upkeep import LeaseUpkeep
from scrapy_bloomdupe.settings import FrontierConfig

GRACE = 5.0


class Setup:
    """One worker's crawl's end, its leases, heartbeat and filter."""

    def __init__(self, redis_url: str, *, engine: bool = False, grace: float = GRACE,
                 lease_timeout: float = 30) -> None:
        self.crawler = crawler_for(redis_url, SCHEDULER_PERSIST=True)
        self.spider = self.crawler.spider
        self.df = build_from_crawler(RedisBloomDupeFilter, self.crawler)
        self.tag = self.df.bloom.key
        self.queue = LeasedQueue(self.df.bloom.client, self.spider, "demo:requests",
                                   tag=self.tag, policy=OneSlot(), lease_timeout=lease_timeout)
        self.clock, self.calls = Clock(), Calls()
        # No reactor started: the jobs run inline (a test may hold them, see HeldRunner);
        # with an engine, as in a crawl.
        self.jobs = RedisJobs(self.df.health, later=self.calls, crawling=engine)
        self.path = RequestPath(self.df, self.queue, self.jobs, stats=self.crawler.stats,
                                spider=self.spider, queued=lambda count: self.end.queued(count),
                                signals=self.crawler.signals, bloomdupe=self.df)
        self.engine = Engine(self.spider) if engine else None
        frontier = FrontierConfig(lease_timeout=lease_timeout, done_grace=grace,
                                  failed_limit=100)
        self.leases = Leases(self.path, frontier=frontier, concurrency=4, acks_early=True,
                             engine=lambda: self.engine,
                             idle_poll=lambda: self.end.idle_poll,
                             idle_missed=lambda: self.end.idle_missed(),
                             clock=self.clock, later=self.calls)
        self.upkeep = LeaseUpkeep(jobs=self.jobs, queue=self.queue, dupefilter=self.df,
                                  server=self.df.bloom.client, frontier=frontier,
                                  stats=self.crawler.stats, spider=self.spider,
                                  settle=self.leases.settle, held=self.leases.held)
        self.end = CrawlEnd(self.path, self.leases, upkeep=self.upkeep,
                            signals=self.crawler.signals, engine=lambda: self.engine,
                            done_grace=grace, clock=self.clock, later=self.calls)
        self.crawler.signals.connect(self.end.spider_idle, signal=signals.spider_idle)

    def idle(self) -> bool:
        """Scrapy's spider_idle: whether this worker stays."""
        try:
            self.end.spider_idle(self.spider)
        except DontCloseSpider:
            return True
        return False

    def take_all(self) -> list[Request]:
        taken = []
        while (request := self.leases.take()) is not None:
            taken.append(request)
        return taken

    def close(self) -> None:
        self.df.close("finished")


@pytest.fixture
def setup(redis_url: str) -> Iterator[Setup]:
    s = Setup(redis_url)
    yield s
    s.close()


def test_an_idle_worker_stays_while_the_queue_has_requests(
        setup: Setup, caplog: pytest.LogCaptureFixture) -> None:
    setup.queue.push(Request("http://a.example/1"))
    with caplog.at_level(logging.INFO, logger="scrapy_bloomdupe.scheduling.ending"):
        assert setup.idle()
        setup.clock.now += 3 * GRACE
        assert setup.idle()
    assert not setup.end.crawl_done
    staying = [r.getMessage() for r in caplog.records if "Idle, staying" in r.getMessage()]
    assert staying == ["Idle, staying: the shared queue has requests"]  # once a change


def test_an_idle_worker_stays_while_another_worker_holds_a_lease(
        setup: Setup, caplog: pytest.LogCaptureFixture) -> None:
    setup.queue.push(Request("http://a.example/1"))
    other = LeasedQueue(setup.df.bloom.client, DemoSpider(), "demo:requests",
                          tag=setup.tag, policy=OneSlot(), lease_timeout=30)
    (lease,) = other.pop_leases(1)
    with caplog.at_level(logging.INFO, logger="scrapy_bloomdupe.scheduling.ending"):
        setup.clock.now += 3 * GRACE
        assert setup.idle()
    assert "1 request(s) are leased by other workers" in caplog.text
    other.ack([lease])
    other.send_acks()
    assert setup.idle()  # empty, no lease: the grace starts now
    setup.clock.now += GRACE
    assert not setup.idle()
    assert setup.end.crawl_done


def test_the_crawl_is_done_once_the_queue_stayed_empty_for_the_grace(
        setup: Setup, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="scrapy_bloomdupe.scheduling.ending"):
        assert setup.idle()
        setup.clock.now += GRACE - 0.1
        assert setup.idle()
        assert not setup.end.crawl_done
        setup.clock.now += 0.1
        assert not setup.idle()
        assert setup.end.crawl_done
        assert not setup.idle()  # a spider kept open comes back: still done
    done = [r for r in caplog.records if r.getMessage().startswith("The crawl is done")]
    assert len(done) == 1  # once an idle spell
    assert "for 5.0s" in done[0].getMessage()
    assert in_job(setup.jobs, setup.end.done_now)  # still empty, no lease held


def test_work_seen_ends_the_idle_spell_and_the_grace_starts_again(setup: Setup) -> None:
    assert setup.idle()
    setup.clock.now += GRACE
    assert not setup.idle() and setup.end.crawl_done
    setup.end.busy()  # this worker handed out or queued something
    assert not setup.end.crawl_done
    assert not in_job(setup.jobs, setup.end.done_now)
    assert setup.idle()  # a new idle spell: its own grace
    setup.clock.now += GRACE
    assert not setup.idle()


def test_done_now_asks_the_queue_again(setup: Setup) -> None:
    assert not in_job(setup.jobs, setup.end.done_now)  # never seen done
    assert setup.idle()
    setup.clock.now += GRACE
    assert not setup.idle()
    other = LeasedQueue(setup.df.bloom.client, DemoSpider(), "demo:requests",
                          tag=setup.tag, policy=OneSlot(), lease_timeout=30)
    other.push(Request("http://a.example/late"))  # another worker queued one since
    assert not in_job(setup.jobs, setup.end.done_now)


def test_the_look_counts_the_queue_puts_dead_workers_leases_back_and_verifies(
        redis_url: str) -> None:
    """What the idle poll asks of Redis, in one job on the Redis thread during a crawl."""
    setup = Setup(redis_url, lease_timeout=0.5)
    try:
        client = setup.df.bloom.client
        setup.queue.push_many([Request(f"http://a.example/{i}") for i in range(3)])
        dead = LeasedQueue(client, DemoSpider(), "demo:requests", tag=setup.tag,
                             policy=OneSlot(), lease_timeout=0.5)
        dead.pop_leases(1)
        look = in_job(setup.jobs, setup.end.look_job())
        assert (look.queued, look.leased, look.verified, look.work) == (2, 1, False, 0)
        assert look.back == []  # its holder heartbeat just now
        time.sleep(0.6)  # it stops heartbeating for a lease timeout
        look = in_job(setup.jobs, setup.end.look_job())
        assert [(n, r.url) for n, r in look.back] == [(1, "http://a.example/0")]
        assert (look.queued, look.leased) == (3, 0)
        assert setup.crawler.stats.get_value("bloomdupe/requeued") is None
        setup.end.looked(look)  # what the poll's answer does with it
        assert setup.crawler.stats.get_value("bloomdupe/requeued") == 1
        assert len(setup.take_all()) == 3
        setup.leases.settle(idle=True)
        assert setup.idle()  # seen empty (its acks sent first): an idle spell begins
        setup.end.busy()  # work seen since
        look = in_job(setup.jobs, setup.end.look_job())
        assert (look.verified, look.work) == (False, 1)  # a look from before is stale
        assert setup.idle()
        look = in_job(setup.jobs, setup.end.look_job())
        # Empty once more: the filter is checked, still there.
        assert (look.queued, look.leased, look.verified) == (0, 0, True)
    finally:
        setup.close()


def test_the_idle_poll_backs_off_while_it_finds_nothing_and_wakes_the_engine_for_work(
        redis_url: str) -> None:
    setup = Setup(redis_url, engine=True)
    try:
        setup.end.wake_later()
        delays = [setup.calls.run() for _ in range(4)]
        # Each poll runs Scrapy's idle round (the grace is not over: it stays).
        assert delays == [IDLE_POLL, 2 * IDLE_POLL, MAX_IDLE_POLL, MAX_IDLE_POLL]
        assert setup.engine.closed == []
        setup.queue.push(Request("http://a.example/1"))  # another worker queued it
        setup.calls.run()
        # The poll leased it; the engine is woken with it (engine.crawl).
        (woken,) = setup.engine.crawled
        assert woken.url == "http://a.example/1" and woken.meta[WAKE_META]
        assert setup.end.idle_poll == IDLE_POLL
        assert setup.leases.take() is woken
    finally:
        setup.close()


def test_the_idle_poll_closes_the_spider_once_the_crawl_is_done(redis_url: str) -> None:
    setup = Setup(redis_url, engine=True, grace=GRACE)
    try:
        setup.end.wake_later()
        setup.calls.run()  # the idle round: the idle spell begins
        assert setup.engine.closed == []
        setup.clock.now += GRACE
        setup.calls.run()
        assert setup.end.crawl_done
        assert setup.engine.closed == ["finished"]
        assert setup.calls.pending() == []  # no more polls
    finally:
        setup.close()


def test_a_busy_engine_is_left_alone_by_the_poll(redis_url: str) -> None:
    setup = Setup(redis_url, engine=True)
    try:
        assert setup.engine is not None
        setup.engine.idle = False
        setup.end.wake_later()
        setup.calls.run()  # nothing held here: look again later
        assert setup.engine.closed == [] and not setup.end.crawl_done
        assert len(setup.calls.pending()) == 1
        setup.end.close()
        assert setup.calls.pending() == []
    finally:
        setup.close()


def test_a_look_answered_later_runs_the_idle_round(redis_url: str) -> None:
    """As during a crawl, the idle handler's look is a job whose answer comes later: the
    worker stays meanwhile, and the answer runs Scrapy's idle round, which acts on it
    (here the crawl is done at once: no grace)."""
    setup = Setup(redis_url, engine=True, grace=0)
    try:
        held = setup.jobs.io = HeldRunner()
        with pytest.raises(DontCloseSpider):
            setup.end.spider_idle(setup.spider)  # no Redis call here: a job is asked
        assert setup.engine is not None and setup.engine.closed == []
        assert held.run_held() == 1  # the look, one job
        assert setup.end.crawl_done
        assert setup.engine.closed == ["finished"]
    finally:
        setup.close()


def test_a_request_found_seen_later_is_dropped_as_scrapy_drops_it(redis_url: str) -> None:
    """As during a crawl, ``enqueue`` answers at once, before Redis: a request then found
    seen before is logged as a duplicate and sent with ``request_dropped``; one answered
    at once (outside a crawl) is refused with False instead, as Scrapy expects."""
    setup = Setup(redis_url, engine=True)
    dropped: list[str] = []

    def on_dropped(request: Request) -> None:
        dropped.append(request.url)

    setup.crawler.signals.connect(on_dropped, signal=signals.request_dropped)
    try:
        assert setup.path.enqueue(Request("http://a.example/1"))  # inline: queued
        assert not setup.path.enqueue(Request("http://a.example/1"))  # inline: a duplicate
        assert dropped == []  # Scrapy's engine sends it for a False
        held = setup.jobs.io = HeldRunner()
        assert setup.path.enqueue(Request("http://a.example/1"))  # said queued, at once
        assert setup.path.enqueuing == 1  # its check is on its way
        setup.calls.run()  # the outbox's gathering ends: one drain, held
        assert held.run_held() == 1
        assert dropped == ["http://a.example/1"]
        assert setup.crawler.stats.get_value("dupefilter/filtered") == 2
        assert setup.path.enqueuing == 0
    finally:
        setup.close()
