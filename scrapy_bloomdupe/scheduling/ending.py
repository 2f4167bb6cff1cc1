"""The crawl's end, as one worker sees it: it stays open while the shared queue has
requests or any worker holds a lease (its page may still yield more), and closes
("finished") once the queue has been empty with no lease held for the grace period
(``BLOOMDUPE_DONE_GRACE``, or ``SCHEDULER_IDLE_BEFORE_CLOSE`` when longer).

Scrapy's public ``spider_idle`` signal asks (:meth:`CrawlEnd.spider_idle`); no Redis
call is made there: it acts on a look at the shared queue taken by a job on the
scheduler's runner (:meth:`CrawlEnd.look_job`), and an idle worker polls (backing off
from :data:`IDLE_POLL` to :data:`MAX_IDLE_POLL`) rather than wait
for the engine's 5 s heartbeat.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from scrapy import signals
from scrapy.exceptions import CloseSpider, DontCloseSpider
from scrapy.utils.asyncio import CallLaterResult, call_later
from scrapy.utils.defer import deferred_from_coro
from twisted.python.failure import Failure

from ..transport.diagnose import check_eviction
from .leases import Later, Leases

if TYPE_CHECKING:
    from scrapy.core.engine import ExecutionEngine
    from scrapy.http import Request
    from scrapy.signalmanager import SignalManager
    from scrapy.spiders import Spider

    from .requestpath import RequestPath
    from .upkeep import LeaseUpkeep

logger = logging.getLogger(__name__)

#: How often an idle worker looks at the shared queue again (seconds), at first; it backs
#: off, doubling, to MAX_IDLE_POLL while it finds nothing to do.
IDLE_POLL = 0.5
MAX_IDLE_POLL = 2.0


@dataclass(frozen=True)
class Look:
    """What an idle worker's look at the shared queue found (see
    :meth:`CrawlEnd.look_job`)."""

    queued: int
    leased: int
    #: Whether the filter was found still there, unchanged (asked once the queue was
    #: seen empty before).
    verified: bool
    #: The work count when the look was asked (see :meth:`CrawlEnd.busy`).
    work: int
    #: Dead workers' leases put back by the look.
    back: list[tuple[int, Request]]


class CrawlEnd:
    """Whether this worker stays or the crawl is done. ``path`` gives the queue and
    where the Redis work runs; ``leases`` is this worker's (:class:`.leases.Leases`);
    ``upkeep`` the leased queue's heartbeat and reaps (None on a scrapy-redis queue);
    ``signals`` the crawler's (the idle round it runs, see :meth:`_after_poll`);
    ``engine`` gives Scrapy's engine (asked only during a crawl);
    ``done_grace`` is the grace period (s).
    ``clock`` and ``later`` are the time and the delayed calls."""

    def __init__(self, path: RequestPath, leases: Leases, *, upkeep: LeaseUpkeep | None,
                 signals: SignalManager, engine: Callable[[], ExecutionEngine],
                 done_grace: float, clock: Callable[[], float] = time.monotonic,
                 later: Later = call_later) -> None:
        self.path = path
        self.queue = path.queue
        self.jobs = path.jobs
        self.leases = leases
        self.upkeep = upkeep
        self.signals = signals
        self._engine = engine
        #: Seconds the shared queue must stay empty, with no lease held, before this
        #: worker closes: ``BLOOMDUPE_DONE_GRACE``, or scrapy-redis's
        #: ``SCHEDULER_IDLE_BEFORE_CLOSE`` when it is longer.
        self.done_grace = done_grace
        self._clock = clock
        self._later = later
        self._wakeup: CallLaterResult | None = None
        #: The idle look at the shared queue that _after_poll is acting on (see look_job).
        self._look: Look | None = None
        #: Times this worker had work (see busy): a look from before is stale.
        self._work = 0
        #: How long an idle worker waits before it looks again (see wake_later).
        self.idle_poll = IDLE_POLL
        self._idle_since: float | None = None
        self._waiting_for: str | None = None
        #: True while this worker sees the crawl done: the queue empty, no lease held,
        #: for the grace period of its current idle spell (any work seen ends it).
        self.crawl_done = False
        self._done_logged = False

    def busy(self) -> None:
        """This worker has work, or queued some: look at the queue again at once."""
        self._not_done()
        self._work += 1
        self.idle_poll = IDLE_POLL
        self.leases.work_came()

    def queued(self, count: int = 1) -> None:
        """This worker queued ``count`` requests (the request path's answer)."""
        self.busy()
        self.leases.queued(count)

    def _not_done(self) -> None:
        """The crawl has work (here or at other workers): an idle spell, if any, is over."""
        self._idle_since = None
        self.crawl_done = False
        self._done_logged = False

    # -- spider_idle --------------------------------------------------------------------

    def spider_idle(self, spider: Spider) -> None:
        """This worker has nothing to do: stay while the crawl may still make work
        (Scrapy's ``spider_idle`` signal; raises ``DontCloseSpider`` to stay). No Redis
        call here: it acts on a look at the shared queue taken by a job (the idle poll's,
        or one it asks for, see :meth:`_take_look`)."""
        failed = self.leases.failed
        if self.path.enqueuing or (failed is not None and failed.pending):
            # A request's check or a failure's record is on its way: its lease is held.
            self.wake_later()
            raise DontCloseSpider
        self.leases.settle(idle=True)
        look = self._take_look()
        if look is None:
            if self.jobs.failed():
                return  # the crawl stopped on an error: nothing keeps it open
            raise DontCloseSpider  # asked: its answer runs the idle round again
        if look.queued or look.leased:
            self._stay(look.queued, look.leased, spider)
        now = self._clock()
        if self._idle_since is None:
            self._idle_since = now
        if now - self._idle_since < self.done_grace or not look.verified:
            self.wake_later(at_most=max(0.0, self._idle_since + self.done_grace - now))
            raise DontCloseSpider
        self._crawl_is_done(now - self._idle_since, spider)

    def _take_look(self) -> Look | None:
        """The look this idle round acts on: the idle poll's that runs it, or else one
        asked now, as a job. A job answered at once (outside a crawl, where no runner
        runs) is acted on here; one answered later runs the idle round as the idle
        poll's answer does (:meth:`_after_poll`), and None is returned meanwhile."""
        look, self._look = self._look, None
        if look is not None and look.work == self._work:
            return look
        answer: list[Look] = []
        asking = True

        def looked(found: Look) -> None:
            self.looked(found)
            if asking:
                answer.append(found)
                self._look = None
            else:
                self._after_poll()

        self.jobs.run(self.look_job()).addCallbacks(looked, self.jobs.redis_failed)
        asking = False
        return answer[0] if answer else None

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
        self.wake_later()
        raise DontCloseSpider

    def look_job(self) -> Callable[[], Look]:
        """An idle worker's look at the shared queue, a job: put dead workers' leases back
        when due, count what is queued and leased, and, once the queue was seen empty
        before (or with no grace), check that the filter is still there."""
        reap = self.upkeep is not None and self.upkeep.reap_due()
        verify = self._idle_since is not None or self.done_grace <= 0
        work = self._work
        call = self.jobs.call
        leased_queue = self.path.leased

        def look() -> Look:
            # The pending acks go first (with the reap when it is due): the leases
            # counted below must not include this worker's finished ones.
            back: list[tuple[int, Request]] = call(self.queue.reap) if reap else []
            if not reap and leased_queue:
                call(self.queue.send_acks)
            queued, leased = call(self.queue.status) if leased_queue else (
                call(lambda: len(self.queue)), 0)
            verified = verify and not queued and not leased
            df = self.path.bloomdupe
            if verified and df is not None:
                call(df.bloom.verify)
                call(lambda: check_eviction(df.bloom.link, warn=False))
            return Look(queued, leased, verified, work, back)
        return look

    def looked(self, look: Look | None) -> None:
        """What the idle poll's look found (None: the poll failed)."""
        if look is not None and self.upkeep is not None:
            self.upkeep.reaped(look.back)
        self._look = look

    # -- the idle poll ------------------------------------------------------------------

    def wake_later(self, delay: float | None = None, *, at_most: float = MAX_IDLE_POLL
                   ) -> None:
        """Look at the shared queue again in ``delay`` seconds (by default the idle poll,
        which then backs off; ``at_most``: no later than that)."""
        if self._wakeup is None and self.jobs.crawling:
            if delay is None:
                delay = min(self.idle_poll, at_most)
                self.idle_poll = min(self.idle_poll * 2, MAX_IDLE_POLL)
            self._wakeup = self._later(delay, self._wake)

    def _wake(self) -> None:
        """An idle engine asks its scheduler again only on its 5 s heartbeat. Look now:
        requests another worker queued are leased and one is handed to
        ``engine.crawl`` (Scrapy's public way to wake the engine, which then asks
        the scheduler's ``next_request``); with none, Scrapy's idle round is run, as the
        engine runs it, so that this worker stays or closes without waiting 5 s."""
        self._wakeup = None
        if self.leases.filling:  # a pop is on its way: look once it is in
            self.wake_later()
            return
        if not self.leases.buffer:
            self.leases.starved = True  # what the pop brings wakes the engine (see fill)
            self.leases.fill(poll=True, then=self._after_poll, look=self.look_job,
                             looked=self.looked)
        else:
            self._after_poll()

    def _after_poll(self) -> None:
        look, self._look = self._look, None
        if not self.jobs.crawling or self.jobs.failed():
            return
        engine = self._engine()
        if engine.spider is None:
            return
        if self.leases.buffer:
            self.idle_poll = IDLE_POLL
            if self.leases.starved:
                self.leases.starved = False
                self.leases.wake_engine()
            return
        if not engine.spider_is_idle():
            if not self.leases.holding():  # the queue had requests, others took them: look again
                self.wake_later()
            return
        self._look = look  # what the idle handler acts on: this poll's look only
        try:
            results = self.signals.send_catch_log(
                signals.spider_idle, spider=engine.spider, dont_log=DontCloseSpider)
        finally:
            self._look = None
        raised = [r.value for _, r in results if isinstance(r, Failure)
                  and isinstance(r.value, (DontCloseSpider, CloseSpider))]
        if any(isinstance(e, DontCloseSpider) for e in raised) or not engine.spider_is_idle():
            return
        reason = next((e.reason for e in raised if isinstance(e, CloseSpider)), "finished")
        deferred_from_coro(engine.close_spider_async(reason=reason))

    def idle_missed(self) -> None:
        """A fill or a check on the runner is over, and the scheduler's
        ``has_pending_requests`` said yes while it was on its way. The engine looks
        whether it is idle (and sends ``spider_idle``) only right after it asks for a
        request, and asks only when a download or callback ends or on its 5 s heartbeat;
        that ask starts a fill, whose answer comes after the look. Without a middleware
        that acks, a page's lease is held until ``spider_idle`` (see Leases.settle), so
        no idle poll was due either (see the scheduler's ``next_request``) and the worker
        never closed. If the engine is idle now, the idle round it missed runs here (the
        idle poll, at once)."""
        if self._wakeup is not None or self.leases.buffer or self.leases.filling \
                or self.path.enqueuing or self.jobs.failed():
            return
        if not self.jobs.crawling:
            return
        engine = self._engine()
        if engine.spider is None:
            return
        with suppress(RuntimeError):  # the engine's slot is gone: it is closing
            if engine.spider_is_idle():
                self.wake_later(0.0)

    # -- closing ------------------------------------------------------------------------

    def done_now(self) -> bool:
        """Whether the crawl is done at this moment (for ``SCHEDULER_PERSIST`` off): this
        worker's current idle spell saw it done for the grace period, and the shared
        queue is still empty with no lease held (this worker's acks sent first)."""
        if not self.crawl_done:
            return False
        if not self.path.leased:
            return not self.jobs.call(lambda: len(self.queue), 1)
        self.leases.settle()
        self.jobs.call(lambda: self.queue.heartbeat() or True, False)
        queued, leased = self.jobs.call(self.queue.status, (1, 1))
        return not queued and not leased and not self.jobs.failed()

    def close(self) -> None:
        """No idle poll any more (the scheduler closes)."""
        if self._wakeup is not None:
            self._wakeup.cancel()
        self._wakeup = None
