"""The crawl's shared state in Redis, as one worker finds it when it opens and leaves it
when it closes: ``SCHEDULER_FLUSH_ON_START`` (:func:`flush_before_open`), the shared
queue (:func:`make_queue`), the queue's shards merged onto one node, a scrapy-redis
queue taken over, the crawl's workers joined and left, and, once the crawl is done
with ``SCHEDULER_PERSIST`` off, the queue cleared by the last worker out
(:class:`SharedCrawl`)."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any, TypeAlias

from redis.exceptions import RedisError
from scrapy.dupefilters import BaseDupeFilter
from scrapy.utils.conf import build_component_list
from scrapy.utils.misc import build_from_crawler, load_object
from scrapy.utils.python import global_object_name
from scrapy_redis.queue import Base as ScrapyRedisQueue

from .. import dupefilter as dupefilter_module
from ..bloom import meta
from ..bloom.filter import BloomFilter
from ..dupefilter import RedisBloomDupeFilter
from ..exceptions import BloomDupeError
from ..frontier import entry
from ..frontier import queue as frontier_queue
from ..frontier.leased import LeasedQueue, slot_status
from ..frontier.politeness import OneSlot, SlotPolicy
from ..frontier.queue import PriorityQueue
from ..settings import BloomDupeConfig, FrontierConfig, wait_replicas
from ..transport.wait import replicas_to_wait

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings
    from scrapy.spiders import Spider

    from .jobs import RedisJobs

logger = logging.getLogger(__name__)

#: The crawl's shared queue: this package's leased one (a :class:`LeasedQueue`
#: whatever the politeness mode; its base class when a queue of the user's extends it)
#: or a scrapy-redis queue class's (``SCHEDULER_QUEUE_CLASS``).
SharedQueue: TypeAlias = PriorityQueue | ScrapyRedisQueue


def flush_before_open(server: Redis | RedisCluster, settings: BaseSettings,
                      spider_name: str) -> None:
    """``SCHEDULER_FLUSH_ON_START``: delete the crawl's filter and queue *before* the
    filter is opened, so this worker opens (and every later one joins) a new filter.
    Deleting them after it was opened, as scrapy-redis's ``open()`` does, left this
    worker with the old filter's seed and sizes over keys that no longer existed."""
    config = BloomDupeConfig.from_settings(settings)
    key = config.key_for(spider_name)
    shards = config.plan.shards
    if meta.read(server, key):
        old = BloomFilter.open(server, key, None, read_only=True)
        shards = max(shards, old.sizing.shards)
        old.clear()
        old.close()
    frontier_queue.clear(server, key, shards)
    logger.info("SCHEDULER_FLUSH_ON_START: deleted the Bloom filter %s and its shared "
                "queue; this crawl starts afresh", key)


def make_queue(queue_cls: str | type[Any], *, server: Redis | RedisCluster, spider: Spider,
               key: str, serializer: Any, df: BaseDupeFilter, settings: BaseSettings,
               frontier: FrontierConfig) -> SharedQueue:
    """The shared queue of class ``queue_cls`` (a dotted path or a class): the leased
    one (:class:`..frontier.leased.LeasedQueue`, or an old path of it) beside the filter
    ``df``, sharded as it is and waiting for the replicas it waits for; or a scrapy-redis
    queue class."""
    cls = load_object(queue_cls)
    extra: dict[str, Any] = {}
    if isinstance(cls, type) and issubclass(cls, PriorityQueue):
        if isinstance(df, RedisBloomDupeFilter):
            tag, shards = df.bloom.key, df.bloom.sizing.shards
            wait = df.bloom.replicas_waited  # the filter's decision, not another
        else:
            tag, shards = BloomDupeConfig.from_settings(settings).key_for(spider.name), 1
            wait = replicas_to_wait(wait_replicas(settings), server)
        extra = {"tag": tag, "shards": shards,
                 "lease_timeout": frontier.lease_timeout, "wait_replicas": wait,
                 "failed_limit": frontier.failed_limit}
        if frontier.politeness == "crawl":  # (check_politeness refused another class)
            cls = LeasedQueue
            extra["policy"] = SlotPolicy(settings, spider)
        elif cls in (PriorityQueue, LeasedQueue):
            # Every request in one slot without limits, a slot a queue shard on a cluster.
            cls = LeasedQueue
            extra["policy"] = OneSlot()
    try:
        queue: SharedQueue = cls(server=server, spider=spider, key=key, serializer=serializer,
                                 **extra)
        return queue
    except TypeError as e:
        raise ValueError(f"Failed to instantiate queue class '{queue_cls}': {e}") from e


