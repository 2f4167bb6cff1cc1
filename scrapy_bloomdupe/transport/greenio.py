"""Blocking code on an asyncio loop: the filter's and the queue's logic, written once
on plain calls, run in a greenlet that suspends at each round trip.

During a crawl on Scrapy's asyncio reactor the scheduler runs each of its Redis
jobs with :func:`run_bridged`: the job's code runs in a greenlet of its own; when
it reaches a round trip, the link hands the round trip's coroutine (on a
``redis.asyncio`` connection) to :func:`await_only`, which switches back to the
coroutine that started the job; that one awaits it on the loop, without blocking
it, and switches back into the job with the answer (or the error, raised where the
job waits). A pause (a lock wait, an outage wait) is an ``asyncio.sleep`` the same
way (:func:`pause`). Outside such a job (a tool, a test, the crawl's start and end)
:func:`bridged` is false and the same code makes blocking calls.

This is how SQLAlchemy's asyncio extension runs its synchronous core; the
``greenlet`` package is the one it uses. The alternative, each operation written
as a generator of round trips, would touch every caller of the filter and the
queue.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from greenlet import getcurrent, greenlet  # type: ignore[import-untyped]

T = TypeVar("T")


class _Bridged(greenlet):  # type: ignore[misc]  # greenlet has no annotations
    """The greenlet of one job run by :func:`run_bridged`."""


def bridged() -> bool:
    """Whether this code runs in a job of :func:`run_bridged` (then a round trip must
    be awaited with :func:`await_only`, never made blocking)."""
    return isinstance(getcurrent(), _Bridged)


def await_only(awaitable: Awaitable[T]) -> T:
    """The result of ``awaitable``, awaited on the loop by the job's starter while this
    job is suspended; only inside :func:`run_bridged`."""
    current = getcurrent()
    if not isinstance(current, _Bridged):
        if isinstance(awaitable, Coroutine):
            awaitable.close()  # never to be awaited: no "never awaited" warning
        raise RuntimeError("await_only() outside a job of run_bridged()")
    result: T = current.parent.switch(awaitable)
    return result


async def run_bridged(call: Callable[[], T]) -> T:
    """``call()``, each :func:`await_only` of it awaited here, on the running loop."""
    job = _Bridged(call, getcurrent())
    result: Any = job.switch()
    while not job.dead:
        try:
            value = await result
        except BaseException as error:  # raised in the job, where it awaits
            result = job.throw(error)
        else:
            result = job.switch(value)
    answer: T = result
    return answer


def pause(seconds: float) -> None:
    """Sleep: on the loop inside a job of :func:`run_bridged` (the reactor goes on),
    else ``time.sleep``."""
    if bridged():
        await_only(asyncio.sleep(seconds))
    else:
        time.sleep(seconds)
