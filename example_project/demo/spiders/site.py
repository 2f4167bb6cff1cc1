"""``scrapy crawl site``: follow every link of the demo site, one item per page.

``-s DEMO_PARSE_DELAY=SECONDS`` makes each callback wait that long first, without
blocking the reactor (as a callback that awaits an API would): the tests' slow
callbacks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import scrapy
from scrapy.http import Response


class SiteSpider(scrapy.Spider):
    name = "site"

    async def start(self) -> AsyncIterator[Any]:
        # Every worker yields the home page; the shared filter lets one through.
        yield scrapy.Request(self.settings.get("DEMO_SITE_URL"), callback=self._callback())

    def parse(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url, "title": response.css("title::text").get()}
        # Every link, duplicates and all: the dupefilter decides what gets fetched.
        yield from response.follow_all(css="a", callback=self._callback())

    async def parse_slowly(self, response: Response) -> AsyncIterator[Any]:
        await asyncio.sleep(self.settings.getfloat("DEMO_PARSE_DELAY"))
        for output in self.parse(response):
            yield output

    def _callback(self) -> Callable[[Response], Any] | None:
        """The callback of the requests this spider yields (None: ``parse``)."""
        return self.parse_slowly if self.settings.getfloat("DEMO_PARSE_DELAY") > 0 else None
