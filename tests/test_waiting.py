"""The dupefilter's checks as jobs when no scheduler of this package runs
(``scheduling/waiting.py``): ``request_seen`` never waits for Redis during a crawl; a
request it holds is crawled again once Redis answers new, logged once Redis answers
seen, and kept in memory meanwhile (the crawl does not end; past the bound the engine
pauses). Its jobs are held by a runner as during a crawl (``HeldRunner``) until the
test runs them; a real redis-server."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import Engine, HeldRunner, crawler_for, run_python
from scrapy.exceptions import DontCloseSpider
from scrapy.http import Request
from scrapy.utils.misc import build_from_crawler

from scrapy_bloomdupe import keys
from scrapy_bloomdupe.dupefilter import CLOSE_REASON, RedisBloomDupeFilter
from scrapy_bloomdupe.testing import RedisServer


class PausingEngine(Engine):
    def __init__(self, spider: Any) -> None:
        super().__init__(spider)
        self.paused = False

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False


def crawling(url: str, **settings: Any) -> tuple[RedisBloomDupeFilter, HeldRunner,
                                                  PausingEngine]:
    """The dupefilter alone as during a crawl: its jobs held, an engine that records."""
    crawler = crawler_for(url, **settings)
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    held = df.jobs.io = HeldRunner()
    engine = crawler.engine = PausingEngine(crawler.spider)
    return df, held, engine


def test_request_seen_holds_a_request_until_redis_answers(redis_url: str) -> None:
    df, held, engine = crawling(redis_url)
    seen_before = Request("http://a.example/old")
    df.bloom.add(df.fingerprinter.fingerprint(seen_before))
    new = Request("http://a.example/new")
    # Scrapy drops both for now, and logs them as duplicates: not counted yet.
    assert df.request_seen(new) and df.request_seen(seen_before)
    df.log(new, None)
    df.log(seen_before, None)
    assert df.stats.get_value("dupefilter/filtered") is None
    with pytest.raises(DontCloseSpider):  # the crawl does not end while they wait
        df.waiting.spider_idle()
    assert held.run_held() == 1  # both in one job
    # The new one is given to the engine again, and let through once; the other is a
    # duplicate, counted now.
    assert engine.crawled == [new]
    assert df.request_seen(new) is False
    assert df.stats.get_value("dupefilter/filtered") == 1
    df.waiting.spider_idle()
    df.bloom.close()


@pytest.mark.parametrize("persist", [True, False])
def test_a_request_redis_takes_as_new_after_the_crawl_closed_is_re_admitted(
        redis_url: str, persist: bool) -> None:
    """Held when the crawl closes (Ctrl-C, a CLOSESPIDER_* limit), answered new after:
    Scrapy's scheduler is closed and it is not queued, so the filter re-admits it (as
    ``bloomdupe forget`` does): the next crawl's check answers it new, once. Without
    SCHEDULER_PERSIST the filter is deleted at the close: nothing is written back."""
    df, held, engine = crawling(redis_url, SCHEDULER_PERSIST=persist)
    late = Request("http://a.example/late")
    fp = df.fingerprinter.fingerprint(late)
    assert df.request_seen(late)  # held
    closing = df.close("shutdown")
    assert held.run_held() == 2  # its check, then the close: Redis answers new
    assert closing is not None and engine.crawled == []
    assert df.waiting.too_late == 1
    assert held.run_held() == 1  # the re-admission, after the close
    client = df.bloom.client
    if persist:
        assert df.bloom.add_many([fp]) == [True]  # the next check answers it new, once
        assert df.bloom.add_many([fp]) == [False]
    else:  # but the mark of a closed crawl (a worker paused past it reads it)
        assert client.keys("*") == [keys.finished(df.bloom.key).encode()]


def test_the_least_privilege_acl_grants_the_re_admission(
        caplog: pytest.LogCaptureFixture) -> None:
    """docs/security.md's ACL (the Lua engine's line, for the demo spider's key) lets a
    request Redis takes as new after the close be re-admitted: no ERROR, no denial, and
    the next check answers it new, once."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "security.md").read_text()
    line = next(t for t in doc.splitlines() if t.startswith("ACL SETUSER crawler "))
    rules = [r.replace("myspider", "demo").replace(">the-password", ">pw")
             for r in line.split()[3:]]
    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url)
        admin.execute_command("ACL", "SETUSER", "crawler", *rules)
        df, held, _ = crawling(server.url.replace("redis://", "redis://crawler:pw@"),
                               SCHEDULER_PERSIST=True)
        late = Request("http://a.example/late")
        fp = df.fingerprinter.fingerprint(late)
        assert df.request_seen(late)
        df.close("shutdown")
        held.run_held()
        with caplog.at_level(logging.ERROR, logger="scrapy_bloomdupe.scheduling.waiting"):
            assert held.run_held() == 1  # the re-admission
        assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == []
        denied = {e[b"object"] for e in admin.execute_command("ACL", "LOG")}
        assert denied <= {b"config|get"}, denied  # the persistence check's, tolerated
        bloom = build_from_crawler(RedisBloomDupeFilter, crawler_for(server.url)).bloom
        assert bloom.add_many([fp]) == [True]
        assert bloom.add_many([fp]) == [False]
        bloom.close()
        admin.close()


