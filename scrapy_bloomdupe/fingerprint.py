"""Which fingerprint of a request goes into the filter (``BLOOMDUPE_FINGERPRINT``).

* ``"scrapy"`` (default): the crawler's ``request_fingerprinter`` (honours
  ``REQUEST_FINGERPRINTER_CLASS``; matches ``JOBDIR/requests.seen``).
* ``"scrapy-redis"``: scrapy-redis's 40-hex sha1, as in its dupefilter SET: to migrate a
  scrapy-redis crawl, whose imported SET members then match.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from scrapy.utils.misc import build_from_crawler, load_object
from scrapy.utils.request import RequestFingerprinter
from scrapy_redis.dupefilter import RFPDupeFilter

from .settings import parse_fingerprint

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Request
    from scrapy.utils.request import RequestFingerprinterProtocol

class MethodFingerprinter:
    """Fingerprints from a dupefilter subclass's ``request_fingerprint(request)``; hex is read
    back into bytes, so returning ``super()``'s answer equals no override."""

    def __init__(self, method: Callable[[Request], object], owner: str) -> None:
        self.method = method
        self.owner = owner

    def fingerprint(self, request: Request) -> bytes:
        fp = self.method(request)
        if isinstance(fp, bytes):
            return fp
        if isinstance(fp, str):
            try:
                return bytes.fromhex(fp)
            except ValueError:
                return fp.encode()
        raise TypeError(f"{self.owner}.request_fingerprint() returned {type(fp).__name__}, "
                        "not a str or bytes")


class ScrapyRedisFingerprinter:
    """scrapy-redis's fingerprint, as the bytes of its hex string (its SET members)."""

    def fingerprint(self, request: Request) -> bytes:
        hexdigest: str = RFPDupeFilter.request_fingerprint(None, request)
        return hexdigest.encode()


def for_crawler(crawler: Crawler, mode: str) -> RequestFingerprinterProtocol:
    if parse_fingerprint(mode) == "scrapy-redis":
        return ScrapyRedisFingerprinter()
    return crawler.request_fingerprinter


def for_tool(crawler: Crawler | None, mode: str) -> RequestFingerprinterProtocol:
    """:func:`for_crawler` for a tool's idle crawler (or none: Scrapy's default fingerprinter)."""
    if parse_fingerprint(mode) == "scrapy-redis":
        return ScrapyRedisFingerprinter()
    if crawler is not None:
        cls = load_object(crawler.settings["REQUEST_FINGERPRINTER_CLASS"])
        fingerprinter: RequestFingerprinterProtocol = build_from_crawler(cls, crawler)
        return fingerprinter
    return RequestFingerprinter()
