"""How a worker keeps its leases on the leased queue: a heartbeat every few seconds
(which carries the pending acks), dead workers' leases put back in the queue, its own
leases that it no longer holds put back after a failover, and a check that the filter
is still the one it opened.

All of it is one job on the scheduler's runner (see :mod:`.jobs`), a tick at a time.
"""

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
    """The heartbeat and its company for one worker's leased ``queue``. ``settle`` acks
    what the scheduler handed out and nothing can be working on any more; ``held``
    gives the leases the scheduler holds (buffered or handed out)."""

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
        #: When this worker last heartbeat (monotonic), and when it may reap again.
        self._last_beat: float | None = None
        self._reap_after = 0.0
        #: When this worker next looks for dead workers' leases (see reap_due).
        self._next_reap = 0.0
        #: When to look for leases of this worker that it does not hold (see tick).
        self._next_reclaim = time.monotonic()
        self._stale_seen = 0
        #: With BLOOMDUPE_POLITENESS = "worker", the per-site limits set, which each worker
        #: holds on its own: named in one INFO line once another live worker is seen.
        crawler = getattr(spider, "crawler", None)
        self._own_limits = per_site_limits(crawler.settings, spider) if (
            crawler is not None and frontier.politeness == "worker") else []

    def start(self) -> None:
        """Tick every third of the lease timeout (at most every MAX_HEARTBEAT s), once
        the engine runs (the looping call needs its reactor or loop)."""
        self._heartbeat = create_looping_call(self.tick)
        self._heartbeat.start(min(MAX_HEARTBEAT, self.frontier.lease_timeout / 3), now=False)

    def stop(self) -> None:
        if self._heartbeat is not None and self._heartbeat.running:
            self._heartbeat.stop()

    def tick(self) -> None:
        """Heartbeat (with the pending acks), put dead workers' leases back, and check
        that the filter is still the one this worker opened; once a lease timeout (and
        after a master change), put back this worker's own leases that it does not
        hold. One job: its answer is acted on back on the reactor."""
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
            # A heartbeat that went through only now (an outage, a full Redis): the other
            # workers were likely as silent; no reaping (see _beaten).
            stalled = last is not None and beat - last > timeout / 2
            back = call(self.queue.reap) if reap and not stalled else []
            # What this worker holds, the queue knows (what its pops took, less its acks;
            # a pop answered on the runner whose leases the reactor has yet to see), and
            # ``held`` says.
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
        """Count the leases a reclaim put back, and say why, one WARNING a reason."""
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
        """Heartbeat. After a silence of this worker's (an outage, a full Redis, a frozen
        reactor) longer than half the lease timeout, the others were likely silent as
        long: put no lease back until they have had a lease timeout to heartbeat again,
        so that a crawl-wide stall does not pass for dead workers (and refetched pages)."""
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
        """Other workers heartbeat in this crawl: with BLOOMDUPE_POLITENESS = "worker" and
        per-site limits set, one INFO line (once a worker) says that each worker holds
        them on its own, and how to make them the whole crawl's."""
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
        """Whether to look for dead workers' leases now: at most every half lease timeout
        (a look is a script on every shard: with 24 shards and idle polls every second it
        was a third of an idle crawl's commands), and never in the lease timeout after
        a stall (see _beaten). A dead worker's leases come back within one and a half
        lease timeouts and a heartbeat."""
        now = time.monotonic()
        if now < max(self._reap_after, self._next_reap):
            return False
        self._next_reap = now + self.frontier.lease_timeout / 2
        return True

    def reaped(self, back: list[tuple[int, Request]]) -> None:
        """Count and name the dead workers' leases a reap put back (and report those that
        could not be decoded, retired instead)."""
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
