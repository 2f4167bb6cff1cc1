"""The crawl's shared state in Redis as a worker opens and leaves it: the flush on start, the
shared queue (:func:`make_queue`), shards merged, a scrapy-redis queue taken over, workers
joining and leaving, and the last worker out clearing a finished crawl (:class:`SharedCrawl`)."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any, TypeAlias

from redis.exceptions import NoPermissionError, RedisError, ResponseError
from scrapy.dupefilters import BaseDupeFilter
from scrapy.utils.conf import build_component_list
from scrapy.utils.misc import build_from_crawler, load_object
from scrapy.utils.python import global_object_name
from scrapy_redis.queue import Base as ScrapyRedisQueue

from .. import __version__, keys, versions
from ..bloom import meta
from ..bloom.filter import BloomFilter
from ..exceptions import BloomDupeError, BuildError
from ..frontier import builds, entry
from ..frontier import queue as frontier_queue
from ..frontier.busiest import slot_status
from ..frontier.leased import LeasedQueue
from ..frontier.politeness import OneSlot, SlotPolicy
from ..frontier.queue import PriorityQueue
from ..settings import BloomDupeConfig, FrontierConfig, report_ttl, wait_replicas
from ..transport.wait import replicas_to_wait
from .health import FINISHED

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings
    from scrapy.spiders import Spider

    from .jobs import RedisJobs

logger = logging.getLogger(__name__)

#: How many workers heartbeat within the lease timeout on Redis's clock (ZRANGEBYSCORE: the
#: ACL grants it, not ZCOUNT). KEYS[1]: shard 0's owners; ARGV[1]: the lease timeout (ms).
AT_WORK_SCRIPT = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
return #redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[1]), '+inf')
"""

#: The crawl's shared queue: this package's (a :class:`LeasedQueue` or a base) or scrapy-redis's.
SharedQueue: TypeAlias = PriorityQueue | ScrapyRedisQueue


def flush_before_open(server: Redis | RedisCluster, settings: BaseSettings,
                      spider_name: str) -> None:
    """``SCHEDULER_FLUSH_ON_START``: delete the crawl's filter and queue *before* the filter
    opens (after, as scrapy-redis does, would keep the old seed and sizes over deleted keys)."""
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
               key: str, serializer: Any, bloom: BloomFilter | None,
               settings: BaseSettings, frontier: FrontierConfig) -> SharedQueue:
    """The shared queue of class ``queue_cls`` (path or class): the leased one, sharded and
    waiting for replicas as the filter ``bloom`` (None: not ours) does; or scrapy-redis's."""
    cls = load_object(queue_cls)
    extra: dict[str, Any] = {}
    if isinstance(cls, type) and issubclass(cls, PriorityQueue):
        if bloom is not None:
            tag, shards = bloom.key, bloom.sizing.shards
            wait = bloom.replicas_waited  # the filter's decision, not another
        else:
            tag, shards = BloomDupeConfig.from_settings(settings).key_for(spider.name), 1
            wait = replicas_to_wait(wait_replicas(settings), server)
        extra = {"tag": tag, "shards": shards,
                 "lease_timeout": frontier.lease_timeout, "wait_replicas": wait,
                 "failed_limit": frontier.failed_limit}
        if frontier.politeness == "crawl":  # (check_politeness refused another class)
            cls = LeasedQueue
            extra["policy"] = SlotPolicy(settings, spider)
        elif cls in (PriorityQueue, LeasedQueue):  # one slot without limits
            cls = LeasedQueue
            extra["policy"] = OneSlot()
    try:
        queue: SharedQueue = cls(server=server, spider=spider, key=key, serializer=serializer,
                                 **extra)
        return queue
    except TypeError as e:
        raise ValueError(f"Failed to instantiate queue class '{queue_cls}': {e}") from e


def _leased(queue_cls: str | type[Any]) -> bool:
    cls = load_object(queue_cls)
    return isinstance(cls, type) and issubclass(cls, PriorityQueue)


def check_builds(server: Redis | RedisCluster, settings: BaseSettings, spider_name: str, *,
                 prune: bool = False) -> None:
    """At a worker's start, before any write: raise :class:`BuildError` if this build cannot
    read the crawl's state, or its live workers cannot read this one's (frontier/builds.py).
    ``prune``: once it may start, forget gone workers' builds."""
    tag = BloomDupeConfig.from_settings(settings).key_for(spider_name)
    lease_ms = round(FrontierConfig.from_settings(settings).lease_timeout * 1000)
    try:
        found = builds.look(server, tag, lease_ms, prune=prune)
    except NoPermissionError:
        return  # the filter's start-up check, next, names what the ACL lacks
    except ResponseError as e:  # the same, denied inside the script (Redis names nothing)
        if "can't run this command" in str(e):
            return
        raise
    why = versions.refusal(tag, builds.OURS, found.state, found.live_builds,
                           list(found.recorded.values()))
    if why is not None:
        raise BuildError(why)


