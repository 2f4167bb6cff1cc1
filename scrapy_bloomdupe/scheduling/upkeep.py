"""How a worker keeps its leases: a heartbeat (carrying pending acks), dead workers' leases put
back, its own unheld leases put back after a failover, and a check that the filter is still the
one it opened; one job on the scheduler's runner (:mod:`.jobs`) a tick."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import create_looping_call

from ..frontier.politeness import per_site_limits
from ..frontier.queue import PriorityQueue, Reclaimed
from ..transport.diagnose import check_eviction

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster
    from scrapy.http import Request
    from scrapy.spiders import Spider
    from scrapy.statscollectors import StatsCollector
    from scrapy.utils.asyncio import AsyncioLoopingCall
    from twisted.internet.task import LoopingCall

    from ..frontier.queue import Lease, PriorityQueue
    from ..settings import FrontierConfig
    from .jobs import RedisJobs
    from .requestpath import BloomDupe

logger = logging.getLogger(__name__)

#: Most seconds between two heartbeats (and looks for dead workers' leases).
MAX_HEARTBEAT = 5.0
#: Most requests named in the WARNING that puts leases back.
NAMED = 10
#: Why a reclaim put this worker's own leases back (see :class:`Reclaimed`).
RECLAIMED_FAILOVER = ("the Redis master changed (a failover) after they were taken, so "
                      "their acks were not sent to the new one: their work may have been "
                      "written to the old master and lost with it")
RECLAIMED_LOST_POPS = ("the replies of the pops that took them never reached this worker "
                       "(an error on the way back)")
RECLAIMED_LOST_ACKS = ("this worker acked them, but the acks are not in Redis: they went to "
                       "a Redis master that a failover replaced")


class LeaseUpkeep:
    """The heartbeat and its company for a leased ``queue``. ``settle`` acks handed-out work
    nothing works on any more; ``held`` gives the leases the scheduler holds."""

    def __init__(self, *, jobs: RedisJobs, queue: PriorityQueue,
                 dupefilter: BloomDupe | None, server: Redis | RedisCluster,
                 frontier: FrontierConfig, stats: StatsCollector, spider: Spider,
                 settle: Callable[[], None], held: Callable[[], list[Lease]],
                 retired: Callable[[], object] = lambda: 0
                 ) -> None:
        self.jobs, self.queue, self.df, self.server = jobs, queue, dupefilter, server
        self.frontier, self.stats, self.spider = frontier, stats, spider
        self._settle, self._held = settle, held
        #: Counts and logs the entries a reap found undecodable (and retired).
        self._retired = retired
        self._heartbeat: AsyncioLoopingCall | LoopingCall | None = None
        self._ticking = False
        #: Last heartbeat (monotonic), and when it may reap again.
        self._last_beat: float | None = None
        self._reap_after = 0.0
        #: When this worker next looks for dead workers' leases (see reap_due).
        self._next_reap = 0.0
        #: When to look for leases of this worker that it does not hold (see tick).
        self._next_reclaim = time.monotonic()
        self._stale_seen = 0
        #: Per-site limits each worker holds alone ("worker" politeness), named once in INFO.
        crawler = getattr(spider, "crawler", None)
        self._own_limits = per_site_limits(crawler.settings, spider) if (
            crawler is not None and frontier.politeness == "worker") else []

    def start(self) -> None:
        """Tick every third of the lease timeout (at most MAX_HEARTBEAT s); needs the engine."""
        self._heartbeat = create_looping_call(self.tick)
        self._heartbeat.start(min(MAX_HEARTBEAT, self.frontier.lease_timeout / 3), now=False)

    def stop(self) -> None:
        if self._heartbeat is not None and self._heartbeat.running:
            self._heartbeat.stop()

    def tick(self) -> None:
        """Heartbeat, reap dead workers' leases and check the filter; once a lease timeout
        (and after a failover) put back own leases not held. One job, answered on the reactor."""
        if self.jobs.failed() or self._ticking:
            return
        self._settle()
        df = self.df
        silence, now, timeout = self.silence(), time.monotonic(), self.frontier.lease_timeout
        reap = silence <= timeout / 2 and self.reap_due()
        reclaim = now >= self._next_reclaim or self.queue.stale != self._stale_seen
        held: list[Lease] = []
        if reclaim:
            self._next_reclaim = now + timeout
            self._stale_seen = self.queue.stale
            held = self._held()
        call = self.jobs.call
        last = self._last_beat

        def job() -> tuple[float, list[tuple[int, Request]], Reclaimed, int | None]:
            if silence > timeout and df is not None:
                df.bloom.verify()  # back from a long silence: the crawl may be gone
            call(self.queue.heartbeat)
            others = self._others_live()
            beat = time.monotonic()
            # A late heartbeat (outage): others were likely as silent; no reaping (_beaten).
            stalled = last is not None and beat - last > timeout / 2
            back = call(self.queue.reap) if reap and not stalled else []
            # The queue's view (pops less acks, some not yet seen by the reactor) vs ``held``.
            reclaimed = call(lambda: self.queue.reclaim(held)) if reclaim else Reclaimed()
            if df is not None:
                call(df.bloom.verify)
                call(lambda: check_eviction(df.bloom.link, warn=False))
                df.flush_crawl_stats_due()
            return beat, back, reclaimed, others

        def ticked(answer: tuple[float, list[tuple[int, Request]], Reclaimed, int | None]
                   ) -> None:
            beat, back, reclaimed, others = answer
            self._beaten(0.0 if last is None else beat - last, beat)
            self._seen_others(others)
            self.reaped(back)
            self._reclaimed(reclaimed)

        def over(result: Any) -> Any:
            self._ticking = False
            return result

        self._ticking = True
        self.jobs.run(job).addCallbacks(ticked, self.jobs.redis_failed).addBoth(over)

    def silence(self) -> float:
        """Seconds since this worker's last heartbeat went through (0 before the first)."""
        return 0.0 if self._last_beat is None else time.monotonic() - self._last_beat

    def _reclaimed(self, back: Reclaimed) -> None:
        """Count the leases a reclaim put back; one WARNING a reason."""
        if not back.total:
            return
        self.stats.inc_value("bloomdupe/requeued", back.total)
        for count, why in ((back.failover, RECLAIMED_FAILOVER),
                           (back.lost_pops, RECLAIMED_LOST_POPS),
                           (back.lost_acks, RECLAIMED_LOST_ACKS)):
            if count:
                logger.warning("Put %d request(s) back in the shared queue: leased to this "
                               "worker in Redis but not held by it: %s; they are fetched "
                               "again", count, why, extra={"spider": self.spider})

    def beat(self) -> None:
        """Heartbeat. After a silence over half the lease timeout others were likely silent
        too: reap nothing for a lease timeout, so a stall does not pass for dead workers."""
        silence = self.silence()

        def heartbeat() -> bool:
            self.queue.heartbeat()
            return True

        if self.jobs.call(heartbeat, False):
            self._beaten(silence, time.monotonic())
            self._seen_others(self._others_live())

    def _others_live(self) -> int | None:
        """How many other workers the last heartbeat saw live (its reply: no round trip)."""
        return self.queue.others_live if isinstance(self.queue, PriorityQueue) else None

    def _seen_others(self, others: int | None) -> None:
        """With others live and "worker" politeness, say once that limits are per worker."""
        if not others or not self._own_limits:
            return
        limits, self._own_limits = self._own_limits, []
        logger.info("%d other worker(s) crawl beside this one: with BLOOMDUPE_POLITENESS = "
                    "'worker' (the default) each worker holds %s on its own, as one Scrapy "
                    "process does, so a site may get up to %d times as much. Set "
                    "BLOOMDUPE_POLITENESS = 'crawl' to hold them for the whole crawl "
                    "(docs/politeness.md)", others, ", ".join(limits), others + 1,
                    extra={"spider": self.spider})

    def _beaten(self, silence: float, now: float) -> None:
        """A heartbeat went through at ``now``, ``silence`` seconds after the last one."""
        timeout = self.frontier.lease_timeout
        if silence > timeout / 2:
            self._reap_after = now + timeout
        if silence > timeout:
            logger.warning(
                "This worker was silent for %.1fs, longer than BLOOMDUPE_LEASE_TIMEOUT "
                "(%ss): its reactor was blocked (a callback or pipeline that blocks, such "
                "as time.sleep or a synchronous HTTP call), the process was paused "
                "(SIGSTOP, swapping) or Redis could not be reached. The other workers "
                "may have put its requests back in the queue: they may be fetched twice. "
                "Raise BLOOMDUPE_LEASE_TIMEOUT above the longest such pause",
                silence, timeout, extra={"spider": self.spider})
        self._last_beat = now

    def reap_due(self) -> bool:
        """Whether to reap now: at most every half lease timeout (a script on every shard),
        never in the lease timeout after a stall (see _beaten). Dead leases return within
        1.5 lease timeouts and a heartbeat."""
        now = time.monotonic()
        if now < max(self._reap_after, self._next_reap):
            return False
        self._next_reap = now + self.frontier.lease_timeout / 2
        return True

    def reaped(self, back: list[tuple[int, Request]]) -> None:
        """Count and name the leases a reap put back (and report undecodable ones retired)."""
        self._retired()
        if back:
            self.stats.inc_value("bloomdupe/requeued", len(back))
            named = "; ".join(f"{request.url} ({times}x)" for times, request in back[:NAMED])
            more = f"; and {len(back) - NAMED} more" if len(back) > NAMED else ""
            logger.warning("Put %d request(s) back in the shared queue: leased by a worker "
                           "that stopped heartbeating for %ss (BLOOMDUPE_LEASE_TIMEOUT): "
                           "%s%s (how often each has come back; one that comes back "
                           "BLOOMDUPE_MAX_REQUEUES = %d times is recorded as failed)",
                           len(back), self.frontier.lease_timeout, named, more,
                           self.frontier.max_requeues, extra={"spider": self.spider})
