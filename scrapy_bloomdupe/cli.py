"""``bloomdupe``: look at, check, clear and fill a scrapy-bloomdupe filter from the shell.

Two front ends share this module:

* the console script ``bloomdupe COMMAND ...`` (also ``python -m
  scrapy_bloomdupe.cli``), which needs no Scrapy project: Redis from
  ``--redis-url`` (default ``$REDIS_URL``, else ``redis://localhost:6379/0``),
  the filter's key from ``--key KEY`` or ``--spider NAME`` and
  ``--key-template`` (default ``%(spider)s:bloomdupe``);
* the Scrapy command ``scrapy bloomdupe COMMAND SPIDER ...``
  (:mod:`scrapy_bloomdupe.commands.bloomdupe`), which reads the project's
  settings (``BLOOMDUPE_KEY``, ``REDIS_URL``/``BLOOMDUPE_REDIS_URL``,
  ``REDIS_PARAMS``, ``REQUEST_FINGERPRINTER_CLASS``, the spider's
  ``custom_settings``, add-ons) and Scrapy's ``-s NAME=VALUE``.

Commands: ``info``, ``stats``, ``check URL...``, ``clear [--yes]``, ``import
--from-set KEY | --from-jobdir DIR``. Tables for people, ``--json`` for
scripts. Exit status: 0 done (``check``: every URL answered, seen or new), 1
failed (Redis unreachable, no filter at the key, an import refused, ``clear``
not confirmed), 2 usage (a bad option, a bad URL), 130 interrupted. Passwords
in Redis URLs are never printed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TextIO

import redis

from . import connection, crawlstats, migrate
from .exceptions import BloomDupeError, ConfigError
from .filter import BloomFilter, FilterInfo, validate_key
from .fingerprint import ScrapyRedisFingerprinter
from .settings import DEFAULTS, BloomDupeConfig

if TYPE_CHECKING:
    from redis.cluster import RedisCluster
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings, Settings
    from scrapy.utils.request import RequestFingerprinterProtocol

PROG = "bloomdupe"
DEFAULT_REDIS_URL = "redis://localhost:6379/0"
DEFAULT_KEY_TEMPLATE = str(DEFAULTS["BLOOMDUPE_KEY"])
COMMANDS = ("info", "stats", "check", "clear", "import")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: Plain progress lines (stderr not a terminal) at most this often, in seconds.
PROGRESS_INTERVAL = 2.0

logger = logging.getLogger(__name__)


class UsageProblem(Exception):
    """A bad command line (exit status 2)."""


class FilterAbsent(BloomDupeError):
    """No filter at the key."""


@dataclass
class Context:
    """What every command works on."""

    client: redis.Redis | RedisCluster
    key: str
    where: str  # Redis, for people (no password)
    settings: BaseSettings
    project: bool  # settings are a Scrapy project's
    crawler: Crawler | None  # for the project's REQUEST_FINGERPRINTER_CLASS
    json: bool
    out: TextIO
    err: TextIO

    def print(self, text: str = "") -> None:
        print(text, file=self.out)

    def note(self, text: str) -> None:
        print(text, file=self.err, flush=True)

    def emit(self, data: dict[str, Any]) -> None:
        self.out.write(json.dumps(_json_safe(data), indent=2) + "\n")


# -- options ------------------------------------------------------------------------


def _add_common(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """``--redis-url``, ``--key``/``--spider``, ``--key-template``, ``--cluster``, ``--json``.

    Given to the main parser and to every command's (so they may come before
    or after the command), with ``SUPPRESS`` defaults so neither overwrites the
    other; :func:`_standalone_defaults` fills them in.
    """
    default = argparse.SUPPRESS if suppress else None
    group = parser.add_argument_group("Redis and filter")
    group.add_argument("--redis-url", metavar="URL", default=default,
                       help=f"Redis to use (default: $REDIS_URL, else {DEFAULT_REDIS_URL})")
    group.add_argument("--cluster", action="store_true", default=default,
                       help="the URL is a node of a Redis Cluster")
    group.add_argument("--key", metavar="KEY", default=default,
                       help="the filter's key (BLOOMDUPE_KEY, resolved)")
    group.add_argument("--spider", metavar="NAME", default=default,
                       help="the spider whose filter to use: the key is --key-template "
                            "with %%(spider)s = NAME")
    group.add_argument("--key-template", metavar="TEMPLATE", default=default,
                       help=f"BLOOMDUPE_KEY template for --spider (default "
                            f"{DEFAULT_KEY_TEMPLATE.replace('%', '%%')!r})")
    _add_json(parser, default)


def _add_json(parser: argparse.ArgumentParser, default: Any = False) -> None:
    parser.add_argument("--json", action="store_true", default=default,
                        help="print JSON for scripts instead of tables")


def add_check_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("check options")
    group.add_argument("--method", default="GET",
                       help="HTTP method of the requests to check (default GET)")
    group.add_argument("--body", default=None, help="body of the requests to check")


def add_clear_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("clear options")
    group.add_argument("-y", "--yes", action="store_true",
                       help="delete without asking to type the key")


def add_import_options(parser: argparse.ArgumentParser, *, standalone: bool) -> None:
    group = parser.add_argument_group("import options")
    source = group.add_mutually_exclusive_group(required=standalone)
    source.add_argument("--from-set", metavar="KEY",
                        help="scrapy-redis's dupefilter SET (e.g. 'myspider:dupefilter'); "
                             "needs a filter with BLOOMDUPE_FINGERPRINT = 'scrapy-redis'")
    source.add_argument("--from-jobdir", metavar="DIR",
                        help="a Scrapy JOBDIR (its requests.seen) or the requests.seen file; "
                             "needs a filter with BLOOMDUPE_FINGERPRINT = 'scrapy'")
    group.add_argument("--batch-size", type=int, default=migrate.DEFAULT_BATCH_SIZE,
                       metavar="N", help=f"fingerprints a round trip "
                                         f"(default {migrate.DEFAULT_BATCH_SIZE})")
    group.add_argument("--no-progress", dest="progress", action="store_false",
                       help="no progress bar or progress lines on stderr")
    if standalone:
        group.add_argument("--capacity", type=str, metavar="N",
                           help="BLOOMDUPE_CAPACITY of a new filter (default "
                                f"{DEFAULTS['BLOOMDUPE_CAPACITY']:_})")
        group.add_argument("--error-rate", type=str, metavar="P",
                           help="BLOOMDUPE_ERROR_RATE of a new filter (default "
                                f"{DEFAULTS['BLOOMDUPE_ERROR_RATE']})")
        group.add_argument("-s", "--set", dest="settings", action="append", default=[],
                           metavar="NAME=VALUE",
                           help="any other BLOOMDUPE_* setting of a new filter, as the "
                                "crawl will have it (BLOOMDUPE_SHARDS, BLOOMDUPE_GROWTH, "
                                "BLOOMDUPE_FINGERPRINT, BLOOMDUPE_LOCK, ...); may be repeated")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Look at, check, clear and fill the Redis Bloom filter of a "
                    "scrapy-bloomdupe crawl. Inside a Scrapy project, `scrapy bloomdupe "
                    "COMMAND SPIDER` does the same with the project's settings.",
        epilog="Exit status: 0 done, 1 failed (Redis unreachable, no filter, import refused, "
               "clear not confirmed), 2 bad usage. `bloomdupe COMMAND -h` for a command's "
               "options.",
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _add_common(parser, suppress=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=text, description=text)
        _add_common(sub, suppress=True)
        return sub

    command("info", "the filter's parameters, fill per generation and shard, estimated items, "
                    "false-positive rate, memory")
    command("stats", "crawl-wide counters (checked, new, duplicates, hit rate) and each "
                     "worker's, with when it was last seen")
    check = command("check", "whether each URL is in the filter (seen) or not (new), "
                             "without adding it")
    check.add_argument("urls", nargs="+", metavar="URL")
    add_check_options(check)
    clear = command("clear", "delete the filter and its crawl stats (asks to type the key)")
    add_clear_options(clear)
    imp = command("import", "add the fingerprints of a scrapy-redis SET or of a JOBDIR's "
                            "requests.seen to the filter (created if absent)")
    add_import_options(imp, standalone=True)
    return parser


def _standalone_defaults(args: argparse.Namespace) -> argparse.Namespace:
    values = vars(args)
    values.setdefault("redis_url", None)
    values.setdefault("cluster", False)
    values.setdefault("key", None)
    values.setdefault("spider", None)
    values.setdefault("key_template", None)
    values.setdefault("json", False)
    values["cluster"] = bool(values["cluster"])
    values["json"] = bool(values["json"])
    return args


# -- contexts -------------------------------------------------------------------------


def standalone_context(args: argparse.Namespace, out: TextIO, err: TextIO) -> Context:
    from scrapy.settings import Settings

    if args.key and args.spider:
        raise UsageProblem("give --key KEY or --spider NAME, not both")
    if args.key_template and not args.spider:
        raise UsageProblem("--key-template applies to --spider NAME only")
    if args.key:
        key = args.key
    elif args.spider:
        template = args.key_template or DEFAULT_KEY_TEMPLATE
        try:
            key = str(template % {"spider": args.spider})
        except (KeyError, ValueError, TypeError) as e:
            raise UsageProblem(f"--key-template {template!r} is not a valid %-template "
                               f"(only %(spider)s is known): {e}") from None
    else:
        raise UsageProblem("which filter? give --key KEY, or --spider NAME (key "
                           f"{DEFAULT_KEY_TEMPLATE!r})")
    try:
        validate_key(key)
    except ConfigError as e:
        raise UsageProblem(f"bad key {key!r}: {e.reason}") from None
    url = args.redis_url or os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
    values: dict[str, Any] = {"REDIS_URL": url}
    if args.cluster:
        values["REDIS_PARAMS"] = {"redis_cls": "redis.cluster.RedisCluster"}
    settings = Settings(values)
    client = connection.from_settings(settings)
    return Context(client, key, connection.redacted(url), settings, False, None, args.json,
                   out, err)


def project_context(settings: Settings, spider: str | None, key: str | None,
                    json_out: bool, out: TextIO, err: TextIO) -> Context:
    """The context of ``scrapy bloomdupe``: the project's settings, with the spider's
    ``custom_settings`` and the add-ons applied as a crawl would apply them."""
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.spiderloader import get_spider_loader
    from scrapy.utils.project import inside_project

    spidercls: type[Spider] | None = None
    if spider is not None:
        loader = get_spider_loader(settings)
        try:
            spidercls = loader.load(spider)
        except KeyError:
            known = sorted(loader.list())
            if known and key is None:
                raise UsageProblem(
                    f"this project has no spider {spider!r} (it has: {', '.join(known)}); "
                    "give one of them, or the filter's key with --key KEY") from None
    if spidercls is None:
        name = spider or "bloomdupe"
        spidercls = type("BloomDupeToolSpider", (Spider,), {"name": name})
    crawler = Crawler(spidercls, settings)  # applies the spider's custom_settings
    crawler.addons.load_settings(crawler.settings)
    effective = crawler.settings
    if key is None:
        assert spider is not None
        key = BloomDupeConfig.from_settings(effective).key_for(spider)
    try:
        validate_key(key)
    except ConfigError as e:
        raise UsageProblem(f"bad key {key!r}: {e.reason}") from None
    client = connection.from_settings(effective)
    url, _ = connection.client_params(effective)
    where = connection.redacted(url) if url else connection.describe(client)
    return Context(client, key, where, effective, inside_project(), crawler, json_out, out, err)


# -- helpers --------------------------------------------------------------------------


def _json_safe(value: Any) -> Any:
    """JSON has no infinity or NaN: those become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *,
          left: Sequence[int] = (0,), indent: str = "  ") -> list[str]:
    """Columns padded to their widest cell; the ``left`` columns left-aligned, others right."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [c.ljust(w) if i in left else c.rjust(w)
                 for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return (indent + "  ".join(parts)).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def fields(pairs: Sequence[tuple[str, str]], indent: str = "  ") -> list[str]:
    width = max(len(name) for name, _ in pairs)
    return [f"{indent}{name:<{width}}  {value}" for name, value in pairs]


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def count(n: float) -> str:
    return "full" if math.isinf(n) else f"{n:,.0f}"


def rate(p: float) -> str:
    return f"{p:.2g}"


def percent(x: float) -> str:
    return f"{x:.2%}"


def ago(seconds: float) -> str:
    """``12 s ago``, ``5 min ago``, ``3.2 h ago``, ``2.0 d ago``."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} d ago"


