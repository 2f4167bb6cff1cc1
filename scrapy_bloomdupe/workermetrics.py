"""A worker's own live figures: in Redis for ``bloomdupe top`` and ``bloomdupe metrics``, and
served to Prometheus with ``BLOOMDUPE_METRICS_PORT``.

``EXTENSIONS = {"scrapy_bloomdupe.workermetrics.WorkerMetrics": 510}`` (the add-on sets it). Every
``BLOOMDUPE_LIVE_INTERVAL`` s it writes this worker's figures to ``K:live:<host:pid>`` (expiring)
and adds its counters to the crawl-wide ones (:func:`crawlstats.write_live`), in one round trip; at
close, the last of them, and deletes its line. ``BLOOMDUPE_METRICS_PORT`` (a port, a range
``"A-B"``, or ``0``) serves ``/metrics`` from memory (list: docs/metrics.md).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import redis
from scrapy import signals
from scrapy.utils.asyncio import AsyncioLoopingCall, create_looping_call

from . import connection, crawlstats, keys, prometheus, scheduler
from .exceptions import ConfigError
from .settings import BloomDupeConfig, MetricsConfig

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import Metric
    from redis import Redis
    from redis.cluster import RedisCluster
    from scrapy.crawler import Crawler
    from scrapy.spiders import Spider
    from twisted.internet.task import LoopingCall
    from typing_extensions import Self

    from .transport.link import Link

logger = logging.getLogger(__name__)

#: A line expires after this many write intervals unwritten (at least :data:`MIN_TTL` s).
TTL_INTERVALS = 3
MIN_TTL = 15.0
#: Stale entries of the index of running workers are dropped every this many writes.
PRUNE_EVERY = 12
#: Scrapy's stats of a response's HTTP status.
STATUS_STAT = "downloader/response_status_count/"

#: The worker's figures served as metrics: (field, name, counter?, help).
WORKER_METRICS = (
    ("pages", "bloomdupe_worker_pages", True, "Responses this worker received (pages)."),
    ("items", "bloomdupe_worker_items", True, "Items this worker scraped."),
    ("checked", "bloomdupe_worker_requests_checked", True,
     "Requests this worker checked against the Bloom filter."),
    ("new", "bloomdupe_worker_requests_new", True, "Requests the filter found new."),
    ("duplicates", "bloomdupe_worker_requests_duplicate", True,
     "Requests the filter found seen before (dropped)."),
    ("lock_waits", "bloomdupe_worker_lock_waits", True,
     "Times this worker waited for a shard lock (lock mode)."),
    ("lock_wait_seconds", "bloomdupe_worker_lock_wait_seconds", True,
     "Seconds this worker waited for shard locks."),
    ("outages", "bloomdupe_worker_redis_outages", True,
     "Redis outages this worker waited out or gave up on."),
    ("outage_seconds", "bloomdupe_worker_redis_outage_seconds", True,
     "Seconds this worker spent waiting for Redis to come back."),
    ("requeued", "bloomdupe_worker_leases_requeued", True,
     "Leases this worker put back in the queue (dead workers', reclaimed)."),
    ("failed", "bloomdupe_worker_requests_failed", True,
     "Requests that failed for good, recorded by this worker."),
    ("held_full", "bloomdupe_worker_held_full", True,
     "Asks for a request that waited for acks: this worker held CONCURRENT_REQUESTS "
     "and a quarter pages not yet acked."),
    ("in_flight", "bloomdupe_worker_requests_in_flight", False,
     "Requests this worker is downloading now."),
    ("started", "bloomdupe_worker_start_time_seconds", False,
     "When this worker opened its spider (Unix time)."),
)


class WorkerMetrics:
    def __init__(self, crawler: Crawler, config: MetricsConfig, key_template: BloomDupeConfig
                 ) -> None:
        self.crawler = crawler
        self.config = config
        self.key_template = key_template
        self.worker = crawlstats.this_worker()
        self.key = ""
        self.client: Redis | RedisCluster | None = None
        self.started = time.time()
        self.task: AsyncioLoopingCall | LoopingCall | None = None
        self.server: WSGIServer | None = None
        #: The LIVE_COUNTERS already added to the crawl-wide ones.
        self._added = dict.fromkeys(crawlstats.LIVE_COUNTERS, 0)
        self._last_pages = 0
        self._last_time = time.monotonic()
        self._writes = 0
        self._warned = False
        #: Whether a write is on its way to Redis (a job of the scheduler's runner).
        self._writing = False
        #: Whether the crawl closed here (spider_closed): no job writes after that.
        self.closed = False
        #: Set by :meth:`write_last` (the scheduler's closing job): a write queued after it
        #: would put the live line back once spider_closed removed it.
        self.left = False
        self._failovers = crawlstats.Failovers()

    @classmethod
    @connection.fails_the_crawl
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = MetricsConfig.from_settings(crawler.settings)
        if config.ports is not None and not prometheus.AVAILABLE:
            raise ConfigError("BLOOMDUPE_METRICS_PORT", crawler.settings.get(
                "BLOOMDUPE_METRICS_PORT"), prometheus.missing("serving a worker's metrics"))
        ext = cls(crawler, config, BloomDupeConfig.from_settings(crawler.settings))
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    @property
    def ttl(self) -> float:
        return max(MIN_TTL, TTL_INTERVALS * self.config.live_interval)

    def spider_opened(self, spider: Spider) -> None:
        self.key = self.key_template.key_for(spider.name)
        self.client = connection.get_client(self.crawler)
        self.started = time.time()
        self._last_time = time.monotonic()
        self.task = create_looping_call(self.write)
        self.task.start(self.config.live_interval, now=True)
        sched = scheduler.for_crawler(self.crawler)
        if sched is not None and sched.shared is not None:
            # Last counters in before leaving, so the last worker's summary counts them.
            sched.shared.before_leaving.append(self.write_last)
        if self.config.ports is not None:
            self.listen(*self.config.ports)

    def spider_closed(self, spider: Spider, reason: str) -> None:
        self.closed = True
        if self.task is not None and self.task.running:
            self.task.stop()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        if self.client is None:
            return
        try:
            # The crawl's state may be gone (cleared by the last worker): write nothing
            # then. The runner is done: the last figures go in a round trip of their own.
            if self.client.exists(keys.meta(self.key)):
                self.write(final=True)
                if not any(self.client.exists(name) for name in (  # (two cluster slots)
                        keys.meta(self.key), keys.finished(self.key))):
                    # State cleared (not a finished crawl's report) between check and
                    # write: delete the counters this write recreated.
                    self.client.delete(keys.stats(self.key))
            crawlstats.forget_live(self.client, self.key, self.worker)
        except redis.RedisError as e:
            logger.debug("Could not remove this worker's live figures from Redis: %s", e)

    def write_last(self) -> None:
        """This worker's last counters, in the scheduler's closing job before it leaves."""
        self.left = True
        df = scheduler.dupefilter_for(self.crawler)
        if self.client is None or self._writing or df is None:
            return
        figures, now = self.figures(), time.monotonic()
        self._written(self._send(df.bloom.link, now, figures, prune=False), figures, now)

    # -- the figures -------------------------------------------------------------------

    def figures(self) -> dict[str, Any]:
        """This worker's figures now, from its memory."""
        stats = dict(self.crawler.stats.get_stats()) if self.crawler.stats else {}
        df = scheduler.dupefilter_for(self.crawler)
        found: dict[str, Any] = {
            "pages": int(stats.get("response_received_count", 0)),
            "items": int(stats.get("item_scraped_count", 0)),
            "requeued": int(stats.get("bloomdupe/requeued", 0)),
            "failed": int(stats.get("bloomdupe/failed", 0)),
            "held_full": int(stats.get("bloomdupe/held_full", 0)),
            "in_flight": self._in_flight(),
            "started": self.started,
            "responses": {name[len(STATUS_STAT):]: int(value) for name, value in stats.items()
                          if name.startswith(STATUS_STAT)},
            "checked": 0, "new": 0, "duplicates": 0, "lock_waits": 0,
            "lock_wait_seconds": 0.0, "outages": 0, "outage_seconds": 0.0,
        }
        if df is not None:
            counters = df.bloom.counters
            found.update(checked=counters.checked, new=counters.new,
                         duplicates=counters.duplicates, lock_waits=counters.lock.waits,
                         lock_wait_seconds=counters.lock.wait_time,
                         outages=df.outage.outages, outage_seconds=df.outage.outage_time)
        return found

    def _in_flight(self) -> int:
        try:
            engine = self.crawler.engine
        except RuntimeError:  # not crawling (a tool, a test)
            return 0
        return len(engine.downloader.active) if engine is not None else 0

    def write(self, *, final: bool = False) -> None:
        """Write this worker's figures to Redis in one round trip, skipped while Redis is away.
        ``final``: the last, at close, on this thread (the caller checked the keys exist)."""
        if self.client is None:
            return
        now = time.monotonic()
        df = scheduler.dupefilter_for(self.crawler)
        if final:
            if self._writing:  # its deltas are on their way: they would be added twice
                logger.debug("This worker's last live figures were not written: a write "
                             "was under way at close")
                return
            figures = self.figures()
            self._written(self._send(self.client, now, figures, prune=False), figures, now)
            return
        if df is not None and (df.failure is not None or df.closed):
            # Stopped or closed (keys maybe deleted): only the final write goes.
            return
        sched = scheduler.for_crawler(self.crawler)
        if sched is not None and sched.silence() > sched.frontier.lease_timeout / 2:
            # Back from a silence (paused process): the crawl may be over and its keys
            # deleted; write nothing until the scheduler's heartbeat has found out.
            return
        if self._writing:
            return
        figures = self.figures()
        self._writes += 1
        client: Redis | RedisCluster | Link = self.client if df is None else df.bloom.link
        prune = self._writes % PRUNE_EVERY == 1
        jobs = sched.jobs if sched is not None else df.jobs if df is not None else None
        if jobs is None:
            self._written(self._send(client, now, figures, prune), figures, now)
            return
        # In a job of the crawl's runner: Scrapy's reactor never waits.
        self._writing = True
        jobs.run(lambda: self._send_unless_closed(client, now, figures, prune),
                 quiet=True).addCallback(self._written, figures, now)

    def _send_unless_closed(self, client: Redis | RedisCluster | Link, now: float,
                            figures: dict[str, Any], prune: bool
                            ) -> tuple[list[str], Exception | None]:
        """A write's job: none once closed (it would recreate the line :meth:`spider_closed`
        removed); one under way at close removes the line again."""
        if self.closed or self.left:
            return [], None
        answer = self._send(client, now, figures, prune)
        if self.closed:
            crawlstats.forget_live(client, self.key, self.worker)
        return answer

    def _send(self, client: Redis | RedisCluster | Link, now: float, figures: dict[str, Any],
              prune: bool) -> tuple[list[str], Exception | None]:
        """One write of ``figures``: the counters added, or the error."""
        rate = (figures["pages"] - self._last_pages) / max(now - self._last_time, 1e-9)
        line = {"host": socket.gethostname(), "pid": os.getpid(), "spider": self._spider_name(),
                "pages_per_second": round(rate, 3), **figures}
        try:
            if self._failovers.since_last(client):
                # Reread what the new master holds, lest a write the failover lost stay lost.
                self._added.update(crawlstats.recorded_live(client, self.key, self.worker))
            deltas = {name: figures[name] - self._added[name]
                      for name in crawlstats.LIVE_COUNTERS}
            return crawlstats.write_live(client, self.key, self.worker, line, deltas,
                                         self.ttl, prune=prune)
        except redis.RedisError as e:
            return [], e

    def _written(self, answer: tuple[list[str], Exception | None], figures: dict[str, Any],
                 now: float) -> None:
        self._writing = False
        added, error = answer
        for name in added:
            self._added[name] = figures[name]
        if error is None:
            self._last_pages, self._last_time = figures["pages"], now
        elif isinstance(error, redis.exceptions.NoPermissionError) and not self._warned:
            self._warned = True
            logger.warning("Could not write this worker's live figures to Redis (for "
                           "`bloomdupe top` and `bloomdupe metrics`): %s. The ACL of "
                           "docs/security.md grants what they need.", error)
        else:
            logger.debug("Could not write this worker's live figures to Redis: %s", error)

    def _spider_name(self) -> str:
        spider = self.crawler.spider
        return spider.name if spider is not None else ""

    # -- Prometheus ----------------------------------------------------------------------

    def collect(self) -> Iterable[Metric]:
        """This worker's metrics now (prometheus-client's collector API)."""
        figures = self.figures()
        labels = ("crawl", "worker")
        values = (self.key, self.worker)
        for field, name, is_counter, doc in WORKER_METRICS:
            build = prometheus.counter if is_counter else prometheus.gauge
            yield build(name, doc, labels, [(values, float(figures[field]))])
        yield prometheus.counter(
            "bloomdupe_worker_responses", "Responses this worker received, by HTTP status.",
            (*labels, "status"),
            [((*values, code), float(n)) for code, n in sorted(figures["responses"].items())])

    def listen(self, first: int, last: int) -> None:
        """Serve ``/metrics`` on the first free port of ``first``-``last`` (0: any)."""
        registry = prometheus.registry(self.collect)
        for port in range(first, last + 1):
            try:
                self.server = prometheus.serve(registry, port, self.config.host)
            except OSError:  # taken
                continue
            logger.info("Serving this worker's Prometheus metrics at http://%s:%d/metrics "
                        "(BLOOMDUPE_METRICS_PORT)", self.config.host, self.server.server_port)
            return
        logger.error("BLOOMDUPE_METRICS_PORT: no free port in %d-%d on %s: this worker serves "
                     "no metrics (widen the range, or use 0 for any free port)", first, last,
                     self.config.host)
