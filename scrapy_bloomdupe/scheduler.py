"""``SCHEDULER = "scrapy_bloomdupe.scheduler.Scheduler"``: scrapy-redis's scheduler, deduplicated
by the Bloom filter, with a leased shared queue.

It keeps everything of scrapy-redis's :class:`scrapy_redis.scheduler.Scheduler`
(the shared request queue and its classes, ``SCHEDULER_PERSIST``,
``SCHEDULER_FLUSH_ON_START``, ``SCHEDULER_IDLE_BEFORE_CLOSE``,
``SCHEDULER_SERIALIZER``) and changes what Scrapy and a shared crawl need: it is
built from the crawler, shares the crawler's one Redis client with the
dupefilter, counts stats without the deprecated ``spider=`` argument, and
closes the dupefilter so its figures reach the stats.

With its default queue (:class:`scrapy_bloomdupe.frontier.queue.PriorityQueue`)
it also makes the crawl lose nothing when a worker dies:

* It leases as many requests in one round trip as the worker has free
  download slots (``CONCURRENT_REQUESTS`` less the requests in progress), a
  quarter of ``CONCURRENT_REQUESTS`` more while the queue is deep, and hands
  them to Scrapy one by one.
* A request it hands to Scrapy stays leased in Redis until Scrapy is done with
  it: its callback's output is queued (or it failed for good and the failure
  middleware recorded it, or it was dropped). Scrapy's public hooks say when
  (:meth:`Scheduler.done`, called by this package's middlewares, and
  ``spider_idle``); the ack rides on the next round trip, within
  :data:`ACK_DELAY`. During a crawl this Redis work runs on the reactor's loop with
  ``redis.asyncio`` (or a thread of its own, :mod:`.scheduling.jobs`), never blocking
  Scrapy's reactor. A heartbeat every few
  seconds keeps this worker's leases; the leases of a worker that stops
  heartbeating for ``BLOOMDUPE_LEASE_TIMEOUT`` seconds are put back in the
  queue by the live ones (:mod:`.scheduling.upkeep`). A worker holds at most
  ``CONCURRENT_REQUESTS`` and a quarter of it in pages not yet acked (see
  ``Scheduler._full``): what a killed worker costs in pages fetched twice.
* A new request is checked against the filter and queued by one script
  (:meth:`~.scheduling.requestpath.RequestPath.queue_output`), so no crash leaves a
  request in the filter and in no queue. The dupefilter, the queue and where their
  Redis work runs are held by one object, the scheduler's :attr:`Scheduler.path`
  (:mod:`.scheduling.requestpath`), made when it opens.
* A worker stays open while the shared queue has requests or any worker holds a
  lease (its page may still yield more), and closes ("finished") once the
  queue has been empty with no lease held for ``BLOOMDUPE_DONE_GRACE``
  seconds. Only such a worker clears the queue and the filter when
  ``SCHEDULER_PERSIST`` is off; one that leaves early never does.
"""

from __future__ import annotations

import importlib
import logging
import secrets
import weakref
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from scrapy import signals
from scrapy.settings import Settings
from scrapy.utils.conf import build_component_list
from scrapy.utils.misc import build_from_crawler, load_object
from scrapy.utils.reactor import is_asyncio_reactor_installed
from scrapy_redis import defaults
from scrapy_redis.scheduler import Scheduler as RedisScheduler
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from . import connection
from . import dupefilter as dupefilter_module
from .bloom import meta
from .bloom.filter import BloomFilter
from .dupefilter import RedisBloomDupeFilter
from .frontier import queue as frontier_queue
from .frontier.queue import PriorityQueue
from .scheduling.ending import IDLE_POLL, MAX_IDLE_POLL, CrawlEnd
from .scheduling.failed import FailedRequests
from .scheduling.jobs import RedisJobs, acted_on
from .scheduling.leases import ACK_DELAY, WAKE_META, Leases
from .scheduling.requestpath import LEASE_META, QUEUED_META, RequestPath
from .scheduling.upkeep import LeaseUpkeep
from .settings import BloomDupeConfig, FrontierConfig, wait_replicas
from .transport.diagnose import check, check_eviction
from .transport.wait import replicas_to_wait

