"""Crawl-wide counters in Redis: every worker's figures added up, one command away.

Each worker adds its counters' growth since its last flush to hash ``K:stats`` (``HINCRBY``,
atomic across workers) and writes its own line (host, pid, times, totals) to ``K:workers``;
the dupefilter flushes every ``BLOOMDUPE_STATS_INTERVAL`` s and at close, and puts the totals in
Scrapy stats as ``bloomdupe/crawl/<name>``. ``WorkerMetrics`` writes live figures (expiring
``K:live:<worker>``, indexed in ``K:live``; :func:`write_live`, :func:`read_live`).

A flush a failover loses (written to the old master) would lose its deltas for good, so after
the master changed a worker reads its own line back from the new one (written after its
counters, so it holds what reached it) and adds what is missing.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoPermissionError

from . import keys
from .transport.link import Link, link_to
from .transport.sentinel import master_epoch

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

logger = logging.getLogger(__name__)

#: The counters added up across workers.
COUNTERS = ("checked", "new", "duplicates", "local_hits", "lock_acquired", "lock_waits",
            "lock_timeouts", "lock_lost", "redis_errors")
#: What :func:`write_live` adds to: pages fetched, leases put back, requests failed for good.
LIVE_COUNTERS = ("pages", "requeued", "failed")
#: A silent (killed) worker's ``K:live`` entry is dropped this many line TTLs after its last write.
PRUNE_AFTER_TTLS = 10


def this_worker() -> str:
    """This worker, as the crawl stats name it: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


class CrawlStats:
    """One worker's share of the crawl-wide counters."""

    def __init__(self, client: Redis | RedisCluster | Link, key: str,
                 worker_id: str | None = None) -> None:
        #: A crawl's link (the filter's: it carries the crawl's commands), or a client.
        self.client = client
        self.key = key
        self.worker_id = worker_id or this_worker()
        self.started = time.time()
        self._flushed: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._failovers = Failovers()

    def flush(self, counters: dict[str, int], closed: str | None = None) -> dict[str, int]:
        """Add what grew since the last flush the master holds; return the crawl-wide totals."""
        line = {"host": socket.gethostname(), "pid": os.getpid(), "started": self.started,
                "last_seen": time.time(), "closed": closed,
                **{name: counters.get(name, 0) for name in COUNTERS}}
        failover = self._failovers.since_last(self.client)
        with link_to(self.client) as link:
            if failover:
                recorded = {**dict.fromkeys(COUNTERS, 0), **_counters(
                    link.call("HGET", keys.workers(self.key), self.worker_id), COUNTERS)}
                if recorded != self._flushed:
                    logger.info("Crawl stats: the new Redis master lacks this worker's last "
                                "flush (%s new of %s); adding it again",
                                self._flushed["new"] - recorded["new"], self._flushed["new"])
                self._flushed = recorded
            deltas = {name: counters.get(name, 0) - self._flushed[name] for name in COUNTERS}
            replies = link.calls([
                *(("HINCRBY", keys.stats(self.key), name, deltas[name]) for name in COUNTERS),
                ("HSET", keys.workers(self.key), self.worker_id, json.dumps(line))])
        self._flushed = {name: counters.get(name, 0) for name in COUNTERS}
        return {name: int(total) for name, total in zip(COUNTERS, replies, strict=False)}


class Failovers:
    """Whether the master changed (Sentinel failover) since the last look (see the module)."""

    def __init__(self) -> None:
        #: The master's epoch at the last look; None before the first.
        self._epoch: int | None = None

    def since_last(self, client: Redis | RedisCluster | Link) -> bool:
        epoch = master_epoch(client.client if isinstance(client, Link) else client)
        changed = self._epoch is not None and epoch != self._epoch
        self._epoch = epoch
        return changed


def _counters(found: Any, names: tuple[str, ...]) -> dict[str, int]:
    """The counters ``names`` in a worker's JSON line ``found`` (None: no line)."""
    line = json.loads(found) if found else {}
    return {name: int(line[name]) for name in names if name in line}


def read(client: Redis | RedisCluster, key: str) -> dict[str, Any]:
    """Crawl-wide totals and hit rate, and each worker's line (for tools)."""
    totals: dict[str, float] = dict.fromkeys(COUNTERS, 0)
    for name, value in client.hgetall(keys.stats(key)).items():
        totals[_text(name)] = int(value)
    totals["hit_rate"] = totals["duplicates"] / totals["checked"] if totals["checked"] else 0.0
    workers = {_text(worker): json.loads(line)
               for worker, line in client.hgetall(keys.workers(key)).items()}
    return {"totals": totals, "workers": workers}


