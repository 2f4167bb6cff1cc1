"""``bloomdupe failed``: a crawl's requests that failed for good; ``--requeue`` refetches them."""

from __future__ import annotations

import argparse

from .. import keys
from ..frontier import failed
from .clear import crawl_keys
from .context import EXIT_OK, Context, FilterAbsent, UsageProblem
from .output import fields, table, when


def run(ctx: Context, opts: argparse.Namespace) -> int:
    if opts.limit is not None and opts.limit < 1:
        raise UsageProblem("--limit must be at least 1")
    total = failed.count(ctx.client, ctx.key)
    if not total and not crawl_keys(ctx.client, ctx.key):  # a typo must not read "0 failed"
        raise FilterAbsent(f"No crawl at key {ctx.key!r} in Redis at {ctx.where}: no key of "
                           "it (`bloomdupe keys`), so no failed request either.")
    if opts.requeue and total and not ctx.client.exists(keys.meta(ctx.key)) \
            and ctx.client.exists(keys.finished(ctx.key)):
        raise FilterAbsent(
            f"The crawl {ctx.key!r} is over: its last worker deleted its filter and queue "
            "(SCHEDULER_PERSIST off) and kept these records as its report, so there is no "
            "queue to put them back in. A new crawl at this key starts afresh and fetches "
            "every page, these too; without --requeue they are listed.")
    records = failed.read(ctx.client, ctx.key, None if opts.requeue else opts.limit)
    moved = 0
    if opts.requeue and records:
        moved = failed.requeue(ctx.client, ctx.key, [r.id for r in records])
    if ctx.json:
        ctx.emit({"key": ctx.key, "redis": ctx.where, "total": total,
                  "failed": [r.as_dict() for r in records],
                  **({"requeued": moved} if opts.requeue else {})})
        return EXIT_OK
    lines = [f"Requests of {ctx.key!r} that failed for good, in Redis at {ctx.where}"]
    lines += fields([("recorded", f"{total:,}"
                      + (f" (showing the oldest {len(records):,})" if len(records) < total
                         else ""))])
    if records:
        lines += [""]
        lines += table(["time", "method", "url", "reason"],
                       [[when(r.time), r.method, r.url, r.reason] for r in records],
                       left=(0, 1, 2, 3))
    if opts.requeue:
        lines += ["", f"Put {moved:,} request(s) back in the crawl's queue, past the filter: "
                      "the next run (or a running one) fetches them again."]
    elif records:
        lines += ["", "`--requeue` puts them back in the crawl's queue, past the filter."]
    ctx.print("\n".join(lines))
    return EXIT_OK
