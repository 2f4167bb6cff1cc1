"""Where a worker's reactor thread waits for Redis, for the end-to-end crawl benchmark.

A developer's instrument, imported by :mod:`harness.timed` (so every benchmark
worker has it): it times,
on the process's main thread only (Scrapy's reactor), every write of a command
to a redis-py connection and every reply read, and every wait for the
scheduler's frontier lock and for a :class:`~scrapy_bloomdupe.transport.link.Link`'s
lock, and names the package function that made the call (the first frame in
``scrapy_bloomdupe`` above the transport, after "crawl" while the scheduler's
Redis thread runs, else "start/end"). :func:`figures` returns the totals,
which the timed dupefilter writes with its own at spider close. A crawl whose
Redis work is all off the reactor shows zeros here (but for the crawl's start
and end).

It also times the scheduler's jobs on its Redis thread (how long each waited
in line and ran) and how long the engine went without a request after asking
for one. ``BENCH_SWITCH_INTERVAL`` (seconds) sets the worker's
``sys.setswitchinterval``, to see what the Redis thread's wait for the GIL costs.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import defaultdict
from typing import Any

from redis.connection import AbstractConnection

from scrapy_bloomdupe.scheduler import Scheduler
from scrapy_bloomdupe.scheduling.jobs import IOLoop, IOThread, RedisJobs
from scrapy_bloomdupe.transport.link import Link

_MAIN = threading.main_thread()
#: call site -> [seconds, count] of Redis I/O on the reactor thread.
IO: defaultdict[str, list[float]] = defaultdict(lambda: [0.0, 0])
#: lock name -> [seconds, count] of waits for it on the reactor thread.
LOCKS: defaultdict[str, list[float]] = defaultdict(lambda: [0.0, 0])
#: Files below the components, skipped when naming the caller.
_LOW = ("/transport/", "/bloom/", "/frontier/", "/redis/", "reactor_wait.py", "timed.py",
        "/crawlstats.py")


#: Whether a scheduler's Redis thread runs (the crawl, between its start and its end).
_CRAWLING = [False]


def _site() -> str:
    return ("crawl " if _CRAWLING[0] else "start/end ") + _caller()


def _caller() -> str:
    frame = sys._getframe(3)
    while frame is not None:
        name = frame.f_code.co_filename
        if "scrapy_bloomdupe" in name and not any(low in name for low in _LOW):
            return f"{name.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


def _timed(method: Any) -> Any:
    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not _MAIN:
            return method(self, *args, **kwargs)
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            entry = IO[_site()]
            entry[0] += time.perf_counter() - start
            entry[1] += 1
    return timed


AbstractConnection.send_packed_command = _timed(  # type: ignore[method-assign]
    AbstractConnection.send_packed_command)
AbstractConnection.read_response = _timed(  # type: ignore[method-assign]
    AbstractConnection.read_response)


class TimedLock:
    """An RLock that counts the reactor thread's waits for it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.RLock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if threading.current_thread() is not _MAIN:
            return self._lock.acquire(blocking, timeout)
        if self._lock.acquire(False):
            return True
        start = time.perf_counter()
        try:
            return self._lock.acquire(blocking, timeout)
        finally:
            entry = LOCKS[f"{self.name} <- {_site()}"]
            entry[0] += time.perf_counter() - start
            entry[1] += 1

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _with_lock(cls: type, name: str) -> None:
    init = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if hasattr(self, "_lock"):
            self._lock = TimedLock(name)

    cls.__init__ = __init__  # type: ignore[misc]


_with_lock(Scheduler, "Scheduler._lock")
_with_lock(Link, "Link._lock")


def figures() -> dict[str, Any]:
    """Seconds (and counts) the reactor thread spent in Redis I/O and lock waits, by site."""
    return {
        "reactor_redis_seconds": sum(v[0] for v in IO.values()),
        "reactor_lock_seconds": sum(v[0] for v in LOCKS.values()),
        "reactor_redis": {k: [round(v[0], 4), int(v[1])] for k, v in IO.items()},
        "reactor_locks": {k: [round(v[0], 4), int(v[1])] for k, v in LOCKS.items()},
    }


#: job name -> [seconds queued, seconds running, count] on the scheduler's Redis thread.
JOBS: defaultdict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
#: [seconds the engine asked for a request and got none until the next one came, count]
STARVED = [0.0, 0]
_starved_since: list[float | None] = [None]


def _timed_run(run: Any) -> Any:
    def _run(self: Any, call: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(call, "__qualname__", "?")
        for part in ("Scheduler.", "Outbox.", "Leases.", "CrawlEnd."):  # the scheduler's
            name = name.replace(part, "")
        asked = time.perf_counter()

        def timed() -> Any:
            start = time.perf_counter()
            try:
                return call()
            finally:
                entry = JOBS[name]
                entry[0] += start - asked
                entry[1] += time.perf_counter() - start
                entry[2] += 1
        return run(self, timed, *args, **kwargs)
    return _run


def _timed_next(next_request: Any) -> Any:
    def timed(self: Any) -> Any:
        request = next_request(self)
        now = time.perf_counter()
        if request is None:
            if _starved_since[0] is None:
                _starved_since[0] = now
        elif _starved_since[0] is not None:
            STARVED[0] += now - _starved_since[0]
            STARVED[1] += 1
            _starved_since[0] = None
        return request
    return timed


def _flagged(runner: type) -> None:
    """``_CRAWLING`` on while ``runner`` (the Redis thread or the asyncio loop's) runs."""
    start, stop = runner.start, runner.stop  # type: ignore[attr-defined]

    def started(self: Any, reactor: Any) -> None:
        start(self, reactor)
        _CRAWLING[0] = True

    def stopped(self: Any) -> None:
        _CRAWLING[0] = False
        stop(self)

    runner.start, runner.stop = started, stopped  # type: ignore[attr-defined]


_flagged(IOThread)
_flagged(IOLoop)
RedisJobs.run = _timed_run(RedisJobs.run)  # type: ignore[method-assign]
Scheduler.next_request = _timed_next(Scheduler.next_request)  # type: ignore[method-assign]
_figures = figures


def figures() -> dict[str, Any]:  # type: ignore[no-redef]
    return {**_figures(),
            "redis_thread_jobs": {k: [round(v[0], 4), round(v[1], 4), int(v[2])]
                                  for k, v in JOBS.items()},
            "starved": [round(STARVED[0], 4), int(STARVED[1])]}

if os.environ.get("BENCH_SWITCH_INTERVAL"):
    sys.setswitchinterval(float(os.environ["BENCH_SWITCH_INTERVAL"]))