def when(timestamp: float | None) -> str:
    if not timestamp:
        return "-"
    moment = datetime.fromtimestamp(timestamp, tz=timezone.utc)
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC ({ago(time.time() - timestamp)})"


def is_cluster_client(client: object) -> bool:
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def shard_spread(client: redis.Redis | RedisCluster, bloom: BloomFilter
                 ) -> dict[str, list[int]] | None:
    """Which master holds which shards, on a cluster client (None elsewhere, or when
    this installation has no ``scrapy_bloomdupe.cluster.shard_nodes``)."""
    if not is_cluster_client(client):
        return None
    try:
        cluster_module = importlib.import_module("scrapy_bloomdupe.cluster")
    except ImportError:
        return None
    shard_nodes = getattr(cluster_module, "shard_nodes", None)
    if shard_nodes is None:
        return None
    spread: dict[str, list[int]] = shard_nodes(client, bloom)
    return spread


def other_filters(client: redis.Redis | RedisCluster, limit: int = 10,
                  scans: int = 50) -> list[str]:
    """Keys of filters in this database (a bounded SCAN; single node only), for hints."""
    if is_cluster_client(client):
        return []
    try:
        return _scan_filters(client, limit, scans)
    except redis.ResponseError:  # SCAN not granted (a least-privilege ACL user): no hint
        return []


