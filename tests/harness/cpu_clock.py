"""``CpuClock``: a worker's CPU time (user + system, ``time.process_time()``) at spider
open and at spider close, written as JSON to the ``CPU_CLOCK_FILE`` setting's path.

For ``benchmarks/docs_crawl.py``: the CPU a crawl costs without the process's start-up
and exit, which weigh the same for every contender.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from scrapy import signals
from scrapy.exceptions import NotConfigured

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self


class CpuClock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.opened = 0.0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        path = crawler.settings.get("CPU_CLOCK_FILE")
        if not path:
            raise NotConfigured("no CPU_CLOCK_FILE")
        clock = cls(Path(path))
        crawler.signals.connect(clock.spider_opened, signals.spider_opened)
        crawler.signals.connect(clock.spider_closed, signals.spider_closed)
        return clock

    def spider_opened(self) -> None:
        self.opened = time.process_time()

    def spider_closed(self) -> None:
        self.path.write_text(json.dumps({"opened": self.opened,
                                         "closed": time.process_time()}))
