"""The lease's whole life on one worker: requests popped from the shared queue into a
buffer, handed to Scrapy one by one, held until Scrapy is done with them, and acked (or,
after an error, left in Redis to come back to the next workers).

* A pop leases as many requests in one round trip as the worker has free download
  slots (``CONCURRENT_REQUESTS`` less the requests in progress), a quarter of
  ``CONCURRENT_REQUESTS`` more while the queue is deep (:meth:`Leases.prefetch_count`).
* A request handed out stays leased until Scrapy is done with it (:meth:`Leases.ack`,
  by way of the scheduler's ``done``); the ack rides on the next round trip, within
  :data:`ACK_DELAY`.
* A worker holds at most ``CONCURRENT_REQUESTS`` and a quarter of it in pages not yet
  acked (:meth:`Leases.full`): what a killed worker costs in pages fetched twice.
* A request whose lease expired ``BLOOMDUPE_MAX_REQUEUES`` times is recorded as failed
  instead of handed out again (:meth:`Leases._came_back_too_often`).

On a scrapy-redis queue class the same buffer holds requests popped one by one (leases
that lease nothing). The crawl's end (:mod:`.ending`) tells it how long an empty queue
is left alone, and hears when a fill is over with nothing for the engine.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from scrapy.utils.asyncio import CallLaterResult, call_later
from twisted.python.failure import Failure

from ..frontier.leased import LeasedQueue
from ..frontier.queue import Lease
from .failed import FailedRequests
from .jobs import Stopped, acted_on
from .requestpath import LEASE_META, QUEUED_META

if TYPE_CHECKING:
    from scrapy.core.engine import ExecutionEngine
    from scrapy.http import Request
    from twisted.internet.defer import Deferred

    from ..settings import FrontierConfig
    from .requestpath import RequestPath

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: ``request.meta`` key of a leased request handed to ``engine.crawl`` to wake an idle
#: engine (see :meth:`Leases.wake_engine`): already in this worker's buffer.
WAKE_META = "_bloomdupe_wake"
#: Longest time an ack waits for a round trip to ride on before it is sent alone (s).
#: Crawl-wide politeness sends it at once (the acks of one turn of the reactor
#: together): a slot's room comes back only with the ack, and the ack's pop takes it
#: (with 50 ms, a page's slot stood idle 50 ms more; docs/politeness.md).
ACK_DELAY = 0.05
#: Crawl-wide politeness: how soon a worker asks again when requests wait in download
#: slots that are all at their limit, in seconds (and up to as much again, at random,
#: so that workers do not ask at once). Room comes back with an ack, and the worker
#: that acks pops with it (see _send_acks): this only catches what that missed.
SLOT_POLL = 0.5

#: How a delayed call is asked for (Scrapy's ``call_later``; a test's own clock).
Later = Callable[[float, Callable[[], None]], CallLaterResult]


class Leases:
    """This worker's leases, from the pop to the ack: :attr:`buffer` (taken, not yet
    handed to Scrapy), :attr:`handed` (handed out, Scrapy not done with them), the acks
    on their way, and the records of requests that failed for good (:attr:`failed`, the
    leased queue only).

    ``path`` gives the queue, where the Redis work runs and the stats; ``concurrency`` is
    ``CONCURRENT_REQUESTS``; ``acks_early`` says whether a middleware acks each page once
    its output is queued (else a page's lease is let go when the worker is idle, and
    :meth:`full` never holds back); ``engine`` gives Scrapy's engine (asked only during
    a crawl). ``idle_poll`` and ``idle_missed`` are the crawl's end's: how long
    an empty queue is not asked again, and what runs when a fill is over with nothing
    for the engine. ``clock`` and ``later`` are the time and the delayed calls."""

    def __init__(self, path: RequestPath, *, frontier: FrontierConfig, concurrency: int,
                 acks_early: bool, engine: Callable[[], ExecutionEngine],
                 idle_poll: Callable[[], float], idle_missed: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic,
                 later: Later = call_later) -> None:
        self.path = path
        self.queue = path.queue
        self.jobs = path.jobs
        self.frontier = frontier
        self._concurrency = concurrency
        self._acks_early = acks_early
        self._engine = engine
        self._idle_poll = idle_poll
        self._idle_missed = idle_missed
        self._clock = clock
        self._later = later
        #: Leases taken and not yet handed to Scrapy.
        self.buffer: list[Lease] = []
        #: Leases handed to Scrapy and not done, by field.
        self.handed: dict[str, Lease] = {}
        #: Requests that failed for good, recorded in Redis (the leased queue only).
        self.failed = FailedRequests(
            jobs=self.jobs, queue=self.queue, limit=frontier.failed_limit, stats=path.stats,
            spider=path.spider, ack=self.ack) if path.leased else None
        self._acks_sending = False
        #: Whether the last pop got all it asked for (see prefetch_count).
        self._deep = False
        self._ack_call: CallLaterResult | None = None
        #: Whether a pop is on its way.
        self.filling = False
        #: A pop whose every request had come back too often: pop again.
        self._refill = False
        #: Whether the engine asked for a request and got none since the last pop.
        self.starved = False
        #: Until when an empty queue is not asked again but by the idle poll (see fill).
        self._empty_until = 0.0
        #: Requests waiting in the shared queue as far as this worker knows without a
        #: round trip (Scrapy's ``len(scheduler)``, ``has_pending_requests``): what a job
        #: saw there last (the queue at the crawl's join, a pop's count), and what this
        #: worker queued since; at least 1 while work is likely but not counted (a pop
        #: failed, requests wait in slots), 0 once a pop found the queue empty.
        self.waiting = 0
        #: Crawl-wide politeness (frontier/leased.py): a pop takes what may start
        #: now or within its horizon (each lease handed out at its start), no
        #: prefetch beyond; while slots wait, the next pop goes when the next slot
        #: comes within the horizon, and acks ride on a pop (which takes what they free).
        self._crawl_wide = isinstance(self.queue, LeasedQueue) and \
            self.queue.policy.crawl_wide
        self._slot_call: CallLaterResult | None = None
        #: Crawl-wide: when each buffered lease taken ahead of its start may go (by
        #: field, on ``clock``; the buffer is ordered by it), and the call that hands
        #: the first one to the engine then.
        self._starts: dict[str, float] = {}
        self._start_call: CallLaterResult | None = None

    @property
    def leased(self) -> bool:
        """Whether the queue is the leased one (scrapy-redis's own queues are not)."""
        return self.path.leased

    def held(self) -> list[Lease]:
        """The leases this worker holds: buffered or handed out."""
        return [*self.buffer, *self.handed.values()]

    # -- handing out ------------------------------------------------------------------

    def take(self) -> Request | None:
        """The next request for Scrapy, from the buffer (a fill tops it up, during a
        crawl in the background), or None: the buffer is empty, or this worker holds
        as many unacked pages as it may (see :meth:`full`; the acks' answer wakes the
        engine)."""
        self.settle()
        if not self.startable():
            self.fill()  # during a crawl, in the background
        request = None
        if self.buffer and self.full():
            if not self.starved:
                self.path.stats.inc_value("bloomdupe/held_full")
            self.starved = True  # the acks' answer wakes the engine (see _acks_out)
            self.send_acks_now()
        elif self.buffer and not self.startable():
            self.starved = True
            self._wake_at_start()  # taken ahead: not before its start
        elif self.buffer:
            lease = self.buffer.pop(0)
            self._starts.pop(lease.field, None)
            request = lease.request
            request.meta.pop(WAKE_META, None)  # left when a signal dropped the wake
            if self.leased:
                self.handed[lease.field] = lease
                request.meta[LEASE_META] = lease.field
                if self.startable() <= self.low_water():
                    self.fill()  # the next ones, while these download
        else:
            self.starved = True
        return request

    def wake_engine(self) -> None:
        """Hand the engine a buffered request (``engine.crawl``, Scrapy's public way to
        make it ask the scheduler's ``next_request`` now), when it runs."""
        if not self.jobs.crawling or not self.buffer:
            return
        engine = self._engine()
        if engine.spider is None:
            return
        request = self.buffer[0].request
        request.meta[WAKE_META] = True
        engine.crawl(request)

    def startable(self) -> int:
        """How many buffered leases Scrapy may have now: all of them, but those taken
        ahead of their start (crawl-wide politeness), which wait for it."""
        if not self._starts:
            return len(self.buffer)
        now = self._clock()
        return sum(1 for lease in self.buffer if self._starts.get(lease.field, 0.0) <= now)

    def _wake_at_start(self) -> None:
        """The engine asked while the first buffered lease waits for its start: hand it
        over then (a call at that time, replacing one set for another time)."""
        if self._start_call is not None:
            self._start_call.cancel()
            self._start_call = None
        if self.buffer and self.jobs.crawling:
            wait = max(0.0, self._starts.get(self.buffer[0].field, 0.0) - self._clock())
            self._start_call = self._later(wait, self._start_due)

    def _start_due(self) -> None:
        self._start_call = None
        if self.starved and self.startable():
            self.starved = False
            self.wake_engine()
        elif self.starved and self.buffer:
            self._wake_at_start()

    def full(self) -> bool:
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
        held: int = len(self.handed) + self.queue.pending_acks()
        return held >= self._concurrency + max(1, self._concurrency // 4)

    def prefetch_count(self) -> int:
        """How many requests to lease in one round trip: this worker's free download
        slots that its buffer does not cover (at least one), which the engine fills at
        once; and, while the queue is deep (the last pop got all it asked for), a
        quarter of ``CONCURRENT_REQUESTS`` more, so that a busy worker pops once every
        few pages instead of once a page.
        Near the end of the crawl (a short answer) it takes no more than it can start,
        so no request waits here while another worker could fetch it. On a scrapy-redis
        queue, never more than the engine can start (its free download slots)."""
        if not self.leased:
            return max(1, self._concurrency - self.holding() - len(self.buffer))
        extra = max(1, self._concurrency // 4) if self._deep and not self._crawl_wide else 0
        return max(1, self._concurrency - len(self.handed) - len(self.buffer)) + extra

    def holding(self) -> int:
        """Requests this worker has in progress, whose end makes the engine ask for more:
        those handed out and not done; on a scrapy-redis queue, those downloading."""
        if self.leased:
            return len(self.handed)
        return len(self._engine().downloader.active) if self.jobs.crawling else 0

    def low_water(self) -> int:
        """How few buffered requests make the next pop go out: while the queue is deep, a
        quarter of ``CONCURRENT_REQUESTS``, so that the pop's round trip runs while
        those start (no download slot waits for it); else none left."""
        return self._concurrency // 4 if self._deep and not self._crawl_wide else 0

    # -- filling the buffer -------------------------------------------------------------

    def fill(self, *, poll: bool = False, then: Callable[[], None] | None = None,
             look: Callable[[], Callable[[], T]] | None = None,
             looked: Callable[[T | None], None] | None = None) -> None:
        """Lease requests into the buffer (see prefetch_count), a job on the runner, the
        engine woken when they come and it had asked for one in vain
        (``engine.crawl``). After a pop that found the queue empty, the engine's asks
        (one per finished download) go to Redis again only once the idle poll is due,
        or this worker queued something; the idle poll (``poll``) always looks.
        ``then`` runs once the answer is in (at once when there is nothing to do).
        ``look`` (the idle poll's) makes a job that runs after a pop that
        took nothing, in the same job; ``looked`` gets what it found (None once the
        fill failed)."""
        if self.filling or self.startable() > self.low_water() or self.jobs.failed() or (
                not poll and self._clock() < self._empty_until):
            if then is not None and not self.filling:
                then()
            return
        count = self.prefetch_count()
        self.filling = True
        if self._slot_call is not None:  # this pop is the one it was to make
            self._slot_call.cancel()
            self._slot_call = None
        pop = partial(self.jobs.call, partial(self.queue.pop_leases, count)) \
            if self.leased else partial(self._pop_unleased, count)
        after = look() if look is not None and poll else None

        def job() -> tuple[list[Lease], T | None]:
            leases = pop()
            return leases, (after() if after is not None and not leases else None)

        d = self.jobs.run(job)
        d.addCallbacks(partial(self._filled, count, looked), self._pop_failed)
        d.addBoth(self._fill_over, then, looked)

    def _pop_failed(self, failure: Failure) -> None:
        # The pop did not say the queue is empty (Redis away, say): as far as this worker
        # knows, work may be left (see pending).
        self.waiting = max(self.waiting, 1)
        self.jobs.redis_failed(failure)

    def work_came(self) -> None:
        """This worker has work, or queued some: the next ask goes to Redis (see fill).
        Crawl-wide, while requests wait in slots, not for that: what they wait for is
        room or a start, not work; the pop that carries a page's acks (its output is
        queued first) moves the new requests into their slots and takes what the acks
        free, and the wait for the next start or room is timed (see _slot_wait)."""
        if not (self._crawl_wide and self._acks_early and self.queue.slots_waiting):
            self._empty_until = 0.0

    def queued(self, count: int = 1) -> None:
        """This worker queued ``count`` requests: the shared queue has work, as far as it
        knows, until a pop takes them or finds it empty (see :meth:`pending`)."""
        self.waiting += count
        self.work_came()

    def found(self, waiting: int) -> None:
        """A job found ``waiting`` requests in the shared queue (the crawl's join: a
        resumed crawl's, or those other workers queued)."""
        if waiting:
            self.waiting = max(self.waiting, waiting)
            self.work_came()

    def pending(self) -> bool:
        """Whether this worker has requests in hand or on their way, as far as it knows
        without a round trip (Scrapy's ``has_pending_requests``, asked whenever the engine
        looks idle): buffered, a pop or a check on its way, or waiting in the shared queue
        (see :attr:`waiting`). With none, the engine fires ``spider_idle``, whose look at
        the shared queue (a job) says whether work is left (:mod:`.ending`)."""
        return bool(self.buffer or self.filling or self.path.enqueuing or self.waiting)

    def length(self) -> int:
        """How many requests this worker counts as scheduled, without a round trip
        (Scrapy's ``len(scheduler)``): those waiting in the shared queue as far as it
        knows (see :attr:`waiting`), buffered here, or on their way there (their
        check-and-queue not answered yet: a duplicate among them is dropped then)."""
        return self.waiting + len(self.buffer) + self.path.enqueuing

    def _pop_unleased(self, count: int) -> list[Lease]:
        """Where the Redis work runs: up to ``count`` requests from a scrapy-redis queue,
        one ``pop`` each, as scrapy-redis pops (wrapped as leases that lease nothing)."""
        popped: list[Lease] = []
        while len(popped) < count:
            try:
                request = self.jobs.call(lambda: self.queue.pop(0))
            except Exception:
                if not popped:
                    raise
                break  # hand out what was popped: the next pop meets the error again
            if request is None:
                break
            popped.append(Lease(0, "", request))
        return popped

    def _filled(self, count: int, looked: Callable[[T | None], None] | None,
                answer: tuple[list[Lease], T | None]) -> None:
        leases, look = answer
        if look is not None and looked is not None:
            looked(look)
        # What waits in the queue now: a crawl-wide pop's count (its shard's, fresh), else
        # this worker's count less what the pop took; none left after a short answer.
        seen = self.queue.waiting_seen if isinstance(self.queue, LeasedQueue) else None
        self.waiting = seen if seen is not None else (
            max(0, self.waiting - len(leases)) if len(leases) >= count else 0)
        # A full answer: the queue is deep, the next pop may take a few more (leased only:
        # what a scrapy-redis queue's pop took is lost if this worker dies with it).
        self._deep = self.leased and len(leases) >= count
        self.buffer.extend(lease for lease in leases
                           if not (self.leased and self._came_back_too_often(lease)))
        if self._crawl_wide:
            # What a lease's start counts from: now, on the reactor, as for the leases
            # due at once, which go out from here (their starts' gaps hold so).
            self._order_by_start(leases, self._clock())
        # Entries it could not decode (retired): the queue is not empty, take more now.
        retired = self.report_retired()
        if retired:
            self._refill = True
        elif self._crawl_wide:
            self._crawl_wide_filled(leases, count)
        elif not leases:
            self.waiting = 0
            self._empty_until = self._clock() + self._idle_poll()
        elif self.buffer and self.starved:
            self.starved = False
            self.wake_engine()

    def _order_by_start(self, leases: list[Lease], at: float) -> None:
        """Crawl-wide: the leases taken ahead wait for their start (counted from ``at``,
        on ``clock``), the buffer ordered by start."""
        held = {lease.field for lease in self.buffer}
        for lease in leases:
            if lease.start_in > 0 and lease.field in held:
                self._starts[lease.field] = at + lease.start_in
        if self._starts:
            self._starts = {f: t for f, t in self._starts.items() if f in held}
            self.buffer.sort(key=lambda lease: self._starts.get(lease.field, 0.0))

    def _crawl_wide_filled(self, leases: list[Lease], count: int) -> None:
        """After a crawl-wide pop: while requests wait in slots and the pop got less than
        it asked for, the next pop waits for the next slot to come within the horizon
        (see _slot_wait); a pop that found nothing at all, for the idle poll. The
        engine, if it asked in vain, gets a lease once one may start."""
        if self.queue.slots_waiting and len(leases) < count:
            self._slot_wait()
        elif not leases:
            self.waiting = 0
            self._empty_until = self._clock() + self._idle_poll()
        if self.buffer and self.starved and not self.full():
            if self.startable():
                self.starved = False
                self.wake_engine()
            else:
                self._wake_at_start()

    def _slot_wait(self) -> None:
        """Requests wait in download slots, none of which this pop could take: ask
        again when the next one comes within the pop's horizon (Redis said when),
        else after SLOT_POLL (all are at their limit, the acks' pops take what they
        free); the engine's asks meanwhile do not go to Redis. Each worker waits a
        little more, at random (a quarter of the horizon at most; what it takes still
        starts on time), so that workers do not ask at once."""
        self.waiting = max(self.waiting, 1)  # work is left, as far as it knows (see pending)
        due = self.queue.next_due
        if due is None:
            wait = SLOT_POLL * (1 + random.random())
        else:
            wait = min(max(due, 0.005), SLOT_POLL * 10) + random.random() * self.queue.horizon / 4
        self._empty_until = self._clock() + wait
        if self._slot_call is not None:
            self._slot_call.cancel()
            self._slot_call = None
        if self.jobs.crawling:
            self._slot_call = self._later(wait, self._slot_due)

    def _slot_due(self) -> None:
        self._slot_call = None
        self._empty_until = 0.0
        self.starved = True  # what the fill takes goes to the engine at once
        self.fill()

    def _fill_over(self, result: Failure | None, then: Callable[[], None] | None,
                   looked: Callable[[T | None], None] | None) -> None:
        self.filling = False
        self.report_retired()  # what the pop could not decode
        if isinstance(result, Failure):
            if looked is not None:
                looked(None)
            if not isinstance(result.value, Stopped):
                logger.error("Leasing requests failed: %s", result.getErrorMessage())
        refill, self._refill = self._refill, False
        if refill and not self.buffer and not self.jobs.failed():
            self.fill()  # all it took came back too often: take more
        if then is not None:
            then()
        else:
            self._idle_missed()

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
                       extra={"spider": self.path.spider})
        recorded = self.record_failed(
            lease.request, f"its lease expired {lease.requeues} times "
            "(BLOOMDUPE_MAX_REQUEUES): every worker that took it stopped heartbeating")
        recorded.addCallbacks(lambda _: self.queue.ack([lease]), acted_on)
        self._refill = True
        return True

    def report_retired(self) -> int:
        """Count and log the queue entries retired since the last call, that cannot be
        decoded into requests (see :meth:`.failed.FailedRequests.report_retired`)."""
        return self.failed.report_retired() if self.failed is not None else 0

    def record_failed(self, request: Request, reason: str) -> Deferred[None]:
        """Record ``request`` as it is to be fetched again (without Scrapy's retry count
        and this package's marks), its lease acked once the record is in Redis."""
        assert self.failed is not None, "the leased queue's"
        meta = {k: v for k, v in request.meta.items()
                if k not in ("retry_times", QUEUED_META, LEASE_META)}
        return self.failed.record(request.replace(meta=meta), reason,
                                  lease=request.meta.get(LEASE_META))

    # -- acks ---------------------------------------------------------------------------

    def settle(self, *, idle: bool = False) -> None:
        """Ack every lease handed out when nothing can be working on it any more: Scrapy
        is ``idle`` (spider_idle: nothing downloading or scraping; a lease that no
        middleware acked, which should not happen, is acked then), or outside a crawl
        (see :attr:`.jobs.RedisJobs.crawling`)."""
        if not self.handed or self.jobs.failed():
            return  # after an error, nothing is acked: what is in hand comes back
        if not idle and self.jobs.crawling:
            return
        done = list(self.handed.values())
        self.handed.clear()
        self.queue.ack(done)

    def ack(self, field: str) -> None:
        """Scrapy is done with the request of lease ``field``: acked with the next round
        trip, within ACK_DELAY (once its failure record is in Redis, if one is on its
        way). A lease this worker does not hold is ignored."""
        if self.failed is not None and self.failed.holds_ack(field):
            return  # acked once its failure record is in Redis
        lease = self.handed.pop(field, None)
        if lease is None or self.jobs.failed():  # after an error what is held comes back
            return
        self.queue.ack([lease])
        if self.starved and self.startable():
            self.send_acks_now()  # the engine waits for them (see full)
        else:
            self._ack_later()

    def _ack_later(self) -> None:
        """Sent with the next round trip, or after ACK_DELAY at the latest: a worker
        killed meanwhile has only what it holds, and these few, fetched again."""
        if self._ack_call is None and self.jobs.crawling:
            self._ack_call = self._later(0.0 if self._crawl_wide else ACK_DELAY,
                                         self._send_acks)

    def send_acks_now(self) -> None:
        """The pending acks, without waiting for ACK_DELAY; not while a send is on its
        way (during an outage the engine's asks would pile sends on the runner):
        its answer sends what came since (see _acks_out)."""
        if self._ack_call is not None:
            self._ack_call.cancel()
            self._ack_call = None
        if not self._acks_sending and self.queue.pending_acks():
            self._send_acks()

    def _send_acks(self) -> None:
        self._ack_call = None
        if self._crawl_wide and not self.filling and not self.jobs.failed():
            # The acks ride on a pop, which takes what they free (their slots' next).
            self._empty_until = 0.0
            self.fill()
            if self.filling:
                return
        if not self.jobs.failed():
            self._acks_sending = True
            sent = self.jobs.run(lambda: self.jobs.call(self.queue.send_acks))
            sent.addCallbacks(self._acks_out, self.jobs.redis_failed)

    def _acks_out(self, _: None) -> None:
        """Acks are in Redis: the engine, if it asked in vain while this worker held its
        limit (see :meth:`full`), gets a request now. Acks that came while these were
        on their way (:meth:`send_acks_now` sent none meanwhile) go now if the engine
        still waits, else within ACK_DELAY."""
        self._acks_sending = False
        if self._crawl_wide:
            self._empty_until = 0.0  # the acks gave their slots room back: take what may go
            self.fill()
        if self.starved and self.startable() and not self.full():
            self.starved = False
            self.wake_engine()
        if self.queue.pending_acks():
            if self.starved and self.startable():
                self.send_acks_now()
            else:
                self._ack_later()

    def give_back(self) -> None:
        """On a scrapy-redis queue, the requests popped and never handed out (the spider
        closed meanwhile): back in the queue, before it is judged empty."""
        if not self.leased and self.buffer and not self.jobs.failed():
            back, self.buffer = [lease.request for lease in self.buffer], []
            self.jobs.call(lambda: [self.queue.push(request) for request in back], None)

    def close(self) -> None:
        """No ack is sent later (the scheduler closes and settles what it holds)."""
        if self._ack_call is not None:
            self._ack_call.cancel()
        self._ack_call = None
        if self._slot_call is not None:
            self._slot_call.cancel()
        self._slot_call = None
        if self._start_call is not None:
            self._start_call.cancel()
        self._start_call = None
