"""A Scrapy extension for tests: when the reactor turned.

``EXTENSIONS = {"reactor_ticks.Ticks": 0}`` with ``tests/harness`` on the worker's
``PYTHONPATH``: a ``LoopingCall`` notes ``time.monotonic()`` every 50 ms while the spider
is open, and at its close the worker writes the list to
``$REACTOR_TICKS_DIR/<pid>.json``. A reactor thread held by a Redis round trip shows a
gap as long as the wait (:func:`longest_gap`)."""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

from scrapy import signals
from twisted.internet import task


class Ticks:
    def __init__(self, crawler: Any) -> None:
        self.stamps: list[float] = []
        self.loop = task.LoopingCall(lambda: self.stamps.append(time.monotonic()))
        crawler.signals.connect(self.opened, signals.spider_opened)
        crawler.signals.connect(self.closed, signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Any) -> Ticks:
        return cls(crawler)

    def opened(self) -> None:
        self.loop.start(0.05)

    def closed(self) -> None:
        if self.loop.running:
            self.loop.stop()
        out = Path(os.environ["REACTOR_TICKS_DIR"]) / f"{os.getpid()}.json"
        out.write_text(json.dumps(self.stamps))


def longest_gap(directory: Path, start: float, end: float) -> float:
    """The longest time between two turns of any worker's reactor within ``start`` ..
    ``end`` (``time.monotonic()`` of this machine, which every process shares), among the
    workers whose spider was open then (one that had finished before ``start``, its
    timer stopped, turned no more: in CI a worker of Scrapy's own scheduler found only
    a duplicate start page and closed before the freeze)."""
    longest = 0.0
    for path in directory.glob("*.json"):
        stamps = json.loads(path.read_text())
        if not stamps or stamps[-1] < start or stamps[0] > end:
            continue
        inside = [s for s in stamps if start < s < end]
        edges = [start, *inside, end]
        longest = max(longest, *(b - a for a, b in itertools.pairwise(edges)))
    return longest
