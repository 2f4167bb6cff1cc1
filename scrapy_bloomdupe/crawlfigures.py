"""A running crawl's figures, read from Redis at once, for ``bloomdupe metrics`` (Prometheus)
and ``bloomdupe top``. Read-only, no ``KEYS`` or ``SCAN``: crawl-wide counters, the filter's
fill (O(filter size), so at most every ``filter_every`` s), queue and failed counts, live
workers (heartbeat within the lease timeout, Redis's clock), the busiest download slots
(:func:`~.frontier.busiest.busiest_slots`) and each worker's own figures.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoPermissionError

from . import crawlstats, keys, sizing
from .bloom import meta
from .bloom.filter import BloomFilter
from .exceptions import BloomDupeError
from .frontier.busiest import BUSIEST, BusySlots, busiest_slots
from .frontier.queue import LEASE_TIMEOUT, status

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

logger = logging.getLogger(__name__)

#: Seconds between two reads of the filter's fill (a scan of every shard).
FILTER_EVERY = 10.0


@dataclass(frozen=True)
class FilterFigures:
    fill_ratio: float
    estimated_false_positive_rate: float
    #: ``BLOOMDUPE_ERROR_RATE`` as the filter was made with it.
    configured_error_rate: float
    estimated_items: float
    #: Items the filter's generations hold at that rate, in all.
    capacity: int
    memory_bytes: int
    generations: int


@dataclass(frozen=True)
class WorkerFigures:
    """One running worker's own figures, as it last wrote them."""

    id: str
    host: str
    pid: str
    spider: str
    started: float
    #: Seconds since its last write (by this machine's clock and the worker's).
    age: float
    pages: int
    pages_per_second: float
    items: int
    in_flight: int
    requeued: int
    failed: int
    checked: int
    duplicates: int
    #: Responses by HTTP status.
    responses: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CrawlFigures:
    key: str
    #: Crawl-wide counters (``crawlstats.COUNTERS`` and ``crawlstats.LIVE_COUNTERS``).
    totals: dict[str, int]
    #: None when there is no filter at the key.
    filter: FilterFigures | None
    waiting: int
    leased: int
    #: Failed requests kept in Redis (``bloomdupe failed``).
    failed_kept: int
    #: Workers that heartbeat within the lease timeout.
    workers_alive: int
    workers: list[WorkerFigures]
    #: Why the filter's figures are missing though its metadata is there.
    problem: str | None = None
    #: The busiest download slots; None when the crawl keeps none (politeness "worker").
    slots: BusySlots | None = None

    @property
    def pages_per_second(self) -> float:
        return sum(w.pages_per_second for w in self.workers)


class CrawlReader:
    """Reads the figures of the crawl at ``key``: the fill at most every ``filter_every``
    seconds (else the last read), and its ``slots`` busiest download slots."""

    def __init__(self, client: Redis | RedisCluster, key: str, *,
                 lease_timeout: float = LEASE_TIMEOUT, filter_every: float = FILTER_EVERY,
                 clock: Callable[[], float] = time.monotonic, slots: int = BUSIEST) -> None:
        self.client = client
        self.key = key
        self.slots = slots
        self.lease_timeout = lease_timeout
        self.filter_every = filter_every
        self.clock = clock
        self._filter: FilterFigures | None = None
        self._filter_read = -math.inf
        self._slots_denied = False

    def read(self) -> CrawlFigures:
        key, client = self.key, self.client
        pipe = client.pipeline(transaction=False)
        pipe.hgetall(keys.stats(key))
        pipe.hgetall(keys.meta(key))
        pipe.xlen(keys.failed(key))
        pipe.zrange(keys.owners(key, 0), 0, -1, withscores=True)
        raw_totals, raw_meta, failed_kept, owners = pipe.execute()
        now: Any = client.time()
        if isinstance(now, dict):  # a cluster client may ask every node: any will do
            now = next(iter(now.values()))
        seconds, micros = now
        since_ms = (seconds * 1000 + micros / 1000) - self.lease_timeout * 1000
        totals = dict.fromkeys((*crawlstats.COUNTERS, *crawlstats.LIVE_COUNTERS), 0)
        totals.update({_text(k): int(v) for k, v in raw_totals.items()})
        problem = None
        shards = 0
        if raw_meta:
            try:
                shards = int(meta.decode(raw_meta).get("shards", 0))
                self._read_filter()
            except (BloomDupeError, ValueError, KeyError, ArithmeticError) as e:
                problem = f"{type(e).__name__}: {e}"
                self._filter = None
        else:
            self._filter, self._filter_read = None, -math.inf
        waiting, leased = status(client, key, shards) if shards else (0, 0)
        slots = self._read_slots(max(shards, 1))
        now = time.time()
        workers = [_worker(wid, line, now)
                   for wid, line in crawlstats.read_live(client, key).items()]
        workers.sort(key=lambda w: (w.started, w.id))
        return CrawlFigures(
            key, totals, self._filter, int(waiting), int(leased), int(failed_kept),
            sum(1 for _, score in owners if score >= since_ms), workers, problem, slots)

    def _read_slots(self, shards: int) -> BusySlots | None:
        try:
            return busiest_slots(self.client, self.key, self.slots, shards)
        except NoPermissionError as e:  # an ACL user without +hmget +llen: the rest is read
            if not self._slots_denied:
                self._slots_denied = True
                logger.warning("Cannot read the busiest download slots of %r: %s (they need "
                               "+hmget +llen, docs/cli.md)", self.key, e)
            return None

    def _read_filter(self) -> None:
        if self._filter is not None and self.clock() - self._filter_read < self.filter_every:
            return
        bloom = BloomFilter.open(self.client, self.key, None, read_only=True)
        try:
            info = bloom.info()
        finally:
            bloom.close()
        self._filter = FilterFigures(
            info.fill_ratio, info.estimated_false_positive_rate,
            sizing.configured_error_rate(info.sizing.error_rate, info.growth),
            info.estimated_items, info.capacity, info.memory_bytes, len(info.generations))
        self._filter_read = self.clock()


def _worker(wid: str, line: dict[str, Any], now: float) -> WorkerFigures:
    def number(name: str) -> float:
        try:
            return float(line.get(name) or 0)
        except (TypeError, ValueError):
            return 0.0

    responses = line.get("responses")
    return WorkerFigures(
        wid, str(line.get("host", "?")), str(line.get("pid", "?")), str(line.get("spider", "")),
        number("started"), max(0.0, now - number("time")), int(number("pages")),
        number("pages_per_second"), int(number("items")), int(number("in_flight")),
        int(number("requeued")), int(number("failed")), int(number("checked")),
        int(number("duplicates")),
        {str(k): int(v) for k, v in responses.items()} if isinstance(responses, dict) else {})


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
