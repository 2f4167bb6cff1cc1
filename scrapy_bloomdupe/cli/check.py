"""``bloomdupe check URL...``: whether each URL is in the filter (seen) or not (new),
fingerprinted as the crawl's workers do, adding nothing."""

from __future__ import annotations

import argparse
from urllib.parse import urlsplit

from scrapy import Request

from .. import hashing
from .context import (
    EXIT_FAILED,
    EXIT_OK,
    Context,
    UsageProblem,
    fingerprinter_for,
    missing_shards,
    open_existing,
    report_missing,
)

#: Schemes a URL to check may have.
SCHEMES = ("http", "https")


def _request(url: str, opts: argparse.Namespace) -> Request:
    parts = urlsplit(url)
    if "://" not in url or parts.scheme.lower() not in SCHEMES:
        raise ValueError("only http:// and https:// URLs can be checked")
    if not parts.netloc:
        raise ValueError("no host")
    return Request(url, method=opts.method, body=opts.body)


def requests_for(urls: list[str], opts: argparse.Namespace) -> list[Request]:
    """One request a URL, as ``check`` and ``forget`` fingerprint them; bad URLs: one error."""
    requests = []
    bad = []
    for url in urls:
        try:
            requests.append(_request(url, opts))
        except (ValueError, TypeError) as e:
            bad.append(f"{url!r}: {e}")
    if bad:
        raise UsageProblem("bad URL " + "; ".join(bad) + " (give absolute http(s) URLs)")
    return requests


def run(ctx: Context, opts: argparse.Namespace) -> int:
    requests = requests_for(opts.urls, opts)
    bloom = open_existing(ctx)
    try:
        fingerprinter = fingerprinter_for(ctx, bloom.fingerprint)
        fps = [fingerprinter.fingerprint(r) for r in requests]
        # A forgotten item (`bloomdupe forget`) is new to the next check, whatever its bits.
        seen = [s and not f for s, f in zip(bloom.contains_many(fps),
                                            bloom.are_forgotten(fps), strict=True)]
        missing = missing_shards(ctx, bloom)
    finally:
        bloom.close()
    # A URL whose shard is missing (in any generation) and reads "new" may have been seen.
    lost = {i for i in range(bloom.sizing.shards)
            if any(bloom.shard_key(i, g) in missing for g in range(len(bloom.generations)))}
    unsure = [not s and hashing.shard_of(hashing.halves(fp, bloom.seed)[0],
                                         bloom.sizing.shards) in lost
              for fp, s in zip(fps, seen, strict=True)]
    status = EXIT_FAILED if missing else EXIT_OK
    if missing:
        report_missing(ctx, missing)

    def shown(fp: bytes) -> str:
        return fp.decode() if bloom.fingerprint == "scrapy-redis" else fp.hex()

    if ctx.json:
        ctx.emit({
            "key": ctx.key, "redis": ctx.where, "fingerprint": bloom.fingerprint,
            "results": [{"url": url, "seen": s, "fingerprint": shown(fp),
                         **({"shard_missing": True} if u else {})}
                        for url, s, fp, u in zip(opts.urls, seen, fps, unsure, strict=True)],
            "seen": sum(seen), "new": len(seen) - sum(seen),
            "missing_shards": missing,
        })
        return status
    for url, s, u in zip(opts.urls, seen, unsure, strict=True):
        ctx.print(f"{'seen' if s else 'new?' if u else 'new ':<4}  {url}")
    ctx.note(f"{len(seen)} URL(s) checked against {ctx.key!r} ({bloom.fingerprint} "
             f"fingerprints, {opts.method}): {sum(seen)} seen, {len(seen) - sum(seen)} new"
             + (f" ({sum(unsure)} of them in a missing shard: 'new?')" if any(unsure) else "")
             + ". Nothing was added. 'seen' can be a false positive, at the rate `info` shows.")
    return status
