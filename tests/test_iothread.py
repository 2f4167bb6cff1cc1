"""The scheduler's Redis thread (``frontier/iothread.py``), with a real reactor in a
process of its own (a test process must not install a reactor others then share)."""

from __future__ import annotations

from helpers import run_python

DRAINED_DESPITE_A_PAUSED_CHAIN = '''
import time
from twisted.internet import defer, reactor
from scrapy_bloomdupe.frontier.iothread import IOThread

io = IOThread()
order = []

def stopped():
    raise RuntimeError("the crawl stopped")

def main():
    io.start(reactor)
    io.run(time.sleep, 0.3)  # a job still running when the others are asked
    # A caller whose chain pauses for good once its job fails, as the scheduler's
    # in_redis_thread does for a job not run after the crawl stopped on an error.
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
