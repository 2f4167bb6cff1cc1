"""``bloomdupe top``: a live, read-only view of one crawl (``--interval``, default 1 s): workers
and their pages a second, the queue, leases put back, the filter's fill and estimated FPR,
failed requests, the busiest download slots. ``--once`` prints one frame (``--json``: figures)."""

from __future__ import annotations

import argparse
import dataclasses
import time
from datetime import datetime

from ..crawlfigures import CrawlFigures, CrawlReader
from .context import EXIT_OK, Context, FilterAbsent
from .output import ago, busy_slots, count, fields, human_bytes, percent, rate, table

#: Clears the terminal and puts the cursor home, before each frame.
CLEAR = "\x1b[H\x1b[2J"


def frame(ctx: Context, figures: CrawlFigures) -> list[str]:
    """One frame of the view, as lines."""
    totals = figures.totals
    checked = totals["checked"]
    lines = [f"bloomdupe top: crawl {figures.key!r} in Redis at {ctx.where}, "
             f"{datetime.now():%H:%M:%S}"]
    f = figures.filter
    if f is None:
        fill = figures.problem or "no filter at this key"
    else:
        fill = (f"fill {percent(f.fill_ratio)}, est. FPR {rate(f.estimated_false_positive_rate)}"
                f" (configured {rate(f.configured_error_rate)}), about "
                f"{count(f.estimated_items)} of {f.capacity:,} items, {f.generations} "
                f"generation(s), {human_bytes(f.memory_bytes)}")
    lines += fields([
        ("workers alive", f"{figures.workers_alive}"),
        ("pages/s", f"{figures.pages_per_second:,.1f}  ({totals['pages']:,} pages in all)"),
        ("queue", f"{figures.waiting:,} waiting, {figures.leased:,} leased"),
        ("leases put back", f"{totals['requeued']:,}"),
        ("failed", f"{totals['failed']:,}  ({figures.failed_kept:,} kept: `bloomdupe failed`)"),
        ("filter", fill),
        ("checked", f"{checked:,}: {totals['new']:,} new, {totals['duplicates']:,} duplicates"
                    + (f" ({totals['duplicates'] / checked:.1%})" if checked else "")),
    ])
    lines += ["", f"Running workers ({len(figures.workers)})"]
    if figures.workers:
        lines += table(
            ["worker", "pages/s", "pages", "in flight", "items", "leases back", "failed",
             "checked", "written"],
            [[w.id, f"{w.pages_per_second:,.1f}", f"{w.pages:,}", f"{w.in_flight:,}",
              f"{w.items:,}", f"{w.requeued:,}", f"{w.failed:,}", f"{w.checked:,}", ago(w.age)]
             for w in figures.workers])
    else:
        lines.append("  (none writes its figures: no worker runs, or none has the "
                     "WorkerMetrics extension)")
    if figures.slots is not None:
        lines += busy_slots(figures.slots)
    return lines


def run(ctx: Context, opts: argparse.Namespace) -> int:
    reader = CrawlReader(ctx.client, ctx.key, lease_timeout=opts.lease_timeout,
                         filter_every=opts.filter_every)
    figures = reader.read()
    if figures.filter is None and figures.problem is None and not figures.workers \
            and not any(figures.totals.values()) and figures.slots is None:
        raise FilterAbsent(f"No crawl at key {ctx.key!r} in Redis at {ctx.where}: no filter, "
                           "no crawl stats, no running worker.")
    while True:
        if ctx.json:
            ctx.emit({**dataclasses.asdict(figures),
                      "pages_per_second": figures.pages_per_second})
        else:
            text = "\n".join(frame(ctx, figures))
            if not opts.once and ctx.out.isatty():
                text = CLEAR + text
            ctx.print(text)
        ctx.out.flush()
        if opts.once:
            return EXIT_OK
        time.sleep(opts.interval)
        figures = reader.read()