def claim_queue_format(queue_cls: str | type[Any], *, server: Redis | RedisCluster,
                       settings: BaseSettings, spider_name: str, write: bool) -> bool:
    """Record the format of the leased queue's entries at a worker's start (``write`` False:
    only look, before the filter's start-up check); whether it is recorded (True for another
    queue). Raises :class:`~..frontier.entry.QueueFormatError` for a newer release's format."""
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
    """Refuse to join a crawl whose requests wait in slots of the other
    ``BLOOMDUPE_POLITENESS`` (one crawl under two sets of limits; it may switch while its
    slots are empty), or, with a scrapy-redis queue class, one whose requests wait in this
    package's queue (never fetched, as the filter has seen them: the crawl would end)."""
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


def open_filter(crawler: Crawler, ours: type[BaseDupeFilter] | None,
                queue_cls: str | type[Any], *, server: Redis | RedisCluster, flush: bool
                ) -> tuple[BaseDupeFilter | None, int | None]:
    """The crawl's filter of class ``ours`` (None: not ours), opened as the scheduler is built
    (before the engine has a slot: an error here is all Scrapy reports), the queue's format
    checked before and recorded after; and the format record found (None: none)."""
    if crawler.spider is None:
        return (build_from_crawler(ours, crawler) if ours else None), None
    name, settings = crawler.spider.name, crawler.settings
    logger.info("scrapy-bloomdupe %s (state format %d)", __version__, entry.STATE_FORMAT)
    if ours and flush:
        flush_before_open(server, settings, name)
    leased = _leased(queue_cls)
    if leased:
        check_builds(server, settings, name)
    refuse_mixed_politeness(queue_cls, server=server, settings=settings, spider_name=name)
    recorded = claim_queue_format(queue_cls, server=server, settings=settings,
                                  spider_name=name, write=False)
    found = None if recorded else entry.found_format(
        server, BloomDupeConfig.from_settings(settings).key_for(name))
    df = build_from_crawler(ours, crawler) if ours else None
    bloom = getattr(df, "bloom", None)
    if isinstance(bloom, BloomFilter) and bloom.fresh:
        # A new crawl at a finished one's key: that one's kept failed requests are not its.
        server.delete(keys.failed(bloom.key))
    if not recorded:
        claim_queue_format(queue_cls, server=server, settings=settings, spider_name=name,
                           write=True)
    if leased:
        check_builds(server, settings, name, prune=True)
    return df, (entry.STATE_FORMAT if recorded else found)