def claim_queue_format(queue_cls: str | type[Any], *, server: Redis | RedisCluster,
                       settings: BaseSettings, spider_name: str, write: bool) -> bool:
    """At the worker's start: record the format of the entries it writes in the crawl's
    leased queue (tagged, as the filter is, by BLOOMDUPE_KEY); ``write`` False: only
    look (before the filter's start-up check, which must find nothing written). Whether
    it is recorded now (True too for a queue that is not the leased one: nothing to
    record). Raises :class:`~..frontier.entry.QueueFormatError` (the worker does not
    start) when a newer release's worker recorded one this release cannot read."""
    cls = load_object(queue_cls)
    if isinstance(cls, type) and issubclass(cls, PriorityQueue):
        return entry.claim_format(
            server, BloomDupeConfig.from_settings(settings).key_for(spider_name), write=write)
    return True


#: Enables the crawl-wide back-off (the add-on does).
BACKOFF_MIDDLEWARE = "scrapy_bloomdupe.backoff.CrawlBackoffMiddleware"


def enabled(settings: BaseSettings, name: str, path: str) -> bool:
    """Whether the component at ``path`` (or a subclass of it) is enabled in ``name``."""
    for component in build_component_list(settings.getwithbase(name)):
        cls = load_object(component) if isinstance(component, str) else component
        if any(global_object_name(c) == path for c in getattr(cls, "__mro__", ())):
            return True
    return False


def check_politeness(frontier: FrontierConfig, settings: BaseSettings,
                     queue_cls: str | type[Any], server: Redis | RedisCluster) -> None:
    """At a worker's start: ``"crawl"`` politeness needs this package's default queue,
    else one line says what to do; without the back-off middleware it warns."""
    if frontier.politeness != "crawl":
        return
    if load_object(queue_cls) not in (PriorityQueue, LeasedQueue):
        raise BloomDupeError(
            f"BLOOMDUPE_POLITENESS = 'crawl' needs this package's default queue, not "
            f"SCHEDULER_QUEUE_CLASS = {queue_cls!r}: remove that setting, or set "
            "BLOOMDUPE_POLITENESS = 'worker'")
    if not enabled(settings, "DOWNLOADER_MIDDLEWARES", BACKOFF_MIDDLEWARE):
        logger.warning(
            "DOWNLOADER_MIDDLEWARES lacks %r (order 560): with BLOOMDUPE_POLITENESS = "
            "'crawl' a 429 or 503 pauses its site only for the worker that got it. Add "
            "it, or use the add-on", BACKOFF_MIDDLEWARE)


