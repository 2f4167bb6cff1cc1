"""``SCHEDULER = "scrapy_bloomdupe.scheduler.Scheduler"``: scrapy-redis's scheduler, deduplicated
by the Bloom filter, with a leased shared queue.

It keeps scrapy-redis's settings and queue classes (``SCHEDULER_PERSIST``, ``_FLUSH_ON_START``,
``_IDLE_BEFORE_CLOSE``, ``_SERIALIZER``), is built from the crawler, shares its one Redis client
with the dupefilter, and closes the dupefilter so its figures reach the stats. With its default
queue (:class:`scrapy_bloomdupe.frontier.leased.LeasedQueue`) a dying worker loses nothing. This
module is Scrapy's adapter; the parts (:mod:`.scheduling`) are made when it opens:

* :attr:`Scheduler.path`: the dupefilter, the queue and where their Redis work runs (the loop
  or a thread of its own, never blocking the reactor: :mod:`.scheduling.jobs`).
* :attr:`Scheduler.leases`: a lease from pop to ack; a request stays leased until Scrapy is done
  with it (:meth:`Scheduler.done`). :attr:`Scheduler.upkeep` heartbeats and puts back dead
  workers' leases.
* :attr:`Scheduler.end`: a worker closes once the queue has been empty with no lease held for
  ``BLOOMDUPE_DONE_GRACE`` s; only such a worker clears the crawl when not persisting.
"""

from __future__ import annotations

import importlib
import logging
import weakref
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.settings import Settings
from scrapy.utils.misc import build_from_crawler, load_object
from scrapy_redis import defaults
from scrapy_redis.scheduler import Scheduler as RedisScheduler
from twisted.internet.defer import Deferred

from . import connection
from .dupefilter import RedisBloomDupeFilter
from .frontier.queue import PriorityQueue
from .scheduling import health as crawl_health
from .scheduling.ending import IDLE_POLL, MAX_IDLE_POLL, CrawlEnd
from .scheduling.failed import FailedRequests
from .scheduling.health import HELD, NOT_HELD, CrawlHealth
from .scheduling.jobs import RedisJobs, acted_on
from .scheduling.leases import ACK_DELAY, WAKE_META, Leases
from .scheduling.requestpath import LEASE_META, QUEUED_META, RequestPath
from .scheduling.shared import SharedCrawl, check_politeness, enabled, make_queue, open_filter
from .scheduling.upkeep import LeaseUpkeep
from .settings import BloomDupeConfig, FrontierConfig
from .transport.diagnose import check, describe
from .transport.outage import OutageGuard

if TYPE_CHECKING:
    from scrapy.core.engine import ExecutionEngine
    from scrapy.core.scheduler import BaseScheduler
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from scrapy.http import Request
    from scrapy.spiders import Spider
    from typing_extensions import Self

logger = logging.getLogger(__name__)

__all__ = ["ACK_DELAY", "IDLE_POLL", "MAX_IDLE_POLL", "QUEUED_META", "WAKE_META", "Scheduler",
           "dupefilter_for", "for_crawler"]

DUPEFILTER_CLASS = "scrapy_bloomdupe.dupefilter.RedisBloomDupeFilter"
QUEUE_CLASS = "scrapy_bloomdupe.frontier.leased.LeasedQueue"
MIDDLEWARE = "scrapy_bloomdupe.middleware.BloomDupeBatchMiddleware"


def for_crawler(crawler: Crawler) -> Scheduler | None:
    """The crawler's open scheduler if it is this package's (how middlewares reach it)."""
    scheduler = _scheduler_of(crawler)
    return scheduler if isinstance(scheduler, Scheduler) else None


def dupefilter_for(crawler: Crawler) -> RedisBloomDupeFilter | None:
    """The crawl's dupefilter (its scheduler's ``df``), if it is this package's."""
    df = getattr(_scheduler_of(crawler), "df", None)
    return df if isinstance(df, RedisBloomDupeFilter) else None


def _scheduler_of(crawler: Crawler) -> BaseScheduler | None:
    """Scrapy's ``engine.scheduler`` (2.19+), else this package's one opened for ``crawler``."""
    try:
        engine = crawler.engine
    except RuntimeError:  # Scrapy's answer when the crawler is not crawling
        engine = None
    if engine is not None and isinstance(getattr(type(engine), "scheduler", None), property):
        return engine.scheduler
    return _opened.get(crawler)


