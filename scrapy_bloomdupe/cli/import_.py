"""``bloomdupe import --from-set KEY | --from-jobdir DIR``: add a scrapy-redis SET's or a
JOBDIR's fingerprints to the filter (created from the settings if absent), with progress."""

from __future__ import annotations

import argparse
import time
from typing import Any, TextIO

import redis
from scrapy.settings import Settings
from scrapy.utils.conf import arglist_to_dict
from scrapy_redis import defaults
from tqdm import tqdm  # type: ignore[import-untyped]

from .. import migrate
from ..settings import BloomDupeConfig
from .context import EXIT_OK, Context, UsageProblem
from .output import fields, rate

#: Plain progress lines (stderr not a terminal) at most this often, in seconds.
PROGRESS_INTERVAL = 2.0


class Progress:
    """tqdm on stderr when it is a terminal; plain lines every few seconds otherwise."""

    def __init__(self, stream: TextIO, total: int | None, enabled: bool, label: str) -> None:
        self.stream = stream
        self.total = total
        self.enabled = enabled
        self.label = label
        self.done = 0
        self.bar: Any = None
        self._last = time.monotonic()
        if enabled and stream.isatty():
            self.bar = tqdm(total=total, unit="fp", unit_scale=True, file=stream, desc=label,
                            dynamic_ncols=True, smoothing=0.1)

    def update(self, n: int, counts: migrate.ImportCounts) -> None:
        self.done += n
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(f"new {counts.added:,}, already present "
                                     f"{counts.already_present:,}", refresh=False)
            self.bar.update(n)
            return
        now = time.monotonic()
        if now - self._last >= PROGRESS_INTERVAL:
            self._last = now
            self._line(counts)

    def _line(self, counts: migrate.ImportCounts) -> None:
        of = ""
        if self.total:
            of = f" of ~{self.total:,} ({min(1.0, self.done / self.total):.0%})"
        print(f"{self.label}: {self.done:,}{of} read, {counts.added:,} new, "
              f"{counts.already_present:,} already present", file=self.stream, flush=True)

    def close(self, counts: migrate.ImportCounts) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            self._line(counts)


def _import_config(ctx: Context, opts: argparse.Namespace, source: migrate.Source
                   ) -> BloomDupeConfig:
    if ctx.project:
        return BloomDupeConfig.from_settings(ctx.settings)
    settings = Settings()
    settings.set("BLOOMDUPE_FINGERPRINT", source.mode, priority="default")
    try:
        settings.setdict(arglist_to_dict(opts.settings), priority="cmdline")
    except ValueError:
        raise UsageProblem("use -s NAME=VALUE") from None
    if opts.capacity is not None:
        settings.set("BLOOMDUPE_CAPACITY", opts.capacity, priority="cmdline")
    if opts.error_rate is not None:
        settings.set("BLOOMDUPE_ERROR_RATE", opts.error_rate, priority="cmdline")
    return BloomDupeConfig.from_settings(settings)


def _queue_next(ctx: Context) -> str:
    """What the first worker does with scrapy-redis's queue (``SCHEDULER_QUEUE_KEY``): moves
    it into the leased queue (``scheduling/shared.py``), unless a scrapy-redis class keeps it."""
    queue_cls = str(ctx.settings.get("SCHEDULER_QUEUE_CLASS") or "")
    if queue_cls.startswith("scrapy_redis."):
        return (f"SCHEDULER_QUEUE_CLASS = {queue_cls!r} keeps scrapy-redis's request queue "
                "where it is, without leases.")
    template = str(ctx.settings.get("SCHEDULER_QUEUE_KEY") or defaults.SCHEDULER_QUEUE_KEY)
    moves = ("The first worker to start moves the requests waiting in scrapy-redis's request "
             "queue")
    then = ("into the package's leased queue, past the filter, and logs \"Took over N "
            "request(s)\"; scrapy-redis's workers must not run on it any more.")
    if ctx.spider is None:
        return f"{moves} (SCHEDULER_QUEUE_KEY, {template!r} by default) {then}"
    queue = template % {"spider": ctx.spider}
    try:
        kind = ctx.client.type(queue)
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        waiting = int(ctx.client.zcard(queue) if kind == "zset"
                      else ctx.client.llen(queue) if kind == "list" else 0)
    except redis.ResponseError:  # an ACL without TYPE or the key: say what happens anyway
        return f"{moves} {queue!r} {then}"
    if not waiting:
        return f"scrapy-redis's request queue {queue!r} holds nothing to take over."
    return f"{moves} {queue!r} ({waiting:,} request(s)) {then}"


