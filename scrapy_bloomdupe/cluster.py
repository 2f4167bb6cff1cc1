"""Old home of the scheduler's queue: ``scrapy_bloomdupe.cluster.PriorityQueue``.

Kept so that ``SCHEDULER_QUEUE_CLASS = "scrapy_bloomdupe.cluster.PriorityQueue"``
in existing settings keeps working; the class lives in
:mod:`scrapy_bloomdupe.frontier.queue`.
"""

from __future__ import annotations

from .frontier.queue import PriorityQueue

__all__ = ["PriorityQueue"]
