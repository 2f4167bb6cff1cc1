"""``bloomdupe forget URL... [--file FILE]``: the next request for each URL counts as new exactly
once, on every worker (local caches included; fingerprinted as ``check`` does). Returns
``FORGET_SETTLE`` s after raising the forget counter, when no local cache answers for them
(see :mod:`..bloom.forgetting`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .check import requests_for
from .context import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    PROG,
    Context,
    UsageProblem,
    fingerprinter_for,
    open_existing,
)


def _urls(opts: argparse.Namespace) -> list[str]:
    urls = list(opts.urls or [])
    if opts.file:
        text = sys.stdin.read() if opts.file == "-" else Path(opts.file).read_text("utf-8")
        urls += [line.strip() for line in text.splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]
    if not urls:
        raise UsageProblem("forget which URLs? give URL... or --file FILE (one a line)")
    return urls


def run(ctx: Context, opts: argparse.Namespace) -> int:
    urls = _urls(opts)
    requests = requests_for(urls, opts)
    bloom = open_existing(ctx)
    try:
        fingerprinter = fingerprinter_for(ctx, bloom.fingerprint)
        fps = [fingerprinter.fingerprint(r) for r in requests]
        seen = bloom.contains_many(fps)
        try:
            added = bloom.forget_many(fps)
        except KeyboardInterrupt:
            ctx.note(f"{PROG}: forget interrupted: the URLs may or may not be re-admitted, and "
                     "a worker's local cache may still answer for them for a second; run the "
                     "same forget again (a URL forgotten twice is still new once)")
            return EXIT_INTERRUPTED
        waiting = bloom.forgotten()
    finally:
        bloom.close()
    distinct = len(set(fps))
    if ctx.json:
        ctx.emit({"key": ctx.key, "redis": ctx.where, "fingerprint": bloom.fingerprint,
                  "forgotten": distinct, "were_seen": sum(seen),
                  "already_waiting": distinct - added, "waiting": waiting})
        return EXIT_OK
    ctx.print(f"Forgot {distinct} URL(s) of {ctx.key!r} ({bloom.fingerprint} fingerprints, "
              f"{opts.method}): {sum(seen)} of them were in the filter"
              + (f", {distinct - added} were already waiting" if distinct - added else "")
              + ". From now on the next request for each counts as new once, on every "
              f"worker (no local cache answers for them any more); {waiting} wait for it now.")
    return EXIT_OK