def test_a_re_admission_the_acl_refuses_is_one_error_naming_the_forget_to_run(
        caplog: pytest.LogCaptureFixture) -> None:
    """An ACL without ``+sadd`` (docs/security.md's grants it): the request is not
    re-admitted, and one ERROR names it and the ``bloomdupe forget`` that does."""
    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url)
        admin.acl_setuser("crawler", enabled=True, passwords=["+pw"], keys=["*"],
                          commands=["+@all", "-sadd"])
        df, held, _ = crawling(server.url.replace("redis://", "redis://crawler:pw@"),
                                    SCHEDULER_PERSIST=True)
        late = Request("http://a.example/late")
        assert df.request_seen(late)
        df.close("shutdown")
        held.run_held()
        with caplog.at_level(logging.ERROR, logger="scrapy_bloomdupe.scheduling.waiting"):
            assert held.run_held() == 1
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "bloomdupe forget http://a.example/late" in errors[0]
        admin.close()


def test_past_the_bound_the_engine_pauses_until_redis_answers(redis_url: str) -> None:
    df, held, engine = crawling(redis_url)
    df.waiting.limit = 4
    for i in range(4):
        df.request_seen(Request(f"http://a.example/{i}"))
    assert engine.paused
    held.run_held()
    assert not engine.paused and len(engine.crawled) == 4
    df.bloom.close()


def test_the_middlewares_check_is_a_job_too(redis_url: str) -> None:
    df, held, _ = crawling(redis_url)
    requests = [Request("http://a.example/1"), Request("http://a.example/1#same")]
    answer: list[list[bool]] = []
    df.check_later(requests).addCallback(answer.append)
    assert answer == []  # nothing waited for here
    held.run_held()
    assert answer == [[False, True]]
    assert df.request_seen(requests[0]) is False  # marked: let through once
    df.bloom.close()


@pytest.mark.parametrize("on_outage", ["close", "allow"])
def test_an_outage_past_its_timeout_stops_the_crawl_or_lets_them_through(on_outage: str
                                                                         ) -> None:
    with RedisServer() as server:
        df, held, engine = crawling(
            server.url, BLOOMDUPE_OUTAGE_TIMEOUT=0.3, BLOOMDUPE_ON_OUTAGE=on_outage,
            REDIS_PARAMS={"socket_timeout": 1, "socket_connect_timeout": 1, "retry": None})
        server.kill()
        request = Request("http://a.example/")
        assert df.request_seen(request)  # held: no wait here
        held.run_held()
    if on_outage == "close":
        assert df.failure == CLOSE_REASON and engine.closed == [CLOSE_REASON]
        assert engine.crawled == []  # the stop says what became of it
    else:
        assert df.failure is None and engine.crawled == [request] and df.unchecked == 1
    assert not df.waiting.held


KILLED_REDIS_ON_THE_LOOP = '''
import sys
import time
sys.path.insert(0, "tests")
from twisted.internet import asyncioreactor
asyncioreactor.install()
from twisted.internet import reactor, task
from scrapy.http import Request
from scrapy.utils.misc import build_from_crawler
from helpers import Engine, crawler_for
from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter
from scrapy_bloomdupe.testing import RedisServer

server = RedisServer().start()
crawler = crawler_for(server.url, BLOOMDUPE_OUTAGE_TIMEOUT=3, REDIS_PARAMS={"retry": None})
df = build_from_crawler(RedisBloomDupeFilter, crawler)
crawler.engine = Engine(crawler.spider)
gaps, last = [], [time.monotonic()]

def tick():
    now = time.monotonic()
    gaps.append(now - last[0])
    last[0] = now

def main():
    task.LoopingCall(tick).start(0.05)
    server.kill()
    started = time.monotonic()
    held = df.request_seen(Request("http://a.example/"))
    print("request_seen", held, round(time.monotonic() - started, 3))
    reactor.callLater(4.5, lambda: (print("failure", df.failure, "longest gap",
                                          max(gaps) < 0.5), reactor.stop()))

reactor.callWhenRunning(main)
reactor.run()
'''


def test_request_seen_never_waits_for_a_dead_redis_on_the_loop() -> None:
    """Scrapy's asyncio reactor running, Redis killed, ``BLOOMDUPE_OUTAGE_TIMEOUT = 3``:
    ``request_seen`` answers at once (it froze the loop 3.06 s, waiting out the
    outage), the loop keeps turning while a job waits the outage out, and the crawl
    stops once it is over."""
    out = run_python(KILLED_REDIS_ON_THE_LOOP)
    seen, took = out.split("\n")[0].split()[1:]
    assert seen == "True" and float(took) < 0.1, out
    assert "failure bloomdupe_redis_unavailable longest gap True" in out, out