class Scheduler(RedisScheduler):  # type: ignore[misc]
    """A scrapy-redis scheduler whose dupefilter is, by default, the Bloom filter."""

    crawler: Crawler
    df: BaseDupeFilter | None  # scrapy-redis sets it in open() when from_crawler did not
    found_format: int | None = None  # the queue's format record at the start: to migrate

    def __init__(self, *args: Any, frontier: FrontierConfig | None = None,
                 health: CrawlHealth | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.frontier = frontier or FrontierConfig.from_settings(Settings())
        #: CONCURRENT_REQUESTS: how many requests a worker can have in flight.
        self._concurrency = 1
        #: Whether a middleware acks each page once its output is queued (else when idle).
        self._acks_early = False
        #: The heartbeat and its company, on the leased queue (see open).
        self.upkeep: LeaseUpkeep | None = None
        #: The crawl's health (failure, outage, stop), which the dupefilter reports to.
        self.health = health or CrawlHealth(OutageGuard(0, describe(self.server)))
        #: Runs the filter's and queue's Redis work, one call at a time, off the reactor.
        self.jobs = RedisJobs(self.health)
        #: The request path: the dupefilter, the queue and their Redis work (see open).
        self.path: RequestPath | None = None
        #: This worker's leases and its view of the crawl's end, made when it opens.
        self.leases: Leases | None = None
        self.end: CrawlEnd | None = None
        #: Requests that failed for good, recorded in Redis (the leased queue; see open).
        self.failed_requests: FailedRequests | None = None
        #: This worker's part in the crawl's shared state (see open).
        self.shared: SharedCrawl | None = None

    @classmethod
    @connection.fails_the_crawl
    def from_crawler(cls, crawler: Crawler) -> Self:
        settings = crawler.settings
        idle = settings.getint("SCHEDULER_IDLE_BEFORE_CLOSE")
        kwargs: dict[str, Any] = {
            "persist": settings.getbool("SCHEDULER_PERSIST"),
            "flush_on_start": settings.getbool("SCHEDULER_FLUSH_ON_START"),
            "idle_before_close": idle,
            "queue_key": settings.get("SCHEDULER_QUEUE_KEY") or defaults.SCHEDULER_QUEUE_KEY,
            # The leased, sharded queue, retry-safe, that a Redis Cluster accepts too.
            "queue_cls": settings.get("SCHEDULER_QUEUE_CLASS") or QUEUE_CLASS,
            "dupefilter_cls": DUPEFILTER_CLASS,
        }
        # Scrapy's default, in-memory, lets every worker fetch every page; a user's choice wins.
        if settings.getpriority("DUPEFILTER_CLASS") not in (None, 0):
            kwargs["dupefilter_cls"] = settings["DUPEFILTER_CLASS"]
        if settings.get("SCHEDULER_DUPEFILTER_KEY"):
            kwargs["dupefilter_key"] = settings.get("SCHEDULER_DUPEFILTER_KEY")
        serializer = settings.get("SCHEDULER_SERIALIZER")
        if isinstance(serializer, str):
            serializer = importlib.import_module(serializer)
        if serializer:
            kwargs["serializer"] = serializer
        kwargs["frontier"] = FrontierConfig.from_settings(settings)
        queue_cls = load_object(kwargs["queue_cls"])
        acks_early = enabled(settings, "SPIDER_MIDDLEWARES", MIDDLEWARE)
        if isinstance(queue_cls, type) and issubclass(queue_cls, PriorityQueue) and \
                not acks_early:
            logger.warning(
                "SPIDER_MIDDLEWARES lacks %r (order 10), which queues each page's output and "
                "then lets the page's lease go: without it a page's lease is let go only when "
                "this worker is idle, and if it dies, every page it handled since is fetched "
                "again. Add it, or activate the package with ADDONS = "
                "{'scrapy_bloomdupe.addon.BloomDupeAddon': 100}, which does", MIDDLEWARE)
        server = connection.get_client(crawler)
        check(server)  # fail here, before the engine opens anything
        check_politeness(kwargs["frontier"], settings, kwargs["queue_cls"], server)
        config = BloomDupeConfig.from_settings(settings)
        kwargs["health"] = crawl_health.for_crawler(crawler, lambda: CrawlHealth(
            OutageGuard(config.outage_timeout, describe(server)), on_outage=config.on_outage,
            crawler=crawler))
        instance = cls(server=server, **kwargs)
        instance.crawler = crawler
        instance.stats = crawler.stats
        instance._concurrency = settings.getint("CONCURRENT_REQUESTS")
        instance._acks_early = acks_early
        # Open the filter before the engine has a slot, so its error is all Scrapy reports.
        dupefilter_cls = load_object(instance.dupefilter_cls)
        ours = dupefilter_cls if isinstance(dupefilter_cls, type) and issubclass(
            dupefilter_cls, RedisBloomDupeFilter) else None
        instance.df, instance.found_format = open_filter(
            crawler, ours, queue_cls, server=server, flush=instance.flush_on_start)
        return instance

    def flush(self) -> None:
        """scrapy-redis's ``flush``, also for a dupefilter without ``clear`` (Scrapy's)."""
        df = self.df
        if df is not None and hasattr(df, "clear"):
            df.clear()
        self.queue.clear()

    @property
    def leased(self) -> bool:
        """Whether the queue is the leased one (scrapy-redis's own queues are not)."""
        return self.path is not None and self.path.leased

    def open(self, spider: Spider) -> Deferred[None]:
        if self.df is None:
            dupefilter_cls = load_object(self.dupefilter_cls)
            if issubclass(dupefilter_cls, RedisBloomDupeFilter) or not hasattr(
                dupefilter_cls, "from_spider"
            ):
                self.df = build_from_crawler(dupefilter_cls, self.crawler)
            else:
                self.df = dupefilter_cls.from_spider(spider)
        # What scrapy-redis's open() does, without its deprecated spider.log().
        self.spider = spider
        ours = self.df if isinstance(self.df, RedisBloomDupeFilter) else None
        bloom = ours.bloom if ours is not None else None
        self.queue = make_queue(
            self.queue_cls, server=self.server, spider=spider,
            key=self.queue_key % {"spider": spider.name}, serializer=self.serializer,
            bloom=bloom, settings=self.crawler.settings, frontier=self.frontier)
        self.shared = SharedCrawl(server=self.server, bloom=bloom, queue=self.queue,
                                  jobs=self.jobs, frontier=self.frontier, spider=spider,
                                  found_format=self.found_format)
        self.path = RequestPath(self.df, self.queue, self.jobs, stats=self.stats, spider=spider,
                                queued=lambda n: self._end().queued(n), bloomdupe=ours,
                                signals=self.crawler.signals, start_once=self.frontier.start_once)
        self.leases = Leases(self.path, frontier=self.frontier, concurrency=self._concurrency,
                             acks_early=self._acks_early, engine=self._engine,
                             idle_poll=lambda: self._end().idle_poll,
                             idle_missed=lambda: self._end().idle_missed())
        self.failed_requests = self.leases.failed
        if isinstance(self.queue, PriorityQueue):
            self.upkeep = LeaseUpkeep(
                jobs=self.jobs, queue=self.queue,
                dupefilter=ours,
                server=self.server, frontier=self.frontier, stats=self.stats, spider=spider,
                settle=self.leases.settle, held=self.leases.held,
                retired=self.leases.report_retired)
        self.end = CrawlEnd(self.path, self.leases, upkeep=self.upkeep,
                            signals=self.crawler.signals, engine=self._engine,
                            done_grace=self.done_grace)
        # What a stop on an error says becomes of the requests in progress.
        self.health.held = HELD if self.leased else NOT_HELD
        # On the loop only if every round trip has a redis.asyncio twin (see .scheduling.jobs).
        self.jobs.start(on_loop=self.leased and bloom is not None and bloom.link.asynchronous)
        _opened[self.crawler] = self  # for an older Scrapy (see _scheduler_of)
        self.crawler.signals.connect(self.end.spider_idle, signal=signals.spider_idle)
        if self.upkeep is not None:  # a scrapy-redis queue has no leases to keep
            self.crawler.signals.connect(self.upkeep.start, signal=signals.spider_opened)
        shared, upkeep, leases = self.shared, self.upkeep, self.leases
        flush = self.flush if self.flush_on_start else None

        def opening() -> int:
            waiting = shared.join(flush=flush)
            if upkeep is not None:
                upkeep.beat()
            return waiting

        # A job like any other (Scrapy waits for it before the spider opens).
        return self.jobs.run(opening, after_stop=True).addCallback(leases.found)

    def close(self, reason: str) -> Deferred[None] | None:
        if self.df is None or getattr(self, "queue", None) is None:  # open() failed
            return None
        if self.path is not None:
            self.path.outbox.flush()  # the outputs gathering go now
        # Once the runner has answered every job asked of it (Scrapy waits).
        drained: Deferred[Any] = self.jobs.io.drained()
        return drained.addCallback(lambda _: self._close(reason))

    def _close(self, reason: str) -> Deferred[None]:
        if self.upkeep is not None:
            self.upkeep.stop()
            self.crawler.signals.disconnect(self.upkeep.start, signal=signals.spider_opened)
        leases, end, shared = self.leases, self.end, self.shared
        assert leases is not None and end is not None and shared is not None, "made with the queue"
        leases.close()
        end.close()
        self.crawler.signals.disconnect(end.spider_idle, signal=signals.spider_idle)
        persist, df = self.persist, self.df

        def closing() -> None:
            leases.give_back()
            clear = shared.close(persist=persist, done_now=end.done_now, settle=leases.settle)
            leases.report_retired()  # what the closing reap could not decode
            if isinstance(df, RedisBloomDupeFilter):
                # The instance's persist wins, even if set after the setting was read.
                df.persist = persist
                df.close_now(reason, clear=clear)  # writes the final stats
            elif clear and df is not None and hasattr(df, "clear"):
                # As scrapy-redis does (its close() would clear even when persisting).
                df.clear()

        def stopped(result: Any) -> Any:
            self.jobs.stop()  # the runner is idle: its last job is answered
            return result

        # The last job of the crawl, on the runner like the others.
        closed: Deferred[None] = self.jobs.run(closing, after_stop=True).addBoth(stopped)
        return closed

    def enqueue_request(self, request: Request) -> bool:
        if request.meta.pop(WAKE_META, False):  # see CrawlEnd._wake: already in the buffer
            return True
        if request.meta.pop(QUEUED_META, False):  # checked, queued and counted by the middleware
            return True
        parent = request.meta.pop(LEASE_META, None)
        leases = self._leases()

        def done() -> None:
            # A copy (redirect, retry) of a leased request carries its work on: ack the parent.
            if parent is not None:
                leases.ack(parent)

        return leases.path.enqueue(request, done=done, over=self._end().idle_missed)

    def next_request(self) -> Request | None:
        # From the buffer a job tops up: never a round trip, never scrapy-redis's BRPOP,
        # which would freeze the reactor; an idle worker polls (CrawlEnd.spider_idle).
        leases = self._leases()
        request = leases.take()
        if request is not None:
            self.stats.inc_value("scheduler/dequeued/redis")
            self._end().busy()
        elif not leases.holding():
            self._end().wake_later()  # nothing in hand: the engine would ask again only in 5 s
        return request

    def done(self, request: Request) -> None:
        """Scrapy is done with ``request`` (output queued, failure recorded, or dropped): ack
        its lease with the next round trip. A request not handed out here is ignored."""
        field = request.meta.get(LEASE_META)
        if field is not None:
            self._leases().ack(field)

    def __len__(self) -> int:  # both from what this worker knows, never a round trip (Leases)
        return self.leases.length() if self.leases is not None else 0

    def has_pending_requests(self) -> bool:
        return self._leases().pending()

    def record_failed(self, request: Request, reason: str) -> None:
        """Keep ``request``, which failed for good, in Redis (``bloomdupe failed``)."""
        if self.failed_requests is not None:  # the leased queue only
            self._leases().record_failed(request, reason).addErrback(acted_on)

    @property
    def crawl_done(self) -> bool:
        """True while this worker sees the crawl done (see :mod:`.scheduling.ending`)."""
        return self.end is not None and self.end.crawl_done

    @property
    def done_grace(self) -> float:
        """Seconds the queue must stay empty, no lease held, before this worker closes: the
        longer of ``BLOOMDUPE_DONE_GRACE`` and ``SCHEDULER_IDLE_BEFORE_CLOSE``."""
        return max(self.frontier.done_grace, float(self.idle_before_close or 0))

    def silence(self) -> float:
        """Seconds since this worker's last heartbeat went through (0 before one, or none)."""
        return 0.0 if self.upkeep is None else self.upkeep.silence()

    def _leases(self) -> Leases:
        assert self.leases is not None, "made when the scheduler opens"
        return self.leases

    def _end(self) -> CrawlEnd:
        assert self.end is not None, "made when the scheduler opens"
        return self.end

    def _engine(self) -> ExecutionEngine:
        """The crawler's engine (its parts ask only during a crawl: RedisJobs.crawling)."""
        engine = self.crawler.engine
        assert engine is not None, "asked during a crawl"
        return engine


_opened: weakref.WeakKeyDictionary[Crawler, Scheduler] = weakref.WeakKeyDictionary()
