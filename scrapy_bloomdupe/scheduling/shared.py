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

#: How many workers heartbeat within the lease timeout, on Redis's clock, as leave.lua
#: finds them (ZRANGEBYSCORE, which the crawl's ACL grants; not ZCOUNT). KEYS[1]: shard
#: 0's owners (owner -> last heartbeat, ms); ARGV[1]: the lease timeout (ms). Returns
#: the count.
AT_WORK_SCRIPT = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
return #redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[1]), '+inf')
"""

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
               key: str, serializer: Any, bloom: BloomFilter | None,
               settings: BaseSettings, frontier: FrontierConfig) -> SharedQueue:
    """The shared queue of class ``queue_cls`` (a dotted path or a class): the leased
    one (:class:`..frontier.leased.LeasedQueue`, or an old path of it) beside the filter
    ``bloom`` (None: the dupefilter is not this package's), sharded as it is and waiting
    for the replicas it waits for; or a scrapy-redis queue class."""
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


def _leased(queue_cls: str | type[Any]) -> bool:
    cls = load_object(queue_cls)
    return isinstance(cls, type) and issubclass(cls, PriorityQueue)


def check_builds(server: Redis | RedisCluster, settings: BaseSettings, spider_name: str, *,
                 prune: bool = False) -> None:
    """At a worker's start, before it writes anything: refuse (:class:`BuildError`, one
    line naming both builds and what to do) a crawl whose state is of a format this build
    does not read, or whose live workers are of a build that cannot read the state this
    one writes (frontier/builds.py). ``prune``: once it may start, forget the builds of
    workers gone."""
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


def open_filter(crawler: Crawler, ours: type[BaseDupeFilter] | None,
                queue_cls: str | type[Any], *, server: Redis | RedisCluster, flush: bool
                ) -> tuple[BaseDupeFilter | None, int | None]:
    """The crawl's filter, of class ``ours`` (this package's dupefilter or a subclass),
    opened when the scheduler is built, before the engine has a slot (an error here, a
    filter made with other settings, is then the only thing Scrapy reports); None when
    the dupefilter is not this package's (``ours`` None). A queue of a newer
    release's entries stops the worker before the filter opens; this release's format
    is recorded once the filter's start-up check has passed (see claim_queue_format).
    Also returns the queue's format record as this worker found it (None: none), which
    says what its start migrates (:meth:`SharedCrawl.join`)."""
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
        # A new crawl at the key of a finished one starts afresh: the failed requests
        # that one kept as its report (BLOOMDUPE_REPORT_TTL) are not this crawl's.
        server.delete(keys.failed(bloom.key))
    if not recorded:
        claim_queue_format(queue_cls, server=server, settings=settings, spider_name=name,
                           write=True)
    if leased:
        check_builds(server, settings, name, prune=True)
    return df, (entry.STATE_FORMAT if recorded else found)


class SharedCrawl:
    """This worker's part in the crawl's shared state: the shared ``queue`` beside the
    filter ``bloom`` (None: the dupefilter is not this package's), the Redis work run by
    ``jobs``."""

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
        #: Called (in the closing job) before this worker leaves the crawl: what it has
        #: to add to the crawl's report goes in while the crawl is there (the
        #: WorkerMetrics extension's last counters), so the last worker's summary has it.
        self.before_leaving: list[Callable[[], None]] = []

    @property
    def leased(self) -> bool:
        return isinstance(self.queue, PriorityQueue)

    def join(self, *, flush: Callable[[], None] | None = None) -> int:
        """Take up the shared queue as it is (its shards on one node merged, a scrapy-redis
        queue it replaces taken over) and count among the crawl's workers; how many
        requests wait in it. ``flush`` (``SCHEDULER_FLUSH_ON_START``): scrapy-redis's,
        for a dupefilter not this package's (this package's filter and queue went before
        the filter opened)."""
        spider = self.spider
        if flush is not None:
            if self.bloom is not None:
                # The filter and its queue went before the filter was opened; what is
                # left is a scrapy-redis queue that this one would otherwise take over.
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
        """How many other workers of the crawl are at work now (heartbeat within the
        lease timeout, on Redis's clock; counted before this one joins); None when
        the crawl's workers are not known (a dupefilter not this package's)."""
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
        """Delete the shared queue, the last worker of a finished crawl; the leased
        queue's failed requests stay for BLOOMDUPE_REPORT_TTL (the crawl's report)."""
        if not isinstance(self.queue, PriorityQueue):
            self.queue.clear()
            return
        try:
            self.queue.clear(self.report_ttl)
        except NoPermissionError as e:  # an ACL from before the report: deleted, as then
            logger.warning("Could not keep the crawl's failed requests (BLOOMDUPE_REPORT_TTL): "
                           "%s. Add +expire to its ACL (docs/security.md); deleted with the "
                           "rest", e, extra={"spider": self.spider})
            self.queue.clear()

    def _migrate(self) -> None:
        """One-shot migration of a layout an earlier build left (LeasedQueue.migrate),
        logged in one INFO line with its counts."""
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
        """Leave the crawl's workers and let the queue go. With ``persist``
        (``SCHEDULER_PERSIST``) off, once the crawl is done (``done_now``, asked first),
        the last worker out deletes the queue; whether it did (the filter goes too,
        then). ``settle`` acks what this worker handed out, before it leaves."""
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
                # The crawl is over and gone: only this worker's name, which its
                # heartbeat or a pop may have written again, is taken out.
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