def _scan_filters(client: redis.Redis | RedisCluster, limit: int, scans: int) -> list[str]:
    found: list[str] = []
    cursor: int = 0
    for _ in range(scans):
        cursor, names = client.scan(cursor, match="*:meta", count=1000, _type="HASH")
        for name in names:
            text = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
            if client.hexists(name, "bits_per_shard") and client.hexists(name, "seed"):
                found.append(text[: -len(":meta")])
                if len(found) >= limit:
                    return sorted(found)
        if int(cursor) == 0:
            break
    return sorted(found)


def open_existing(ctx: Context) -> BloomFilter:
    if not migrate.filter_exists(ctx.client, ctx.key):
        others = other_filters(ctx.client)
        hint = (f" Filters there: {', '.join(repr(k) for k in others)}." if others
                else " There is no scrapy-bloomdupe filter there.")
        raise FilterAbsent(
            f"No Bloom filter at key {ctx.key!r} in Redis at {ctx.where} (no "
            f"{BloomFilter.meta_key(ctx.key)!r}).{hint} A filter is created by the first "
            "worker of a crawl, or by `import`.")
    return BloomFilter.open(ctx.client, ctx.key, None)


def fingerprinter_for(ctx: Context, mode: str) -> RequestFingerprinterProtocol:
    """Fingerprint as the filter's workers do: its stored mode; for "scrapy", the project's
    REQUEST_FINGERPRINTER_CLASS in a project, Scrapy's default one outside."""
    if mode == "scrapy-redis":
        return ScrapyRedisFingerprinter()
    if ctx.crawler is not None:
        from scrapy.utils.misc import build_from_crawler, load_object

        cls = load_object(ctx.crawler.settings["REQUEST_FINGERPRINTER_CLASS"])
        fingerprinter: RequestFingerprinterProtocol = build_from_crawler(cls, ctx.crawler)
        return fingerprinter
    from scrapy.utils.request import RequestFingerprinter

    return RequestFingerprinter()


