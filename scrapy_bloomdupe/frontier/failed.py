"""Requests that failed for good, kept in a Redis stream instead of lost.

A request that failed after RetryMiddleware's retries, or whose response HttpErrorMiddleware
drops, is in the filter already: no later run would fetch it. So it is recorded (URL, method,
reason, serialized request) in the capped stream ``keys.failed(K)`` (``XADD MAXLEN ~``).
``bloomdupe failed`` lists them; ``--requeue`` queues them again, past the filter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import keys, luascript

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

REQUEUE_SCRIPT = luascript.read(__package__, "requeue_failed.lua")


@dataclass(frozen=True)
class FailedRequest:
    """One record: when (the stream id's milliseconds), what and why."""

    id: str
    time: float
    url: str
    method: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "time": self.time, "url": self.url, "method": self.method,
                "reason": self.reason}


def record(client: Redis | RedisCluster, tag: str, *, url: str, method: str, reason: str,
           score: int, request: bytes, limit: int) -> None:
    """Keep one failed request (at most about ``limit`` records in all)."""
    client.xadd(keys.failed(tag), {"url": url, "method": method, "reason": reason,
                                   "score": score, "request": request},
                maxlen=limit, approximate=True)


def record_command(tag: str, *, url: str, method: str, reason: str, score: int,
                   request: bytes, limit: int) -> tuple[Any, ...]:
    """:func:`record` as a command, for a round trip on the queue's link."""
    return ("XADD", keys.failed(tag), "MAXLEN", "~", limit, "*", "url", url, "method", method,
            "reason", reason, "score", score, "request", request)


def read(client: Redis | RedisCluster, tag: str, count: int | None = None
         ) -> list[FailedRequest]:
    """The records, oldest first (at most ``count``)."""
    out = []
    records: Any = client.xrange(keys.failed(tag), count=count)
    for raw_id, fields in records:
        text = {_text(k): v for k, v in fields.items()}
        ident = _text(raw_id)
        out.append(FailedRequest(ident, int(ident.split("-")[0]) / 1000,
                                 _text(text.get("url", b"")), _text(text.get("method", b"")),
                                 _text(text.get("reason", b""))))
    return out


def count(client: Redis | RedisCluster, tag: str) -> int:
    return int(client.xlen(keys.failed(tag)))


def requeue(client: Redis | RedisCluster, tag: str, ids: list[str], batch: int = 500) -> int:
    """Put these records' requests back in the queue, past the filter; delete them."""
    script = client.register_script(REQUEUE_SCRIPT)
    moved = 0
    for start in range(0, len(ids), batch):
        moved += int(script(keys=[keys.failed(tag), keys.queue(tag, 0)],
                            args=ids[start:start + batch]))
    return moved


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
