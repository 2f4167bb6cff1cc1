"""A small extension for the demo's workers.

``StatsToJson``: at close, writes the crawl's stats to ``DEMO_STATS_FILE``
(JSON), for ``run_demo.py``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from scrapy import signals
from scrapy.exceptions import NotConfigured

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.spiders import Spider
    from typing_extensions import Self

logger = logging.getLogger(__name__)


class StatsToJson:
    def __init__(self, crawler: Crawler, path: Path) -> None:
        self.crawler = crawler
        self.path = path

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        path = crawler.settings.get("DEMO_STATS_FILE")
        if not path:  # a plain `scrapy crawl site`
            raise NotConfigured
        ext = cls(crawler, Path(path))
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    def spider_closed(self, spider: Spider, reason: str) -> None:
        # The scheduler (and so the dupefilter) has closed: its figures are in.
        assert self.crawler.stats is not None
        stats = dict(self.crawler.stats.get_stats())
        stats.setdefault("finish_reason", reason)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(stats, indent=2, sort_keys=True, default=str))