def refuse_mixed_politeness(queue_cls: str | type[Any], *, server: Redis | RedisCluster,
                            settings: BaseSettings, spider_name: str) -> None:
    """A worker does not join a crawl whose requests wait in download slots filled by
    workers of the other ``BLOOMDUPE_POLITENESS``: the requests it queued would not
    keep the crawl's limits ("worker" into "crawl"), or would put one crawl under two
    sets of limits ("crawl" into "worker"). One crawl runs in one mode; it may switch
    while its slots are empty (a crawl of an earlier release has none: its queue is
    moved into them). Nor does a worker with a scrapy-redis queue class join a crawl
    whose requests wait in this package's queue: it would never fetch them (the filter
    has seen them), and would call the crawl done."""
    cls = load_object(queue_cls)
    ours = isinstance(cls, type) and issubclass(cls, PriorityQueue)
    mode = FrontierConfig.from_settings(settings).politeness
    tag = BloomDupeConfig.from_settings(settings).key_for(spider_name)
    with suppress(RedisError):  # the filter's start-up check, next, names what fails
        found, waiting, leased, elsewhere = slot_status(server, tag)
        if not ours and (waiting or leased or elsewhere):
            name = queue_cls if isinstance(queue_cls, str) else global_object_name(queue_cls)
            raise BloomDupeError(
                f"The crawl {tag!r} has {waiting + elsewhere} request(s) waiting and "
                f"{leased} leased in this package's queue, which SCHEDULER_QUEUE_CLASS = "
                f"{name!r} would never fetch (the filter has seen them): remove that "
                "setting to go on with this package's queue, or clear the crawl "
                "(`bloomdupe clear`) to start over")
        if ours and found and found != mode and (waiting or leased):
            raise BloomDupeError(
                f"The crawl {tag!r} has {waiting} request(s) waiting and {leased} leased, "
                f"queued by workers with BLOOMDUPE_POLITENESS = {found!r}: set "
                f"BLOOMDUPE_POLITENESS = {found!r} on this worker too (one crawl runs in one "
                "mode), or clear the crawl (`bloomdupe clear`) to start over")


def open_filter(crawler: Crawler, dupefilter_cls: type[BaseDupeFilter],
                queue_cls: str | type[Any], *, server: Redis | RedisCluster, flush: bool
                ) -> tuple[RedisBloomDupeFilter | None, int | None]:
    """The crawl's filter, opened when the scheduler is built, before the engine has a
    slot (an error here, a filter made with other settings, is then the only thing
    Scrapy reports); None when the dupefilter is not this package's. A queue of a newer
    release's entries stops the worker before the filter opens; this release's format
    is recorded once the filter's start-up check has passed (see claim_queue_format).
    Also returns the queue's format record as this worker found it (None: none), which
    says what its start migrates (:meth:`SharedCrawl.join`)."""
    ours = dupefilter_cls if isinstance(dupefilter_cls, type) and issubclass(
        dupefilter_cls, RedisBloomDupeFilter) else None
    if crawler.spider is None:
        return (build_from_crawler(ours, crawler) if ours else None), None
    name, settings = crawler.spider.name, crawler.settings
    if ours and flush:
        flush_before_open(server, settings, name)
    refuse_mixed_politeness(queue_cls, server=server, settings=settings, spider_name=name)
    recorded = claim_queue_format(queue_cls, server=server, settings=settings,
                                  spider_name=name, write=False)
    found = None if recorded else entry.found_format(
        server, BloomDupeConfig.from_settings(settings).key_for(name))
    df = build_from_crawler(ours, crawler) if ours else None
    if not recorded:
        claim_queue_format(queue_cls, server=server, settings=settings, spider_name=name,
                           write=True)
    return df, (entry.STATE_FORMAT if recorded else found)


