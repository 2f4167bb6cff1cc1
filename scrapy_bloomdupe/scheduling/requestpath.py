"""The request path (:attr:`scrapy_bloomdupe.scheduler.Scheduler.path`): the crawl's dupefilter,
shared queue and Redis jobs (:class:`~.jobs.RedisJobs`). Callbacks' outputs
(:meth:`RequestPath.queue_output`) and ``enqueue_request`` (:meth:`RequestPath.enqueue`) go
through it as jobs, checked and queued in one script (:meth:`RequestPath.check_and_push`);
outputs wait in the :class:`Outbox` and go together, :data:`GATHER_DELAY` after the first.
Leases and acks are in :mod:`.leases`, idleness in :mod:`.ending`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from redis.exceptions import RedisError
from scrapy import signals as scrapy_signals
from scrapy.utils.asyncio import CallLaterResult, call_later
from scrapy_redis.spiders import RedisMixin
from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from ..exceptions import BloomDupeError
from ..frontier import storable
from ..frontier.leased import LeasedQueue
from ..frontier.queue import PriorityQueue
from .health import CLOSE_REASON
from .jobs import RedisJobs, Stopped
from .offsite import Offsite
from .shared import SharedQueue

if TYPE_CHECKING:
    from scrapy.dupefilters import BaseDupeFilter
    from scrapy.http import Request
    from scrapy.signalmanager import SignalManager
    from scrapy.spiders import Spider
    from scrapy.statscollectors import StatsCollector
    from scrapy.utils.request import RequestFingerprinterProtocol

    from ..bloom.filter import BloomFilter

logger = logging.getLogger(__name__)

#: ``request.meta`` key of a handed-out request's lease; its copies (redirect, retry) carry it.
LEASE_META = "_bloomdupe_lease"
#: ``request.meta`` key of a request the batch middleware has already queued.
QUEUED_META = "_bloomdupe_queued"
#: ``request.meta`` key of a start request checked by ``BLOOMDUPE_START_ONCE``: its copies
#: (retry, redirect) carry it and pass the filter as their ``dont_filter`` says.
START_META = "_bloomdupe_start"
#: Scrapy's ``request.meta`` key of a start request (its ``StartSpiderMiddleware``).
IS_START_META = "is_start_request"


class BloomDupe(Protocol):
    """This package's dupefilter as the scheduler's parts use it (not imported here)."""

    bloom: BloomFilter
    fingerprinter: RequestFingerprinterProtocol

    def check_and_queue(self, fingerprints: list[bytes], queue: Any,
                        entries: list[Any]) -> list[bool]: ...

    def flush_crawl_stats_due(self) -> None: ...

    def log(self, request: Request, spider: Any) -> None: ...


#: Seconds an output waits for others: a burst of callbacks then costs one script call and
#: round trip a master, not one per callback (a page's lease and links wait that much longer).
GATHER_DELAY = 0.02

#: A drain's result: the outputs taken, and whether each item was new (in order) or the error.
Drained = tuple[list["Output"], list[bool] | Exception]


@dataclass
class Output:
    """One callback's output (or ``enqueue_request``'s request) in the outbox: fingerprints
    to check, entries to queue if new, ``dont_filter`` requests to push, and the answer."""

    fingerprints: list[bytes]
    entries: list[Any]
    pushed: list[Request]
    answer: Deferred[list[bool]] = field(default_factory=Deferred)


class Outbox:
    """Outputs waiting for the runner: ``run`` runs a job, ``check_and_push`` does their
    Redis work (whether each was new), ``later`` delays a call."""

    def __init__(self, run: Callable[[Callable[[], Drained]], Deferred[Drained]],
                 check_and_push: Callable[[list[bytes], list[Any], list[Request]], list[bool]],
                 *, later: Callable[[float, Callable[[], None]], CallLaterResult | None
                                    ] = call_later) -> None:
        self._run = run
        self._check_and_push = check_and_push
        self._later = later
        self._outputs: list[Output] = []
        self._lock = threading.Lock()
        self._drain_asked = False
        #: The drain, due GATHER_DELAY after the first output waiting.
        self._gather_call: CallLaterResult | None = None

    def send(self, output: Output) -> Deferred[list[bool]]:
        """Queue ``output`` with the next drain; its answer fires on the reactor."""
        with self._lock:
            self._outputs.append(output)
            ask, self._drain_asked = not self._drain_asked, True
        if ask:
            self._gather_call = self._later(GATHER_DELAY, self._ask_drain)
        return output.answer

    def flush(self) -> None:
        """Send the gathered outputs now (the crawl closes)."""
        if self._gather_call is not None:
            self._gather_call.cancel()
            self._ask_drain()

    def _ask_drain(self) -> None:
        self._gather_call = None
        self._run(self._drain).addCallbacks(self._drained, self._undrained)

    def _drain(self) -> Drained:
        """On the runner: check and queue every output waiting, together."""
        with self._lock:
            outputs, self._outputs = self._outputs, []
            self._drain_asked = False
        fps = [fp for output in outputs for fp in output.fingerprints]
        entries = [entry for output in outputs for entry in output.entries]
        pushed = [request for output in outputs for request in output.pushed]
        try:
            new = self._check_and_push(fps, entries, pushed)
        except Exception as e:  # each output's caller acts on it
            return outputs, e
        return outputs, new

    def _drained(self, answer: Drained) -> None:
        outputs, new = answer
        at = 0
        for output in outputs:
            if isinstance(new, Exception):
                output.answer.errback(new)
                continue
            output.answer.callback(new[at:at + len(output.fingerprints)])
            at += len(output.fingerprints)

    def _undrained(self, failure: Failure) -> None:
        """The drain did not run (the crawl stopped): every output waiting gets the reason."""
        with self._lock:
            outputs, self._outputs = self._outputs, []
            self._drain_asked = False
        for output in outputs:
            output.answer.errback(failure.value)


class RequestPath:
    """The crawl's dupefilter (``df``; also ``bloomdupe`` if this package's), shared queue
    and Redis ``jobs``, owned by the scheduler. ``queued(n)`` counts queued requests;
    ``signals`` get ``request_dropped``; ``start_once``: see :meth:`starts_once`."""

    def __init__(self, df: BaseDupeFilter, queue: SharedQueue, jobs: RedisJobs, *,
                 stats: StatsCollector,
                 spider: Spider, queued: Callable[[int], None],
                 signals: SignalManager | None = None, start_once: bool = False,
                 bloomdupe: BloomDupe | None = None) -> None:
        self.df = df
        self.bloomdupe = bloomdupe
        self.queue = queue
        self.jobs = jobs
        self.stats = stats
        self.spider = spider
        self._queued = queued
        self._signals = signals
        self.start_once = start_once
        #: Whether a start request was found already in the crawl (said once).
        self._start_seen_said = False
        #: The spider's ``allowed_domains``, applied before Redis.
        self.offsite = Offsite(getattr(spider, "crawler", None))
        #: Requests given to enqueue whose check is on its way.
        self.enqueuing = 0
        #: Callbacks' outputs waiting to go to Redis together (see queue_output).
        self.outbox = Outbox(jobs.run, self.check_and_push, later=jobs.later)

    @property
    def bloom(self) -> BloomDupe:
        """The dupefilter where only this package's can be (callers check first)."""
        assert self.bloomdupe is not None, self.df
        return self.bloomdupe

    @property
    def leased(self) -> bool:
        """Whether the queue is the leased one (scrapy-redis's own queues are not)."""
        return isinstance(self.queue, PriorityQueue)

    def enqueue(self, request: Request, *, done: Callable[[], None] = lambda: None,
                over: Callable[[], None] = lambda: None) -> bool:
        """The scheduler's ``enqueue_request``, checked and queued with the outbox's next drain.
        Whether ``request`` was queued, if known at once (outside a crawl); in a crawl True, and
        a duplicate found later is dropped as Scrapy does (``dupefilter/filtered``,
        ``request_dropped``). Off-site or unstorable: refused now. ``done`` runs once it is
        queued, dropped or refused (its page may be acked), ``over`` once its check is over."""
        if not self.offsite.allows(request):
            done()
            return False
        once = self.starts_once(request)
        if once:
            request.meta[START_META] = True
        sent = self._check_one(request, once=once)
        if sent is None:
            done()
            return False  # cannot be stored (reported), or the crawl has stopped
        self.enqueuing += 1
        answer: list[bool | None] = []
        asking = True

        def answered(outcomes: list[bool | None]) -> None:
            self.enqueuing -= 1
            (outcome,) = outcomes
            if outcome:
                if once:
                    self._start_seen(request)
                self.df.log(request, self.spider)
            if outcome is not False and not asking and self._signals is not None:
                self._signals.send_catch_log(scrapy_signals.request_dropped,
                                             request=request, spider=self.spider)
            answer.append(outcome)
            done()  # its work goes on in this copy, now queued (or done: a duplicate)
            over()

        def failed(failure: Failure) -> Failure:
            self.enqueuing -= 1
            over()
            return failure

        sent.addCallbacks(answered, failed)
        asking = False
        return answer[0] is False if answer else True

    def starts_once(self, request: Request) -> bool:
        """Whether ``request`` is a start request (``is_start_request``, not a copy already
        checked) to check despite ``dont_filter`` (``BLOOMDUPE_START_ONCE``), so only the
        first worker queues it. Not for a ``RedisSpider``: its start URLs are popped once."""
        return (self.start_once and request.dont_filter
                and bool(request.meta.get(IS_START_META))
                and START_META not in request.meta
                and not isinstance(self.spider, RedisMixin))

    def _start_seen(self, request: Request) -> None:
        if self._start_seen_said:
            return
        self._start_seen_said = True
        logger.info(
            "Start request %s is in the crawl's filter already (another worker queued it, "
            "or this crawl fetched it before it was resumed): not fetched again. Each start "
            "request is fetched once a crawl; BLOOMDUPE_START_ONCE = False fetches them in "
            "every worker, as Scrapy does", request, extra={"spider": self.spider})

    def _check_one(self, request: Request, *, once: bool = False
                   ) -> Deferred[list[bool | None]] | None:
        """``request``'s check-and-queue as a job (None: nothing to send); with another
        dupefilter, ask then push in one job as scrapy-redis does. ``once``: :meth:`starts_once`."""
        if self.bloomdupe is not None:
            prepared = self.prepare([request], once=once)
            return None if prepared is None else self.queue_prepared([None], *prepared)
        if self.storable([request]) == [None]:
            return None

        def job() -> list[bool | None]:
            if (once or not request.dont_filter) and self.df.request_seen(request):
                return [True]
            self.jobs.call(partial(self.queue.push, request))
            return [False]

        def answered(outcomes: list[bool | None]) -> list[bool | None]:
            if outcomes == [False]:
                self.stats.inc_value("scheduler/enqueued/redis")
                self._queued(1)
            return outcomes

        def failed(failure: Failure) -> list[bool | None]:
            logger.error("Could not queue %s: %s", request, failure.getErrorMessage())
            return [None]

        return self.jobs.run(job).addCallbacks(answered, failed)

    def queue_output(self, requests: list[Request]) -> Deferred[list[bool | None]]:
        """Check ``requests`` and queue the new (and ``dont_filter``) ones with the outbox's next
        drain. Gives whether each was seen before (False: queued), or None if not queued:
        unstorable (``bloomdupe/unserializable``, not in the filter) or Redis failed."""
        outcomes: list[bool | None] = [None] * len(requests)
        prepared = self.prepare(requests)
        if prepared is None:
            return defer.succeed(outcomes)
        return self.queue_prepared(outcomes, *prepared)

    def prepare(self, requests: list[Request], *, once: bool = False
                ) -> tuple[list[int], list[int], list[bytes], list[Any], list[Request]] | None:
        """What :meth:`queue_output` sends: indexes checked and pushed past the filter, the
        checked ones' fingerprints and entries (requests on a scrapy-redis queue), the pushed
        requests; None if nothing. ``once``: check ``dont_filter`` ones too."""
        entries = self.storable(requests)
        checked = [i for i, r in enumerate(requests)
                   if entries[i] is not None and (once or not r.dont_filter)]
        unfiltered = [i for i, r in enumerate(requests)
                      if entries[i] is not None and r.dont_filter and not once]
        if not (checked or unfiltered) or self.jobs.failed():
            return None
        fingerprint = self.bloom.fingerprinter.fingerprint
        queued = entries if self.leased else requests
        return (checked, unfiltered, [fingerprint(requests[i]) for i in checked],
                [queued[i] for i in checked], [requests[i] for i in unfiltered])

    def queue_prepared(self, outcomes: list[bool | None], checked: list[int],
                       unfiltered: list[int], fps: list[bytes], checked_entries: list[Any],
                       pushed: list[Request]) -> Deferred[list[bool | None]]:
        def answered(new: list[bool]) -> list[bool | None]:
            for i, is_new in zip(checked, new, strict=True):
                outcomes[i] = not is_new
            for i in unfiltered:
                outcomes[i] = False
            queued = new.count(True) + len(unfiltered)
            if queued:
                self.stats.inc_value("scheduler/enqueued/redis", queued)
                self._queued(queued)
            return outcomes

        def failed(failure: Failure) -> list[bool | None]:
            error = failure.value
            if not isinstance(error, (RedisError, BloomDupeError)):
                failure.raiseException()
            # Not queued: their page stays leased (no ack), so another worker fetches it.
            if isinstance(error, Stopped):
                return outcomes
            health = self.jobs.health
            health.fail(error, len(fps))
            if not health.failed():  # BLOOMDUPE_ON_OUTAGE = "allow": no queue to use
                health.stop(CLOSE_REASON, (
                    "Redis stayed unavailable and the shared queue is in Redis: "
                    f"{len(checked) + len(unfiltered)} new request(s) could not be queued"))
            return outcomes

        sent = self.outbox.send(Output(fps, checked_entries, pushed))
        return sent.addCallbacks(answered, failed)

    def check_and_push(self, fps: list[bytes], entries: list[Any], pushed: list[Request]
                       ) -> list[bool]:
        """The Redis work: check ``fps``, queue the new ``entries`` and ``pushed`` past the
        filter; whether each was new. On a scrapy-redis queue check and push are separate
        calls (a crash between leaves a request in the filter and no queue)."""
        if self.leased:
            new = self.bloom.check_and_queue(fps, self.queue, entries) if fps else []
            if pushed:
                self.jobs.call(lambda: self.queue.push_many(pushed))
            if isinstance(self.queue, LeasedQueue) and self.queue.moves and any(new):
                # Cluster: intake to home shards now (a third of the bytes; else a pop moves it).
                self.jobs.call(self.queue.sort, 0)
            return new
        new = self.bloom.check_and_queue(fps, None, entries) if fps else []
        for request in [e for e, is_new in zip(entries, new, strict=True) if is_new] + pushed:
            self.jobs.call(partial(self.queue.push, request))
        return new

    def storable(self, requests: list[Request]) -> list[Any]:
        """Each request as the queue stores it, or None if unserializable
        (:mod:`.frontier.storable`): logged, counted, and costing no other request."""
        for request in requests:  # a child made with replace() from its parent: not a lease
            request.meta.pop(LEASE_META, None)
        encode = self.queue.sink_entry if self.leased else self.queue._encode_request
        entries, failures = storable.entries(encode, requests)
        for i, error in failures:
            request = requests[i]
            self.stats.inc_value("bloomdupe/unserializable")
            logger.error("Cannot store %s in the shared queue: %s. Dropped this request "
                         "only (counted as bloomdupe/unserializable); %s", request,
                         storable.what_fails(request, self.spider, self.queue.serializer,
                                             error),
                         storable.ADVICE, extra={"spider": self.spider})
        return entries

