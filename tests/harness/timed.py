"""Dupefilters that time themselves: the end-to-end benchmarks' instrument, and tests'.

``DUPEFILTER_CLASS = "harness.timed.TimedRedisBloomDupeFilter"`` (or
``TimedScrapyRedisDupeFilter``; ``tests/`` on the worker's ``PYTHONPATH``) with
``BENCH_TIMING_DIR`` set: at spider close each worker writes
``<BENCH_TIMING_DIR>/<pid>.json``, its time in dedup beside its own CPU and wall time
(docs/benchmarks.md, section f), its Redis round trips and what each carried
(:mod:`harness.round_trips`), and what its reactor waited for
(:mod:`harness.reactor_wait`). Nothing of the filtering changes.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from scrapy import signals
from scrapy_redis.dupefilter import RFPDupeFilter

from harness import reactor_wait
from harness.round_trips import CARRIED, ROUND_TRIPS
from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter

T = TypeVar("T")


class _Clock:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.dedup_cpu = 0.0
        self.dedup_wall = 0.0
        self.calls = 0
        self.requests = 0
        self.start_cpu = time.process_time()
        self.start_wall = time.perf_counter()
        directory = crawler.settings.get("BENCH_TIMING_DIR")
        self.path = Path(directory) / f"{os.getpid()}.json" if directory else None
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    def timed(self, requests: int, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)``, its CPU and wall time added to the totals."""
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            return call(*args)
        finally:
            self.dedup_cpu += time.process_time() - cpu
            self.dedup_wall += time.perf_counter() - wall
            self.calls += 1
            self.requests += requests

    def spider_closed(self, spider: Any, reason: str) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({
            "dedup_cpu": self.dedup_cpu, "dedup_wall": self.dedup_wall,
            "round_trips": ROUND_TRIPS[0], "carried": dict(CARRIED), "calls": self.calls,
            "requests": self.requests,
            "worker_cpu": time.process_time() - self.start_cpu,
            "worker_wall": time.perf_counter() - self.start_wall,
            "process_cpu": time.process_time(), "reason": reason,
            **reactor_wait.figures(),
        }))


class TimedRedisBloomDupeFilter(RedisBloomDupeFilter):
    """This package's dupefilter, timed."""

    _clock: _Clock

    @classmethod
    def from_crawler(cls, crawler: Any) -> TimedRedisBloomDupeFilter:
        instance = super().from_crawler(crawler)
        instance._clock = _Clock(crawler)
        return instance

    def request_seen(self, request: Any) -> bool:
        return self._clock.timed(1, super().request_seen, request)

    def requests_seen(self, requests: Sequence[Any]) -> list[bool]:
        return self._clock.timed(len(requests), super().requests_seen, requests)

    def check_and_queue(self, fingerprints: Sequence[bytes], queue: Any,
                        entries: Sequence[Any]) -> list[bool]:
        # Checks and queues (the scheduler's leased queue, on its Redis thread): the
        # queue's share is timed too.
        return self._clock.timed(len(fingerprints), super().check_and_queue, fingerprints,
                                 queue, entries)


class TimedScrapyRedisDupeFilter(RFPDupeFilter):  # type: ignore[misc]
    """scrapy-redis's dupefilter (a SET of sha1 hex fingerprints), timed."""

    _clock: _Clock

    @classmethod
    def from_spider(cls, spider: Any) -> TimedScrapyRedisDupeFilter:
        instance = super().from_spider(spider)
        instance._clock = _Clock(spider.crawler)
        return instance

    def request_seen(self, request: Any) -> bool:
        return bool(self._clock.timed(1, super().request_seen, request))
