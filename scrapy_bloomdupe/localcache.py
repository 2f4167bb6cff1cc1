"""Fingerprints this worker knows are in the filter: answered "seen" without Redis.

A Bloom filter only gains items, so once Redis answered for one, every later check is "seen"
and repeated links cost no round trip (a filter cleared while workers run is missed until
they restart). ``BLOOMDUPE_LOCAL_CACHE`` bounds it (0: off). Two sets keep hot items: the
younger fills to half the size, then replaces the older; a hit in the older moves it back.
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
    """A :class:`LocalCache` for a recrawl window: each item is "seen" until its deadline
    (``clock()``'s time), then Redis is asked again (the window may have let it go)."""

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
