"""Crawl-wide counters in Redis: every worker's figures added up, one command away.

Each worker adds the growth of its counters since its last flush to the hash
``K:stats`` (``HINCRBY``, atomic across workers) and writes its own line to the
hash ``K:workers`` (host, pid, when it started and was last seen, its own
totals). The dupefilter flushes every ``BLOOMDUPE_STATS_INTERVAL`` seconds and
at close, and puts the crawl-wide totals it reads back into the worker's Scrapy
stats as ``bloomdupe/crawl/<name>``.
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


class CrawlStats:
    """One worker's share of the crawl-wide counters."""

    def __init__(self, client: Redis | RedisCluster, key: str, worker_id: str | None = None
                 ) -> None:
        self.client = client
        self.key = key
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
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


def clear(client: Redis | RedisCluster, key: str) -> None:
    client.delete(keys.stats(key))
    client.delete(keys.workers(key))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
