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

from typing import TYPE_CHECKING

from scrapy_redis.dupefilter import RFPDupeFilter

from .exceptions import ConfigError

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Request
    from scrapy.utils.request import RequestFingerprinterProtocol

MODES = ("scrapy", "scrapy-redis")


class ScrapyRedisFingerprinter:
    """scrapy-redis's fingerprint, as the bytes of its hex string (its SET members)."""

    def fingerprint(self, request: Request) -> bytes:
        hexdigest: str = RFPDupeFilter.request_fingerprint(None, request)
        return hexdigest.encode()


def validate(mode: object) -> str:
    if mode not in MODES:
        raise ConfigError("BLOOMDUPE_FINGERPRINT", mode, f"must be one of {', '.join(MODES)}")
    return str(mode)


def for_crawler(crawler: Crawler, mode: str) -> RequestFingerprinterProtocol:
    if validate(mode) == "scrapy-redis":
        return ScrapyRedisFingerprinter()
    return crawler.request_fingerprinter
