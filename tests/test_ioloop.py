"""The crawl's Redis jobs on Scrapy's asyncio loop (``frontier/ioloop.py``), with a real
asyncio reactor in a process of its own (a test process must not install a reactor
others then share)."""

from __future__ import annotations

from helpers import run_python

IN_ORDER_WITHOUT_BLOCKING = '''
from twisted.internet import asyncioreactor
asyncioreactor.install()
from twisted.internet import defer, reactor, task
from scrapy_bloomdupe.frontier.ioloop import IOLoop
from scrapy_bloomdupe.transport.greenio import pause

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
