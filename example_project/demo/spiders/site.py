"""``scrapy crawl site``: follow every link of the demo site, one item per page."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import scrapy
from scrapy.http import Response


class SiteSpider(scrapy.Spider):
    name = "site"

    async def start(self) -> AsyncIterator[Any]:
        # Every worker yields the home page; the shared filter lets one through.
        yield scrapy.Request(self.settings.get("DEMO_SITE_URL"))

    def parse(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url, "title": response.css("title::text").get()}
        # Every link, duplicates and all: the dupefilter decides what gets fetched.
        yield from response.follow_all(css="a")

    def log(self, message: Any, level: int = logging.DEBUG, **kw: Any) -> None:
        # WORKAROUND, to delete once scrapy_bloomdupe's Scheduler.open() stops
        # calling scrapy-redis's: that one logs "Resuming crawl (N requests
        # scheduled)" through the deprecated Spider.log() whenever a worker joins
        # a crawl whose queue holds requests, i.e. in every worker but the first,
        # and Scrapy 2.13+ turns that into a ScrapyDeprecationWarning.
        self.logger.log(level, message, **kw)