# -- info -----------------------------------------------------------------------------

#: BLOOMDUPE_FINGERPRINT modes, for people.
FINGERPRINT_MODES = {
    "scrapy": "Scrapy's request fingerprinter (REQUEST_FINGERPRINTER_CLASS)",
    "scrapy-redis": "scrapy-redis's sha1 hex fingerprint, as in its dupefilter SET",
}


def filter_fpr(info: FilterInfo) -> float:
    """The filter's false-positive rate now; below float precision of 1 - prod(1 - p_g),
    the sum of the generations' rates (the same to first order)."""
    fpr = info.estimated_false_positive_rate
    if fpr < 1e-12:
        fpr = sum(g.estimated_false_positive_rate for g in info.generations)
    return fpr



def info_dict(ctx: Context, bloom: BloomFilter, info: FilterInfo,
              nodes: dict[str, list[int]] | None) -> dict[str, Any]:
    data = info.as_dict()
    data.update({
        "redis": ctx.where,
        "fingerprint": bloom.fingerprint,
        "hashes": info.sizing.hashes,
        "bits_per_shard": info.sizing.bits_per_shard,
        "generation_count": len(info.generations),
        "total_bits": info.total_bits,
        "nodes": nodes,
    })
    return data


def cmd_info(ctx: Context, opts: argparse.Namespace) -> int:
    bloom = open_existing(ctx)
    try:
        info = bloom.info()
        nodes = shard_spread(ctx.client, bloom)
    finally:
        bloom.close()
    if ctx.json:
        ctx.emit(info_dict(ctx, bloom, info, nodes))
        return EXIT_OK
    first = info.sizing
    newest = info.generations[-1].sizing
    growth = "on" if info.growth else "off"
    if info.growth:
        growth += f" (each new generation twice the last; newest holds {newest.capacity:,})"
    lines = [f"Bloom filter {info.key!r} in Redis at {ctx.where}"]
    lines += fields([
        ("created", when(info.created)),
        ("fingerprints", f"{bloom.fingerprint}: {FINGERPRINT_MODES.get(bloom.fingerprint, '?')}"),
        ("capacity", f"{first.capacity:,} at error rate {rate(first.error_rate)} (first "
                     f"generation); {info.capacity:,} in all"),
        ("shards", f"{first.shards}, {human_bytes(first.bytes_per_shard)} each in generation 0"),
        ("hashes", str(first.hashes)),
        ("growth", growth),
        ("generations", str(len(info.generations))),
        ("estimated items", f"{count(info.estimated_items)} "
                            f"({info.estimated_items / info.capacity:.1%} of capacity)"),
        ("fill", f"{percent(info.fill_ratio)} of {info.total_bits:,} bits"),
        ("est. false-positive rate", f"{rate(filter_fpr(info))} now"),
        ("memory", human_bytes(info.memory_bytes)),
    ])
    lines += ["", "Generations"]
    lines += table(
        ["gen", "capacity", "error rate", "bits/shard", "hashes", "fill", "est. items",
         "est. FPR", "memory"],
        [[str(g.index), f"{g.sizing.capacity:,}", rate(g.sizing.error_rate),
          f"{g.sizing.bits_per_shard:,}", str(g.sizing.hashes), percent(g.fill_ratio),
          count(g.estimated_items), rate(g.estimated_false_positive_rate),
          human_bytes(g.memory_bytes)] for g in info.generations],
    )
    node_of: dict[int, str] = {}
    if nodes:
        for name, indexes in nodes.items():
            for index in indexes:
                node_of[index] = name
    headers = ["shard", *(f"fill g{g.index}" for g in info.generations), "memory"]
    rows = []
    for i in range(first.shards):
        row = [str(i), *(percent(g.shards[i].fill_ratio) for g in info.generations),
               human_bytes(sum(g.shards[i].memory_bytes for g in info.generations))]
        if nodes:
            row.append(node_of.get(i, "?"))
        rows.append(row)
    if nodes:
        headers.append("node")
    lines += ["", "Shards"]
    lines += table(headers, rows, left=(0, len(headers) - 1) if nodes else (0,))
    if nodes:
        lines += ["", f"Shards over {len(nodes)} master(s)"]
        lines += fields([(name, f"{len(idx)} shard(s) {idx}") for name, idx in nodes.items()])
    ctx.print("\n".join(lines))
    return EXIT_OK


