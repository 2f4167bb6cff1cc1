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
import time
import weakref
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from redis.exceptions import RedisError
from scrapy import signals
from scrapy.exceptions import CloseSpider, DontCloseSpider
from scrapy.settings import Settings
from scrapy.utils.asyncio import call_later
from scrapy.utils.conf import build_component_list
from scrapy.utils.defer import deferred_from_coro
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
from .frontier.queue import Lease, PriorityQueue
from .scheduling.failed import FailedRequests
from .scheduling.jobs import RedisJobs, Stopped, acted_on
from .scheduling.requestpath import LEASE_META, RequestPath
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

T = TypeVar("T")

DUPEFILTER_CLASS = "scrapy_bloomdupe.dupefilter.RedisBloomDupeFilter"
QUEUE_CLASS = "scrapy_bloomdupe.frontier.queue.PriorityQueue"
MIDDLEWARE = "scrapy_bloomdupe.middleware.BloomDupeBatchMiddleware"
#: ``request.meta`` key of a request the batch middleware has already queued.
QUEUED_META = "_bloomdupe_queued"
#: ``request.meta`` key of a leased request handed to ``engine.crawl`` to wake an idle
#: engine (see _wake): already in this scheduler's buffer.
WAKE_META = "_bloomdupe_wake"
#: How often an idle worker looks at the shared queue again (seconds), at first; it backs
#: off, doubling, to MAX_IDLE_POLL while it finds nothing to do.
IDLE_POLL = 0.5
MAX_IDLE_POLL = 2.0
#: Longest time an ack waits for a round trip to ride on before it is sent alone (s).
ACK_DELAY = 0.05


