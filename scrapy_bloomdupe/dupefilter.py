"""``DUPEFILTER_CLASS = "scrapy_bloomdupe.dupefilter.RedisBloomDupeFilter"``: turns requests
into fingerprints (the crawler's ``request_fingerprinter``, see :mod:`scrapy_bloomdupe.fingerprint`)
and asks the shared :class:`~scrapy_bloomdupe.bloom.filter.BloomFilter` through the outage guard.
Works under Scrapy's scheduler and :class:`scrapy_bloomdupe.scheduler.Scheduler` (many workers).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from scrapy import signals
from scrapy.dupefilters import BaseDupeFilter
from scrapy.utils.request import referer_str

from . import connection, crawlstats, fingerprint, keys
from .bloom.filter import BloomFilter
from .bloom.lua import LuaEngine
from .exceptions import BloomDupeError, FilterFullError, FilterLostError
from .frontier.queue import PriorityQueue
from .persistence import CLEAR, KEEP_IF_FINISHED, keeps_filter
from .scheduling import health as crawl_health
from .scheduling.health import (
    CLOSE_REASON,
    FINISHED,
    FULL_REASON,
    LOST_REASON,
    REFUSED_REASON,
    CrawlHealth,
)
from .scheduling.jobs import RedisJobs
from .scheduling.waiting import Waiting
from .settings import BloomDupeConfig, replaced_dupefilter_key, report_ttl, wait_replicas
from .transport.diagnose import check, check_eviction, describe, probe, refusal, warn_if_not_durable
from .transport.link import link_to
from .transport.outage import OutageGuard, RedisUnavailable
from .transport.wait import replicas_to_wait

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Request
    from scrapy.spiders import Spider
    from scrapy.statscollectors import StatsCollector
    from scrapy.utils.request import RequestFingerprinterProtocol
    from twisted.internet.defer import Deferred
    from typing_extensions import Self

    from .bloom.info import FilterInfo

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: ``request.meta`` key of the batch middleware's mark: the fingerprint it checked.
CHECKED_META = "_bloomdupe_checked"
__all__ = ["CHECKED_META", "CLOSE_REASON", "FINISHED", "FULL_REASON", "LOST_REASON",
           "REFUSED_REASON", "RedisBloomDupeFilter"]

class RedisBloomDupeFilter(BaseDupeFilter):
    """Duplicate filter backed by a sharded Bloom filter in Redis."""

    #: BLOOMDUPE_REPORT_TTL: how long a finished crawl's report outlives its state.
    report_ttl = 0.0

    def __init__(
        self,
        bloom: BloomFilter,
        fingerprinter: RequestFingerprinterProtocol,
        *,
        debug: bool = False,
        persist: bool = False,
        stats: StatsCollector | None = None,
        outage: OutageGuard | None = None,
        on_outage: str = "close",
        crawl_stats: crawlstats.CrawlStats | None = None,
        stats_interval: float = 10.0,
        crawler: Crawler | None = None,
        health: CrawlHealth | None = None,
    ) -> None:
        self.bloom = bloom
        self.fingerprinter = fingerprinter
        #: The fingerprints :meth:`request_fingerprint` gives, before any override.
        self.base_fingerprinter = fingerprinter
        self.debug = debug
        self.persist = persist
        #: Alone without JOBDIR (:mod:`.persistence`): a crawl stopped early deletes the
        #: filter, lest its queued requests be skipped next run.
        self.keep_if_finished = False
        self.stats = stats
        #: The crawl's health (the scheduler's, else its own): says why the crawl stopped.
        self.health = health or CrawlHealth(outage or OutageGuard(0, describe(bloom.client)),
                                            on_outage=on_outage, crawler=crawler)
        self.health.explain = self._explain
        # Outages waited out per round trip: a retry replays the same ids, no URL lost.
        bloom.outage = self.health.outage
        #: Runs checks Scrapy's or scrapy-redis's scheduler asks for (on the loop in a crawl).
        self.jobs = RedisJobs(self.health)
        #: The requests that wait for Redis's answer meanwhile.
        self.waiting = Waiting(self.jobs, self._check_in_job, crawler=crawler,
                               mark=self._mark, duplicate=self._duplicate,
                               readmit=self._readmit)
        self.crawl_stats = crawl_stats
        self.stats_interval = stats_interval
        self.crawler = crawler
        self.logdupes = True
        #: Set by :meth:`close`: the filter is closed (and maybe deleted), write no more.
        self.closed = False
        #: Set by :meth:`close_now` when it deleted the filter.
        self.cleared = False
        self._warned_full = False
        #: ``bloomdupe/*`` figures last copied to the stats, for the log; never read back
        #: (scrapy-redis's ``RedisStatsCollector`` reads values back as ints: a rate fails).
        self.figures: dict[str, float] = {}
        self._next_flush = time.monotonic() + stats_interval

    @classmethod
    @connection.fails_the_crawl
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = BloomDupeConfig.from_settings(crawler.settings)
        client = connection.get_client(crawler)
        check(client)
        assert crawler.spider is not None, "the dupefilter is built once the spider exists"
        key = config.key_for(crawler.spider.name)
        try:
            engine = BloomFilter.engine_for(client, key, config.engine)
        except redis.exceptions.NoPermissionError:  # HGETALL denied: the probe names it
            engine = "lua" if config.engine == "auto" else config.engine
        wait = replicas_to_wait(wait_replicas(crawler.settings), client)
        # An ACL that lacks a command: one error now, not on page one.
        probe(client, key, engine, window=config.window is not None, wait=wait > 0)
        with link_to(client) as link:
            check_eviction(link)
        try:
            bloom = BloomFilter.open(
                client,
                key,
                config.plan,
                growth=config.growth,
                fingerprint=config.fingerprint,
                use_lock=config.lock,
                lock_ttl=config.lock_ttl,
                lock_wait=config.lock_wait,
                local_cache=config.local_cache,
                wait_replicas=wait,
                engine=config.engine,
                window=config.window,
            )
        except BloomDupeError:
            raise
        except (ValueError, KeyError, ArithmeticError) as e:  # the stored metadata, unreadable
            raise BloomDupeError(
                f"The Bloom filter's metadata {keys.meta(key)!r} in Redis at {describe(client)} "
                f"cannot be read ({type(e).__name__}: {e}); `bloomdupe info --key {key}` names "
                "the damaged fields. Restore them, or use another BLOOMDUPE_KEY."
            ) from None
        keep = keeps_filter(crawler.settings)
        persist = keep != CLEAR
        if persist:
            warn_if_not_durable(client)
        instance = cls(
            bloom,
            fingerprint.for_crawler(crawler, config.fingerprint),
            debug=crawler.settings.getbool("DUPEFILTER_DEBUG"),
            persist=persist,
            stats=crawler.stats,
            crawl_stats=crawlstats.CrawlStats(bloom.link, bloom.key),
            stats_interval=config.stats_interval,
            crawler=crawler,
            health=crawl_health.for_crawler(crawler, lambda: CrawlHealth(
                OutageGuard(config.outage_timeout, describe(client)),
                on_outage=config.on_outage, crawler=crawler)),
        )
        instance.keep_if_finished = keep == KEEP_IF_FINISHED
        crawler.signals.connect(instance.waiting.spider_idle, signal=signals.spider_idle)
        instance.report_ttl = report_ttl(crawler.settings)
        if cls.request_fingerprint is not RedisBloomDupeFilter.request_fingerprint:
            # Overridden, as scrapy-redis projects do (scrapy-splash): honoured.
            instance.fingerprinter = fingerprint.MethodFingerprinter(
                instance.request_fingerprint, cls.__name__)
            logger.info("Fingerprints come from %s.request_fingerprint() (overridden); "
                        "the bloomdupe command line (check, import) uses "
                        "REQUEST_FINGERPRINTER_CLASS, so give it the same fingerprints "
                        "there", cls.__name__)
        ignored_key = replaced_dupefilter_key(crawler.settings)
        if ignored_key is not None:
            logger.warning("SCHEDULER_DUPEFILTER_KEY (%r) is scrapy-redis's and is not used: "
                           "BLOOMDUPE_KEY names the Bloom filter's keys (here %r). Set "
                           "BLOOMDUPE_KEY instead, and remove SCHEDULER_DUPEFILTER_KEY",
                           ignored_key, bloom.key)
        lua = bloom.engine
        calls = ""
        if isinstance(lua, LuaEngine) and lua.SECTIONS and lua.cluster:
            calls = (", one script call a master" if lua.sections else
                     ", one script call a shard (one a master needs Redis 7 or later on every "
                     "master, and +info in the ACL to see it)")
        logger.info(
            "Bloom filter %(key)s: capacity %(capacity)d at error rate %(rate)g, %(shards)d "
            "shard(s) of %(bytes)d bytes, %(k)d hashes, %(gens)d generation(s), growth %(growth)s, "
            "%(fp)s fingerprints, %(mode)s mode%(wait)s%(calls)s",
            {"key": bloom.key, "capacity": bloom.sizing.capacity,
             "rate": bloom.sizing.error_rate, "shards": bloom.sizing.shards,
             "bytes": bloom.sizing.bytes_per_shard, "k": bloom.sizing.hashes,
             "gens": len(bloom.generations), "growth": "on" if bloom.growth else "off",
             "fp": bloom.fingerprint, "mode": "lock" if bloom.use_lock else "atomic",
             "wait": f", WAIT {bloom.replicas_waited} after each write" if bloom.replicas_waited
             else "", "calls": calls},
        )
        return instance

    @classmethod
    def from_spider(cls, spider: Spider) -> Self:
        """What scrapy-redis's scheduler calls."""
        return cls.from_crawler(spider.crawler)

    # -- checking -------------------------------------------------------------

    def request_fingerprint(self, request: Request) -> str:
        """``request``'s fingerprint in hex, as scrapy-redis's ``RFPDupeFilter`` has it; a
        subclass's override (returning str or bytes) is used instead."""
        return self.base_fingerprinter.fingerprint(request).hex()

    def request_seen(self, request: Request) -> bool:
        """Scrapy's scheduler's question. In a crawl the request is held (seen for now) and
        re-crawled if Redis answers new (:mod:`.scheduling.waiting`); else Redis answers now."""
        fp = self.fingerprinter.fingerprint(request)
        if request.meta.get(CHECKED_META) == fp:
            # Checked, and new, by the batch middleware: let it through once.
            del request.meta[CHECKED_META]
            return False
        if not self._runner():  # a tool, a test: answered now
            new = self._guarded(lambda: [self.bloom.add(fp)], [request])
            self._maybe_flush()
            return not new[0]
        self.waiting.hold(request, fp)
        return True

    def check_later(self, requests: Sequence[Request]) -> Deferred[list[bool]]:
        """:meth:`requests_seen` as a job (the batch middleware's, under another scheduler).
        Fails with :class:`~.scheduling.jobs.Stopped` once the crawl stopped on an error."""
        self._runner()
        fps = [self.fingerprinter.fingerprint(r) for r in requests]

        def marked(new: list[bool]) -> list[bool]:
            for request, fp, is_new in zip(requests, fps, new, strict=True):
                if is_new:
                    self._mark(request, fp)
            return [not n for n in new]
        return self.waiting.ask(fps).addCallback(marked)

    def _runner(self) -> bool:
        """Whether checks run on a runner (a crawl runs), started at the first: on the
        reactor's loop with ``redis.asyncio`` links, else on its own thread."""
        return self.jobs.start(on_loop=self.bloom.link.asynchronous)

    def _check_in_job(self, fps: list[bytes]) -> list[bool]:
        new = self.bloom.add_many(fps)
        self._maybe_flush()
        return new

    def _readmit(self, fps: list[bytes]) -> None:
        """Items added once the crawl had closed (not queued): re-admitted, if kept."""
        if not self.cleared:
            self.bloom.readmit(fps)

    @staticmethod
    def _mark(request: Request, fp: bytes) -> None:
        request.meta[CHECKED_META] = fp

    def _duplicate(self, request: Request) -> None:
        spider = self.crawler.spider if self.crawler is not None else None
        self.log(request, spider)

    def requests_seen(self, requests: Sequence[Request]) -> list[bool]:
        """Check-and-add many requests in one round trip; mark the new ones, so that
        :meth:`request_seen` passes each once without checking again."""
        fps = [self.fingerprinter.fingerprint(r) for r in requests]
        new = self._guarded(lambda: self.bloom.add_many(fps), requests)
        for request, fp, is_new in zip(requests, fps, new, strict=True):
            if is_new:
                request.meta[CHECKED_META] = fp
        self._maybe_flush()
        return [not n for n in new]

    def check_and_queue(self, fingerprints: Sequence[bytes], queue: PriorityQueue | None,
                        entries: Sequence[Sequence[Any]]) -> list[bool]:
        """Check ``fingerprints`` and queue the new ones' ``entries`` into ``queue`` (if any) in
        one script, so no crash leaves a request in the filter and no queue; whether each was
        new. Errors are raised, for the caller to hand to :meth:`CrawlHealth.fail`."""
        new = self.bloom.add_many(fingerprints, queue,
                                  None if queue is None else entries.__getitem__)
        self._maybe_flush()
        return new

    def _guarded(self, check: Callable[[], list[bool]], requests: Sequence[Request]
                 ) -> list[bool]:
        """Run ``check``; if Redis stays away, report every request new (unchecked), so it
        is scheduled, not lost (``BLOOMDUPE_ON_OUTAGE = "close"`` then stops the crawl)."""
        new = self._call(check, unchecked=len(requests))
        return [True] * len(requests) if new is None else new

    def _call(self, check: Callable[[], list[bool]], unchecked: int = 0) -> list[bool] | None:
        """``check``'s answer, or None if Redis failed (the health counts ``unchecked``).
        Once this worker stopped the crawl on an error, Redis is not asked again."""
        if self.health.failed():
            self.health.unchecked += unchecked
            return None
        try:
            return check()
        except (redis.RedisError, BloomDupeError) as e:  # RedisUnavailable included
            self.health.fail(e, unchecked)
            return None

    # -- the crawl's health ---------------------------------------------------

    @property
    def outage(self) -> OutageGuard:
        return self.health.outage

    @property
    def failure(self) -> str | None:
        """The close reason once this worker stopped the crawl on an error."""
        return self.health.failure

    @property
    def unchecked(self) -> int:
        return self.health.unchecked

    @property
    def redis_errors(self) -> int:
        return self.health.redis_errors

    def _explain(self, error: Exception) -> tuple[str, str]:
        """``error`` as a close reason and advice. A filter lost because the last worker
        deleted it at the crawl's end is no error: the others fetched what this one held."""
        if isinstance(error, FilterLostError):
            if self._cleared_when_finished():
                return FINISHED, (
                    f"The crawl of the Bloom filter {self.bloom.key} finished while this "
                    "worker was away, and its last worker deleted the shared queue and the "
                    "filter (SCHEDULER_PERSIST is off); the other workers fetched what this "
                    "one held. Closing")
            return LOST_REASON, str(error)
        if isinstance(error, FilterFullError):
            return FULL_REASON, str(error)
        if isinstance(error, BloomDupeError):
            return REFUSED_REASON, str(error)
        return REFUSED_REASON, self._refusal(error)

    def _cleared_when_finished(self) -> bool:
        try:
            return self.bloom.cleared_when_finished()
        except redis.RedisError:
            return False

    def _refusal(self, error: Exception) -> str:
        """What to say of a refused command; one denied inside a script (Redis does not
        name it) is named by running the start-up ACL probe again."""
        client = self.bloom.client
        message = refusal(describe(client), error)
        if isinstance(error, redis.exceptions.NoPermissionError) or \
                "can't run this command" in str(error):
            try:
                probe(client, self.bloom.key, self.bloom.engine_name)
            except BloomDupeError as e:
                message = str(e)
            except redis.RedisError:
                pass
        return message

    # -- logging and stats ----------------------------------------------------

    def log(self, request: Request, spider: Spider | None) -> None:
        if self.waiting.holds(request):
            return  # not yet known a duplicate: logged once Redis says so
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

    def counters(self) -> dict[str, int]:
        """This worker's counters, under the names of :data:`crawlstats.COUNTERS`."""
        c = self.bloom.counters
        return {"checked": c.checked, "new": c.new, "duplicates": c.duplicates,
                "local_hits": c.local_hits,
                "lock_acquired": c.lock.acquired, "lock_waits": c.lock.waits,
                "lock_timeouts": c.lock.timeouts, "lock_lost": c.lock.lost,
                "redis_errors": self.redis_errors}

    def flush_crawl_stats_due(self) -> None:
        """:meth:`flush_crawl_stats` if ``BLOOMDUPE_STATS_INTERVAL`` has passed since last."""
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if time.monotonic() >= self._next_flush:
            self._next_flush = time.monotonic() + self.stats_interval
            self.flush_crawl_stats()

    def flush_crawl_stats(self, closed: str | None = None) -> None:
        """Add this worker's counters to the crawl-wide ones in Redis; copy the totals back."""
        crawl_stats = self.crawl_stats
        if crawl_stats is None:
            return
        try:
            totals = self.outage.call(lambda: crawl_stats.flush(self.counters(), closed))
        except (RedisUnavailable, redis.RedisError) as e:
            logger.warning("Could not add this worker's counters to the crawl-wide stats: %s", e)
            return
        if self.stats is not None:
            for name, value in totals.items():
                self.stats.set_value(f"bloomdupe/crawl/{name}", value)

    def update_stats(self, *, with_fill: bool = False, info: FilterInfo | None = None) -> None:
        """Copy the counters into Scrapy's stats; the fill too with ``with_fill`` or ``info``."""
        if self.stats is None:
            return
        counters = self.bloom.counters
        lock = counters.lock
        values: dict[str, float] = {
            "bloomdupe/checked": counters.checked,
            "bloomdupe/new": counters.new,
            "bloomdupe/duplicates": counters.duplicates,
            "bloomdupe/local_hits": counters.local_hits,
            "bloomdupe/hit_rate": counters.duplicates / counters.checked if counters.checked
            else 0.0,
            "bloomdupe/redis_errors": self.redis_errors,
            "bloomdupe/unchecked": self.unchecked,
            "bloomdupe/outages": self.outage.outages,
            "bloomdupe/outage_time": round(self.outage.outage_time, 3),
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
        if with_fill or info is not None:
            if info is None:
                info = self.bloom.info()
            values.update({
                "bloomdupe/fill_ratio": info.fill_ratio,
                "bloomdupe/estimated_items": round(info.estimated_items),
                "bloomdupe/estimated_false_positive_rate": info.estimated_false_positive_rate,
                "bloomdupe/memory_bytes": info.memory_bytes,
                "bloomdupe/generations": len(info.generations),
            })
            if self.bloom.window is not None:
                window = self.bloom.engine.figures(info)
                values["bloomdupe/window/slices"] = window["slices"]
                values["bloomdupe/window/oldest_slice_age"] = window["oldest_slice_age"]
            if not self._warned_full:
                self._warn_if_full(info)
        self.figures.update(values)
        for name, value in values.items():
            self.stats.set_value(name, value)

    def _warn_if_full(self, info: FilterInfo) -> None:
        """Warn once if the filter (or window slice) is past capacity and cannot grow."""
        if self.bloom.window is None:
            if self.bloom.growth or info.estimated_items <= info.capacity:
                return
            what, items, capacity = "", info.estimated_items, info.capacity
            advice = ("Turn on BLOOMDUPE_GROWTH, or start a new filter with a larger "
                      "BLOOMDUPE_CAPACITY.")
        else:
            newest = info.generations[-1]
            if self.bloom.slices_grow or newest.estimated_items <= newest.sizing.capacity:
                return
            what, items, capacity = ("'s current time slice", newest.estimated_items,
                                     newest.sizing.capacity)
            advice = ("Turn on BLOOMDUPE_GROWTH (each time slice then grows), or start a "
                      "new filter with a larger BLOOMDUPE_CAPACITY (requests a window).")
        self._warned_full = True
        logger.warning(
            "Bloom filter %(key)s%(what)s holds about %(items)d items, past its capacity of "
            "%(capacity)d: its false-positive rate is now %(fpr).2g and climbing, and "
            "every false positive is a page never crawled. %(advice)s",
            {"key": self.bloom.key, "what": what, "items": items, "capacity": capacity,
             "fpr": info.estimated_false_positive_rate, "advice": advice},
        )

    # -- end ------------------------------------------------------------------

    def clear(self) -> None:
        """Delete the filter in Redis (every worker's) and the crawl-wide stats."""
        self.bloom.clear()

    def _clear_finished(self, ended: bool) -> None:
        # At the end of a crawl: marked, so that a worker paused past it closes quietly;
        # a crawl that ran to its end (``ended``) keeps its report (BLOOMDUPE_REPORT_TTL).
        if ended:
            logger.info("%s", crawlstats.summary(self.bloom.link, self.bloom.key,
                                                 self.report_ttl))
        self.bloom.clear(finished=True, report_ttl=self.report_ttl if ended else 0)

    def close(self, reason: str = "", *, clear: bool | None = None) -> Deferred[None] | None:
        """Scrapy's scheduler's hook (it waits for the Deferred): :meth:`close_now` as
        the last job of this filter's runner, which then stops; outside a crawl, now."""
        self.waiting.close()
        if self.jobs.inline:
            self.close_now(reason, clear=clear)
            return None

        def stopped(result: Any) -> Any:
            self.jobs.stop()
            return result
        closed: Deferred[None] = self.jobs.run(
            lambda: self.close_now(reason, clear=clear), after_stop=True).addBoth(stopped)
        return closed

    def close_now(self, reason: str = "", *, clear: bool | None = None) -> None:
        """Write the final figures; delete the filter when ``clear`` (default: as
        :mod:`.persistence` says; the scheduler decides for a shared crawl)."""
        self.closed = True
        ended = clear is not None or reason == FINISHED  # the scheduler saw it done
        if clear is None:
            clear = not self.persist and self.failure is None
            if self.keep_if_finished and reason != FINISHED and self.failure is None:
                clear = True
                logger.warning(
                    "The crawl stopped before its end (%s) and Scrapy's scheduler keeps its "
                    "queue only with JOBDIR: the Bloom filter %s is deleted, so that the "
                    "requests still queued are not skipped next run (every page will be "
                    "fetched again). Set JOBDIR to resume a crawl", reason, self.bloom.key)
        try:
            # After an error stop, only this worker's own figures (Redis may be gone).
            self.update_stats(with_fill=self.failure is None)
        except (redis.RedisError, BloomDupeError) as e:
            logger.warning("Could not read the Bloom filter's final figures from Redis: %s", e)
            self.update_stats()
        if self.failure is None:  # also when the crawl's state goes: its report stays
            self.flush_crawl_stats(closed=reason or "closed")
        if self.stats is not None:
            get = self.figures.get
            logger.info(
                "Bloom filter closed: %(checked)d checked, %(new)d new, %(dups)d duplicates "
                "(hit rate %(hit).1f%%), fill %(fill).2f%%, est. FPR %(fpr).2g",
                {"checked": get("bloomdupe/checked", 0), "new": get("bloomdupe/new", 0),
                 "dups": get("bloomdupe/duplicates", 0),
                 "hit": 100 * get("bloomdupe/hit_rate", 0.0),
                 "fill": 100 * get("bloomdupe/fill_ratio", 0.0),
                 "fpr": get("bloomdupe/estimated_false_positive_rate", 0.0)},
            )
        self.cleared = bool(clear)
        if clear:
            try:
                self._clear_finished(ended)
            except redis.RedisError as e:
                logger.error("Could not delete the Bloom filter %s (SCHEDULER_PERSIST is off): "
                             "%s", self.bloom.key, e)
        self.bloom.close()