def run(ctx: Context, opts: argparse.Namespace) -> int:
    if opts.batch_size < 1:
        raise UsageProblem("--batch-size must be at least 1")
    if not opts.from_set and not opts.from_jobdir:
        raise UsageProblem("import from what? give --from-set KEY or --from-jobdir DIR")
    source = migrate.open_source(ctx.client, from_set=opts.from_set,
                                 from_jobdir=opts.from_jobdir)
    config = _import_config(ctx, opts, source)
    hint = ("BLOOMDUPE_FINGERPRINT in the project's settings" if ctx.project
            else "-s BLOOMDUPE_FINGERPRINT=...")
    bloom, created = migrate.open_target(ctx.client, ctx.key, config, source, setting_hint=hint)
    try:
        plan = bloom.sizing
        state = "new filter" if created else "existing filter"
        total = "?" if source.total is None else f"{source.total:,}"
        ctx.note(f"Importing {source.describe()}, {total} fingerprint(s), into {state} "
                 f"{ctx.key!r} in Redis at {ctx.where} "
                 f"(capacity {plan.capacity:,}, error rate {rate(plan.error_rate)}, "
                 f"{plan.shards} shard(s), growth {'on' if bloom.growth else 'off'}, "
                 f"{bloom.fingerprint} fingerprints, {bloom.engine_name} engine)")
        asked = [o for o, v in (("--capacity", getattr(opts, "capacity", None)),
                                ("--error-rate", getattr(opts, "error_rate", None)),
                                ("-s", getattr(opts, "settings", None))) if v]
        if asked and not created:
            ctx.note(f"note: {', '.join(asked)} ignored: they size a new filter, and "
                     f"{ctx.key!r} exists with the parameters above.")
        if source.total and not bloom.growth and source.total > plan.capacity:
            ctx.note(f"warning: {source.total:,} fingerprints exceed the filter's capacity of "
                     f"{plan.capacity:,} and it cannot grow (BLOOMDUPE_GROWTH off): its "
                     "false-positive rate will be past BLOOMDUPE_ERROR_RATE.")
        shown_notes = len(source.notes)
        for text in source.notes:
            ctx.note(f"note: {text}")
        started = time.monotonic()
        progress = Progress(ctx.err, source.total, opts.progress, "import")
        counts = migrate.ImportCounts()
        try:
            counts = migrate.import_fingerprints(bloom, source, batch_size=opts.batch_size,
                                                 progress=progress.update)
        finally:
            progress.close(counts)
        seconds = time.monotonic() - started
        generations = len(bloom.generations)
    finally:
        bloom.close()
    notes = list(source.notes)
    for text in notes[shown_notes:]:  # found while reading (a truncated last record)
        ctx.note(f"note: {text}")
    if ctx.json:
        ctx.emit({
            "key": ctx.key, "redis": ctx.where, "created": created,
            "fingerprint": bloom.fingerprint, "generations": generations,
            "source": {"kind": source.kind, "name": source.name, "format": source.format,
                       "mode": source.mode},
            **counts.as_dict(), "seconds": seconds, "notes": notes,
        })
        return EXIT_OK
    lines = [f"Imported {source.describe()} into {'new' if created else 'existing'} Bloom "
             f"filter {ctx.key!r} ({bloom.fingerprint} fingerprints) in {seconds:.1f} s"]
    lines += fields([
        ("read", f"{counts.read:,}"),
        ("added (new)", f"{counts.added:,}"),
        ("already present", f"{counts.already_present:,}"),
        *([("skipped (not fingerprints)", f"{counts.skipped:,}")] if counts.skipped else []),
    ])
    if source.kind == "set":
        lines += ["", (
            f"Next: crawl with scrapy_bloomdupe's SCHEDULER and DUPEFILTER_CLASS, "
            f"BLOOMDUPE_FINGERPRINT = 'scrapy-redis' and BLOOMDUPE_KEY naming {ctx.key!r}. "
            f"{_queue_next(ctx)} The SET {source.name!r} is left as it was: delete it once "
            "the new crawl runs well.")]
    else:
        lines += ["", (
            f"Next: crawl with DUPEFILTER_CLASS = "
            f"'scrapy_bloomdupe.dupefilter.RedisBloomDupeFilter' (BLOOMDUPE_FINGERPRINT = "
            f"'scrapy', the default) and BLOOMDUPE_KEY naming {ctx.key!r}. Only the seen "
            "fingerprints were imported, not the JOBDIR's pending requests.")]
    ctx.print("\n".join(lines))
    return EXIT_OK