@dataclass(frozen=True)
class _Look:
    """What an idle worker's look at the shared queue found (see _fill)."""

    queued: int
    leased: int
    #: Whether the filter was found still there, unchanged (asked once the queue was
    #: seen empty before).
    verified: bool
    #: The scheduler's work count when the look was asked (see _busy).
    work: int
    #: Dead workers' leases put back by the look.
    back: list[tuple[int, Request]]


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
        #: Leases taken and not yet handed to Scrapy, then handed and not yet done.
        self._buffer: list[Lease] = []
        #: CONCURRENT_REQUESTS: how many requests a worker can have in flight.
        self._concurrency = 1
        #: Whether a middleware acks each page once its output is queued (else a page's
        #: lease is let go when this worker is idle, and :meth:`_full` never holds back).
        self._acks_early = False
        self._acks_sending = False
        #: Whether the last pop got all it asked for (see _prefetch_count).
        self._deep = False
        self._handed: dict[str, Lease] = {}
        #: The heartbeat and its company, on the leased queue (see open).
        self.upkeep: LeaseUpkeep | None = None
        self._wakeup: Any = None
        self._ack_call: Any = None
        #: Where the Redis work of the filter and the queue runs: on the reactor's loop
        #: or a thread of its own during the crawl (so that Scrapy's reactor never waits
        #: for Redis), one call at a time; and what a Redis error there does.
        self.jobs = RedisJobs(lambda: self.df)
        #: The request path's owner: the dupefilter, the queue and their Redis work
        #: (see open).
        self.path: RequestPath | None = None
        #: Requests given to enqueue_request whose check is on the Redis thread.
        self._enqueuing = 0
        #: Requests that failed for good, recorded in Redis (the leased queue; see open).
        self.failed_requests: FailedRequests | None = None
        #: The idle look at the shared queue that _after_poll is acting on (see _fill).
        self._look: _Look | None = None
        #: Times this worker had work (see _busy): a look from before is stale.
        self._work = 0
        self._filling = False
        #: A pop whose every request had come back too often: pop again.
        self._refill = False
        #: Whether the engine asked for a request and got none since the last pop.
        self._starved = False
        self._idle_poll = IDLE_POLL
        #: Until when an empty queue is not asked again but by the idle poll (see _fill).
        self._empty_until = 0.0
        self._idle_since: float | None = None
        self._waiting_for: str | None = None
        #: True while this worker sees the crawl done: the queue empty, no lease held,
        #: for the grace period of its current idle spell (any work seen ends it).
        self.crawl_done = False
        self._done_logged = False
        #: This worker's name among the crawl's workers, on a scrapy-redis queue class.
        self._member = secrets.token_hex(6)

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
                     "lease_timeout": self.frontier.lease_timeout, "wait_replicas": wait,
                     "failed_limit": self.frontier.failed_limit}
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
                                queued=self._busy)
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
        self.crawler.signals.connect(self._spider_idle, signal=signals.spider_idle)
        if isinstance(self.queue, PriorityQueue):
            self.failed_requests = FailedRequests(
                jobs=self.jobs, queue=self.queue, limit=self.frontier.failed_limit,
                stats=self.stats, spider=spider, ack=self._ack)
            self.upkeep = LeaseUpkeep(
                jobs=self.jobs, queue=self.queue,
                dupefilter=self.df if isinstance(self.df, RedisBloomDupeFilter) else None,
                server=self.server, frontier=self.frontier, stats=self.stats, spider=spider,
                settle=self._settle, held=lambda: [*self._buffer, *self._handed.values()],
                verify=self._verify, retired=self.failed_requests.report_retired)
            self.upkeep.beat()
        if self.leased or isinstance(self.df, RedisBloomDupeFilter):
            self.crawler.signals.connect(self._start_heartbeat, signal=signals.spider_opened)

    def _done_now(self) -> bool:
        """Whether the crawl is done at this moment (for ``SCHEDULER_PERSIST`` off): this
        worker's current idle spell saw it done for the grace period, and the shared
        queue is still empty with no lease held (this worker's acks sent first)."""
        if not self.crawl_done:
            return False
        if not self.leased:
            return not self.jobs.guarded(lambda: len(self.queue), 1)
        self._settle()
        self.jobs.guarded(lambda: self.queue.heartbeat() or True, False)
        queued, leased = self.jobs.guarded(self.queue.status, (1, 1))
        return not queued and not leased and not self.jobs.failed()

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
        for call in (self._wakeup, self._ack_call):
            if call is not None:
                call.cancel()
        self._wakeup = self._ack_call = None
        self.crawler.signals.disconnect(self._spider_idle, signal=signals.spider_idle)
        self.crawler.signals.disconnect(self._start_heartbeat, signal=signals.spider_opened)
        if not self.leased and self._buffer and not self.jobs.failed():
            # Popped and never handed out (the spider closed meanwhile): back in the
            # queue, before it is judged empty.
            back, self._buffer = [lease.request for lease in self._buffer], []
            self.jobs.guarded(lambda: [self.queue.push(request) for request in back], None)
        clear = not self.persist and not self.jobs.failed() and self._done_now()
        if not self.persist and not clear and not self.jobs.failed():
            logger.info("SCHEDULER_PERSIST is off, but this worker did not see the crawl "
                        "done: the shared queue and the filter are kept for the others",
                        extra={"spider": self.spider})
        self._settle()
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
        if self.failed_requests is not None:
            self.failed_requests.report_retired()  # what the closing reap could not decode
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
            self._idle_missed()

        def failed(failure: Failure) -> Failure:
            self._enqueuing -= 1
            self._idle_missed()
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
            self._busy()
            return True
        logger.error("Could not queue %s: Redis is unavailable", request)
        return False

    def next_request(self) -> Request | None:
        if not self.buffered:
            # Never a blocking pop (scrapy-redis's BRPOP for SCHEDULER_IDLE_BEFORE_CLOSE):
            # it would freeze the reactor, and one longer than the socket timeout fails
            # as if Redis were gone. An idle worker polls instead (_spider_idle), and
            # waits SCHEDULER_IDLE_BEFORE_CLOSE seconds for work before it closes.
            request: Request | None = self.jobs.guarded(lambda: self.queue.pop(0), None)
        else:
            self._settle()
            if not self._buffer:
                self._fill()  # during a crawl, in the background
            request = None
            if self._buffer and self._full():
                if not self._starved:
                    self.stats.inc_value("bloomdupe/held_full")
                self._starved = True  # the acks' answer wakes the engine (see _acks_out)
                self._send_acks_now()
            elif self._buffer:
                lease = self._buffer.pop(0)
                request = lease.request
                request.meta.pop(WAKE_META, None)  # left when a signal dropped the wake
                if self.leased:
                    self._handed[lease.field] = lease
                    request.meta[LEASE_META] = lease.field
                    if len(self._buffer) <= self._low_water():
                        self._fill()  # the next ones, while these download
            else:
                self._starved = True
        if request is not None:
            self.stats.inc_value("scheduler/dequeued/redis")
            self._busy()
        elif self.buffered and not self._holding():
            self._wake_later()  # nothing in hand: the engine would ask again only in 5 s
        return request

    def _fill(self, *, poll: bool = False, then: Callable[[], None] | None = None) -> None:
        """Lease requests into the buffer (see _prefetch_count): during a crawl on the
        Redis thread, the engine woken when they come and it had asked for one in vain
        (``engine.crawl``). After a pop that found the queue empty, the engine's asks
        (one per finished download) go to Redis again only once the idle poll is due,
        or this worker queued something; the idle poll (``poll``) always looks.
        ``then`` runs once the answer is in (at once when there is nothing to do)."""
        if self._filling or len(self._buffer) > self._low_water() or self.jobs.failed() or (
                not poll and time.monotonic() < self._empty_until):
            if then is not None and not self._filling:
                then()
            return
        count = self._prefetch_count()
        self._filling = True
        pop = partial(self.jobs.outage_call, partial(self.queue.pop_leases, count)) \
            if self.leased else partial(self._pop_unleased, count)
        look = self._look_job() if poll and not self.jobs.inline else None

        def job() -> tuple[list[Lease], _Look | None]:
            leases = pop()
            return leases, (look() if look is not None and not leases else None)

        d = self.jobs.run(job)
        d.addCallbacks(partial(self._filled, count), self.jobs.redis_failed)
        d.addBoth(self._fill_over, then)

    def _pop_unleased(self, count: int) -> list[Lease]:
        """Where the Redis work runs: up to ``count`` requests from a scrapy-redis queue,
        one ``pop`` each, as scrapy-redis pops (wrapped as leases that lease nothing)."""
        popped: list[Lease] = []
        while len(popped) < count:
            try:
                request = self.jobs.outage_call(lambda: self.queue.pop(0))
            except Exception:
                if not popped:
                    raise
                break  # hand out what was popped: the next pop meets the error again
            if request is None:
                break
            popped.append(Lease(0, "", request))
        return popped

    def _look_job(self) -> Callable[[], _Look]:
        """An idle worker's look at the shared queue, for the Redis thread (what
        ``spider_idle`` asks of Redis when the worker runs without the thread): put dead
        workers' leases back when due, count what is queued and leased, and, once the
        queue was seen empty before, check that the filter is still there."""
        reap = self.upkeep is not None and self.upkeep.reap_due()
        verify = self._idle_since is not None
        work = self._work
        call = self.jobs.outage_call

        def look() -> _Look:
            # The pending acks go first (with the reap when it is due): the leases
            # counted below must not include this worker's finished ones.
            back: list[tuple[int, Request]] = call(self.queue.reap) if reap else []
            if not reap and self.leased:
                call(self.queue.send_acks)
            queued, leased = call(self.queue.status) if self.leased else (
                call(lambda: len(self.queue)), 0)
            verified = verify and not queued and not leased
            if verified:
                call(self.df.bloom.verify)
                call(lambda: check_eviction(self.df.bloom.link, warn=False))
            return _Look(queued, leased, verified, work, back)
        return look

    def _filled(self, count: int, answer: tuple[list[Lease], _Look | None]) -> None:
        leases, look = answer
        if look is not None:
            if self.upkeep is not None:
                self.upkeep.reaped(look.back)
            self._look = look
        # A full answer: the queue is deep, the next pop may take a few more (leased only:
        # what a scrapy-redis queue's pop took is lost if this worker dies with it).
        self._deep = self.leased and len(leases) >= count
        self._buffer.extend(lease for lease in leases
                            if not (self.leased and self._came_back_too_often(lease)))
        # Entries it could not decode (retired): the queue is not empty, take more now.
        retired = self.failed_requests.report_retired() if self.failed_requests else 0
        if retired:
            self._refill = True
        elif not leases:
            self._empty_until = time.monotonic() + self._idle_poll
        elif self._buffer and self._starved:
            self._starved = False
            self._wake_engine()

    def _fill_over(self, result: Any, then: Callable[[], None] | None) -> None:
        self._filling = False
        if self.failed_requests is not None:
            self.failed_requests.report_retired()  # what the pop could not decode
        if isinstance(result, Failure):
            self._look = None
            if not isinstance(result.value, Stopped):
                logger.error("Leasing requests failed: %s", result.getErrorMessage())
        refill, self._refill = self._refill, False
        if refill and not self._buffer and not self.jobs.failed():
            self._fill()  # all it took came back too often: take more
        if then is not None:
            then()
        else:
            self._idle_missed()

    def _idle_missed(self) -> None:
        """A fill or a check on the Redis thread is over, and :meth:`has_pending_requests`
        said yes while it was on its way. The engine looks whether it is idle (and sends
        ``spider_idle``) only right after it asks for a request, and asks only when a
        download or callback ends or on its 5 s heartbeat; that ask starts a fill, whose
        answer comes after the look. Without a middleware that acks, a page's lease is
        held until ``spider_idle`` (see _settle), so no idle poll was due either (see
        next_request) and the worker never closed. If the engine is idle now, the idle
        round it missed runs here (the idle poll, at once)."""
        if self._wakeup is not None or self._buffer or self._filling or self._enqueuing \
                or self.jobs.failed():
            return
        engine = self._engine()
        if engine is None or engine.spider is None:
            return
        with suppress(RuntimeError):  # the engine's slot is gone: it is closing
            if engine.spider_is_idle():
                self._wake_later(0.0)

    def _wake_engine(self) -> None:
        """Hand the engine a buffered request (``engine.crawl``, Scrapy's public way to
        make it ask :meth:`next_request` now), when it runs."""
        engine = self._engine()
        if engine is None or engine.spider is None or not self._buffer:
            return
        request = self._buffer[0].request
        request.meta[WAKE_META] = True
        engine.crawl(request)

    def done(self, request: Request) -> None:
        """Scrapy is done with ``request`` (its callback's output is queued, it failed for
        good and was recorded, or it was dropped): its lease is acked, with the next
        round trip. Called by this package's middlewares; a request this scheduler did
        not hand out is ignored."""
        field = request.meta.get(LEASE_META)
        if field is not None:
            self._ack(field)

    def _ack(self, field: str) -> None:
        if self.failed_requests is not None and self.failed_requests.holds_ack(field):
            return  # acked once its failure record is in Redis
        lease = self._handed.pop(field, None)
        if lease is None or self.jobs.failed():  # after an error what is held comes back
            return
        self.queue.ack([lease])
        if self._starved and self._buffer:
            self._send_acks_now()  # the engine waits for them (see _full)
        else:
            self._ack_later()

    def _ack_later(self) -> None:
        """Sent with the next round trip, or after ACK_DELAY at the latest: a worker
        killed meanwhile has only what it holds, and these few, fetched again."""
        if self._ack_call is None and self._engine() is not None:
            self._ack_call = call_later(ACK_DELAY, self._send_acks)

    def _send_acks_now(self) -> None:
        """The pending acks, without waiting for ACK_DELAY; not while a send is on its
        way (during an outage the engine's asks would pile sends on the Redis thread):
        its answer sends what came since (see _acks_out)."""
        if self._ack_call is not None:
            self._ack_call.cancel()
            self._ack_call = None
        if not self._acks_sending and self.queue.pending_acks():
            self._send_acks()

    def _send_acks(self) -> None:
        self._ack_call = None
        if not self.jobs.failed():
            self._acks_sending = True
            sent = self.jobs.run(lambda: self.jobs.outage_call(self.queue.send_acks))
            sent.addCallbacks(self._acks_out, self.jobs.redis_failed)

    def _acks_out(self, _: None) -> None:
        """Acks are in Redis: the engine, if it asked in vain while this worker held its
        limit (see :meth:`_full`), gets a request now. Acks that came while these were
        on their way (:meth:`_send_acks_now` sent none meanwhile) go now if the engine
        still waits, else within ACK_DELAY."""
        self._acks_sending = False
        if self._starved and self._buffer and not self._full():
            self._starved = False
            self._wake_engine()
        if self.queue.pending_acks():
            if self._starved and self._buffer:
                self._send_acks_now()
            else:
                self._ack_later()

    def _full(self) -> bool:
        """Whether this worker holds as many unacked pages as it may: those handed to
        Scrapy and not done, and those done whose acks are not in Redis yet, at most
        ``CONCURRENT_REQUESTS`` and the prefetch (a quarter of it). The engine can hold
        more than ``CONCURRENT_REQUESTS`` (downloaded pages whose callbacks, or whose
        output's check-and-queue, are not over); every one of them would be fetched
        again if this worker died, so a killed worker costs at most that many pages
        fetched twice. Its buffer's requests do not count (not fetched yet). Without
        the batch middleware (pages acked only when this worker is idle), never."""
        if not (self.leased and self._acks_early):
            return False
        held: int = len(self._handed) + self.queue.pending_acks()
        return held >= self._concurrency + max(1, self._concurrency // 4)

    def _came_back_too_often(self, lease: Lease) -> bool:
        """A request whose lease expired ``BLOOMDUPE_MAX_REQUEUES`` times (each worker
        that took it stopped heartbeating: it blocks the reactor, or crashes the
        process) is recorded as failed and leaves the queue, so that the crawl ends."""
        limit = self.frontier.max_requeues
        if lease.requeues < limit:
            return False
        logger.warning("%s came back to the queue %d times (BLOOMDUPE_MAX_REQUEUES = %d): "
                       "each worker that took it stopped heartbeating for "
                       "BLOOMDUPE_LEASE_TIMEOUT (%ss) while it held it. A callback that "
                       "blocks the reactor (time.sleep, a synchronous HTTP call) or that "
                       "kills the process does this. Recorded as failed instead of handed "
                       "out again (`bloomdupe failed --requeue` fetches it again)",
                       lease.request, lease.requeues, limit, self.frontier.lease_timeout,
                       extra={"spider": self.spider})
        recorded = self._record_failed(
            lease.request, f"its lease expired {lease.requeues} times "
            "(BLOOMDUPE_MAX_REQUEUES): every worker that took it stopped heartbeating")
        recorded.addCallbacks(lambda _: self.queue.ack([lease]), acted_on)
        self._refill = True
        return True

    def _busy(self) -> None:
        """This worker has work, or queued some: look at the queue again at once."""
        self._not_done()
        self._work += 1
        self._idle_poll = IDLE_POLL
        self._empty_until = 0.0

    def _not_done(self) -> None:
        """The crawl has work (here or at other workers): an idle spell, if any, is over."""
        self._idle_since = None
        self.crawl_done = False
        self._done_logged = False

    def _prefetch_count(self) -> int:
        """How many requests to lease in one round trip: this worker's free download
        slots that its buffer does not cover (at least one), which the engine fills at
        once; and, while the queue is deep (the last pop got all it asked for), a
        quarter of ``CONCURRENT_REQUESTS`` more, so that a busy worker pops once every
        few pages instead of once a page.
        Near the end of the crawl (a short answer) it takes no more than it can start,
        so no request waits here while another worker could fetch it. On a scrapy-redis
        queue, never more than the engine can start (its free download slots)."""
        if not self.leased:
            return max(1, self._concurrency - self._holding() - len(self._buffer))
        extra = max(1, self._concurrency // 4) if self._deep else 0
        return max(1, self._concurrency - len(self._handed) - len(self._buffer)) + extra

    def _holding(self) -> int:
        """Requests this worker has in progress, whose end makes the engine ask for more:
        those handed out and not done; on a scrapy-redis queue, those downloading."""
        if self.leased:
            return len(self._handed)
        return len(getattr(getattr(self._engine(), "downloader", None), "active", ()))

    def _low_water(self) -> int:
        """How few buffered requests make the next pop go out: while the queue is deep, a
        quarter of ``CONCURRENT_REQUESTS``, so that the pop's round trip runs while
        those start (no download slot waits for it); else none left."""
        return self._concurrency // 4 if self._deep else 0

    def has_pending_requests(self) -> bool:
        if self.buffered and (self._buffer or self._filling or self._enqueuing):
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
            self._record_failed(request, reason).addErrback(acted_on)

    def _record_failed(self, request: Request, reason: str) -> Deferred[None]:
        """Record ``request`` as it is to be fetched again (without Scrapy's retry count
        and this package's marks), its lease acked once the record is in Redis."""
        assert self.failed_requests is not None, "the leased queue's"
        meta = {k: v for k, v in request.meta.items()
                if k not in ("retry_times", QUEUED_META, LEASE_META)}
        return self.failed_requests.record(request.replace(meta=meta), reason,
                                           lease=request.meta.get(LEASE_META))

    # -- leases ---------------------------------------------------------------------

    def _settle(self, *, idle: bool = False) -> None:
        """Ack every lease handed out when nothing can be working on it any more: Scrapy
        is ``idle`` (spider_idle: nothing downloading or scraping; a lease that no
        middleware acked, which should not happen, is acked then), or there is no engine
        (a tool, a test: whoever took a request is done with it)."""
        if not self._handed or self.jobs.failed():
            return  # after an error, nothing is acked: what is in hand comes back
        if not idle and self._engine() is not None:
            return
        done = list(self._handed.values())
        self._handed.clear()
        self.queue.ack(done)

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

    # -- the end of the crawl -----------------------------------------------------------

    def _spider_idle(self, spider: Spider) -> None:
        """This worker has nothing to do: stay while the crawl may still make work."""
        if not self.jobs.inline:
            self._idle_async(spider)
            return
        self._settle(idle=True)
        if self.upkeep is not None:
            self.upkeep.reap()
            queued, leased = self.jobs.guarded(self.queue.status, (1, 0))
        else:
            queued, leased = self.jobs.guarded(lambda: len(self.queue), 1), 0
        if queued or leased:
            self._stay(queued, leased, spider)
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        if now - self._idle_since < self.done_grace:
            self._wake_later()
            raise DontCloseSpider
        if not self._verify():
            return  # an empty queue of a filter that is gone is no finished crawl
        self._crawl_is_done(now - self._idle_since, spider)

    def _crawl_is_done(self, idle: float, spider: Spider) -> None:
        """The shared queue has been empty, with no lease held, for ``idle`` seconds:
        the grace is over, and this worker may close."""
        self.crawl_done = True
        if not self._done_logged:  # once an idle spell: a spider kept open comes back here
            self._done_logged = True
            logger.info("The crawl is done: the shared queue is empty and no worker holds a "
                        "lease (for %.1fs, BLOOMDUPE_DONE_GRACE or SCHEDULER_IDLE_BEFORE_CLOSE)",
                        idle, extra={"spider": spider})

    def _stay(self, queued: int, leased: int, spider: Spider) -> NoReturn:
        """The crawl has work left: stay (once a change, one INFO line saying why)."""
        self._not_done()
        waiting = ("the shared queue has requests" if queued else
                   f"{leased} request(s) are leased by other workers, whose pages may "
                   "queue more")
        if waiting != self._waiting_for:
            self._waiting_for = waiting
            logger.info("Idle, staying: %s", waiting, extra={"spider": spider})
        self._wake_later()
        raise DontCloseSpider

    def _idle_async(self, spider: Spider) -> None:
        """:meth:`_spider_idle` during a crawl, with no Redis call here: it acts on the
        look at the shared queue that the idle poll took on the Redis thread (see
        _wake), and, with none at hand, asks for one and stays."""
        if self._enqueuing or (self.failed_requests is not None and self.failed_requests.pending):
            # A request's check or a failure's record is on its way: its lease is held.
            self._wake_later()
            raise DontCloseSpider
        self._settle(idle=True)
        look = self._look
        if look is None or look.work != self._work:
            self._wake_later(0.0)
            raise DontCloseSpider
        if look.queued or look.leased:
            self._stay(look.queued, look.leased, spider)
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        if now - self._idle_since < self.done_grace or not look.verified:
            self._wake_later(min(self._idle_poll,
                                 max(0.0, self._idle_since + self.done_grace - now)))
            raise DontCloseSpider
        self._crawl_is_done(now - self._idle_since, spider)

    @property
    def done_grace(self) -> float:
        """Seconds the shared queue must stay empty, with no lease held, before this
        worker closes: ``BLOOMDUPE_DONE_GRACE``, or scrapy-redis's
        ``SCHEDULER_IDLE_BEFORE_CLOSE`` when it is longer."""
        return max(self.frontier.done_grace, float(self.idle_before_close or 0))

    def _wake_later(self, delay: float | None = None) -> None:
        """Look at the shared queue again in ``delay`` seconds (by default the idle poll,
        which then backs off)."""
        if self._wakeup is None and self._engine() is not None:
            if delay is None:
                delay = self._idle_poll
                self._idle_poll = min(self._idle_poll * 2, MAX_IDLE_POLL)
            self._wakeup = call_later(delay, self._wake)

    def _wake(self) -> None:
        """An idle engine asks its scheduler again only on its 5 s heartbeat. Look now:
        requests another worker queued are leased and one is handed to
        ``engine.crawl`` (Scrapy's public way to wake the engine, which then asks
        :meth:`next_request`); with none, Scrapy's idle round is run, as the engine
        runs it, so that this worker stays or closes without waiting 5 s."""
        self._wakeup = None
        if self._filling:  # a pop is on its way: look once it is in
            self._wake_later()
            return
        if self.buffered and not self._buffer:
            self._starved = True  # what the pop brings wakes the engine (see _filled)
            self._fill(poll=True, then=self._after_poll)
        else:
            self._after_poll()

    def _after_poll(self) -> None:
        look, self._look = self._look, None
        engine = self._engine()
        if engine is None or engine.spider is None or self.jobs.failed():
            return
        if self._buffer:
            self._idle_poll = IDLE_POLL
            if self._starved:
                self._starved = False
                self._wake_engine()
            return
        if not engine.spider_is_idle():
            if not self._holding():  # the queue had requests, others took them: look again
                self._wake_later()
            return
        self._look = look  # what the idle handler acts on: this poll's look only
        try:
            results = self.crawler.signals.send_catch_log(
                signals.spider_idle, spider=engine.spider, dont_log=DontCloseSpider)
        finally:
            self._look = None
        raised = [r.value for _, r in results if isinstance(r, Failure)
                  and isinstance(r.value, (DontCloseSpider, CloseSpider))]
        if any(isinstance(e, DontCloseSpider) for e in raised) or not engine.spider_is_idle():
            return
        reason = next((e.reason for e in raised if isinstance(e, CloseSpider)), "finished")
        deferred_from_coro(engine.close_spider_async(reason=reason))

    def _engine(self) -> ExecutionEngine | None:
        """The crawler's engine once it runs, else None (a tool, a test)."""
        try:
            return self.crawler.engine
        except RuntimeError:  # "Crawler.engine is not set yet"
            return None


_opened: weakref.WeakKeyDictionary[Crawler, Scheduler] = weakref.WeakKeyDictionary()
