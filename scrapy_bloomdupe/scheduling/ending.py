"""The crawl's end as one worker sees it: it stays open while the shared queue has requests
or any worker holds a lease (its page may yield more), and closes ("finished") once the queue
has been empty with no lease held for the grace period (``BLOOMDUPE_DONE_GRACE``, or
``SCHEDULER_IDLE_BEFORE_CLOSE`` if longer). ``spider_idle`` makes no Redis call: it acts on a
look taken by a job (:meth:`CrawlEnd.look_job`); an idle worker polls (:data:`IDLE_POLL` to
:data:`MAX_IDLE_POLL`) rather than wait for the engine's 5 s heartbeat."""

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

#: How often an idle worker looks at the queue again (s), doubling up to MAX_IDLE_POLL.
IDLE_POLL = 0.5
MAX_IDLE_POLL = 2.0


@dataclass(frozen=True)
class Look:
    """What an idle worker's look at the shared queue found (:meth:`CrawlEnd.look_job`)."""

    queued: int
    leased: int
    #: Whether the filter was found unchanged (asked once the queue was seen empty before).
    verified: bool
    #: The work count when the look was asked (see :meth:`CrawlEnd.busy`).
    work: int
    #: Dead workers' leases put back by the look.
    back: list[tuple[int, Request]]


class CrawlEnd:
    """Whether this worker stays or the crawl is done. ``path``: the queue and where Redis
    work runs; ``leases``: this worker's; ``upkeep``: heartbeat and reaps (None on a
    scrapy-redis queue); ``signals``, ``engine``: the crawler's; ``done_grace``: the grace
    period (s); ``clock``, ``later``: the time and delayed calls."""

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
        #: Seconds the queue must stay empty, no lease held, before closing (see the module).
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
        #: Whether this idle spell has seen the crawl done for the grace period.
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
        """Scrapy's ``spider_idle``: raise ``DontCloseSpider`` while the crawl may still make
        work. No Redis call: it acts on a look taken by a job (:meth:`_take_look`)."""
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
        """The look this idle round acts on: the idle poll's, else one asked now as a job; None
        while that is on its way (its answer runs the idle round: :meth:`_after_poll`)."""
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
        """The queue has been empty, no lease held, for ``idle`` s: this worker may close."""
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
        """An idle worker's look, a job: reap when due, count what is queued and leased, and,
        once the queue was seen empty (or with no grace), check the filter is still there."""
        reap = self.upkeep is not None and self.upkeep.reap_due()
        verify = self._idle_since is not None or self.done_grace <= 0
        work = self._work
        call = self.jobs.call
        leased_queue = self.path.leased

        def look() -> Look:
            # Acks go first (with a due reap): the count must not hold our finished leases.
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
        """Look again in ``delay`` s (default: the idle poll, backing off; at most ``at_most``)."""
        if self._wakeup is None and self.jobs.crawling:
            if delay is None:
                delay = min(self.idle_poll, at_most)
                self.idle_poll = min(self.idle_poll * 2, MAX_IDLE_POLL)
            self._wakeup = self._later(delay, self._wake)

    def _wake(self) -> None:
        """Look now, not on the idle engine's 5 s heartbeat: lease what others queued and hand
        one to ``engine.crawl`` (which wakes the engine), or with none run Scrapy's idle round."""
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
        """A fill or check ended after ``has_pending_requests`` said yes: the engine checks for
        idleness only right after asking (before the fill's answer) and, leases being held until
        ``spider_idle``, no idle poll was due, so it would never close. Run the missed round."""
        if self._wakeup is not None or self.leases.buffer or self.leases.filling \
                or self.path.enqueuing or self.jobs.failed() or not self.jobs.crawling:
            return
        engine = self._engine()
        if engine.spider is None:
            return
        with suppress(RuntimeError):  # the engine's slot is gone: it is closing
            if engine.spider_is_idle():
                self.wake_later(0.0)

    # -- closing ------------------------------------------------------------------------

    def done_now(self) -> bool:
        """Whether the crawl is done now (``SCHEDULER_PERSIST`` off): seen done for the grace
        period, and the queue still empty with no lease held (our acks sent first)."""
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
