"""``bloomdupe clear``: delete the filter and its crawl stats, once the key is typed
back (or ``--yes``)."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from .context import EXIT_FAILED, EXIT_OK, Context, open_existing
from .output import count, human_bytes


def run(ctx: Context, opts: argparse.Namespace, stdin: TextIO | None = None) -> int:
    bloom = open_existing(ctx)
    try:
        info = bloom.info()
        if not opts.yes:
            ctx.note(
                f"This deletes the Bloom filter {ctx.key!r} in Redis at {ctx.where}: about "
                f"{count(info.estimated_items)} seen requests, {human_bytes(info.memory_bytes)}, "
                "and its crawl-wide stats. A crawl using it would fetch those pages again. "
                "(scrapy-redis's request queue is not touched.)")
            print(f"Type the key ({ctx.key}) to delete it: ", end="", file=ctx.err, flush=True)
            answer = (stdin or sys.stdin).readline()
            if answer.strip() != ctx.key:
                ctx.note("")
                ctx.note("Not confirmed: nothing was deleted.")
                if ctx.json:
                    ctx.emit({"key": ctx.key, "redis": ctx.where, "cleared": False})
                return EXIT_FAILED
        bloom.clear()
    finally:
        bloom.close()
    if ctx.json:
        ctx.emit({"key": ctx.key, "redis": ctx.where, "cleared": True,
                  "estimated_items": info.estimated_items, "memory_bytes": info.memory_bytes})
    else:
        ctx.print(f"Deleted Bloom filter {ctx.key!r} (about {count(info.estimated_items)} items, "
                  f"{human_bytes(info.memory_bytes)}) and its crawl stats in Redis at "
                  f"{ctx.where}.")
    return EXIT_OK