# -- stats ----------------------------------------------------------------------------


def cmd_stats(ctx: Context, opts: argparse.Namespace) -> int:
    data = crawlstats.read(ctx.client, ctx.key)
    exists = migrate.filter_exists(ctx.client, ctx.key)
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
            "totals": totals,
            "workers": [
                {"id": wid, **line,
                 "last_seen_seconds_ago": (now - line["last_seen"]) if line.get("last_seen")
                 else None}
                for wid, line in workers
            ],
        })
        return EXIT_OK
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
    return EXIT_OK


# -- check ----------------------------------------------------------------------------


def cmd_check(ctx: Context, opts: argparse.Namespace) -> int:
    from scrapy import Request

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


# -- clear ----------------------------------------------------------------------------


def cmd_clear(ctx: Context, opts: argparse.Namespace, stdin: TextIO | None = None) -> int:
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


# -- import ---------------------------------------------------------------------------


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
            from tqdm import tqdm  # type: ignore[import-untyped]

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
    from scrapy.settings import Settings
    from scrapy.utils.conf import arglist_to_dict

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


def cmd_import(ctx: Context, opts: argparse.Namespace) -> int:
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
                 f"{bloom.fingerprint} fingerprints)")
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
            f"BLOOMDUPE_FINGERPRINT = 'scrapy-redis' and BLOOMDUPE_KEY naming {ctx.key!r}; "
            f"scrapy-redis's request queue is used as it is. The SET {source.name!r} is left "
            "as it was: delete it once the new crawl runs well.")]
    else:
        lines += ["", (
            f"Next: crawl with DUPEFILTER_CLASS = "
            f"'scrapy_bloomdupe.dupefilter.RedisBloomDupeFilter' (BLOOMDUPE_FINGERPRINT = "
            f"'scrapy', the default) and BLOOMDUPE_KEY naming {ctx.key!r}. Only the seen "
            "fingerprints were imported, not the JOBDIR's pending requests.")]
    ctx.print("\n".join(lines))
    return EXIT_OK


