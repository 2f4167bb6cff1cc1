"""``bloomdupe check URL...``: whether each URL is in the filter (seen) or not (new),
fingerprinted as the crawl's workers do, adding nothing."""

from __future__ import annotations

import argparse

from scrapy import Request

from .context import EXIT_OK, Context, UsageProblem, fingerprinter_for, open_existing


def run(ctx: Context, opts: argparse.Namespace) -> int:
    requests = []
    bad = []
    for url in opts.urls:
        try:
            requests.append(Request(url, method=opts.method, body=opts.body))
        except (ValueError, TypeError) as e:
            bad.append(f"{url!r}: {e}")
    if bad:
        raise UsageProblem("bad URL " + "; ".join(bad) + " (give absolute http(s) URLs)")
    bloom = open_existing(ctx)
    try:
        fingerprinter = fingerprinter_for(ctx, bloom.fingerprint)
        fps = [fingerprinter.fingerprint(r) for r in requests]
        seen = bloom.contains_many(fps)
    finally:
        bloom.close()

    def shown(fp: bytes) -> str:
        return fp.decode() if bloom.fingerprint == "scrapy-redis" else fp.hex()

    if ctx.json:
        ctx.emit({
            "key": ctx.key, "redis": ctx.where, "fingerprint": bloom.fingerprint,
            "results": [{"url": url, "seen": s, "fingerprint": shown(fp)}
                        for url, s, fp in zip(opts.urls, seen, fps, strict=True)],
            "seen": sum(seen), "new": len(seen) - sum(seen),
        })
        return EXIT_OK
    for url, s in zip(opts.urls, seen, strict=True):
        ctx.print(f"{'seen' if s else 'new ':<4}  {url}")
    ctx.note(f"{len(seen)} URL(s) checked against {ctx.key!r} ({bloom.fingerprint} "
             f"fingerprints, {opts.method}): {sum(seen)} seen, {len(seen) - sum(seen)} new. "
             "Nothing was added. 'seen' can be a false positive, at the rate `info` shows.")
    return EXIT_OK