if TYPE_CHECKING:
    from scrapy.core.engine import ExecutionEngine
    from scrapy.crawler import Crawler
    from scrapy.http import Request
    from scrapy.settings import BaseSettings
    from scrapy.spiders import Spider
    from typing_extensions import Self

logger = logging.getLogger(__name__)

__all__ = ["ACK_DELAY", "IDLE_POLL", "MAX_IDLE_POLL", "QUEUED_META", "WAKE_META", "Scheduler",
           "dupefilter_for", "for_crawler"]

DUPEFILTER_CLASS = "scrapy_bloomdupe.dupefilter.RedisBloomDupeFilter"
QUEUE_CLASS = "scrapy_bloomdupe.frontier.queue.PriorityQueue"
MIDDLEWARE = "scrapy_bloomdupe.middleware.BloomDupeBatchMiddleware"


def _enabled(settings: BaseSettings, name: str, path: str) -> bool:
    """Whether the component at ``path`` (or a subclass of it) is enabled in ``name``."""
    for component in build_component_list(settings.getwithbase(name)):
        cls = load_object(component) if isinstance(component, str) else component
        if any(f"{c.__module__}.{c.__qualname__}" == path for c in getattr(cls, "__mro__", ())):
            return True
    return False


def for_crawler(crawler: Crawler) -> Scheduler | None:
    """The crawler's scheduler while it is open, if it is this package's (or a subclass):
    what the middlewares and extensions reach the request path through."""
    scheduler = _scheduler_of(crawler)
    return scheduler if isinstance(scheduler, Scheduler) else None


def dupefilter_for(crawler: Crawler) -> RedisBloomDupeFilter | None:
    """The crawl's dupefilter, if it is this package's: its scheduler's ``df`` (this
    package's scheduler, scrapy-redis's and Scrapy's own all keep it there)."""
    df = getattr(_scheduler_of(crawler), "df", None)
    return df if isinstance(df, RedisBloomDupeFilter) else None


