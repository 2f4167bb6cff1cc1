"""``CrawlWideQueue``, an alias of :class:`~.leased.LeasedQueue`, so that settings naming
``scrapy_bloomdupe.frontier.crawlwide.CrawlWideQueue`` keep working."""

from __future__ import annotations

from .leased import LeasedQueue

CrawlWideQueue = LeasedQueue

__all__ = ["CrawlWideQueue"]
