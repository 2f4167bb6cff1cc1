"""What opening a filter settles before it creates one: the engine a new filter gets,
and no new filter over keys a lost one left (with the message for a lost filter)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import keys
from ..exceptions import FilterLostError
from . import meta, native
from .lua import _pipelined

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster


def _new_engine(client: Redis | RedisCluster, key: str, engine: str) -> str:
    """The engine a new filter gets for ``BLOOMDUPE_ENGINE = engine`` on this server."""
    if engine == "lua":
        return engine
    has_bf = native.available(client, key, required=engine == native.NAME)
    if engine == native.NAME and not has_bf:
        raise native.unavailable_error(client, "BLOOMDUPE_ENGINE is 'redisbloom'")
    return native.NAME if has_bf else "lua"


def lost_message(key: str, what: str) -> str:
    """What to tell a user whose filter's state is gone from Redis."""
    return (
        f"The Bloom filter {key!r} lost its state in Redis: {what}. Keys were deleted, "
        "evicted (a maxmemory-policy that evicts), flushed (FLUSHDB, SCHEDULER_FLUSH_ON_START) "
        "or lost in a Redis restart without persistence; the seen URLs and the queued "
        "requests they stood for cannot be trusted, and going on would fetch pages twice or "
        f"never. Restore Redis from a backup, or delete what is left (`bloomdupe clear --key "
        f"{key}`) and start the crawl again from its start URLs"
    )


def _refuse_orphans(client: Redis | RedisCluster, key: str, shards: int) -> None:
    """Refuse to create metadata over a lost filter's shards or queue at ``key`` (a new seed
    over old bits would make every answer wrong). Looks at shards ``0..shards-1``; a worker
    that made the metadata in the meantime is joined, not refused."""
    names = [n for i in range(shards)
             for n in (keys.bits(key, i), keys.bloom(key, i), keys.queue(key, i),
                       keys.leases(key, i), keys.slice_record(key, i))]
    there = _pipelined(client, [("EXISTS", n) for n in names])
    found = [n for n, is_there in zip(names, there, strict=True) if is_there]
    if found and not meta.read(client, key):
        listed = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise FilterLostError(lost_message(
            key, f"{listed} are there but its metadata {keys.meta(key)} is not"))