def _scheduler_of(crawler: Crawler) -> Any:
    """Scrapy's public ``engine.scheduler`` (Scrapy 2.19 and later); without it (an
    older Scrapy, or no engine: a tool, a test), the scheduler of this package that
    opened for ``crawler``, if any."""
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
    df: Any

    def __init__(self, *args: Any, frontier: FrontierConfig | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.frontier = frontier or FrontierConfig.from_settings(Settings())
        #: CONCURRENT_REQUESTS: how many requests a worker can have in flight.
        self._concurrency = 1
        #: Whether a middleware acks each page once its output is queued (else a page's
        #: lease is let go when this worker is idle, and ``Leases.full`` never holds back).
        self._acks_early = False
        #: The heartbeat and its company, on the leased queue (see open).
        self.upkeep: LeaseUpkeep | None = None
        #: Where the Redis work of the filter and the queue runs: on the reactor's loop
        #: or a thread of its own during the crawl (so that Scrapy's reactor never waits
        #: for Redis), one call at a time; and what a Redis error there does.
        self.jobs = RedisJobs(lambda: self.df)
        #: The request path's owner: the dupefilter, the queue and their Redis work
        #: (see open).
        self.path: RequestPath | None = None
        #: This worker's leases, from the pop to the ack (:mod:`.scheduling.leases`), and
        #: its view of the crawl's end (:mod:`.scheduling.ending`): made when it opens.
        self.leases: Leases | None = None
        self.end: CrawlEnd | None = None
        #: Requests given to enqueue_request whose check is on the Redis thread.
        self._enqueuing = 0
        #: Requests that failed for good, recorded in Redis (the leased queue; see open).
        self.failed_requests: FailedRequests | None = None
        #: This worker's name among the crawl's workers, on a scrapy-redis queue class.
        self._member = secrets.token_hex(6)

    @classmethod
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
        # Scrapy's default DUPEFILTER_CLASS is in-memory, one per worker: it would
        # let every worker fetch every page. Only a dupefilter the user chose wins.
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
        acks_early = _enabled(settings, "SPIDER_MIDDLEWARES", MIDDLEWARE)
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
        instance = cls(server=server, **kwargs)
        instance.crawler = crawler
        instance.stats = crawler.stats
        instance._concurrency = settings.getint("CONCURRENT_REQUESTS")
        instance._acks_early = acks_early
        # Open the filter now, before the engine has a slot: an error here (a filter made
        # with other settings, damaged metadata) is then the only thing Scrapy reports.
        dupefilter_cls = load_object(instance.dupefilter_cls)
        if issubclass(dupefilter_cls, RedisBloomDupeFilter):
            if instance.flush_on_start:
                instance._flush_before_open()
            instance.df = build_from_crawler(dupefilter_cls, crawler)
        return instance

    def _flush_before_open(self) -> None:
        """``SCHEDULER_FLUSH_ON_START``: delete the crawl's filter and queue *before* the
        filter is opened, so this worker opens (and every later one joins) a new filter.
        Deleting them after it was opened, as scrapy-redis's ``open()`` does, left this
        worker with the old filter's seed and sizes over keys that no longer existed."""
        assert self.crawler.spider is not None, "built once the spider exists"
        config = BloomDupeConfig.from_settings(self.crawler.settings)
        key = config.key_for(self.crawler.spider.name)
        shards = config.plan.shards
        if meta.read(self.server, key):
            old = BloomFilter.open(self.server, key, None, read_only=True)
            shards = max(shards, old.sizing.shards)
            old.clear()
            old.close()
        frontier_queue.clear(self.server, key, shards)
        logger.info("SCHEDULER_FLUSH_ON_START: deleted the Bloom filter %s and its shared "
                    "queue; this crawl starts afresh", key)

    @property
    def leased(self) -> bool:
        """Whether the queue is the leased one (scrapy-redis's own queues are not)."""
        return self.path is not None and self.path.leased

    @property
    def buffered(self) -> bool:
        """Whether requests are handed out from a buffer that a fill tops up, and a
        callback's output is checked and queued together (see ``RequestPath.buffered``)."""
        return self.path is not None and self.path.buffered

    def open(self, spider: Spider) -> None:
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
        queue_cls = load_object(self.queue_cls)
        extra: dict[str, Any] = {}
        if isinstance(queue_cls, type) and issubclass(queue_cls, PriorityQueue):
            if isinstance(self.df, RedisBloomDupeFilter):
                tag, shards = self.df.bloom.key, self.df.bloom.sizing.shards
                wait = self.df.bloom.replicas_waited  # the filter's decision, not another
            else:
                tag, shards = BloomDupeConfig.from_settings(self.crawler.settings).key_for(
                    spider.name), 1
                wait = replicas_to_wait(wait_replicas(self.crawler.settings), self.server)
            extra = {"tag": tag, "shards": shards,
                     "lease_timeout": self.frontier.lease_timeout, "wait_replicas": wait}
        try:
            self.queue = queue_cls(
                server=self.server,
                spider=spider,
                key=self.queue_key % {"spider": spider.name},
                serializer=self.serializer,
                **extra,
            )
        except TypeError as e:
            raise ValueError(f"Failed to instantiate queue class '{self.queue_cls}': {e}") from e
        self.path = RequestPath(self.df, self.queue, self.jobs, stats=self.stats, spider=spider,
                                queued=lambda: self._end().busy())
        self.leases = Leases(self.path, frontier=self.frontier, concurrency=self._concurrency,
                             acks_early=self._acks_early, engine=self._engine,
                             idle_poll=lambda: self._end().idle_poll,
                             idle_missed=lambda: self._end().idle_missed())
        self.failed_requests = self.leases.failed
        if self.flush_on_start:
            if isinstance(self.df, RedisBloomDupeFilter):
                # The filter and its queue went before the filter was opened; what is
                # left is a scrapy-redis queue that this one would otherwise take over.
                if self.queue.key != getattr(self.queue, "tag", None):
                    self.jobs.guarded(lambda: self.server.delete(self.queue.key), 0)
            else:
                self.flush()
        if isinstance(self.queue, PriorityQueue):
            merged = self.jobs.guarded(self.queue.merge_shards, 0)
            if merged:
                logger.info("Moved %d queued request(s) and lease(s) of the queue's other "
                            "shards into shard 0 (one queue shard on one Redis node)",
                            merged, extra={"spider": spider})
        if self.leased and self.queue.key != self.queue.tag:
            # A crawl moving over from scrapy-redis: its queue's requests go on here.
            adopted = self.jobs.guarded(lambda: self.queue.adopt(self.queue.key), 0)
            if adopted:
                logger.info("Took over %d request(s) from scrapy-redis's queue %r",
                            adopted, self.queue.key, extra={"spider": spider})
        pending = self.jobs.guarded(lambda: len(self.queue), 0)
        if pending:
            logger.info("Resuming crawl (%d requests scheduled)", pending,
                        extra={"spider": spider})
        if not self.leased and isinstance(self.df, RedisBloomDupeFilter):
            # Counted among the crawl's workers, so that the last one out clears (close).
            self.jobs.guarded(lambda: frontier_queue.join(self.server, self.df.bloom.key,
                                                      self._member), None)
        if isinstance(self.df, RedisBloomDupeFilter):
            self.df.leased_queue = self.leased
        _opened[self.crawler] = self  # for an older Scrapy (see _scheduler_of)
        if isinstance(self.queue, PriorityQueue):
            self.upkeep = LeaseUpkeep(
                jobs=self.jobs, queue=self.queue,
                dupefilter=self.df if isinstance(self.df, RedisBloomDupeFilter) else None,
                server=self.server, frontier=self.frontier, stats=self.stats, spider=spider,
                settle=self.leases.settle, held=self.leases.held, verify=self._verify)
        self.end = CrawlEnd(self.path, self.leases, upkeep=self.upkeep,
                            signals=self.crawler.signals, engine=self._engine,
                            verify=self._verify, enqueuing=lambda: self._enqueuing,
                            done_grace=self.done_grace)
        self.crawler.signals.connect(self.end.spider_idle, signal=signals.spider_idle)
        if self.upkeep is not None:
            self.upkeep.beat()
        if self.leased or isinstance(self.df, RedisBloomDupeFilter):
            self.crawler.signals.connect(self._start_heartbeat, signal=signals.spider_opened)

    def _leave(self) -> bool:
        """Leave the crawl's workers; whether this one was the last (see close)."""
        if self.leased:
            return bool(self.jobs.guarded(self.queue.leave, True))
        if isinstance(self.df, RedisBloomDupeFilter):
            return bool(self.jobs.guarded(lambda: frontier_queue.leave(
                self.server, self.df.bloom.key, self._member,
                round(self.frontier.lease_timeout * 1000)), True))
        return True

    def _start_heartbeat(self) -> None:
        # Once the engine runs (the looping call needs its reactor or loop). Imported
        # here, not at the top: importing the reactor installs one, and Scrapy installs
        # its own (TWISTED_REACTOR) first.
        from twisted.internet import reactor

        if isinstance(self.df, RedisBloomDupeFilter):
            # On the loop when every round trip of the jobs has a redis.asyncio twin: the
            # filter's and the leased queue's (scrapy-redis's queues use the client).
            self.jobs.start(reactor, on_loop=is_asyncio_reactor_installed() and self.leased
                            and self.df.bloom.link.asynchronous)
        if self.upkeep is not None:  # a scrapy-redis queue has no leases to keep
            self.upkeep.start()

    def close(self, reason: str) -> Deferred[None] | None:
        if self.df is None or getattr(self, "queue", None) is None:  # open() failed
            return None
        if self.jobs.inline:
            self._close(reason)
            return None
        if self.path is not None:
            self.path.outbox.flush()  # the outputs gathering go now
        # Once the Redis thread has answered every call asked of it (Scrapy waits).
        drained: Deferred[Any] = self.jobs.io.drained()
        return drained.addCallback(lambda _: self._close(reason))

    def _close(self, reason: str) -> None:
        self.jobs.io.stop()
        if self.upkeep is not None:
            self.upkeep.stop()
        leases, end = self.leases, self.end
        if leases is not None:
            leases.close()
        if end is not None:
            end.close()
            self.crawler.signals.disconnect(end.spider_idle, signal=signals.spider_idle)
        self.crawler.signals.disconnect(self._start_heartbeat, signal=signals.spider_opened)
        if not self.leased and leases is not None and leases.buffer and not self.jobs.failed():
            # Popped and never handed out (the spider closed meanwhile): back in the
            # queue, before it is judged empty.
            back, leases.buffer = [lease.request for lease in leases.buffer], []
            self.jobs.guarded(lambda: [self.queue.push(request) for request in back], None)
        clear = not self.persist and not self.jobs.failed() and end is not None \
            and end.done_now()
        if not self.persist and not clear and not self.jobs.failed():
            logger.info("SCHEDULER_PERSIST is off, but this worker did not see the crawl "
                        "done: the shared queue and the filter are kept for the others",
                        extra={"spider": self.spider})
        if leases is not None:
            leases.settle()
        last = self._leave() if not self.jobs.failed() else False
        if clear and not last:
            # The others are closing too: the last one out deletes what is shared (the
            # first would delete the filter under them, which they take for lost state).
            clear = False
            logger.info("SCHEDULER_PERSIST is off and the crawl is done: the last worker "
                        "to close deletes the shared queue and the filter",
                        extra={"spider": self.spider})
        if self.jobs.failed():
            # Stopped on an error: touch nothing more in Redis. The leases held come back
            # to the other (or next) workers after BLOOMDUPE_LEASE_TIMEOUT.
            detach = getattr(self.queue, "detach", None)
            if self.df.failure == dupefilter_module.FINISHED and self.leased:
                # The crawl is over and gone: only this worker's name, which its
                # heartbeat or a pop may have written again, is taken out.
                detach = self.queue.forget
            if detach is not None:
                with suppress(RedisError):
                    detach()
        elif clear:
            self.jobs.guarded(self.queue.clear, None)
        else:
            close_queue = getattr(self.queue, "close", None)
            if close_queue is not None:
                self.jobs.guarded(close_queue, None)
        if isinstance(self.df, RedisBloomDupeFilter):
            # The scheduler's persist decides, also when set on the instance after
            # SCHEDULER_PERSIST was read (as scrapy-redis's close() honours it).
            self.df.persist = self.persist
            self.df.close(reason, clear=clear)  # writes the final stats
        elif clear:
            self.df.clear()  # as scrapy-redis does; its close() would clear even when persisting

    # -- queueing -------------------------------------------------------------------

    def enqueue_request(self, request: Request) -> bool:
        if request.meta.pop(WAKE_META, False):  # see _wake: it is in the buffer already
            return True
        if request.meta.pop(QUEUED_META, False):  # checked, queued and counted by the middleware
            return True
        parent = request.meta.pop(LEASE_META, None)
        if isinstance(self.df, RedisBloomDupeFilter) and not self.jobs.inline:
            return self._enqueue_async(request, parent)
        queued = self._enqueue(request)
        if parent is not None:
            # A copy of a request handed out here, scheduled from outside the spider's
            # output (a redirect, a retry, an errback's): its work goes on in the copy.
            self._ack(parent)
        return queued

    def _enqueue_async(self, request: Request, parent: str | None) -> bool:
        """:meth:`enqueue_request` during a crawl: the check-and-queue goes with the next
        Redis round trip, and the engine hears at once that the request is scheduled.
        One found seen before (or not queued: the crawl stops) is then dropped as
        Scrapy drops it: counted in ``dupefilter/filtered`` and sent with
        ``request_dropped``. A request that cannot be stored is refused here and now."""
        assert self.path is not None
        prepared = self.path.prepare([request])
        if prepared is None:
            if parent is not None:
                self._ack(parent)
            return False  # cannot be stored (reported), or the crawl has stopped
        self._enqueuing += 1

        def answered(outcomes: list[bool | None]) -> None:
            self._enqueuing -= 1
            (outcome,) = outcomes
            if outcome is not False:
                if outcome:
                    self.df.log(request, self.spider)
                self.crawler.signals.send_catch_log(signals.request_dropped, request=request,
                                                    spider=self.spider)
            if parent is not None:
                # Its work goes on in this copy, now queued (or done: a duplicate).
                self._ack(parent)
            self._end().idle_missed()

        def failed(failure: Failure) -> Failure:
            self._enqueuing -= 1
            self._end().idle_missed()
            return failure

        self.path.queue_prepared([None], *prepared).addCallbacks(answered, failed)
        return True

    def _enqueue(self, request: Request) -> bool:
        assert self.path is not None
        if self.leased and isinstance(self.df, RedisBloomDupeFilter):
            (outcome,) = self.path.check_and_queue([request])
            if outcome is None:
                return False  # cannot be stored, reported; the engine sends request_dropped
            if outcome:
                self.df.log(request, self.spider)
                return False
            return True  # queued by the filter's own script
        if self.path.storable([request]) == [None]:
            return False
        if not request.dont_filter and self.df.request_seen(request):
            self.df.log(request, self.spider)
            return False
        if self.jobs.guarded(lambda: self.queue.push(request) or True, False):
            self.stats.inc_value("scheduler/enqueued/redis")
            self._end().busy()
            return True
        logger.error("Could not queue %s: Redis is unavailable", request)
        return False

    def next_request(self) -> Request | None:
        if not self.buffered:
            # Never a blocking pop (scrapy-redis's BRPOP for SCHEDULER_IDLE_BEFORE_CLOSE):
            # it would freeze the reactor, and one longer than the socket timeout fails
            # as if Redis were gone. An idle worker polls instead (CrawlEnd.spider_idle),
            # and waits SCHEDULER_IDLE_BEFORE_CLOSE seconds for work before it closes.
            request: Request | None = self.jobs.guarded(lambda: self.queue.pop(0), None)
        else:
            request = self._leases().take()
        if request is not None:
            self.stats.inc_value("scheduler/dequeued/redis")
            self._end().busy()
        elif self.buffered and not self._leases().holding():
            self._end().wake_later()  # nothing in hand: the engine would ask again only in 5 s
        return request

    def done(self, request: Request) -> None:
        """Scrapy is done with ``request`` (its callback's output is queued, it failed for
        good and was recorded, or it was dropped): its lease is acked, with the next
        round trip. Called by this package's middlewares; a request this scheduler did
        not hand out is ignored."""
        field = request.meta.get(LEASE_META)
        if field is not None:
            self._ack(field)

    def _ack(self, field: str) -> None:
        self._leases().ack(field)

    def has_pending_requests(self) -> bool:
        leases = self._leases()
        if self.buffered and (leases.buffer or leases.filling or self._enqueuing):
            return True
        if not self.jobs.inline:
            # Asked by the engine whenever it looks idle: no round trip here. With nothing
            # in hand it fires spider_idle, whose handler asks Redis whether work is left.
            return False
        # Unknown while Redis is away: say yes, so the spider is not closed as idle.
        return bool(self.jobs.guarded(lambda: len(self.queue) > 0, True))

    def record_failed(self, request: Request, reason: str) -> None:
        """Keep ``request``, which failed for good, in Redis (``bloomdupe failed``)."""
        if self.failed_requests is not None:  # the leased queue only
            self._leases().record_failed(request, reason).addErrback(acted_on)

    @property
    def crawl_done(self) -> bool:
        """True while this worker sees the crawl done: the queue empty, no lease held,
        for the grace period of its current idle spell (see :mod:`.scheduling.ending`)."""
        return self.end is not None and self.end.crawl_done

    @property
    def done_grace(self) -> float:
        """Seconds the shared queue must stay empty, with no lease held, before this
        worker closes: ``BLOOMDUPE_DONE_GRACE``, or scrapy-redis's
        ``SCHEDULER_IDLE_BEFORE_CLOSE`` when it is longer."""
        return max(self.frontier.done_grace, float(self.idle_before_close or 0))

    def silence(self) -> float:
        """Seconds since this worker's last heartbeat went through (0 before the first,
        and on a scrapy-redis queue class, which has none)."""
        return 0.0 if self.upkeep is None else self.upkeep.silence()

    def _verify(self) -> bool:
        """Whether the filter is still there, unchanged (else the crawl is stopped)."""
        if isinstance(self.df, RedisBloomDupeFilter):
            self.jobs.guarded(self.df.bloom.verify, None)
            self.jobs.guarded(lambda: check_eviction(self.df.bloom.link, warn=False), None)
        return not self.jobs.failed()

    def _leases(self) -> Leases:
        assert self.leases is not None, "made when the scheduler opens"
        return self.leases

    def _end(self) -> CrawlEnd:
        assert self.end is not None, "made when the scheduler opens"
        return self.end

    def _engine(self) -> ExecutionEngine | None:
        """The crawler's engine once it runs, else None (a tool, a test)."""
        try:
            return self.crawler.engine
        except RuntimeError:  # "Crawler.engine is not set yet"
            return None


_opened: weakref.WeakKeyDictionary[Crawler, Scheduler] = weakref.WeakKeyDictionary()