def write_live(client: Redis | RedisCluster | Link, key: str, worker: str,
               figures: dict[str, Any], deltas: dict[str, int], ttl: float, *,
               prune: bool = False) -> tuple[list[str], Exception | None]:
    """One pipelined write: ``worker``'s figures (JSON, expiring after ``ttl`` s), its index
    entry, and its :data:`LIVE_COUNTERS` ``deltas``; with ``prune``, also drop entries silent
    for :data:`PRUNE_AFTER_TTLS` TTLs. Uses only the crawl ACL's commands (docs/security.md).
    Returns the counters added and the first error (the rest is still written), so a counter
    is added once whatever else failed."""
    now = time.time()
    index = keys.live(key)
    names = [name for name, delta in deltas.items() if delta]
    commands: list[tuple[Any, ...]] = [
        *(("HINCRBY", keys.stats(key), name, deltas[name]) for name in names),
        ("SET", keys.live_worker(key, worker), json.dumps({**figures, "time": now}),
         "PX", max(1, round(ttl * 1000))),
        ("ZADD", index, now, worker)]
    if prune:
        commands.append(("ZRANGEBYSCORE", index, "-inf", now - PRUNE_AFTER_TTLS * ttl))
    with link_to(client) as link:
        replies = link.execute(commands)
        errors = [r for r in replies if isinstance(r, Exception)]
        if prune and not errors and replies[-1]:
            link.call("ZREM", index, *replies[-1])
    added = [n for n, reply in zip(names, replies, strict=False)
             if not isinstance(reply, Exception)]
    return added, errors[0] if errors else None


def recorded_live(client: Redis | RedisCluster | Link, key: str, worker: str
                  ) -> dict[str, int]:
    """``worker``'s :data:`LIVE_COUNTERS` in its line on this master (none if expired)."""
    with link_to(client) as link:
        return _counters(link.call("GET", keys.live_worker(key, worker)), LIVE_COUNTERS)


def forget_live(client: Redis | RedisCluster | Link, key: str, worker: str) -> None:
    """``worker`` stops: its line and its entry go."""
    with link_to(client) as link:
        link.calls([("DEL", keys.live_worker(key, worker)), ("ZREM", keys.live(key), worker)])


def live_workers(client: Redis | RedisCluster, key: str) -> list[str]:
    """The workers in the index of running workers (some may have stopped since)."""
    found: list[Any] = client.zrange(keys.live(key), 0, -1)
    return [_text(w) for w in found]


def read_live(client: Redis | RedisCluster, key: str) -> dict[str, dict[str, Any]]:
    """Each running worker's figures (expired lines left out). Two round trips."""
    workers = live_workers(client, key)
    if not workers:
        return {}
    pipe = client.pipeline(transaction=False)
    for worker in workers:
        pipe.get(keys.live_worker(key, worker))
    lines: list[Any] = pipe.execute()
    return {worker: json.loads(line) for worker, line in zip(workers, lines, strict=True)
            if line is not None}


def summary(target: Redis | RedisCluster | Link, key: str, ttl: float) -> str:
    """The line the last worker logs as it deletes a finished crawl (``SCHEDULER_PERSIST``
    off): counters, failed requests, and what is kept for ``ttl`` s. One round trip."""
    with link_to(target) as link:
        found = link.call("HGETALL", keys.stats(key))
        if isinstance(found, dict):
            found = [x for kv in found.items() for x in kv]
        totals = {_text(name): int(value) for name, value in zip(found[::2], found[1::2],
                                                                  strict=True)}
        # WorkerMetrics' count, else the records kept (XLEN, if the ACL grants it).
        failed: Any = totals.get("failed")
        if failed is None:
            try:
                failed = link.call("XLEN", keys.failed(key))
            except NoPermissionError:
                failed = "?"
    pages = f"{totals['pages']:,}" if "pages" in totals else "?"
    failed = f"{int(failed):,}" if failed != "?" else failed
    kept = (f"its report, the failed requests (`bloomdupe failed`) and these counters "
            f"(`bloomdupe stats`), is kept for {_duration(ttl)} (BLOOMDUPE_REPORT_TTL)"
            if ttl else "its report is deleted too (BLOOMDUPE_REPORT_TTL = 0)")
    return (f"The crawl {key} is over, over all its workers: {pages} pages, "
            f"{totals.get('new', 0):,} new, {totals.get('duplicates', 0):,} duplicates, "
            f"{failed} failed. SCHEDULER_PERSIST is off: its filter and queue are "
            f"deleted; {kept}")


def _duration(seconds: float) -> str:
    for unit, size in (("day", 86_400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n > 1 else ''}"
    return f"{seconds:g} s"


def clear(client: Redis | RedisCluster, key: str) -> None:
    client.delete(keys.stats(key))
    client.delete(keys.workers(key))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
