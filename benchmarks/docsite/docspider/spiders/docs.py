"""``docs``: every page of the local doc site, by a CrawlSpider's one rule."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self


class DocsSpider(CrawlSpider):
    name = "docs"

    @classmethod
    def from_crawler(cls, crawler: Crawler, *args: Any, **kwargs: Any) -> Self:
        kwargs.setdefault("site_url", crawler.settings["DOCSITE_URL"])
        spider: Self = super().from_crawler(crawler, *args, **kwargs)
        return spider

    def __init__(self, site_url: str, *args: Any, **kwargs: Any) -> None:
        # allow_domains is compared with the URL's netloc, port included
        # (scrapy.utils.url.url_is_from_any_domain): "127.0.0.1" alone matches no
        # link of a site on another port than 80.
        host = urlsplit(site_url).netloc
        self.start_urls = [site_url + "index.html"]
        self.rules = (Rule(LinkExtractor(allow_domains=[host]), callback="parse_item",
                           follow=True),)
        super().__init__(*args, **kwargs)

    def parse_item(self, response: Response) -> Iterator[dict[str, Any]]:
        yield {"url": response.url, "title": response.css("title::text").get()}
