"""``bloomdupe stats``: crawl-wide counters (checked, new, duplicates) and each worker's line."""

from __future__ import annotations

import argparse
import time

from .. import crawlstats, keys, migrate
from .context import (
    EXIT_FAILED,
    EXIT_OK,
    Context,
    DamagedFilter,
    FilterAbsent,
    missing_shards,
    open_existing,
    report_missing,
)
from .output import ago, fields, table


def run(ctx: Context, opts: argparse.Namespace) -> int:
    try:
        data = crawlstats.read(ctx.client, ctx.key)
    except (ValueError, TypeError) as e:  # not numbers, not JSON
        raise DamagedFilter(
            f"The crawl stats {keys.stats(ctx.key)!r} / {keys.workers(ctx.key)!r} in Redis at "
            f"{ctx.where} cannot be read ({type(e).__name__}: {e}). Nothing was changed."
        ) from None
    exists = migrate.filter_exists(ctx.client, ctx.key)
    problem: str | None = None
    missing: list[str] = []
    if exists:
        try:
            bloom = open_existing(ctx)  # read-only
        except DamagedFilter as e:
            problem = str(e)
        else:
            try:
                missing = missing_shards(ctx, bloom)
            finally:
                bloom.close()
    status = EXIT_FAILED if problem or missing else EXIT_OK
    if problem:
        ctx.note(f"{ctx.prog}: error: {problem}")
    if missing:
        report_missing(ctx, missing)
    totals = data["totals"]
    if not exists and not data["workers"] and not any(totals[n] for n in crawlstats.COUNTERS):
        raise FilterAbsent(
            f"No Bloom filter and no crawl stats at key {ctx.key!r} in Redis at {ctx.where}. "
            "Workers write the stats to '<key>:stats' every BLOOMDUPE_STATS_INTERVAL seconds.")
    now = time.time()
    workers = sorted(data["workers"].items(), key=lambda kv: kv[1].get("started") or 0)
    if ctx.json:
        ctx.emit({
            "key": ctx.key, "redis": ctx.where, "filter_exists": exists, "now": now,
            "filter_problem": problem, "missing_shards": missing,
            "totals": totals,
            "workers": [
                {"id": wid, **line,
                 "last_seen_seconds_ago": (now - line["last_seen"]) if line.get("last_seen")
                 else None}
                for wid, line in workers
            ],
        })
        return status
    lines = [f"Crawl stats of {ctx.key!r} in Redis at {ctx.where}"
             + ("" if exists else " (the filter itself is gone)")]
    lines += fields([
        ("checked", f"{totals['checked']:,}"),
        ("new", f"{totals['new']:,}"),
        ("duplicates", f"{totals['duplicates']:,}"),
        ("hit rate", f"{totals['hit_rate']:.1%}  (duplicates / checked)"),
        ("local hits", f"{totals['local_hits']:,}  (duplicates answered by a worker's "
                       "BLOOMDUPE_LOCAL_CACHE, without Redis)"),
        ("lock acquired", f"{totals['lock_acquired']:,}"),
        ("lock waits", f"{totals['lock_waits']:,}"),
        ("lock timeouts", f"{totals['lock_timeouts']:,}"),
        ("lock lost", f"{totals['lock_lost']:,}"),
        ("redis errors", f"{totals['redis_errors']:,}"),
    ])
    lines += ["", f"Workers ({len(workers)})"]
    if workers:
        rows = []
        for wid, line in workers:
            checked = int(line.get("checked", 0))
            dups = int(line.get("duplicates", 0))
            rows.append([
                wid, str(line.get("host", "?")), str(line.get("pid", "?")),
                ago(now - line["started"]) if line.get("started") else "-",
                ago(now - line["last_seen"]) if line.get("last_seen") else "-",
                str(line.get("closed") or "-"), f"{checked:,}", f"{int(line.get('new', 0)):,}",
                f"{dups:,}", f"{dups / checked:.1%}" if checked else "-",
            ])
        lines += table(["worker", "host", "pid", "started", "last seen", "closed", "checked",
                        "new", "duplicates", "hit rate"], rows, left=(0, 1, 5))
    else:
        lines.append("  (none has written its stats yet)")
    ctx.print("\n".join(lines))
    return status