class SharedCrawl:
    """This worker's part in the crawl's shared state: the ``queue`` beside the filter
    ``bloom`` (None: not this package's), the Redis work run by ``jobs``."""

    def __init__(self, *, server: Redis | RedisCluster, bloom: BloomFilter | None,
                 queue: SharedQueue, jobs: RedisJobs, frontier: FrontierConfig,
                 spider: Spider, found_format: int | None = None) -> None:
        self.server, self.bloom, self.queue, self.jobs = server, bloom, queue, jobs
        self.frontier, self.spider = frontier, spider
        #: The queue's format record as this worker found it at its start (None: none).
        self.found_format = found_format
        #: This worker's name among the crawl's workers, on a scrapy-redis queue class.
        self.member = secrets.token_hex(6)
        crawler = getattr(spider, "crawler", None)
        #: BLOOMDUPE_REPORT_TTL: how long a finished crawl's failed requests are kept.
        self.report_ttl = report_ttl(crawler.settings) if crawler is not None else 0.0
        #: Called before this worker leaves, so the last worker's summary has its last figures.
        self.before_leaving: list[Callable[[], None]] = []

    @property
    def leased(self) -> bool:
        return isinstance(self.queue, PriorityQueue)

    def join(self, *, flush: Callable[[], None] | None = None) -> int:
        """Take up the shared queue (shards merged, a scrapy-redis queue taken over) and join
        the crawl's workers; returns how many requests wait. ``flush``: scrapy-redis's
        ``SCHEDULER_FLUSH_ON_START``, for a dupefilter not this package's."""
        spider = self.spider
        if flush is not None:
            if self.bloom is not None:
                # Ours went before the filter opened; delete a scrapy-redis queue left.
                if self.queue.key != getattr(self.queue, "tag", None):
                    self.jobs.call(lambda: self.server.delete(self.queue.key), 0)
            else:
                flush()
        if self.leased:
            merged = self.jobs.call(self.queue.merge_shards, 0)
            if merged:
                logger.info("Moved %d queued request(s) and lease(s) of the queue's other "
                            "shards into shard 0 (one queue shard on one Redis node)",
                            merged, extra={"spider": spider})
        if isinstance(self.queue, LeasedQueue):
            self._migrate()
        if self.leased and self.queue.key != self.queue.tag:
            # A crawl moving over from scrapy-redis: its queue's requests go on here.
            adopted = self.jobs.call(lambda: self.queue.adopt(self.queue.key), 0)
            if adopted:
                logger.info("Took over %d request(s) from scrapy-redis's queue %r",
                            adopted, self.queue.key, extra={"spider": spider})
        pending = self.jobs.call(lambda: len(self.queue), 0)
        if pending:
            others = self.jobs.call(self._others_at_work, None)
            if others:
                logger.info("Joining the crawl under way: %d other worker(s) at work, %d "
                            "request(s) queued", others, pending, extra={"spider": spider})
            elif others == 0:
                logger.info("Resuming the crawl: %d request(s) left queued by an earlier run "
                            "(no other worker at work)", pending, extra={"spider": spider})
            else:
                logger.info("Joining the crawl: %d request(s) queued", pending,
                            extra={"spider": spider})
        bloom = self.bloom
        if not self.leased and bloom is not None:
            # Counted among the crawl's workers, so that the last one out clears (close).
            self.jobs.call(lambda: frontier_queue.join(self.server, bloom.key,
                                                          self.member), None)
        return int(pending)

    def _others_at_work(self) -> int | None:
        """Other workers at work now (heartbeat within the lease timeout); None if unknown."""
        if self.leased:
            link, tag = self.queue.link, self.queue.tag
            timeout_ms = self.queue.lease_timeout_ms
        elif self.bloom is not None:
            link, tag = self.bloom.link, self.bloom.key
            timeout_ms = round(self.frontier.lease_timeout * 1000)
        else:
            return None
        (sha,) = link.knows(AT_WORK_SCRIPT)  # through the link, as every crawl's command
        return int(link.call("EVALSHA", sha, 1, keys.owners(tag, 0), timeout_ms))

    def _clear_queue(self) -> None:
        """Delete the shared queue (last worker out); failed requests stay for the report TTL."""
        if not isinstance(self.queue, PriorityQueue):
            self.queue.clear()
            return
        try:
            self.queue.clear(self.report_ttl)
        except NoPermissionError as e:  # an ACL without +expire: delete them too
            logger.warning("Could not keep the crawl's failed requests (BLOOMDUPE_REPORT_TTL): "
                           "%s. Add +expire to its ACL (docs/security.md); deleted with the "
                           "rest", e, extra={"spider": self.spider})
            self.queue.clear()

    def _migrate(self) -> None:
        """Migrate an earlier build's layout (LeasedQueue.migrate); one INFO line if any."""
        assert isinstance(self.queue, LeasedQueue)
        found = self.found_format
        migrated = self.jobs.call(self.queue.migrate, None)
        if migrated is None:
            return
        if migrated.moved or migrated.leases_back or (
                found is not None and found < entry.STATE_FORMAT):
            layout = ("the intake layout (format 2)" if found == 2 else
                      f"format {found}" if found is not None else
                      "the sorted-set layout (the build of 2026-11-27, no format record)")
            waiting, leased = self.jobs.call(self.queue.status, (0, 0))
            logger.info("Migrated the shared queue from %s to format %d: %d waiting "
                        "request(s) moved into the download slots, %d lease(s) of stopped "
                        "workers put back; %d waiting and %d leased now",
                        layout, entry.STATE_FORMAT, migrated.moved, migrated.leases_back,
                        waiting, leased, extra={"spider": self.spider})

    def _leave(self) -> bool:
        """Leave the crawl's workers; whether this one was the last (see close)."""
        if self.leased:
            return bool(self.jobs.call(self.queue.leave, True))
        bloom = self.bloom
        if bloom is not None:
            return bool(self.jobs.call(lambda: frontier_queue.leave(
                self.server, bloom.key, self.member,
                round(self.frontier.lease_timeout * 1000)), True))
        return True

    def close(self, *, persist: bool, done_now: Callable[[], bool],
              settle: Callable[[], None]) -> bool:
        """Leave the crawl's workers (``settle`` acks first). With ``persist`` off and the
        crawl done (``done_now``), the last worker out deletes the queue and the filter;
        returns whether it did."""
        for write in self.before_leaving:
            if not self.jobs.failed():
                with suppress(RedisError):  # figures only: the crawl goes on without them
                    write()
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
            if self.leased and self.jobs.health.failure == FINISHED:
                # The crawl is gone: take out only this worker's name (a late pop rewrote it).
                detach = self.queue.forget
            if detach is not None:
                with suppress(RedisError):
                    detach()
        elif clear:
            self.jobs.call(self._clear_queue, None)
        else:
            close_queue = getattr(self.queue, "close", None)
            if close_queue is not None:
                self.jobs.call(close_queue, None)
        return clear
