"""A lease's life on one worker: popped from the shared queue into a buffer, handed to Scrapy
one by one, held until Scrapy is done, then acked (after an error, left in Redis to come back).

* A pop leases, in one round trip, a request per free download slot, plus a quarter of
  ``CONCURRENT_REQUESTS`` while the queue is deep (:meth:`Leases.prefetch_count`).
* The ack (:meth:`Leases.ack`) rides on the next round trip, within :data:`ACK_DELAY`.
* At most ``CONCURRENT_REQUESTS`` and a quarter are held unacked (:meth:`Leases.full`): what a
  killed worker costs in pages fetched twice.
* A lease expired ``BLOOMDUPE_MAX_REQUEUES`` times is recorded as failed, not handed out again.

On a scrapy-redis queue the buffer holds requests popped one by one (leases that lease
nothing). :mod:`.ending` sets how long an empty queue is left alone.
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

#: ``request.meta`` key of a buffered request handed to ``engine.crawl`` to wake an idle engine.
WAKE_META = "_bloomdupe_wake"
#: Longest wait (s) of an ack for a round trip to ride on. Crawl-wide politeness sends at once
#: (one reactor turn's acks together): a slot's room comes back only with the ack.
ACK_DELAY = 0.05
#: Crawl-wide: how soon (s, plus up to as much again at random) a worker asks again while all
#: waiting slots are at their limit. The acks' pops take freed room; this catches the rest.
SLOT_POLL = 0.5

#: How a delayed call is asked for (Scrapy's ``call_later``; a test's own clock).
Later = Callable[[float, Callable[[], None]], CallLaterResult]


class Leases:
    """This worker's leases from pop to ack: :attr:`buffer` (not yet handed to Scrapy),
    :attr:`handed` (Scrapy not done), pending acks, and :attr:`failed` (leased queue only).

    ``path`` gives the queue, the Redis runner and stats; ``concurrency`` is
    ``CONCURRENT_REQUESTS``; ``acks_early``: a middleware acks each page once its output is
    queued (else leases go when idle and :meth:`full` never holds back); ``engine`` gives
    Scrapy's engine. ``idle_poll`` and ``idle_missed`` come from :mod:`.ending`: how long an
    empty queue is left alone, and what runs when a fill brought nothing for the engine."""

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
        #: Requests in the shared queue as far as known without a round trip: a job's last
        #: count plus what this worker queued since; at least 1 while work is likely but
        #: uncounted (a pop failed, slots wait), 0 once a pop found the queue empty.
        self.waiting = 0
        #: Crawl-wide politeness (frontier/leased.py): a pop takes only what may start within
        #: its horizon; while slots wait, pops are timed to them and acks ride on pops.
        self._crawl_wide = isinstance(self.queue, LeasedQueue) and \
            self.queue.policy.crawl_wide
        self._slot_call: CallLaterResult | None = None
        #: Crawl-wide: when each lease taken ahead may go (by field, on ``clock``; the buffer
        #: is sorted by it), and the call that hands the first one over then.
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
        """The next request for Scrapy from the buffer (a fill tops it up), or None: empty,
        not startable yet, or :meth:`full` (the acks' answer wakes the engine)."""
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
        """Make a running engine ask ``next_request`` now (``engine.crawl`` a buffered one)."""
        if not self.jobs.crawling or not self.buffer:
            return
        engine = self._engine()
        if engine.spider is None:
            return
        request = self.buffer[0].request
        request.meta[WAKE_META] = True
        engine.crawl(request)

    def startable(self) -> int:
        """How many buffered leases may go now: all but those taken ahead of their start."""
        if not self._starts:
            return len(self.buffer)
        now = self._clock()
        return sum(1 for lease in self.buffer if self._starts.get(lease.field, 0.0) <= now)

    def _wake_at_start(self) -> None:
        """Hand the first buffered lease over at its start (replacing an earlier call)."""
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
        """Whether this worker holds its limit of unacked pages (handed out, or done with acks
        not in Redis yet): ``CONCURRENT_REQUESTS`` plus a quarter. The engine can hold more
        (callbacks or check-and-queue not over), each fetched again if the worker dies; this
        bounds that. The buffer does not count. Never without the batch middleware."""
        if not (self.leased and self._acks_early):
            return False
        held: int = len(self.handed) + self.queue.pending_acks()
        return held >= self._concurrency + max(1, self._concurrency // 4)

    def prefetch_count(self) -> int:
        """Requests to lease in one round trip: free download slots the buffer does not cover
        (at least one), plus a quarter of ``CONCURRENT_REQUESTS`` while the queue is deep, so a
        busy worker pops every few pages. After a short answer (the crawl's end) only what it
        can start, so nothing waits here that another worker could fetch."""
        if not self.leased:
            return max(1, self._concurrency - self.holding() - len(self.buffer))
        extra = max(1, self._concurrency // 4) if self._deep and not self._crawl_wide else 0
        return max(1, self._concurrency - len(self.handed) - len(self.buffer)) + extra

    def holding(self) -> int:
        """Requests in progress (handed out; on a scrapy-redis queue, downloading)."""
        if self.leased:
            return len(self.handed)
        return len(self._engine().downloader.active) if self.jobs.crawling else 0

    def low_water(self) -> int:
        """Buffer size at which the next pop goes out: a quarter of ``CONCURRENT_REQUESTS``
        while the queue is deep (no slot waits for the round trip), else 0."""
        return self._concurrency // 4 if self._deep and not self._crawl_wide else 0

    # -- filling the buffer -------------------------------------------------------------

    def fill(self, *, poll: bool = False, then: Callable[[], None] | None = None,
             look: Callable[[], Callable[[], T]] | None = None,
             looked: Callable[[T | None], None] | None = None) -> None:
        """Lease requests into the buffer in a runner job, waking an engine that asked in
        vain. After an empty pop, the engine's asks (one per download) skip Redis until the
        idle poll (``poll``, which always looks) or this worker queued something. ``then``
        runs once answered (at once if nothing to do); ``look`` makes a job run after an
        empty pop in the same job, and ``looked`` gets its result (None if the fill failed)."""
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
        # The pop did not say the queue is empty (Redis away): work may be left.
        self.waiting = max(self.waiting, 1)
        self.jobs.redis_failed(failure)

    def work_came(self) -> None:
        """Work came: the next ask goes to Redis. Not crawl-wide while slots wait (for room
        or a start, not work): the pop carrying a page's acks moves its output into slots."""
        if not (self._crawl_wide and self._acks_early and self.queue.slots_waiting):
            self._empty_until = 0.0

    def queued(self, count: int = 1) -> None:
        """This worker queued ``count`` requests: work, until a pop takes them or finds none."""
        self.waiting += count
        self.work_came()

    def found(self, waiting: int) -> None:
        """A job found ``waiting`` requests in the shared queue (at the crawl's join)."""
        if waiting:
            self.waiting = max(self.waiting, waiting)
            self.work_came()

    def pending(self) -> bool:
        """Scrapy's ``has_pending_requests`` without a round trip: buffered, a pop or check on
        its way, or :attr:`waiting`. If not, ``spider_idle`` looks at Redis (:mod:`.ending`)."""
        return bool(self.buffer or self.filling or self.path.enqueuing or self.waiting)

    def length(self) -> int:
        """Scrapy's ``len(scheduler)`` without a round trip: :attr:`waiting`, buffered, and
        on their way to the queue (duplicates among them are dropped then)."""
        return self.waiting + len(self.buffer) + self.path.enqueuing

    def _pop_unleased(self, count: int) -> list[Lease]:
        """On the runner: up to ``count`` requests from a scrapy-redis queue, one ``pop`` each."""
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
        # A crawl-wide pop's fresh count, else ours less what it took; 0 after a short answer.
        seen = self.queue.waiting_seen if isinstance(self.queue, LeasedQueue) else None
        self.waiting = seen if seen is not None else (
            max(0, self.waiting - len(leases)) if len(leases) >= count else 0)
        # Deep: prefetch more (leased only: scrapy-redis pops are lost if this worker dies).
        self._deep = self.leased and len(leases) >= count
        self.buffer.extend(lease for lease in leases
                           if not (self.leased and self._came_back_too_often(lease)))
        if self._crawl_wide:
            # Starts count from now, on the reactor, as do the leases due at once.
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
        """Crawl-wide: note the start of leases taken ahead (from ``at``), sort the buffer."""
        held = {lease.field for lease in self.buffer}
        for lease in leases:
            if lease.start_in > 0 and lease.field in held:
                self._starts[lease.field] = at + lease.start_in
        if self._starts:
            self._starts = {f: t for f, t in self._starts.items() if f in held}
            self.buffer.sort(key=lambda lease: self._starts.get(lease.field, 0.0))

    def _crawl_wide_filled(self, leases: list[Lease], count: int) -> None:
        """After a crawl-wide short pop, the next waits for a slot (_slot_wait), or after an
        empty one for the idle poll. A waiting engine gets a lease once one may start."""
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
        """Slots wait, none takeable: ask again when the next comes within the horizon (Redis
        said when), else after SLOT_POLL; the engine's asks skip Redis meanwhile. Up to a
        quarter horizon more at random (still on time), so workers do not ask at once."""
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
        """A lease expired ``BLOOMDUPE_MAX_REQUEUES`` times (every taker blocked the reactor
        or crashed) is recorded as failed and leaves the queue, so that the crawl ends."""
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
        """See :meth:`.failed.FailedRequests.report_retired`."""
        return self.failed.report_retired() if self.failed is not None else 0

    def record_failed(self, request: Request, reason: str) -> Deferred[None]:
        """Record ``request`` as failed (without retry count and our marks); acked once in Redis."""
        assert self.failed is not None, "the leased queue's"
        meta = {k: v for k, v in request.meta.items()
                if k not in ("retry_times", QUEUED_META, LEASE_META)}
        return self.failed.record(request.replace(meta=meta), reason,
                                  lease=request.meta.get(LEASE_META))

    # -- acks ---------------------------------------------------------------------------

    def settle(self, *, idle: bool = False) -> None:
        """Ack every handed-out lease once nothing can work on it: Scrapy is ``idle``
        (spider_idle), or outside a crawl (:attr:`.jobs.RedisJobs.crawling`)."""
        if not self.handed or self.jobs.failed():
            return  # after an error, nothing is acked: what is in hand comes back
        if not idle and self.jobs.crawling:
            return
        done = list(self.handed.values())
        self.handed.clear()
        self.queue.ack(done)

    def ack(self, field: str) -> None:
        """Scrapy is done with lease ``field``: acked within ACK_DELAY (after its failure
        record, if one is on its way). A lease this worker does not hold is ignored."""
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
        """Sent with the next round trip, within ACK_DELAY (bounds a killed worker's refetches)."""
        if self._ack_call is None and self.jobs.crawling:
            self._ack_call = self._later(0.0 if self._crawl_wide else ACK_DELAY,
                                         self._send_acks)

    def send_acks_now(self) -> None:
        """Send pending acks now, unless a send is on its way (an outage would pile sends
        on the runner); its answer sends what came since."""
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
        """Acks are in Redis: an engine that waited on :meth:`full` gets a request; acks
        that came meanwhile go now if it still waits, else within ACK_DELAY."""
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
        """Scrapy-redis queue: push back unhanded requests before the queue is judged empty."""
        if not self.leased and self.buffer and not self.jobs.failed():
            back, self.buffer = [lease.request for lease in self.buffer], []
            self.jobs.call(lambda: [self.queue.push(request) for request in back], None)

    def close(self) -> None:
        """Cancel delayed calls (the scheduler settles what it holds)."""
        if self._ack_call is not None:
            self._ack_call.cancel()
        self._ack_call = None
        if self._slot_call is not None:
            self._slot_call.cancel()
        self._slot_call = None
        if self._start_call is not None:
            self._start_call.cancel()
        self._start_call = None
