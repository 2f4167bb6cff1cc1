"""Which fingerprint of a request goes into the filter (``BLOOMDUPE_FINGERPRINT``).

* ``"scrapy"`` (default): the crawler's ``request_fingerprinter``, so
  ``REQUEST_FINGERPRINTER_CLASS`` is honoured, and fingerprints match Scrapy's
  ``JOBDIR/requests.seen``.
* ``"scrapy-redis"``: scrapy-redis's own fingerprint (sha1 of a JSON of method,
  canonical URL and body, as 40 hex characters), as stored in its dupefilter
  SET. Choose it to migrate a running scrapy-redis crawl: imported SET members
  then match the requests the new crawl makes.
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
    """The fingerprints of a dupefilter subclass's own ``request_fingerprint(request)``.

    scrapy-redis projects override that method (for example for scrapy-splash);
    it returns a hex string as scrapy-redis's does, or bytes. A hex string is
    read back into its bytes, so an override that returns its parent's answer
    (``super().request_fingerprint(request)``) puts the same item in the filter
    as no override at all.
    """

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
    """As :func:`for_crawler`, for a tool whose crawler never crawls (so has no
    ``request_fingerprinter`` yet): the project's ``REQUEST_FINGERPRINTER_CLASS``
    built from ``crawler``; without a crawler, Scrapy's default fingerprinter."""
    if parse_fingerprint(mode) == "scrapy-redis":
        return ScrapyRedisFingerprinter()
    if crawler is not None:
        cls = load_object(crawler.settings["REQUEST_FINGERPRINTER_CLASS"])
        fingerprinter: RequestFingerprinterProtocol = build_from_crawler(cls, crawler)
        return fingerprinter
    return RequestFingerprinter()
