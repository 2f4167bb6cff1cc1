"""Per-shard locks: ``SET <lock> <token> NX PX <ttl>``, released by token, bounded waits.

The filter pipelines the ``SET ... NX PX`` with its fenced write (a script that first checks
the token), so an uncontended lock costs no extra round trip. Here: tokens, the
compare-and-delete release, and the bounded wait (``BLOOMDUPE_LOCK_WAIT``) with its counters;
during a crawl a pause holds up one of the scheduler's Redis jobs, not Scrapy's reactor.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import luascript
from ..transport.onloop import pause

if TYPE_CHECKING:
    from ..transport.link import Link

#: First pause when a lock is busy, and the most any one pause lasts (seconds).
FIRST_PAUSE = 0.0005
MAX_PAUSE = 0.02


@dataclass
class LockCounters:
    acquired: int = 0
    waits: int = 0
    wait_time: float = 0.0
    timeouts: int = 0
    lost: int = 0


class ShardLocks:
    """Tokens, release and waiting for the shard locks of one filter."""

    RELEASE_SCRIPT = luascript.read(__package__, "release_lock.lua")

    def __init__(
        self,
        link: Link,
        ttl: float,
        wait: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = pause,
        counters: LockCounters | None = None,
    ) -> None:
        #: Carries the lock's commands (the filter's link).
        self.link = link
        self.ttl_ms = max(1, round(ttl * 1000))
        self.wait = wait
        self.counters = counters if counters is not None else LockCounters()
        self._clock = clock
        self._sleep = sleep
        (self._release,) = link.knows(self.RELEASE_SCRIPT)  # its SHA1, loaded when missing

    @staticmethod
    def new_token() -> bytes:
        return os.urandom(12).hex().encode()

    def release(self, name: str, token: bytes) -> bool:
        """Delete the lock only if it still holds ``token``."""
        return bool(self.link.call("EVALSHA", self._release, 1, name, token))

    def pauses(self) -> Iterator[float]:
        """Yield after each pause while the wait budget lasts, counting the waiting; the caller
        retries once per value. When the budget is spent it ends and a timeout is counted."""
        deadline = self._clock() + self.wait
        pause = FIRST_PAUSE
        while True:
            left = deadline - self._clock()
            if left <= 0:
                self.counters.timeouts += 1
                return
            step = min(pause, left)
            started = self._clock()
            self._sleep(step)
            self.counters.waits += 1
            self.counters.wait_time += self._clock() - started
            pause = min(pause * 2, MAX_PAUSE)
            yield step
