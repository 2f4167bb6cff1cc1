"""How callbacks' outputs go to Redis together: each waits in the outbox, and one Redis
job, asked :data:`GATHER_DELAY` after the first output waiting, checks and queues them
all in one round trip (one script call a node with the Lua engine, else a shard; one
round trip a master), instead of
one job and one round trip each."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import CallLaterResult, call_later
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

if TYPE_CHECKING:
    from scrapy.http import Request

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
