"""``DUPEFILTER_CLASS = "scrapy_bloomdupe.dupefilter.RedisBloomDupeFilter"``.

A thin Scrapy component: it turns requests into fingerprints with the
crawler's own ``request_fingerprinter`` (so ``REQUEST_FINGERPRINTER_CLASS`` is
honoured) and asks the shared :class:`~scrapy_bloomdupe.filter.BloomFilter`.
Works under Scrapy's own scheduler (one machine) and under
:class:`scrapy_bloomdupe.scheduler.Scheduler` (many workers).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

import redis
from scrapy.dupefilters import BaseDupeFilter
from scrapy.utils.request import referer_str

from . import connection
from .filter import BloomFilter
from .settings import BloomDupeConfig

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Request
    from scrapy.spiders import Spider
    from scrapy.statscollectors import StatsCollector
    from scrapy.utils.request import RequestFingerprinterProtocol
    from typing_extensions import Self

logger = logging.getLogger(__name__)

#: ``request.meta`` key of the batch middleware's mark: the fingerprint it checked.
CHECKED_META = "_bloomdupe_checked"

_by_crawler: weakref.WeakKeyDictionary[Crawler, RedisBloomDupeFilter] = (
    weakref.WeakKeyDictionary()
)


def for_crawler(crawler: Crawler) -> RedisBloomDupeFilter | None:
    """The crawler's dupefilter, once the scheduler has built it."""
    return _by_crawler.get(crawler)