# -- running ----------------------------------------------------------------------------

HANDLERS: dict[str, Callable[[Context, argparse.Namespace], int]] = {
    "info": cmd_info,
    "stats": cmd_stats,
    "check": cmd_check,
    "clear": cmd_clear,
    "import": cmd_import,
}


def _setup_logging() -> None:
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"{PROG}: %(levelname)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.WARNING)


def execute(command: str, make_context: Callable[[], Context], opts: argparse.Namespace,
            err: TextIO, prog: str = PROG) -> int:
    """Run ``command``; every failure a user can fix becomes one line on stderr."""
    ctx: Context | None = None
    try:
        ctx = make_context()
        connection.check(ctx.client)
        return HANDLERS[command](ctx, opts)
    except UsageProblem as e:
        print(f"{prog}: error: {e}", file=err)
        return EXIT_USAGE
    except BloomDupeError as e:
        print(f"{prog}: error: {e}", file=err)
        return EXIT_FAILED
    except redis.RedisError as e:
        where = ctx.where if ctx is not None else "?"
        print(f"{prog}: error: Redis at {where}: {type(e).__name__}: {e}", file=err)
        return EXIT_FAILED
    except OSError as e:
        print(f"{prog}: error: {e}", file=err)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=err)
        return EXIT_INTERRUPTED
    finally:
        if ctx is not None:
            ctx.client.close()