class SharedCrawl:
    """This worker's part in the crawl's shared state: the shared ``queue`` beside the
    filter ``df``, the Redis work run by ``jobs``."""

    def __init__(self, *, server: Redis | RedisCluster, df: BaseDupeFilter, queue: SharedQueue,
                 jobs: RedisJobs, frontier: FrontierConfig, spider: Spider,
                 found_format: int | None = None) -> None:
        self.server, self.df, self.queue, self.jobs = server, df, queue, jobs
        self.frontier, self.spider = frontier, spider
        #: The queue's format record as this worker found it at its start (None: none).
        self.found_format = found_format
        #: This worker's name among the crawl's workers, on a scrapy-redis queue class.
        self.member = secrets.token_hex(6)

    @property
    def leased(self) -> bool:
        return isinstance(self.queue, PriorityQueue)

    def join(self, *, flush: Callable[[], None] | None = None) -> None:
        """Take up the shared queue as it is (its shards on one node merged, a scrapy-redis
        queue it replaces taken over) and count among the crawl's workers. ``flush``
        (``SCHEDULER_FLUSH_ON_START``): scrapy-redis's, for a dupefilter not this
        package's (this package's filter and queue went before the filter opened)."""
        spider = self.spider
        if flush is not None:
            if isinstance(self.df, RedisBloomDupeFilter):
                # The filter and its queue went before the filter was opened; what is
                # left is a scrapy-redis queue that this one would otherwise take over.
                if self.queue.key != getattr(self.queue, "tag", None):
                    self.jobs.guarded(lambda: self.server.delete(self.queue.key), 0)
            else:
                flush()
        if self.leased:
            merged = self.jobs.guarded(self.queue.merge_shards, 0)
            if merged:
                logger.info("Moved %d queued request(s) and lease(s) of the queue's other "
                            "shards into shard 0 (one queue shard on one Redis node)",
                            merged, extra={"spider": spider})
        if isinstance(self.queue, LeasedQueue):
            self._migrate()
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
        df = self.df
        if not self.leased and isinstance(df, RedisBloomDupeFilter):
            # Counted among the crawl's workers, so that the last one out clears (close).
            self.jobs.guarded(lambda: frontier_queue.join(self.server, df.bloom.key,
                                                          self.member), None)

    def _migrate(self) -> None:
        """One-shot migration of a layout an earlier build left (LeasedQueue.migrate),
        logged in one INFO line with its counts."""
        assert isinstance(self.queue, LeasedQueue)
        found = self.found_format
        migrated = self.jobs.guarded(self.queue.migrate, None)
        if migrated is None:
            return
        if migrated.moved or migrated.leases_back or (
                found is not None and found < entry.STATE_FORMAT):
            layout = ("the intake layout (format 2)" if found == 2 else
                      f"format {found}" if found is not None else
                      "the sorted-set layout (the build of 2026-11-27, no format record)")
            waiting, leased = self.jobs.guarded(self.queue.status, (0, 0))
            logger.info("Migrated the shared queue from %s to format %d: %d waiting "
                        "request(s) moved into the download slots, %d lease(s) of stopped "
                        "workers put back; %d waiting and %d leased now",
                        layout, entry.STATE_FORMAT, migrated.moved, migrated.leases_back,
                        waiting, leased, extra={"spider": self.spider})

    def _leave(self) -> bool:
        """Leave the crawl's workers; whether this one was the last (see close)."""
        if self.leased:
            return bool(self.jobs.guarded(self.queue.leave, True))
        df = self.df
        if isinstance(df, RedisBloomDupeFilter):
            return bool(self.jobs.guarded(lambda: frontier_queue.leave(
                self.server, df.bloom.key, self.member,
                round(self.frontier.lease_timeout * 1000)), True))
        return True

    def close(self, *, persist: bool, done_now: Callable[[], bool],
              settle: Callable[[], None]) -> bool:
        """Leave the crawl's workers and let the queue go. With ``persist``
        (``SCHEDULER_PERSIST``) off, once the crawl is done (``done_now``, asked first),
        the last worker out deletes the queue; whether it did (the filter goes too,
        then). ``settle`` acks what this worker handed out, before it leaves."""
        clear = not persist and not self.jobs.failed() and done_now()
        if not persist and not clear and not self.jobs.failed():
            logger.info("SCHEDULER_PERSIST is off, but this worker did not see the crawl "
                        "done: the shared queue and the filter are kept for the others",
                        extra={"spider": self.spider})
        settle()
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
            if isinstance(self.df, RedisBloomDupeFilter) and self.leased and \
                    self.df.failure == dupefilter_module.FINISHED:
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
        return clear
