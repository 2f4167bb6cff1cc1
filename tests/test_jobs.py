"""Where a crawl's Redis jobs run (``scheduling/jobs.py``): the Redis thread (the
fallback) and Scrapy's asyncio loop, each with a real reactor in a process of its own (a
test process must not install a reactor others then share)."""

from __future__ import annotations

import pytest
from helpers import run_python

from scrapy_bloomdupe.scheduling.health import CrawlHealth
from scrapy_bloomdupe.scheduling.jobs import RedisJobs
from scrapy_bloomdupe.transport.outage import OutageGuard

DRAINED_DESPITE_A_PAUSED_CHAIN = '''
import time
from twisted.internet import defer, reactor
from scrapy_bloomdupe.scheduling.jobs import IOThread

io = IOThread()
order = []

def stopped():
    raise RuntimeError("the crawl stopped")

def main():
    io.start(reactor)
    io.run(time.sleep, 0.3)  # a job still running when the others are asked
    # A caller whose chain pauses for good once its job fails, as the scheduler's
    # run(quiet=True) does for a job not run after the crawl stopped on an error.
    io.run(stopped).addErrback(lambda failure: defer.Deferred())
    io.run(lambda: 1).addCallback(lambda _: order.append("callback"))
    def drained(_):
        order.append("drained")
        print(order)
        reactor.stop()
    io.drained().addCallback(drained)
    reactor.callLater(10, lambda: (print("not drained", order), reactor.stop()))

reactor.callWhenRunning(main)
reactor.run()
io.stop()
'''


def test_drained_fires_after_the_callbacks_even_when_a_chain_pauses_for_good() -> None:
    """A job's caller whose chain pauses for good (a Deferred that never fires) does not
    keep drained() from firing: a worker stopping on a Redis error waits for drained()
    at close, and one such periodic job asked meanwhile kept it open until SIGKILL. It
    still fires only after the callers' callbacks have run."""
    out = run_python(DRAINED_DESPITE_A_PAUSED_CHAIN)
    assert out.strip() == "['callback', 'drained']", out


IN_ORDER_WITHOUT_BLOCKING = '''
from twisted.internet import asyncioreactor
asyncioreactor.install()
from twisted.internet import defer, reactor, task
from scrapy_bloomdupe.scheduling.jobs import IOLoop
from scrapy_bloomdupe.transport.onloop import pause

io = IOLoop()
order, ticks = [], []

def job(name, seconds):
    order.append(name + " starts")
    pause(seconds)
    order.append(name + " ends")
    return name

def stopped():
    raise RuntimeError("the crawl stopped")

def main():
    io.start(reactor)
    ticking = task.LoopingCall(lambda: ticks.append(1))
    ticking.start(0.01)
    io.run(job, "a", 0.2)
    io.run(stopped).addErrback(lambda failure: defer.Deferred())  # a chain paused for good
    io.run(job, "b", 0.0).addCallback(lambda name: order.append("callback " + name))
    def drained(_):
        ticking.stop()
        order.append("drained")
        print(order, len(ticks) >= 10)
        reactor.stop()
    io.drained().addCallback(drained)
    reactor.callLater(10, lambda: (print("not drained", order), reactor.stop()))

reactor.callWhenRunning(main)
reactor.run()
io.stop()
print(io.inline)
'''


def test_jobs_run_in_order_and_their_pauses_leave_the_reactor_running() -> None:
    """One job at a time, in the order asked (b waits for a, even while a pauses);
    the reactor runs during a's pause (a looping call ticks); drained() fires after
    the callbacks, despite a caller whose chain pauses for good."""
    out = run_python(IN_ORDER_WITHOUT_BLOCKING)
    assert out.split("\n")[:2] == [
        "['a starts', 'a ends', 'b starts', 'b ends', 'callback b', 'drained'] True",
        "True"], out


def test_a_redis_call_is_made_only_inside_a_job() -> None:
    """``RedisJobs.call``, the one way a part of the scheduler reaches Redis, refuses to
    run outside a job of ``RedisJobs.run`` (a tool's and a test's run at once)."""
    jobs = RedisJobs(CrawlHealth(OutageGuard(0, "here")))
    with pytest.raises(RuntimeError, match="outside a job"):
        jobs.call(lambda: 1)
    answers: list[int] = []
    jobs.run(lambda: jobs.call(lambda: 1) + jobs.call(lambda: 1, fallback=0)).addCallback(
        answers.append)
    assert answers == [2]