def main(argv: Sequence[str] | None = None) -> int:
    """The ``bloomdupe`` console script."""
    parser = build_parser()
    args = _standalone_defaults(parser.parse_args(argv))
    if not args.command:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    _setup_logging()
    return execute(args.command, lambda: standalone_context(args, sys.stdout, sys.stderr),
                   args, sys.stderr)


# -- the Scrapy command's side -------------------------------------------------------------

#: Options of ``scrapy bloomdupe`` and the commands they apply to.
_PROJECT_OPTIONS: dict[str, tuple[str, Any, tuple[str, ...]]] = {
    # dest: (option, default, commands)
    "method": ("--method", "GET", ("check",)),
    "body": ("--body", None, ("check",)),
    "yes": ("--yes", False, ("clear",)),
    "from_set": ("--from-set", None, ("import",)),
    "from_jobdir": ("--from-jobdir", None, ("import",)),
    "batch_size": ("--batch-size", migrate.DEFAULT_BATCH_SIZE, ("import",)),
    "progress": ("--no-progress", True, ("import",)),
}


def add_project_options(parser: argparse.ArgumentParser) -> None:
    """``scrapy bloomdupe``'s options, added to Scrapy's own (``-s``, ``--loglevel``, ...)."""
    group = parser.add_argument_group("filter options")
    group.add_argument("--key", metavar="KEY",
                       help="the filter's key, instead of BLOOMDUPE_KEY with the spider's name")
    group.add_argument("--json", action="store_true", default=False,
                       help="print JSON for scripts instead of tables")
    add_check_options(parser)
    add_clear_options(parser)
    add_import_options(parser, standalone=False)


def run_project_command(settings: Settings, args: list[str], opts: argparse.Namespace,
                        out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``scrapy bloomdupe COMMAND [SPIDER] [URL...]``; returns the exit status.

    Raises :class:`UsageProblem` for a bad command line (the caller shows usage).
    """
    out = out or sys.stdout
    err = err or sys.stderr
    if not args:
        raise UsageProblem(f"give a command: {', '.join(COMMANDS)}")
    command, rest = args[0], list(args[1:])
    if command not in COMMANDS:
        raise UsageProblem(f"unknown command {command!r}: use one of {', '.join(COMMANDS)}")
    unknown = [a for a in rest if a.startswith("-")]
    if unknown:
        raise UsageProblem(f"unknown option(s) {' '.join(unknown)}")
    for dest, (option, default, commands) in _PROJECT_OPTIONS.items():
        if getattr(opts, dest, default) != default and command not in commands:
            raise UsageProblem(f"{option} applies to {' and '.join(commands)} only")
    spider: str | None = None
    if opts.key is None:
        if not rest:
            raise UsageProblem(f"which spider's filter? scrapy bloomdupe {command} SPIDER "
                               "(or --key KEY)")
        spider = rest.pop(0)
    if command == "check":
        if not rest:
            raise UsageProblem("check which URLs? scrapy bloomdupe check SPIDER URL [URL ...]")
        opts.urls = rest
    elif rest:
        raise UsageProblem(f"unexpected argument(s) for {command}: {' '.join(rest)}")
    if command == "import":
        opts.capacity = opts.error_rate = None
        opts.settings = []
    _setup_logging()
    key = opts.key
    return execute(command, lambda: project_context(settings, spider, key, opts.json, out, err),
                   opts, err, prog="scrapy bloomdupe")


if __name__ == "__main__":
    sys.exit(main())
