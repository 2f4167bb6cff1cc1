"""A request's download slot and its limits, as Scrapy's downloader reads them: what
``BLOOMDUPE_POLITENESS = "crawl"`` holds crawl-wide (:mod:`.leased`).

The key is Scrapy's own (``Downloader.get_slot_key``: ``download_slot`` meta, the hostname,
or the IP). Limits are a new Scrapy slot's: ``DOWNLOAD_SLOTS[key]``, else
``CONCURRENT_REQUESTS_PER_IP`` or ``_PER_DOMAIN`` and ``DOWNLOAD_DELAY`` (the spider's
``download_delay`` wins). The jitter is ``DOWNLOAD_DELAY_JITTER`` (Scrapy 2.19+), or
``RANDOMIZE_DOWNLOAD_DELAY`` (±50% or none) where it wins by priority or on older Scrapy,
or a ``DOWNLOAD_SLOTS`` entry's ``jitter`` or ``randomize_delay``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from scrapy.settings import default_settings

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.settings import BaseSettings


#: Whether Scrapy has ``DOWNLOAD_DELAY_JITTER`` and a ``DOWNLOAD_SLOTS`` ``jitter`` (2.19+).
SCRAPY_JITTER = hasattr(default_settings, "DOWNLOAD_DELAY_JITTER")


@dataclass(frozen=True)
class SlotLimits:
    """A download slot's name and limits: requests in flight crawl-wide (0: no limit), ms
    between two starts, and the random jitter of each gap (0.5: the delay times 0.5-1.5)."""

    slot: str
    concurrency: int
    delay_ms: int
    jitter: float = 0.0


def default_jitter(settings: BaseSettings) -> float:
    """The jitter of a slot that sets none, as Scrapy reads it (see the module)."""
    randomize = settings.getpriority("RANDOMIZE_DOWNLOAD_DELAY") or 0
    if not SCRAPY_JITTER or randomize > (settings.getpriority("DOWNLOAD_DELAY_JITTER") or 0):
        return 0.5 if settings.getbool("RANDOMIZE_DOWNLOAD_DELAY", True) else 0.0
    # (A negative one spreads as its opposite does: Scrapy draws uniform(-j, j).)
    return abs(settings.getfloat("DOWNLOAD_DELAY_JITTER"))


def slot_jitter(own: dict[str, Any], default: float) -> float:
    """A ``DOWNLOAD_SLOTS`` entry's ``jitter``, or ``randomize_delay`` (±50%), or ``default``."""
    if SCRAPY_JITTER and "jitter" in own:
        return abs(float(own["jitter"]))
    if "randomize_delay" in own:
        return 0.5 if own["randomize_delay"] else 0.0
    return default


def per_site_limits(settings: BaseSettings, spider: Spider | None = None) -> list[str]:
    """The per-site limits set (``NAME = value``), which in ``"worker"`` mode each worker holds
    alone: a low ``CONCURRENT_REQUESTS_PER_DOMAIN``, ``_PER_IP``, a delay, ``DOWNLOAD_SLOTS``."""
    found = []
    domain = settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN")
    if domain < default_settings.CONCURRENT_REQUESTS_PER_DOMAIN:
        found.append(f"CONCURRENT_REQUESTS_PER_DOMAIN = {domain}")
    ip = settings.getint("CONCURRENT_REQUESTS_PER_IP")
    if ip > 0:
        found.append(f"CONCURRENT_REQUESTS_PER_IP = {ip}")
    delay = settings.getfloat("DOWNLOAD_DELAY")
    if spider is not None and hasattr(spider, "download_delay"):
        delay = float(spider.download_delay)
    if delay > 0:
        found.append(f"DOWNLOAD_DELAY = {delay:g}")
    if settings.getdict("DOWNLOAD_SLOTS"):
        found.append("DOWNLOAD_SLOTS")
    return found


class SlotPolicy:
    """Scrapy's slot key and limits for a request (see the module's docstring)."""

    #: Whether the limits hold crawl-wide, or each worker's downloader has them (:class:`OneSlot`).
    crawl_wide = True

    def __init__(self, settings: BaseSettings, spider: Spider | None = None) -> None:
        self.domain_concurrency = settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN")
        self.ip_concurrency = settings.getint("CONCURRENT_REQUESTS_PER_IP")
        delay = settings.getfloat("DOWNLOAD_DELAY")
        if spider is not None and hasattr(spider, "download_delay"):
            delay = float(spider.download_delay)
        self.delay = delay
        self.per_slot: dict[str, dict[str, Any]] = settings.getdict("DOWNLOAD_SLOTS")
        #: The jitter of a slot that ``DOWNLOAD_SLOTS`` does not give one.
        self.jitter = default_jitter(settings)
        self.spider = spider

    def jitters(self) -> dict[str, float]:
        """The slots of ``DOWNLOAD_SLOTS`` whose jitter is not :attr:`jitter`, with theirs."""
        own = {slot: slot_jitter(entry, self.jitter) for slot, entry in self.per_slot.items()}
        return {slot: jitter for slot, jitter in own.items() if jitter != self.jitter}

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
        return SlotLimits(slot, max(0, concurrency), max(0, round(delay * 1000)),
                          slot_jitter(own, self.jitter))

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
    """``BLOOMDUPE_POLITENESS = "worker"``: every request in :data:`ONE_SLOT`, without limits
    (each worker's downloader keeps Scrapy's)."""

    crawl_wide = False

    def __init__(self) -> None:
        self.jitter = 0.0
        self.per_slot = {}
        self.spider = None

    def key(self, request: Request) -> str:
        return ONE_SLOT

    def limits(self, slot: str) -> SlotLimits:
        return SlotLimits(slot, 0, 0)


#: The slot of every request when the limits are each worker's.
ONE_SLOT = "*"
