"""Dupefilters that time themselves, for the end-to-end crawl benchmark.

``DUPEFILTER_CLASS = "benchmarks.timed.TimedRedisBloomDupeFilter"`` (or
``TimedScrapyRedisDupeFilter``) with ``BENCH_TIMING_DIR`` set: each call of
``request_seen`` / ``requests_seen`` adds its CPU time (``time.process_time``)
and wall time (``time.perf_counter``) to running totals, fingerprinting
included (users pay it). When the spider closes, the worker writes
``<BENCH_TIMING_DIR>/<pid>.json`` with those totals beside the worker's own
CPU and wall time over the same window (from the dupefilter's creation, at
spider open, to spider close), so dedup's share of the worker's CPU is
``dedup_cpu / worker_cpu``; and its Redis round trips and what each carried
(``tests/harness/round_trips.py``). Nothing of the filtering changes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from scrapy import signals
from scrapy_redis.dupefilter import RFPDupeFilter

from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from harness import reactor_wait
from harness.round_trips import CARRIED, ROUND_TRIPS

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
