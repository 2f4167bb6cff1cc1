"""``bloomdupe keys``: every Redis key of a crawl, with what it holds. Reads only.

Shard keys start with a hash tag (``{K:i}:bits``), so a cleanup by prefix misses them; this
lists them as ``bloomdupe clear`` finds them (orphans too), and the spider's scrapy-redis keys.
"""

from __future__ import annotations

import argparse
from typing import Any

from scrapy_redis import defaults

from .. import keys
from ..transport.cluster import is_cluster
from .clear import crawl_keys
from .context import EXIT_OK, Context
from .output import table

#: scrapy-redis's keys of a spider (its defaults), and what they are.
SCRAPY_REDIS_KEYS = (
    (defaults.SCHEDULER_QUEUE_KEY, "scrapy-redis's request queue (taken over at start)"),
    (defaults.SCHEDULER_DUPEFILTER_KEY, "scrapy-redis's dupefilter SET (`bloomdupe import "
                                        "--from-set`)"),
    (defaults.START_URLS_KEY.replace("%(name)s", "%(spider)s"),
     "RedisSpider's start URLs"),
    (defaults.PIPELINE_KEY, "RedisPipeline's items"),
)


def find(ctx: Context) -> list[dict[str, Any]]:
    """Every existing key of ``ctx.key``'s crawl: key, type, shard, what it holds."""
    found: dict[str, tuple[int, str]] = {}
    for name in crawl_keys(ctx.client, ctx.key):
        found[name] = keys.what_is(ctx.key, name) or (-1, "")
    ordered = sorted(found, key=lambda n: (found[n][0], n))
    rows: list[dict[str, Any]] = [
        {"key": n, "shard": found[n][0] if found[n][0] >= 0 else None, "what": found[n][1]}
        for n in ordered]
    if ctx.spider:
        for template, legacy in SCRAPY_REDIS_KEYS:
            name = template % {"spider": ctx.spider}
            if name not in found and ctx.client.exists(name):
                rows.append({"key": name, "shard": None, "what": legacy})
    types = _types(ctx, [row["key"] for row in rows])
    for row, kind in zip(rows, types, strict=True):
        row["type"] = kind
    return rows


def _types(ctx: Context, names: list[str]) -> list[str]:
    if is_cluster(ctx.client):
        replies = [ctx.client.type(name) for name in names]
    else:
        pipe = ctx.client.pipeline(transaction=False)
        for name in names:
            pipe.type(name)
        replies = pipe.execute()
    return [r.decode() if isinstance(r, bytes) else str(r) for r in replies]


def run(ctx: Context, opts: argparse.Namespace) -> int:
    rows = find(ctx)
    if ctx.json:
        ctx.emit({"key": ctx.key, "redis": ctx.where, "keys": rows})
        return EXIT_OK
    if not rows:
        ctx.print(f"No key of the crawl {ctx.key!r} in Redis at {ctx.where}.")
        return EXIT_OK
    lines = [f"Keys of the crawl {ctx.key!r} in Redis at {ctx.where}: {len(rows):,}", ""]
    lines += table(["key", "type", "holds"], [[r["key"], r["type"], r["what"]] for r in rows],
                   left=(0, 1, 2))
    ctx.print("\n".join(lines))
    return EXIT_OK