class RedisBloomDupeFilter(BaseDupeFilter):
    """Duplicate filter backed by a sharded Bloom filter in Redis."""

    def __init__(
        self,
        bloom: BloomFilter,
        fingerprinter: RequestFingerprinterProtocol,
        *,
        debug: bool = False,
        persist: bool = False,
        stats: StatsCollector | None = None,
    ) -> None:
        self.bloom = bloom
        self.fingerprinter = fingerprinter
        self.debug = debug
        self.persist = persist
        self.stats = stats
        self.logdupes = True
        self.redis_errors = 0
        self._warned_full = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = BloomDupeConfig.from_settings(crawler.settings)
        client = connection.get_client(crawler)
        connection.check(client)
        assert crawler.spider is not None, "the dupefilter is built once the spider exists"
        bloom = BloomFilter.open(
            client,
            config.key_for(crawler.spider.name),
            config.plan,
            growth=config.growth,
            use_lock=config.lock,
            lock_ttl=config.lock_ttl,
            lock_wait=config.lock_wait,
        )
        persist = crawler.settings.getbool("SCHEDULER_PERSIST")
        if persist:
            _warn_if_not_durable(client)
        instance = cls(
            bloom,
            crawler.request_fingerprinter,
            debug=crawler.settings.getbool("DUPEFILTER_DEBUG"),
            persist=persist,
            stats=crawler.stats,
        )
        _by_crawler[crawler] = instance
        logger.info(
            "Bloom filter %(key)s: capacity %(capacity)d at error rate %(rate)g, %(shards)d "
            "shard(s) of %(bytes)d bytes, %(k)d hashes, %(gens)d generation(s), growth %(growth)s, "
            "%(mode)s mode",
            {"key": bloom.key, "capacity": bloom.sizing.capacity,
             "rate": bloom.sizing.error_rate, "shards": bloom.sizing.shards,
             "bytes": bloom.sizing.bytes_per_shard, "k": bloom.sizing.hashes,
             "gens": len(bloom.generations), "growth": "on" if bloom.growth else "off",
             "mode": "lock" if bloom.use_lock else "atomic"},
        )
        return instance

    @classmethod
    def from_spider(cls, spider: Spider) -> Self:
        """What scrapy-redis's scheduler calls."""
        return cls.from_crawler(spider.crawler)

    def request_seen(self, request: Request) -> bool:
        fingerprint = self.fingerprinter.fingerprint(request)
        if request.meta.get(CHECKED_META) == fingerprint:
            # Checked, and new, by the batch middleware: let it through once.
            del request.meta[CHECKED_META]
            return False
        try:
            return not self.bloom.add(fingerprint)
        except redis.RedisError:
            self.redis_errors += 1
            raise

    def requests_seen(self, requests: Sequence[Request]) -> list[bool]:
        """Check-and-add many requests in one round trip; mark the new ones.

        The mark (the fingerprint in ``request.meta``) makes :meth:`request_seen`
        pass that request once without checking it again.
        """
        fingerprints = [self.fingerprinter.fingerprint(r) for r in requests]
        try:
            new = self.bloom.add_many(fingerprints)
        except redis.RedisError:
            self.redis_errors += 1
            raise
        for request, fingerprint, is_new in zip(requests, fingerprints, new, strict=True):
            if is_new:
                request.meta[CHECKED_META] = fingerprint
        return [not n for n in new]

    def log(self, request: Request, spider: Spider | None) -> None:
        if self.debug:
            msg = "Filtered duplicate request: %(request)s (referer: %(referer)s)"
            args = {"request": request, "referer": referer_str(request)}
            logger.debug(msg, args, extra={"spider": spider})
        elif self.logdupes:
            msg = (
                "Filtered duplicate request: %(request)s"
                " - no more duplicates will be shown"
                " (see DUPEFILTER_DEBUG to show all duplicates)"
            )
            logger.debug(msg, {"request": request}, extra={"spider": spider})
            self.logdupes = False
        if self.stats is not None:
            self.stats.inc_value("dupefilter/filtered")

    def clear(self) -> None:
        """Delete the filter in Redis (every worker's)."""
        self.bloom.clear()

    def update_stats(self, *, with_fill: bool = False) -> None:
        """Copy the counters into Scrapy's stats; with ``with_fill``, read the fill from Redis."""
        if self.stats is None:
            return
        counters = self.bloom.counters
        lock = counters.lock
        values: dict[str, float] = {
            "bloomdupe/checked": counters.checked,
            "bloomdupe/new": counters.new,
            "bloomdupe/duplicates": counters.duplicates,
            "bloomdupe/hit_rate": counters.duplicates / counters.checked if counters.checked
            else 0.0,
            "bloomdupe/redis_errors": self.redis_errors,
            "bloomdupe/generations": len(self.bloom.generations),
        }
        if self.bloom.use_lock:
            values.update({
                "bloomdupe/lock/acquired": lock.acquired,
                "bloomdupe/lock/waits": lock.waits,
                "bloomdupe/lock/wait_time": round(lock.wait_time, 6),
                "bloomdupe/lock/timeouts": lock.timeouts,
                "bloomdupe/lock/lost": lock.lost,
            })
        if with_fill:
            info = self.bloom.info()
            values.update({
                "bloomdupe/fill_ratio": info.fill_ratio,
                "bloomdupe/estimated_items": round(info.estimated_items),
                "bloomdupe/estimated_false_positive_rate": info.estimated_false_positive_rate,
                "bloomdupe/memory_bytes": info.memory_bytes,
            })
            if (not self.bloom.growth and info.estimated_items > info.capacity
                    and not self._warned_full):
                self._warned_full = True
                logger.warning(
                    "Bloom filter %(key)s holds about %(items)d items, past its capacity of "
                    "%(capacity)d: its false-positive rate is now %(fpr).2g and climbing, and "
                    "every false positive is a page never crawled. Turn on BLOOMDUPE_GROWTH, "
                    "or start a new filter with a larger BLOOMDUPE_CAPACITY.",
                    {"key": self.bloom.key, "items": info.estimated_items,
                     "capacity": info.capacity,
                     "fpr": info.estimated_false_positive_rate},
                )
        for name, value in values.items():
            self.stats.set_value(name, value)

    def close(self, reason: str = "") -> None:
        try:
            self.update_stats(with_fill=True)
        except redis.RedisError as e:
            logger.warning("Could not read the Bloom filter's final figures from Redis: %s", e)
            self.update_stats()
        if self.stats is not None:
            get = self.stats.get_value
            logger.info(
                "Bloom filter closed: %(checked)d checked, %(new)d new, %(dups)d duplicates "
                "(hit rate %(hit).1f%%), fill %(fill).2f%%, est. FPR %(fpr).2g",
                {"checked": get("bloomdupe/checked", 0), "new": get("bloomdupe/new", 0),
                 "dups": get("bloomdupe/duplicates", 0),
                 "hit": 100 * get("bloomdupe/hit_rate", 0.0),
                 "fill": 100 * get("bloomdupe/fill_ratio", 0.0),
                 "fpr": get("bloomdupe/estimated_false_positive_rate", 0.0)},
            )
        if not self.persist:
            self.clear()
        self.bloom.close()


def _warn_if_not_durable(client: redis.Redis | redis.RedisCluster) -> None:
    """Warn when Redis keeps nothing on disk: a restart would forget every seen URL."""
    try:
        config = client.config_get("appendonly") | client.config_get("save")
    except redis.ResponseError as e:  # CONFIG is often not granted; then say nothing
        logger.debug("Cannot read Redis persistence settings: %s", e)
        return
    if not isinstance(config, dict) or "appendonly" not in config:
        return  # a cluster client answers per node; checked by the cluster docs instead
    if str(config.get("appendonly")) in ("no", "b'no'") and not config.get("save"):
        logger.warning(
            "SCHEDULER_PERSIST is on but Redis keeps nothing on disk (appendonly no, no save "
            "points): a Redis restart forgets every seen URL and the crawl fetches them all "
            "again. Turn on AOF (appendonly yes) or RDB snapshots."
        )
