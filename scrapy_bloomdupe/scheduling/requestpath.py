"""The request path's owner: the crawl's dupefilter, its shared queue and where their
Redis work runs (:class:`~.jobs.RedisJobs`: a job at a time, an outage waited out, a
refusal that stops the crawl), held together by one object that the scheduler makes
when it opens (:attr:`scrapy_bloomdupe.scheduler.Scheduler.path`).

What reaches Redis during a crawl goes through it, as jobs: a callback's output (the
batch middleware's :meth:`RequestPath.queue_output`), a request given to
``enqueue_request`` (:meth:`RequestPath.enqueue`), and, in one script, the check
against the filter and the queueing of the new requests
(:meth:`RequestPath.check_and_push`). Callbacks' outputs go together (:class:`Outbox`):
each waits there, and one job, asked :data:`GATHER_DELAY` after the first output
waiting, checks and queues them all in one round trip (one script call a node with the
Lua engine, else a shard; one round trip a master), instead of one job and one round
trip each. Handing requests out and the acks are the leases' (:mod:`.leases`), idleness
the crawl's end's (:mod:`.ending`).
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

#: ``request.meta`` key of a request this scheduler handed to Scrapy: its lease. A copy of
#: it (a redirect, a retry, an errback's) carries it too, and continues its work.
LEASE_META = "_bloomdupe_lease"
#: ``request.meta`` key of a request the batch middleware has already queued.
QUEUED_META = "_bloomdupe_queued"
#: ``request.meta`` key of a start request checked against the crawl's filter
#: (``BLOOMDUPE_START_ONCE``): its copies (a retry, a redirect) carry it, and go past the
#: filter as their ``dont_filter`` says.
START_META = "_bloomdupe_start"
#: Scrapy's ``request.meta`` key of a start request (its ``StartSpiderMiddleware``).
IS_START_META = "is_start_request"


class BloomDupe(Protocol):
    """This package's dupefilter, as the scheduler's parts use it: the scheduler tells
    it from another dupefilter and hands it over (nothing here imports it)."""

    bloom: BloomFilter
    fingerprinter: RequestFingerprinterProtocol

    def check_and_queue(self, fingerprints: list[bytes], queue: Any,
                        entries: list[Any]) -> list[bool]: ...

    def flush_crawl_stats_due(self) -> None: ...

    def log(self, request: Request, spider: Any) -> None: ...


#: How long a callback's output waits for others' to go to Redis with it (s): callbacks
#: end in bursts, and one check-and-queue for a burst costs Redis a script call a master
#: (Lua engine; a shard otherwise) and a round trip a master, not as many as the
#: callbacks. In the demo crawl 0.02 s gathers about 5 callbacks' outputs, where 1.5 went
#: together before (Redis CPU a page: docs/benchmarks.md, section h); a page's lease and
#: its links wait that much longer.
GATHER_DELAY = 0.02

#: What a drain gives back: the outputs it took, and whether each checked item was new
#: (all outputs' items in order), or the error the check met.
Drained = tuple[list["Output"], list[bool] | Exception]


@dataclass
class Output:
    """One callback's output (or one request given to ``enqueue_request``) waiting in
    the outbox: the fingerprints to check, what to queue for each new one, the
    ``dont_filter`` requests to queue past the filter, and the Deferred that gets
    whether each fingerprint was new."""

    fingerprints: list[bytes]
    entries: list[Any]
    pushed: list[Request]
    answer: Deferred[list[bool]] = field(default_factory=Deferred)


class Outbox:
    """The outputs waiting for the runner. ``run`` runs a job there (see
    :meth:`.jobs.RedisJobs.run`); ``check_and_push(fps, entries, pushed)`` is the Redis
    work for everything gathered, and returns whether each fingerprint was new.
    ``later`` asks for a delayed call (Scrapy's ``call_later``; the runner's, which runs
    it at once outside a crawl; a test's own)."""

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
        """The outputs gathering go now (the crawl closes)."""
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
    """The crawl's dupefilter (``df``; ``bloomdupe`` too when it is this package's),
    shared queue (``queue``) and Redis work (``jobs``), owned by the scheduler.
    ``queued`` is called with how many each time requests were queued (the scheduler's
    work count); ``signals`` are the crawler's (a request dropped after the engine heard
    it was scheduled is sent with ``request_dropped``). ``start_once``
    (``BLOOMDUPE_START_ONCE``): a start request goes through the crawl's filter,
    ``dont_filter`` or not, so that it is fetched once a crawl (see :meth:`starts_once`)."""

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
        """The dupefilter, where only this package's can be: a callback's output and a
        request's check-and-queue come this way only with it (the batch middleware and
        :meth:`enqueue` ask first)."""
        assert self.bloomdupe is not None, self.df
        return self.bloomdupe

    @property
    def leased(self) -> bool:
        """Whether the queue is the leased one (scrapy-redis's own queues are not)."""
        return isinstance(self.queue, PriorityQueue)

    def enqueue(self, request: Request, *, done: Callable[[], None] = lambda: None,
                over: Callable[[], None] = lambda: None) -> bool:
        """The scheduler's ``enqueue_request``: the check-and-queue is a job (with the
        outbox's next drain). Whether ``request`` was queued, when the answer is in at
        once (outside a crawl: not queued when seen before, logged as Scrapy's dupefilter
        logs, or not stored); during a crawl True at once, and one found seen before (or
        not queued: the crawl stops) is then dropped as Scrapy drops it: counted in
        ``dupefilter/filtered`` and sent with ``request_dropped``. A request that cannot
        be stored is refused here and now. ``done`` runs once the request is queued,
        dropped or refused (the page it came from may be acked), ``over`` once its check
        is over (answered or failed). An off-site request is dropped first (as Scrapy's
        ``OffsiteMiddleware`` drops it, counted in ``offsite/filtered``)."""
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
        """Whether ``request`` is a start request to check against the crawl's filter
        though ``dont_filter`` (``BLOOMDUPE_START_ONCE``): one that Scrapy's
        ``StartSpiderMiddleware`` marked (``is_start_request``), not a copy of one already
        checked (a retry, a redirect). The first worker to check it queues it; every
        other, and a worker that joins later or resumes the crawl, finds it seen; a link
        back to it is a duplicate. A ``RedisSpider``'s start URLs come from a Redis list
        that each worker pops, once each already: they go as scrapy-redis sends them."""
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
        """``request``'s check-and-queue as a job (None: nothing to send). With a
        dupefilter of the user's (scrapy-redis's, Scrapy's own) the filter is asked,
        then the request pushed, in one job, as scrapy-redis does. ``once``: a start
        request, checked though ``dont_filter`` (:meth:`starts_once`)."""
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
        """Check ``requests`` against the Bloom dupefilter and queue the new ones (and
        ``dont_filter`` ones past the filter), a job with the outbox's next drain: its
        answer fires back on Scrapy's reactor, which never waits for Redis meanwhile.
        Gives, in order, whether each was seen before (False: queued), or None for one
        not queued: it cannot be stored in the queue (reported, counted as
        ``bloomdupe/unserializable``, never added to the filter), or Redis failed (the
        crawl stops)."""
        outcomes: list[bool | None] = [None] * len(requests)
        prepared = self.prepare(requests)
        if prepared is None:
            return defer.succeed(outcomes)
        return self.queue_prepared(outcomes, *prepared)

    def prepare(self, requests: list[Request], *, once: bool = False
                ) -> tuple[list[int], list[int], list[bytes], list[Any], list[Request]] | None:
        """What :meth:`queue_output` sends for ``requests``: the indexes of those checked
        and of those queued past the filter, the fingerprints and entries of the
        checked ones (on a scrapy-redis queue, the requests: its push encodes them), the
        requests pushed; None when there is nothing to send. ``once``: ``dont_filter``
        requests are checked too (start requests, see :meth:`starts_once`)."""
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
            # Not queued. The page that made them stays leased (no ack from now on), so
            # it is fetched again by the next workers.
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
        """Where the Redis work runs: check ``fps`` and queue the new ones' ``entries``,
        and queue ``pushed`` (``dont_filter``) past the filter; whether each was new.
        On a scrapy-redis queue the check and each push are separate calls, as in
        scrapy-redis (a crash between them leaves a request in the filter and in no
        queue)."""
        if self.leased:
            new = self.bloom.check_and_queue(fps, self.queue, entries) if fps else []
            if pushed:
                self.jobs.call(lambda: self.queue.push_many(pushed))
            if isinstance(self.queue, LeasedQueue) and self.queue.moves and any(new):
                # A cluster's intake into the slots' home shards now: a request waits
                # there at a third of the intake's bytes (else the next pop moves it).
                self.jobs.call(self.queue.sort, 0)
            return new
        new = self.bloom.check_and_queue(fps, None, entries) if fps else []
        for request in [e for e, is_new in zip(entries, new, strict=True) if is_new] + pushed:
            self.jobs.call(partial(self.queue.push, request))
        return new

    def storable(self, requests: list[Request]) -> list[Any]:
        """Each request as the queue stores it, or None for one that cannot be serialized
        (see :mod:`.frontier.storable`): that one gets one ERROR and is counted as
        ``bloomdupe/unserializable``; it costs no other request."""
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

