"""Old home of ``PriorityQueue``, kept so existing ``SCHEDULER_QUEUE_CLASS`` settings naming
``scrapy_bloomdupe.cluster.PriorityQueue`` work; it lives in :mod:`scrapy_bloomdupe.frontier.queue`.
"""

from __future__ import annotations

from .frontier.queue import PriorityQueue

__all__ = ["PriorityQueue"]
