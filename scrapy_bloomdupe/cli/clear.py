"""``bloomdupe clear``: delete a crawl's state at a key (filter, queue, failed-request records,
crawl stats) once the key is typed back (or ``--yes``). Keys are found by name
(``keys.belongs``), not from the metadata, so any state clears: metadata gone or damaged, a
Redis out of memory (``SCAN`` and ``DEL`` still run), thousands of shards."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

import redis
from redis.cluster import RedisCluster

from .. import crawlstats, keys
from ..exceptions import BloomDupeError
from .context import EXIT_FAILED, EXIT_OK, Context, FilterAbsent, open_existing
from .output import count, human_bytes

#: Keys deleted in one pipeline.
CHUNK = 500


def crawl_keys(client: redis.Redis | RedisCluster, key: str) -> list[str]:
    """Every Redis key of the crawl at ``key``, by name (one ``SCAN`` of the keyspace)."""
    names = [keys.meta(key), keys.growlock(key), keys.stats(key), keys.workers(key),
             keys.forgets(key), keys.live(key), keys.finished(key),
             *(keys.live_worker(key, w) for w in crawlstats.live_workers(client, key))]
    found = [n for n in names if client.exists(n)]
    for name in client.scan_iter(match=keys.shards_pattern(key), count=1000):
        text = name.decode() if isinstance(name, bytes) else str(name)
        if keys.belongs(key, text):
            found.append(text)
    return list(dict.fromkeys(found))


def delete(client: redis.Redis | RedisCluster, names: Sequence[str]) -> None:
    for start in range(0, len(names), CHUNK):
        pipe = client.pipeline(transaction=False)
        for name in names[start:start + CHUNK]:
            pipe.delete(name)
        pipe.execute()


def run(ctx: Context, opts: argparse.Namespace, stdin: TextIO | None = None) -> int:
    names = crawl_keys(ctx.client, ctx.key)
    if not names:
        open_existing(ctx)  # raises FilterAbsent, with the filters that are there
        raise FilterAbsent(f"No Bloom filter at key {ctx.key!r} in Redis at {ctx.where}.")
    items: float | None = None
    memory: int | None = None
    report = False  # what a finished crawl kept (BLOOMDUPE_REPORT_TTL), and its end mark
    try:
        bloom = open_existing(ctx)
        try:
            info = bloom.info()
            items, memory = info.estimated_items, info.memory_bytes
        finally:
            bloom.close()
        what = (f"the Bloom filter {ctx.key!r} in Redis at {ctx.where} (about "
                f"{count(items)} seen requests, {human_bytes(memory)}), its request queue, "
                "failed-request records and crawl-wide stats")
    except BloomDupeError as e:  # metadata gone or damaged: the keys go all the same
        why = "is gone" if isinstance(e, FilterAbsent) else "is damaged"
        what = (f"the {len(names)} key(s) left at {ctx.key!r} in Redis at {ctx.where} by a "
                f"crawl whose filter metadata {keys.meta(ctx.key)!r} {why}")
        report = isinstance(e, FilterAbsent) and keys.finished(ctx.key) in names
        if report:
            what = (f"the report of the finished crawl {ctx.key!r} in Redis at {ctx.where} "
                    "(its failed requests and crawl stats, kept after its end: "
                    f"BLOOMDUPE_REPORT_TTL) and its end mark, {len(names)} key(s)")
    if not opts.yes:
        ctx.note(f"This deletes {what}. A crawl using it would start over. "
                 "(A scrapy-redis request queue or set under another key is not touched.)")
        print(f"Type the key ({ctx.key}) to delete it: ", end="", file=ctx.err, flush=True)
        answer = (stdin or sys.stdin).readline()
        if answer.strip() != ctx.key:
            ctx.note("")
            ctx.note("Not confirmed: nothing was deleted.")
            if ctx.json:
                ctx.emit({"key": ctx.key, "redis": ctx.where, "cleared": False})
            return EXIT_FAILED
    delete(ctx.client, names)
    if ctx.json:
        ctx.emit({"key": ctx.key, "redis": ctx.where, "cleared": True, "keys": len(names),
                  "estimated_items": items, "memory_bytes": memory})
    elif items is not None:
        ctx.print(f"Deleted Bloom filter {ctx.key!r} (about {count(items)} items, "
                  f"{human_bytes(memory or 0)}), its queue and its crawl stats in Redis at "
                  f"{ctx.where}: {len(names)} key(s).")
    elif report:
        ctx.print(f"Deleted the report of the finished crawl {ctx.key!r} (failed requests, "
                  f"crawl stats) and its end mark in Redis at {ctx.where}: {len(names)} "
                  "key(s).")
    else:
        ctx.print(f"Deleted the {len(names)} key(s) left at {ctx.key!r} in Redis at "
                  f"{ctx.where}.")
    return EXIT_OK
