"""Requests that failed for good, kept in Redis (``bloomdupe failed``; ``--requeue`` fetches
them again). Recorded before their lease is acked: a worker killed in between leaves the lease,
so the request comes back rather than being lost. Undecodable queue entries are recorded by the
queue (:mod:`..frontier.undecodable`) and counted and logged here."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from ..frontier import failed

if TYPE_CHECKING:
    from scrapy.http import Request
    from scrapy.spiders import Spider
    from scrapy.statscollectors import StatsCollector

    from ..frontier.queue import PriorityQueue
    from .jobs import RedisJobs

logger = logging.getLogger(__name__)

#: Most entries named in the ERROR of entries that cannot be decoded.
NAMED = 10


class FailedRequests:
    """Records failed requests of the leased ``queue`` (as :mod:`.jobs`); ``ack`` acks a lease."""

    def __init__(self, *, jobs: RedisJobs, queue: PriorityQueue, limit: int,
                 stats: StatsCollector, spider: Spider, ack: Callable[[str], None]) -> None:
        self.jobs, self.queue, self.limit = jobs, queue, limit
        self.stats, self.spider, self._ack = stats, spider, ack
        #: Leases whose failure record is on its way to Redis: True once acked meanwhile.
        self._recording: dict[str, bool] = {}
        self._logged = False

    @property
    def pending(self) -> bool:
        """Whether a record is on its way to Redis (its lease is held meanwhile)."""
        return bool(self._recording)

    def holds_ack(self, field: str) -> bool:
        """Whether lease ``field``'s ack waits for its failure record to reach Redis."""
        if field in self._recording:
            self._recording[field] = True
            return True
        return False

    def record(self, request: Request, reason: str, *, lease: str | None = None
               ) -> Deferred[None]:
        """Keep ``request`` in Redis as it is to be fetched again; fires once recorded (its
        ``lease``, if any, is acked only then)."""
        score, payload = self.queue.entry(request)

        def write() -> None:
            # The queue's link: with its WAIT for replicas (record and lease may be on
            # different cluster masters).
            self.queue.send([failed.record_command(
                self.queue.tag, url=request.url, method=request.method, reason=reason,
                score=score, request=payload, limit=self.limit)])

        if self.jobs.failed():
            recorded: Deferred[None] = Deferred()  # never fires: after an error nothing is acked
        else:
            if lease is not None:
                self._recording[lease] = False

            def answered(_: None) -> None:
                if lease is not None and self._recording.pop(lease, False):
                    self._ack(lease)

            def not_recorded(failure: Failure) -> Failure:
                if lease is not None:
                    self._recording.pop(lease, None)
                self.jobs.redis_failed(failure)
                return failure

            recorded = self.jobs.run(lambda: self.jobs.call(write))
            recorded.addCallbacks(answered, not_recorded)
        self.stats.inc_value("bloomdupe/failed")
        level = logging.DEBUG if self._logged else logging.WARNING
        self._logged = True
        logger.log(level, "Failed for good, recorded in Redis: %s (%s); `bloomdupe failed` "
                   "lists such requests and --requeue fetches them again", request, reason,
                   extra={"spider": self.spider})
        return recorded

    def report_retired(self) -> int:
        """Count and log (one ERROR) the undecodable queue entries retired since the last
        call (now in the failed requests' record); returns how many."""
        retired = self.queue.take_retired()
        if not retired:
            return 0
        self.stats.inc_value("bloomdupe/undecodable", len(retired))
        self.stats.inc_value("bloomdupe/failed", len(retired))
        named = "; ".join(f"{r.url or '(no URL readable)'} ({r.error})"
                          for r in retired[:NAMED])
        more = f"; and {len(retired) - NAMED} more" if len(retired) > NAMED else ""
        logger.error("Moved %d shared queue entr%s that cannot be decoded into requests to "
                     "the failed requests' record, where they stay: %s%s. Restore what "
                     "they need (the spider's callback or errback they name, the request "
                     "class, the SCHEDULER_SERIALIZER that wrote them), then `bloomdupe "
                     "failed --requeue` queues them again",
                     len(retired), "y" if len(retired) == 1 else "ies", named, more,
                     extra={"spider": self.spider})
        return len(retired)
