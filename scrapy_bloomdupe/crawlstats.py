"""Crawl-wide counters in Redis: every worker's figures added up, one command away.

Each worker adds the growth of its counters since its last flush to the hash
``K:stats`` (``HINCRBY``, atomic across workers) and writes its own line to the
hash ``K:workers`` (host, pid, when it started and was last seen, its own
totals). The dupefilter flushes every ``BLOOMDUPE_STATS_INTERVAL`` seconds and
at close, and puts the crawl-wide totals it reads back into the worker's Scrapy
stats as ``bloomdupe/crawl/<name>``.

While it runs, a worker also writes its own figures (pages, pages a second,
requests in flight, ...) to the hash ``K:live:<worker>``, which expires a few
write intervals after its last write, and lists itself in the sorted set
``K:live``; with them it adds its pages, leases put back and failed requests
to ``K:stats`` (:func:`write_live`; the ``WorkerMetrics`` extension does it).
``bloomdupe top`` and ``bloomdupe metrics`` read them (:func:`read_live`).
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from . import keys

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

#: The counters added up across workers.
COUNTERS = ("checked", "new", "duplicates", "local_hits", "lock_acquired", "lock_waits",
            "lock_timeouts", "lock_lost", "redis_errors")
#: The crawl-wide counters :func:`write_live` adds to (beside :data:`COUNTERS`): pages
#: fetched (responses received), leases put back in the queue, requests failed for good.
LIVE_COUNTERS = ("pages", "requeued", "failed")
#: A worker's entry in ``K:live`` is dropped this many times its line's TTL after its
#: last write (a worker killed without a word); its line itself expired long before.
PRUNE_AFTER_TTLS = 10


def this_worker() -> str:
    """This worker, as the crawl stats name it: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


class CrawlStats:
    """One worker's share of the crawl-wide counters."""

    def __init__(self, client: Redis | RedisCluster, key: str, worker_id: str | None = None
                 ) -> None:
        self.client = client
        self.key = key
        self.worker_id = worker_id or this_worker()
        self.started = time.time()
        self._flushed: dict[str, int] = dict.fromkeys(COUNTERS, 0)

    def flush(self, counters: dict[str, int], closed: str | None = None) -> dict[str, int]:
        """Add what grew since the last flush; return the crawl-wide totals."""
        deltas = {name: counters.get(name, 0) - self._flushed[name] for name in COUNTERS}
        line = {"host": socket.gethostname(), "pid": os.getpid(), "started": self.started,
                "last_seen": time.time(), "closed": closed,
                **{name: counters.get(name, 0) for name in COUNTERS}}
        pipe = self.client.pipeline(transaction=False)
        for name in COUNTERS:
            pipe.hincrby(keys.stats(self.key), name, deltas[name])
        pipe.hset(keys.workers(self.key), self.worker_id, json.dumps(line))
        replies = pipe.execute()
        self._flushed = {name: counters.get(name, 0) for name in COUNTERS}
        return {name: int(total) for name, total in zip(COUNTERS, replies, strict=False)}


def read(client: Redis | RedisCluster, key: str) -> dict[str, Any]:
    """Crawl-wide totals and hit rate, and each worker's line (for tools)."""
    totals: dict[str, float] = dict.fromkeys(COUNTERS, 0)
    for name, value in client.hgetall(keys.stats(key)).items():
        totals[_text(name)] = int(value)
    totals["hit_rate"] = totals["duplicates"] / totals["checked"] if totals["checked"] else 0.0
    workers = {_text(worker): json.loads(line)
               for worker, line in client.hgetall(keys.workers(key)).items()}
    return {"totals": totals, "workers": workers}


def write_live(client: Redis | RedisCluster, key: str, worker: str,
               figures: dict[str, float | str], deltas: dict[str, int], ttl: float) -> None:
    """One pipelined write: ``worker``'s figures (expiring after ``ttl`` seconds), its
    entry in the index of running workers, and the growth of its
    :data:`LIVE_COUNTERS` (``deltas``) added to the crawl-wide ones."""
    now = time.time()
    ttl_ms = max(1, round(ttl * 1000))
    line, index = keys.live_worker(key, worker), keys.live(key)
    pipe = client.pipeline(transaction=False)
    for name, delta in deltas.items():
        if delta:
            pipe.hincrby(keys.stats(key), name, delta)
    mapping: dict[Any, Any] = {**figures, "time": now}
    pipe.hset(line, mapping=mapping)
    pipe.pexpire(line, ttl_ms)
    pipe.zadd(index, {worker: now})
    pipe.zremrangebyscore(index, "-inf", now - PRUNE_AFTER_TTLS * ttl)
    pipe.pexpire(index, PRUNE_AFTER_TTLS * ttl_ms)
    pipe.execute()


def forget_live(client: Redis | RedisCluster, key: str, worker: str) -> None:
    """``worker`` stops: its line and its entry go."""
    pipe = client.pipeline(transaction=False)
    pipe.delete(keys.live_worker(key, worker))
    pipe.zrem(keys.live(key), worker)
    pipe.execute()


def live_workers(client: Redis | RedisCluster, key: str) -> list[str]:
    """The workers in the index of running workers (some may have stopped since)."""
    found: list[Any] = client.zrange(keys.live(key), 0, -1)
    return [_text(w) for w in found]


def read_live(client: Redis | RedisCluster, key: str) -> dict[str, dict[str, str]]:
    """Each running worker's figures (as written: text), by worker; workers whose
    line has expired are left out. Two round trips."""
    workers = live_workers(client, key)
    if not workers:
        return {}
    pipe = client.pipeline(transaction=False)
    for worker in workers:
        pipe.hgetall(keys.live_worker(key, worker))
    lines: list[dict[Any, Any]] = pipe.execute()
    return {worker: {_text(k): _text(v) for k, v in line.items()}
            for worker, line in zip(workers, lines, strict=True) if line}


def clear(client: Redis | RedisCluster, key: str) -> None:
    client.delete(keys.stats(key))
    client.delete(keys.workers(key))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
