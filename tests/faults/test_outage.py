"""Redis outages: waited out with backoff, one error each, no request dropped."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from helpers import EXAMPLE_PROJECT, crawler_for
from scrapy import Request
from scrapy.utils.misc import build_from_crawler

from scrapy_bloomdupe.bloom.forgetting import FORGET_CHECK_EVERY
from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter
from scrapy_bloomdupe.scheduler import Scheduler
from scrapy_bloomdupe.testing import RedisServer, free_port, redisbloom_module
from scrapy_bloomdupe.transport.outage import OutageGuard, RedisUnavailable


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def failing(times: int, error: Exception) -> Any:
    calls = {"n": 0}

    def call() -> str:
        calls["n"] += 1
        if calls["n"] <= times:
            raise error
        return "ok"

    return call


def test_a_dropped_connection_is_sent_again_at_once_in_silence(
        caplog: pytest.LogCaptureFixture) -> None:
    # A Redis restarted since the last round trip: its connections are gone, and a
    # new one answers. Not an outage (no pause, no ERROR); a timeout is (no new
    # connection makes a slow Redis answer sooner).
    t = FakeTime()
    guard = OutageGuard(60, "here", clock=t.clock, sleep=t.sleep)
    with caplog.at_level(logging.INFO, logger="scrapy_bloomdupe.transport.outage"):
        assert guard.call(failing(1, redis.ConnectionError("closed by server"))) == "ok"
        assert t.sleeps == [] and guard.outages == 0 and not caplog.records
        assert guard.call(failing(1, redis.TimeoutError("timed out"))) == "ok"
    assert t.sleeps == [0.25] and guard.outages == 1


def test_guard_waits_out_an_outage_with_short_pauses(caplog: pytest.LogCaptureFixture) -> None:
    t = FakeTime()
    guard = OutageGuard(60, "here", clock=t.clock, sleep=t.sleep)
    with caplog.at_level(logging.INFO, logger="scrapy_bloomdupe.transport.outage"):
        # Six failures: the first is sent again at once (a dropped connection), then
        # the wait.
        assert guard.call(failing(6, redis.ConnectionError("refused"))) == "ok"
    # Half a second at most: the crawl resumes soon after Redis is back.
    assert t.sleeps == [0.25, 0.5, 0.5, 0.5, 0.5]
    assert guard.outages == 1 and guard.outage_time == pytest.approx(2.25)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "unavailable" in errors[0].getMessage()
    assert "back after 2.2s" in caplog.text


def test_guard_gives_up_after_the_timeout() -> None:
    t = FakeTime()
    guard = OutageGuard(10, "here", clock=t.clock, sleep=t.sleep)
    with pytest.raises(RedisUnavailable, match="stayed unavailable for 10"):
        guard.call(failing(1000, redis.TimeoutError("timed out")))
    assert sum(t.sleeps) == pytest.approx(10)
    assert max(t.sleeps) <= 0.5


def test_guard_does_not_wait_on_other_errors() -> None:
    guard = OutageGuard(10, "here", sleep=lambda s: pytest.fail("slept"))
    with pytest.raises(redis.ResponseError):
        guard.call(failing(1, redis.ResponseError("WRONGTYPE")))


@pytest.fixture
def durable() -> Iterator[RedisServer]:
    """A Redis of its own with AOF, to kill and restart."""
    with RedisServer(persist=True) as server:
        yield server


@pytest.fixture
def durable_engine(engine: str) -> Iterator[RedisServer]:
    """Like ``durable``, per engine: with RedisBloom loaded for ``"redisbloom"`` (which
    ``"auto"`` then picks; a restart loads it again, and its filters come back from the
    AOF)."""
    module = redisbloom_module() if engine == "redisbloom" else None
    with RedisServer(persist=True, modules=[module] if module else []) as server:
        yield server


def outage_crawler(url: str, **settings: Any) -> Any:
    """A demo crawler that gives up on a dead connection within a second, and persists."""
    fast = {"socket_timeout": 1, "socket_connect_timeout": 1, "retry": None}
    return crawler_for(url, **{"REDIS_PARAMS": fast, "SCHEDULER_PERSIST": True,
                                    **settings})


def restart_later(server: RedisServer, delay: float) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        server.start()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("use_lock", [True, False], ids=["lock", "atomic"])
def test_redis_killed_and_restarted_loses_nothing(durable_engine: RedisServer, engine: str,
                                                  use_lock: bool,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    durable = durable_engine
    crawler = outage_crawler(durable.url, BLOOMDUPE_OUTAGE_TIMEOUT=30, BLOOMDUPE_LOCK=use_lock)
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    assert df.bloom.engine_name == engine
    before = [Request(f"http://a.example/{i}") for i in range(50)]
    assert not any(df.request_seen(r) for r in before)
    durable.kill()
    thread = restart_later(durable, 1.5)
    started = time.monotonic()
    with caplog.at_level(logging.INFO):
        # Blocks through the outage, then answers correctly.
        assert not df.request_seen(Request("http://a.example/new"))
        assert not any(df.requests_seen([Request(f"http://a.example/b{i}") for i in range(20)]))
    thread.join()
    assert time.monotonic() - started >= 1.0
    # The AOF kept what was added before the crash.
    assert all(df.request_seen(r) for r in before)
    assert df.request_seen(Request("http://a.example/new"))
    assert [r.levelno for r in caplog.records if "unavailable" in r.getMessage()] == [
        logging.ERROR]
    assert "is back after" in caplog.text
    df.update_stats()
    assert crawler.stats.get_value("bloomdupe/outages") == 1
    assert crawler.stats.get_value("bloomdupe/unchecked") == 0


def test_allow_lets_requests_through_unchecked(durable: RedisServer) -> None:
    crawler = outage_crawler(durable.url, BLOOMDUPE_OUTAGE_TIMEOUT=0.5, BLOOMDUPE_ON_OUTAGE="allow")
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    other = build_from_crawler(RedisBloomDupeFilter, outage_crawler(durable.url))
    other.request_seen(Request("http://a.example/b"))  # another worker's
    df.request_seen(Request("http://a.example/"))  # it reads the forget counter too
    durable.kill()
    # Known to this worker (its local cache), within FORGET_CHECK_EVERY of its last
    # read of the forget counter: still answered, as Redis would.
    assert df.request_seen(Request("http://a.example/"))
    # In Redis but not known here: not dropped as a duplicate for want of
    # Redis, but passed on unchecked, and counted.
    assert not df.request_seen(Request("http://a.example/b"))
    assert not any(df.requests_seen([Request("http://a.example/x")]))
    assert df.unchecked == 2 and df.redis_errors == 2
    # Past FORGET_CHECK_EVERY without a read of that counter, the cache no longer
    # answers (a forget may have been made since): unchecked too.
    time.sleep(FORGET_CHECK_EVERY)
    assert not df.request_seen(Request("http://a.example/"))
    assert df.unchecked == 3


def test_close_stops_the_crawl_and_drops_nothing(durable: RedisServer,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    crawler = outage_crawler(durable.url, BLOOMDUPE_OUTAGE_TIMEOUT=0.5)
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    durable.kill()
    with caplog.at_level(logging.ERROR):
        assert not df.request_seen(Request("http://a.example/"))
    assert "Stopping the crawl" in caplog.text
    assert df.unchecked == 1


@pytest.mark.parametrize("queue_cls, says", [
    (None, "the requests in progress stay leased in Redis"),
    ("scrapy_redis.queue.FifoQueue", "did not finish are in the filter and in no queue"),
])
def test_the_stop_line_says_what_becomes_of_the_requests_in_progress(
        durable: RedisServer, caplog: pytest.LogCaptureFixture, queue_cls: str | None,
        says: str) -> None:
    # A scrapy-redis queue class keeps no leases: the line must not promise them.
    extra = {"SCHEDULER_QUEUE_CLASS": queue_cls} if queue_cls else {}
    crawler = outage_crawler(durable.url, BLOOMDUPE_OUTAGE_TIMEOUT=0.3, **extra)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    durable.kill()
    with caplog.at_level(logging.ERROR):
        scheduler.enqueue_request(Request("http://a.example/1"))
    (line,) = [r.getMessage() for r in caplog.records if "Stopping the crawl" in r.getMessage()]
    assert says in line


def test_scheduler_waits_for_its_queue_too(durable: RedisServer) -> None:
    crawler = outage_crawler(durable.url, BLOOMDUPE_OUTAGE_TIMEOUT=30)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    assert scheduler.enqueue_request(Request("http://a.example/1"))
    durable.kill()
    thread = restart_later(durable, 1.0)
    assert scheduler.enqueue_request(Request("http://a.example/2"))
    thread.join()
    urls = {scheduler.next_request().url, scheduler.next_request().url}  # type: ignore[union-attr]
    assert urls == {"http://a.example/1", "http://a.example/2"}
    durable.kill()
    scheduler.df.outage.timeout = 0.3
    # While Redis is away past the timeout: nothing to hand out, but not idle.
    assert scheduler.next_request() is None
    assert scheduler.has_pending_requests()


def test_scrapy_crawl_without_redis_fails_with_one_clear_error() -> None:
    url = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    proc = subprocess.run(
        [sys.executable, "-m", "scrapy", "crawl", "site", "-s", f"REDIS_URL={url}",
         "-s", "LOG_LEVEL=INFO"],
        cwd=EXAMPLE_PROJECT, capture_output=True, text=True, timeout=120,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert output.count("Cannot reach Redis at 127.0.0.1:") >= 1
    assert "Start Redis or point REDIS_URL" in output
    assert "s3cret" not in output
