"""Old home of the scheduler's queue, ``CrawlWideQueue``, now
:class:`~.leased.LeasedQueue` (it runs both politeness modes): kept so that
``SCHEDULER_QUEUE_CLASS = "scrapy_bloomdupe.frontier.crawlwide.CrawlWideQueue"`` in
existing settings keeps working."""

from __future__ import annotations

from .leased import LeasedQueue

CrawlWideQueue = LeasedQueue

__all__ = ["CrawlWideQueue"]
