"""Fingerprints this worker knows are in the filter: answered "seen" without Redis.

A Bloom filter only ever gains items, so once Redis has answered for an item
(new, now added; or seen) every later check of it will answer "seen". A crawl
meets the same links again and again (menus, pagination, "related" blocks), and
most of those repeats come back to the worker that met them first: each of them
saves a round trip. ``BLOOMDUPE_LOCAL_CACHE`` bounds the entries (about 100
bytes each for Scrapy's 20-byte fingerprints, measured with tracemalloc); 0
turns the cache off.

Bounded in the simplest way that keeps hot items: two sets, the younger filled
until it holds half the size, then it becomes the older and the older is
dropped. A hit in the older set moves the item to the younger.

What it changes: nothing in what is answered (the filter in Redis would give
the same answer), only where. A filter cleared in Redis while workers run
(``bloomdupe clear``, a worker with ``SCHEDULER_FLUSH_ON_START``) is not seen
by the caches of the others until they restart: that was never safe anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


class LocalCache:
    """At most ``size`` items (0: off), with lookups answered from memory."""

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError("a cache size is 0 or more")
        self.size = size
        self._half = max(1, size // 2)
        self._young: set[bytes] = set()
        self._old: set[bytes] = set()

    def __len__(self) -> int:
        return len(self._young) + len(self._old - self._young)

    def __contains__(self, item: bytes) -> bool:
        if item in self._young:
            return True
        if item in self._old:
            self._remember(item)
            return True
        return False

    def update(self, items: Iterable[bytes]) -> None:
        if self.size:
            for item in items:
                self._remember(item)

    def _remember(self, item: bytes) -> None:
        young = self._young
        young.add(item)
        if len(young) >= self._half:
            self._old, self._young = young, set()

    def clear(self) -> None:
        self._young = set()
        self._old = set()


class TimedCache:
    """A :class:`LocalCache` for a filter with a recrawl window: each item carries until
    when (``clock()``'s time) it may be answered "seen"; past that, the window may have
    let it go, and Redis is asked again. Same bounds and halves as :class:`LocalCache`."""

    def __init__(self, size: int, clock: Callable[[], float]) -> None:
        if size < 0:
            raise ValueError("a cache size is 0 or more")
        self.size = size
        self._half = max(1, size // 2)
        self._clock = clock
        self._young: dict[bytes, float] = {}
        self._old: dict[bytes, float] = {}

    def __len__(self) -> int:
        return len(self._young) + len(self._old.keys() - self._young.keys())

    def __contains__(self, item: bytes) -> bool:
        deadline = self._young.get(item)
        if deadline is None:
            deadline = self._old.get(item)
            if deadline is None:
                return False
            self.put(item, deadline)
        if deadline > self._clock():
            return True
        self._young.pop(item, None)
        self._old.pop(item, None)
        return False

    def put(self, item: bytes, deadline: float) -> None:
        if not self.size:
            return
        young = self._young
        young[item] = deadline
        if len(young) >= self._half:
            self._old, self._young = young, {}

    def clear(self) -> None:
        self._young = {}
        self._old = {}
