"""Scrapy's scheduler contract, on this package's scheduler (issue 49, item 8): the
behaviours Scrapy's own ``SchedulerTestMixin`` checks on its scheduler (tests/test_scheduler.py
in Scrapy), written here for a shared queue in Redis.

* ``len(scheduler)`` and ``has_pending_requests()`` count what this worker queued and what
  a resumed crawl holds (``SCHEDULER_PERSIST``: the queue a closed worker left), without a
  round trip;
* ``next_request()`` hands out every request once, the highest priority first;
* once each is handed out, nothing is pending and the length is 0.

Each behaviour runs fresh and reopened (Scrapy's in-memory and on-disk cases), in each
``BLOOMDUPE_POLITENESS`` (the downloader-aware cases: "crawl" keeps download slots): 12
cases. They run twice: with no reactor (the jobs run inline, in the caller's thread, and
Scrapy's strict contract holds: ``next_request()`` is never None while requests are
pending), and under Scrapy's asyncio reactor in a process of its own, where the Redis work
runs on the reactor's loop and an answer may come a moment later: there the test waits
for it as a crawl does (the engine asks again), a reactor turn at a time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
import redis
from helpers import crawler_for, run_python
from scrapy import Request

from scrapy_bloomdupe.scheduler import Scheduler

URLS = ["http://foo.example/a", "http://foo.example/b", "http://foo.example/c"]
PRIORITIES = [("http://foo.example/p1", -2), ("http://foo.example/p2", 1),
              ("http://foo.example/p3", -1), ("http://foo.example/p4", 0),
              ("http://foo.example/p5", 2)]
#: How long a dequeue may wait, in all, for the answers it needs (seconds; a loaded CI).
MOST_WAIT = 20.0

Wait = Callable[[], Awaitable[None]]


async def opened(url: str, politeness: str) -> Scheduler:
    """A scheduler opened as Scrapy opens it (its ``open``'s Deferred awaited), on a
    crawl that persists (the reopened cases' second worker finds what the first left)."""
    crawler = crawler_for(url, SCHEDULER_PERSIST=True, BLOOMDUPE_POLITENESS=politeness)
    scheduler = Scheduler.from_crawler(crawler)
    await scheduler.open(crawler.spider)
    return scheduler


async def closed(scheduler: Scheduler) -> None:
    done = scheduler.close("finished")
    if done is not None:
        await done


async def scheduler_after(url: str, politeness: str, reopen: bool,
                          setup: Callable[[Scheduler], None]) -> Scheduler:
    """A scheduler on which ``setup`` ran, or (``reopen``) a new one opened on the crawl
    that the one ``setup`` ran on left when it closed."""
    scheduler = await opened(url, politeness)
    setup(scheduler)
    if not reopen:
        return scheduler
    await closed(scheduler)
    return await opened(url, politeness)


async def dequeue(scheduler: Scheduler, wait: Wait) -> tuple[list[Request], int]:
    """Every request the scheduler hands out while it has some pending, and how many
    times it had none at hand yet (each followed by a reactor turn)."""
    handed: list[Request] = []
    waits = 0
    deadline = time.monotonic() + MOST_WAIT
    while scheduler.has_pending_requests():
        request = scheduler.next_request()
        if request is not None:
            handed.append(request)
            continue
        waits += 1
        assert time.monotonic() < deadline, f"still pending after {waits} turns, " \
            f"{len(handed)} handed"
        await wait()
    return handed, waits


async def length(url: str, politeness: str, reopen: bool, wait: Wait) -> int:
    def setup(scheduler: Scheduler) -> None:
        assert not scheduler.has_pending_requests()
        assert len(scheduler) == 0
        for u in URLS:
            assert scheduler.enqueue_request(Request(u))
        # Counted at once, while their check-and-queue is on its way.
        assert scheduler.has_pending_requests()
        assert len(scheduler) == len(URLS)

    scheduler = await scheduler_after(url, politeness, reopen, setup)
    assert scheduler.has_pending_requests()
    assert len(scheduler) == len(URLS)
    await closed(scheduler)
    return 0


async def dequeue_all(url: str, politeness: str, reopen: bool, wait: Wait) -> int:
    def setup(scheduler: Scheduler) -> None:
        for u in URLS:
            scheduler.enqueue_request(Request(u))

    scheduler = await scheduler_after(url, politeness, reopen, setup)
    handed, waits = await dequeue(scheduler, wait)
    assert sorted(r.url for r in handed) == URLS
    assert len(scheduler) == 0
    await closed(scheduler)
    return waits


async def dequeue_by_priority(url: str, politeness: str, reopen: bool, wait: Wait) -> int:
    def setup(scheduler: Scheduler) -> None:
        for u, priority in PRIORITIES:
            scheduler.enqueue_request(Request(u, priority=priority))

    scheduler = await scheduler_after(url, politeness, reopen, setup)
    handed, waits = await dequeue(scheduler, wait)
    assert [r.priority for r in handed] == sorted((p for _, p in PRIORITIES), reverse=True)
    assert len(scheduler) == 0
    await closed(scheduler)
    return waits


BEHAVIOURS = {"length": length, "dequeue": dequeue_all, "dequeue_priorities": dequeue_by_priority}
CASES = [(name, politeness, reopen) for name in BEHAVIOURS for politeness in ("worker", "crawl")
         for reopen in (False, True)]
CASE_IDS = [f"{name}-{politeness}-{'reopened' if reopen else 'fresh'}"
            for name, politeness, reopen in CASES]


def run_at_once(coroutine: Coroutine[Any, Any, int]) -> int:
    """The coroutine run to its end without a reactor: every Deferred it awaits has fired
    (no runner: each job ran in the caller's thread), so it never suspends."""
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return int(stop.value)
    coroutine.close()
    raise AssertionError("suspended: a Deferred was not answered at once without a reactor")


async def no_wait() -> None:
    raise AssertionError("next_request() gave None while requests were pending")


@pytest.mark.parametrize(("name", "politeness", "reopen"), CASES, ids=CASE_IDS)
def test_without_a_reactor(durable_redis: str, name: str, politeness: str, reopen: bool
                           ) -> None:
    assert run_at_once(BEHAVIOURS[name](durable_redis, politeness, reopen, no_wait)) == 0


UNDER_ASYNCIO = '''
import json, sys, traceback
from twisted.internet import asyncioreactor
asyncioreactor.install()
from twisted.internet import defer, reactor, task
sys.path.insert(0, "tests")
import redis
from test_scheduler_contract import BEHAVIOURS, CASES

URL = "REDIS_URL"
results = {}

async def turn():
    await task.deferLater(reactor, 0.005, lambda: None)

async def main():
    client = redis.Redis.from_url(URL)
    for name, politeness, reopen in CASES:
        client.flushall()
        case = f"{name} {politeness} {reopen}"
        try:
            waits = await BEHAVIOURS[name](URL, politeness, reopen, turn)
            results[case] = ["passed", waits]
        except BaseException:
            results[case] = ["failed", traceback.format_exc(limit=4)]
    client.close()

def run():
    defer.ensureDeferred(main()).addBoth(lambda _: reactor.stop())

reactor.callWhenRunning(run)
reactor.run()
print(json.dumps(results))
'''


@pytest.fixture(scope="module")
def under_asyncio(redis_server: Any) -> dict[str, list[Any]]:
    """Every case run under Scrapy's asyncio reactor, in one process of its own (a test
    process must not install a reactor); each case's outcome."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    before = client.config_get("save")["save"]
    client.config_set("save", "3600 1")  # a persisting crawl's Redis (see durable_redis)
    try:
        out = run_python(UNDER_ASYNCIO.replace("REDIS_URL", redis_server.url))
    finally:
        client.config_set("save", before)
        client.flushall()
        client.close()
    results: dict[str, list[Any]] = json.loads(out.strip().splitlines()[-1])
    return results


@pytest.mark.parametrize(("name", "politeness", "reopen"), CASES, ids=CASE_IDS)
def test_under_the_asyncio_reactor(under_asyncio: dict[str, list[Any]], name: str,
                                   politeness: str, reopen: bool) -> None:
    outcome, detail = under_asyncio[f"{name} {politeness} {reopen}"]
    assert outcome == "passed", detail
