"""Which download slot a request belongs to, and that slot's limits, as Scrapy's
downloader reads them: what ``BLOOMDUPE_POLITENESS = "crawl"`` holds for the whole
crawl (:mod:`.leased`).

The slot key is Scrapy's own (``Downloader.get_slot_key``: the ``download_slot``
meta, else the hostname; with ``CONCURRENT_REQUESTS_PER_IP`` the IP once Scrapy's DNS
cache knows it), asked of the crawl's downloader when it runs. The limits are those a
new slot of Scrapy's downloader gets: ``DOWNLOAD_SLOTS[key]``'s ``concurrency`` and
``delay``, else ``CONCURRENT_REQUESTS_PER_IP`` (when set) or
``CONCURRENT_REQUESTS_PER_DOMAIN``, and ``DOWNLOAD_DELAY`` (a spider's
``download_delay`` attribute wins, as in Scrapy). Randomized delays (Scrapy's
default) are 0.5x-1.5x crawl-wide, whatever the jitter's magnitude.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.settings import BaseSettings


@dataclass(frozen=True)
class SlotLimits:
    """A download slot's name and limits: requests in flight crawl-wide (0: none),
    milliseconds between two starts."""

    slot: str
    concurrency: int
    delay_ms: int


class SlotPolicy:
    """Scrapy's slot key and limits for a request (see the module's docstring)."""

    #: Whether the limits hold crawl-wide (``"crawl"``), or each worker's downloader
    #: keeps them (``"worker"``: :class:`OneSlot`).
    crawl_wide = True

    def __init__(self, settings: BaseSettings, spider: Spider | None = None) -> None:
        self.domain_concurrency = settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN")
        self.ip_concurrency = settings.getint("CONCURRENT_REQUESTS_PER_IP")
        delay = settings.getfloat("DOWNLOAD_DELAY")
        if spider is not None and hasattr(spider, "download_delay"):
            delay = float(spider.download_delay)
        self.delay = delay
        self.per_slot: dict[str, dict[str, Any]] = settings.getdict("DOWNLOAD_SLOTS")
        jitter = settings.get("DOWNLOAD_DELAY_JITTER")
        if jitter is None or (settings.getpriority("RANDOMIZE_DOWNLOAD_DELAY") or 0) > (
                settings.getpriority("DOWNLOAD_DELAY_JITTER") or 0):
            self.randomize = settings.getbool("RANDOMIZE_DOWNLOAD_DELAY", True)
        else:
            self.randomize = float(jitter) > 0
        self.spider = spider

    def key(self, request: Request) -> str:
        """Scrapy's slot key for ``request`` (its downloader's, when it runs)."""
        get = self._downloader_key()
        if get is not None:
            return str(get(request))
        meta_slot = request.meta.get("download_slot")
        if meta_slot is not None:
            return str(meta_slot)
        return urlparse(request.url).hostname or ""

    def of(self, request: Request) -> SlotLimits:
        """``request``'s slot and the slot's limits."""
        return self.limits(self.key(request))

    def limits(self, slot: str) -> SlotLimits:
        own = self.per_slot.get(slot, {})
        concurrency = int(own.get("concurrency", self.ip_concurrency or self.domain_concurrency))
        delay = float(own.get("delay", self.delay))
        return SlotLimits(slot, max(0, concurrency), max(0, round(delay * 1000)))

    def defaults(self) -> SlotLimits:
        """The limits of a slot that ``DOWNLOAD_SLOTS`` does not name."""
        return self.limits("\0")

    def _downloader_key(self) -> Callable[[Request], Any] | None:
        crawler = getattr(self.spider, "crawler", None)
        try:
            engine = getattr(crawler, "engine", None) if crawler is not None else None
        except RuntimeError:  # Scrapy's answer when the crawler is not crawling
            engine = None
        downloader = getattr(engine, "downloader", None)
        return getattr(downloader, "get_slot_key", None)


class OneSlot(SlotPolicy):
    """``BLOOMDUPE_POLITENESS = "worker"``: every request in one slot, :data:`ONE_SLOT`,
    without limits (each worker's downloader keeps Scrapy's, as Scrapy alone does)."""

    crawl_wide = False

    def __init__(self) -> None:
        self.randomize = False
        self.spider = None

    def key(self, request: Request) -> str:
        return ONE_SLOT

    def limits(self, slot: str) -> SlotLimits:
        return SlotLimits(slot, 0, 0)


#: The slot of every request when the limits are each worker's.
ONE_SLOT = "*"
