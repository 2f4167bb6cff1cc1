"""A crawl moving over from scrapy-redis: its queue's requests (a sorted set, or FIFO/LIFO
lists) taken over by the leased queue past the filter, which accepted them already. Every
command goes through the queue's link (a job on the scheduler's runner)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoPermissionError

if TYPE_CHECKING:
    from ..transport.link import Link


def take_over(link: Link, legacy: str, queue: Callable[[list[tuple[int, Any]]], None],
              batch: int = 500) -> int:
    """Move what waits at ``legacy`` in batches, each given to ``queue`` as (score, member)
    pairs before it is removed (a crash repeats requests, never loses them). Returns how many
    moved (0 when the ACL denies that key)."""
    try:
        kind = link.call("TYPE", legacy)
    except NoPermissionError:  # a least-privilege user of a crawl that never had one
        return 0
    kind = kind.decode() if isinstance(kind, bytes) else str(kind)
    moved = 0
    while kind in ("zset", "list"):
        if kind == "zset":
            items = link.call("ZRANGE", legacy, 0, batch - 1, "WITHSCORES")
            pairs = items if items and isinstance(items[0], (list, tuple)) else list(
                zip(items[::2], items[1::2], strict=True))  # RESP3 pairs, or RESP2 flat
            entries = [(int(float(score)), member) for member, score in pairs]
        else:
            entries = [(0, member) for member in link.call("LRANGE", legacy, 0, batch - 1)]
        if not entries:
            break
        queue(entries)
        if kind == "zset":
            link.call("ZREM", legacy, *(member for _, member in entries))
        else:
            link.call("LTRIM", legacy, len(entries), -1)
        moved += len(entries)
    return moved
