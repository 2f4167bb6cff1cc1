"""``scrapy crawl site``: follow every link of the demo site, one item per page."""

from __future__ import annotations

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
