"""``bloomdupe info``: the filter's parameters, fill, estimated items and false-positive rate,
memory, the queue per shard, the state's format and live workers' versions, shards per
cluster master, and with crawl-wide politeness the busiest download slots."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import redis

from ..bloom.filter import BloomFilter
from ..bloom.info import FilterInfo
from ..bloom.placement import shard_nodes
from ..frontier import builds as builds_module
from ..frontier.builds import Builds
from ..frontier.busiest import BusySlots, busiest_slots
from ..frontier.queue import LEASE_TIMEOUT, shard_status
from ..sizing import TIGHTENING
from ..transport.cluster import is_cluster
from ..versions import UNRECORDED
from .context import EXIT_FAILED, EXIT_OK, Context, missing_shards, open_existing, report_missing
from .output import busy_slots, count, fields, human_bytes, percent, rate, table, when

#: BLOOMDUPE_FINGERPRINT modes, for people.
MODE_DESCRIPTIONS = {
    "scrapy": "Scrapy's request fingerprinter (REQUEST_FINGERPRINTER_CLASS)",
    "scrapy-redis": "scrapy-redis's sha1 hex fingerprint, as in its dupefilter SET",
}


#: What ``info`` says of each engine.
ENGINE_DESCRIPTIONS = {"lua": "lua (BITFIELD on plain strings, from a Lua script)",
                       "redisbloom": "redisbloom (the server's BF.* commands, from a Lua script)"}


def info_dict(ctx: Context, bloom: BloomFilter, info: FilterInfo,
              nodes: dict[str, list[int]] | None, missing: list[str] | None = None,
              queue: list[tuple[int, int]] | None = None, slots: BusySlots | None = None,
              builds: Builds | None = None) -> dict[str, Any]:
    data = info.as_dict()
    data.update({
        "redis": ctx.where,
        "fingerprint": bloom.fingerprint,
        "hashes": info.sizing.hashes,
        "bits_per_shard": info.sizing.bits_per_shard,
        "generation_count": len(info.generations),
        "total_bits": info.total_bits,
        "nodes": nodes,
        "missing_shards": missing or [],
        "queue": {"waiting": sum(q for q, _ in queue or []),
                  "leased": sum(leased for _, leased in queue or []),
                  "shards": [{"index": i, "waiting": q, "leased": leased}
                             for i, (q, leased) in enumerate(queue or [])]},
        "slots": None if slots is None else dataclasses.asdict(slots),
        "state_format": None if builds is None else builds.state,
        "workers": None if builds is None else [
            {"owner": owner, "version": None if build is None else build.version,
             "format": None if build is None else build.format}
            for owner, build in builds.live],
    })
    return data


def worker_lines(builds: Builds | None) -> list[str]:
    """The state's format and each live worker's build, for people."""
    if builds is None:
        return []
    state = builds.state or "none recorded (no queue yet, or one of a build before the record)"
    lines = fields([("state format", f"{state}; this scrapy-bloomdupe writes "
                                     f"{builds_module.OURS.format}"),
                    ("live workers", f"{len(builds.live)} (heard from in the last "
                                     f"{LEASE_TIMEOUT:g} s)")])
    if builds.live:
        lines += ["", "Live workers"]
        lines += table(["worker", "version", "state format"], [
            [owner, UNRECORDED if build is None else build.version,
             "?" if build is None else str(build.format)] for owner, build in builds.live])
    return lines


def run(ctx: Context, opts: argparse.Namespace) -> int:
    bloom = open_existing(ctx)
    try:
        info = bloom.info()
        nodes = shard_nodes(ctx.client, bloom) if is_cluster(ctx.client) else None
        missing = missing_shards(ctx, bloom)
        queue = shard_status(bloom.link, bloom.key, bloom.sizing.shards)
        try:
            builds: Builds | None = builds_module.look(ctx.client, bloom.key,
                                                       round(LEASE_TIMEOUT * 1000))
        except redis.exceptions.NoPermissionError as e:  # the rest is shown
            builds = None
            ctx.note(f"{ctx.prog}: the workers' builds cannot be read: {e}")
        try:
            slots = busiest_slots(bloom.link, bloom.key, shards=bloom.sizing.shards)
        except redis.exceptions.NoPermissionError as e:  # the rest is shown
            slots = None
            ctx.note(f"{ctx.prog}: the busiest download slots cannot be read: {e} (they "
                     "need +hmget +llen)")
    finally:
        bloom.close()
    status = EXIT_FAILED if missing else EXIT_OK
    if missing:
        report_missing(ctx, missing)
    if ctx.json:
        ctx.emit(info_dict(ctx, bloom, info, nodes, missing, queue, slots, builds))
        return status
    first = info.sizing
    newest = info.generations[-1].sizing
    growth = "on" if info.growth else "off"
    if info.growth:
        growth += f" (each new generation twice the last; newest holds {newest.capacity:,})"
    window = bloom.window
    lines = [f"Bloom filter {info.key!r} in Redis at {ctx.where}"]
    lines += fields([
        ("created", when(info.created)),
        ("fingerprints", f"{bloom.fingerprint}: {MODE_DESCRIPTIONS.get(bloom.fingerprint, '?')}"),
        ("engine", ENGINE_DESCRIPTIONS.get(info.engine, info.engine)),
        ("capacity", f"{first.capacity:,} at error rate {rate(first.error_rate)} (first "
                     f"generation); {info.capacity:,} in all" if window is None else
                     f"{first.capacity:,} a time slice at error rate {rate(first.error_rate)}; "
                     f"{first.capacity * window.slices:,} a window at "
                     f"{rate(first.error_rate * window.live / (1 - TIGHTENING))}"),
        ("shards", f"{first.shards}, {human_bytes(first.bytes_per_shard)} each in "
                   + ("generation 0" if window is None else "every time slice")),
        ("hashes", str(first.hashes)),
        *([("growth", growth), ("generations", str(len(info.generations)))] if window is None
          else [("window", f"{window.window_ms / 1000:g} s in {window.slices} slices of "
                           f"{window.slice_ms / 1000:g} s (Redis's clock); forgotten between "
                           f"the window and the window plus a slice after being added"),
                ("time slices", f"{len({g.index for g in info.generations if g.memory_bytes})} in "
                                f"Redis (at most {window.live}), each expiring on schedule")]),
        ("estimated items", f"{count(info.estimated_items)} "
                            f"({info.estimated_items / info.capacity:.1%} of capacity)"),
        ("fill", f"{percent(info.fill_ratio)} of {info.total_bits:,} bits"),
        ("est. false-positive rate", f"{rate(info.estimated_false_positive_rate)} now"),
        ("memory", human_bytes(info.memory_bytes)),
        ("queue", f"{sum(q for q, _ in queue):,} request(s) waiting, "
                  f"{sum(leased for _, leased in queue):,} leased by workers"),
    ])
    lines += ["", "Generations" if window is None else "Time slices (oldest first)"]
    lines += table(
        ["gen" if window is None else "slice", "capacity", "error rate", "bits/shard",
         "hashes", "fill", "est. items", "est. FPR", "memory"],
        [[g.label, f"{g.sizing.capacity:,}", rate(g.sizing.error_rate),
          f"{g.sizing.bits_per_shard:,}", str(g.sizing.hashes), percent(g.fill_ratio),
          count(g.estimated_items), rate(g.estimated_false_positive_rate),
          human_bytes(g.memory_bytes)] for g in info.generations],
    )
    node_of: dict[int, str] = {}
    if nodes:
        for name, indexes in nodes.items():
            for index in indexes:
                node_of[index] = name
    headers = ["shard", *(f"fill {'g' if window is None else 's'}{g.label}"
                          for g in info.generations), "memory",
               "waiting", "leased"]
    rows = []
    for i in range(first.shards):
        row = [str(i), *("missing" if g.shards[i].key in missing
                         else percent(g.shards[i].fill_ratio) for g in info.generations),
               human_bytes(sum(g.shards[i].memory_bytes for g in info.generations)),
               f"{queue[i][0]:,}", f"{queue[i][1]:,}"]
        if nodes:
            row.append(node_of.get(i, "?"))
        rows.append(row)
    if nodes:
        headers.append("node")
    lines += ["", "Shards"]
    lines += table(headers, rows, left=(0, len(headers) - 1) if nodes else (0,))
    if nodes:
        lines += ["", f"Shards over {len(nodes)} master(s)"]
        lines += fields([(name, f"{len(idx)} shard(s) {idx}, queue: "
                                f"{sum(queue[i][0] for i in idx):,} waiting, "
                                f"{sum(queue[i][1] for i in idx):,} leased")
                         for name, idx in nodes.items()])
    lines += worker_lines(builds)
    if slots is not None:
        lines += busy_slots(slots)
    ctx.print("\n".join(lines))
    return status
