"""How callbacks' outputs go to Redis together (``scheduling/requestpath.py``'s
Outbox), without a crawl: the
outputs that come within GATHER_DELAY of the first go in one drain (one check-and-queue
against the real filter and queue), each output gets its own answer, an error reaches
every output of its drain, and a drain that does not run (the crawl stopped) answers
every output waiting. The delayed calls run when the test says."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers import Calls, crawler_for
from redis.exceptions import RedisError
from scrapy import Request
from scrapy.utils.misc import build_from_crawler
from twisted.internet import defer
from twisted.python.failure import Failure

from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter
from scrapy_bloomdupe.frontier.queue import PriorityQueue
from scrapy_bloomdupe.scheduling.jobs import Stopped
from scrapy_bloomdupe.scheduling.requestpath import GATHER_DELAY, Drained, Outbox, Output


class Setup:
    """An outbox in front of the real filter and leased queue; its jobs run inline."""

    def __init__(self, redis_url: str) -> None:
        crawler = crawler_for(redis_url, SCHEDULER_PERSIST=True)
        self.df = build_from_crawler(RedisBloomDupeFilter, crawler)
        self.queue = PriorityQueue(self.df.bloom.client, crawler.spider, "demo:requests",
                                   tag=self.df.bloom.key)
        self.calls = Calls()
        self.drains: list[int] = []  # fingerprints checked by each drain
        self.stopped = False
        self.outbox = Outbox(self._run, self._check_and_push, later=self.calls)

    def _run(self, job: Callable[[], Drained]) -> defer.Deferred[Drained]:
        if self.stopped:
            return defer.fail(Stopped("the crawl stopped on an error"))
        return defer.maybeDeferred(job)

    def _check_and_push(self, fps: list[bytes], entries: list[Any],
                        pushed: list[Request]) -> list[bool]:
        self.drains.append(len(fps))
        new: list[bool] = self.df.check_and_queue(fps, self.queue, entries)
        if pushed:
            self.queue.push_many(pushed)
        return new

    def output(self, *urls: str, pushed: tuple[str, ...] = ()) -> Output:
        requests = [Request(url) for url in urls]
        return Output([self.df.fingerprinter.fingerprint(r) for r in requests],
                      [self.queue.entry(r) for r in requests], [Request(u) for u in pushed])


@pytest.fixture
def setup(redis_url: str) -> Iterator[Setup]:
    s = Setup(redis_url)
    yield s
    s.df.close("finished")


def answers(d: defer.Deferred[list[bool]]) -> list[Any]:
    got: list[Any] = []
    d.addBoth(got.append)
    return got


def test_outputs_within_the_gather_delay_go_in_one_drain_each_with_its_answer(
        setup: Setup) -> None:
    first = answers(setup.outbox.send(setup.output("http://a.example/1", "http://a.example/2")))
    second = answers(setup.outbox.send(setup.output("http://a.example/2", "http://a.example/3",
                                                    pushed=("http://a.example/again",))))
    third = answers(setup.outbox.send(setup.output("http://a.example/1")))
    (call,) = setup.calls.pending()  # one drain asked, for the first output waiting
    assert call.delay == GATHER_DELAY
    assert first == second == third == []  # nothing sent yet
    setup.calls.run()
    assert setup.drains == [5]  # one check-and-queue for the three
    # In order: a fingerprint seen earlier in the same drain is not new.
    assert first == [[True, True]]
    assert second == [[False, True]]
    assert third == [[False]]
    assert setup.queue.status() == (4, 0)  # 3 new and the one queued past the filter


def test_the_next_output_asks_for_the_next_drain(setup: Setup) -> None:
    setup.outbox.send(setup.output("http://a.example/1"))
    setup.calls.run()
    assert setup.calls.pending() == []
    later = answers(setup.outbox.send(setup.output("http://a.example/1")))
    assert len(setup.calls.pending()) == 1
    setup.calls.run()
    assert setup.drains == [1, 1]
    assert later == [[False]]


def test_flush_drains_at_once(setup: Setup) -> None:
    got = answers(setup.outbox.send(setup.output("http://a.example/1")))
    (call,) = setup.calls.pending()
    setup.outbox.flush()  # the crawl closes: the outputs gathering go now
    assert call.cancelled
    assert got == [[True]]
    setup.outbox.flush()  # nothing gathering: nothing sent
    assert setup.drains == [1]


def test_an_error_of_the_drain_reaches_every_output_in_it(setup: Setup) -> None:
    first = answers(setup.outbox.send(setup.output("http://a.example/1")))
    second = answers(setup.outbox.send(setup.output("http://a.example/2")))
    setup.df.bloom.client.set(setup.queue.sink_keys(0)[0], "not a list")  # a WRONGTYPE reply
    setup.calls.run()
    for got in (first, second):
        (failure,) = got
        assert isinstance(failure, Failure)
        assert failure.check(RedisError), failure  # each caller acts on it


def test_a_drain_that_does_not_run_answers_every_output_waiting(setup: Setup) -> None:
    first = answers(setup.outbox.send(setup.output("http://a.example/1")))
    second = answers(setup.outbox.send(setup.output("http://a.example/2")))
    setup.stopped = True
    setup.calls.run()
    assert setup.drains == []
    for got in (first, second):
        (failure,) = got
        assert isinstance(failure, Failure) and failure.check(Stopped)
    # The outbox is empty and asks for the next drain again.
    setup.stopped = False
    third = answers(setup.outbox.send(setup.output("http://a.example/3")))
    setup.calls.run()
    assert third == [[True]]
