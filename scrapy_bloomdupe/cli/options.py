"""The ``bloomdupe`` parser, and the options ``scrapy bloomdupe`` adds to Scrapy's own."""

from __future__ import annotations

import argparse
from typing import Any

from .. import __version__, migrate
from ..crawlfigures import FILTER_EVERY
from ..frontier.queue import LEASE_TIMEOUT
from ..settings import DEFAULTS
from .context import DEFAULT_KEY_TEMPLATE, DEFAULT_REDIS_URL, PROG
from .metrics import DEFAULT_HOST


def _add_common(parser: argparse.ArgumentParser, *, suppress: bool, several: bool = False
                ) -> None:
    """The Redis, key and ``--json`` options, on the main parser and each command's, with
    ``SUPPRESS`` defaults (neither overwrites the other; :func:`standalone_defaults`)."""
    default = argparse.SUPPRESS if suppress else None
    group = parser.add_argument_group("Redis and filter")
    group.add_argument("--redis-url", metavar="URL", default=default,
                       help=f"Redis to use (default: $REDIS_URL, else {DEFAULT_REDIS_URL})")
    group.add_argument("--cluster", action="store_true", default=default,
                       help="the URL is a node of a Redis Cluster")
    group.add_argument("--sentinels", metavar="HOST:PORT,...", default=default,
                       help="Redis Sentinel: the sentinels (default: $BLOOMDUPE_SENTINELS); "
                            "the master's password and db come from the URL, the "
                            "sentinels' password from $BLOOMDUPE_SENTINEL_PASSWORD")
    group.add_argument("--sentinel-master", metavar="NAME", default=default,
                       help="Redis Sentinel: the master's name (default: "
                            "$BLOOMDUPE_SENTINEL_MASTER)")
    # ``several``: a command that serves several crawls takes them repeated.
    repeated: dict[str, Any] = {"action": "append"} if several else {}
    again = " (may be repeated)" if several else ""
    group.add_argument("--key", metavar="KEY", default=default, **repeated,
                       help=f"the filter's key (BLOOMDUPE_KEY, resolved){again}")
    group.add_argument("--spider", metavar="NAME", default=default, **repeated,
                       help="the spider whose filter to use: the key is --key-template "
                            f"with %%(spider)s = NAME{again}")
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


def add_forget_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("forget options")
    group.add_argument("--file", default=None, metavar="FILE",
                       help="more URLs to forget, one a line ('-': standard input)")


def add_clear_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("clear options")
    group.add_argument("-y", "--yes", action="store_true",
                       help="delete without asking to type the key")


def add_failed_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("failed options")
    group.add_argument("--requeue", action="store_true",
                       help="put the failed requests back in the crawl's queue, past the "
                            "filter, and forget them: the next run fetches them again")
    group.add_argument("--limit", type=int, default=None, metavar="N",
                       help="list at most N (the oldest first)")


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


def _add_watch_options(group: argparse._ArgumentGroup) -> None:
    """What ``metrics`` and ``top`` share: how to read the crawl."""
    group.add_argument("--lease-timeout", type=float, default=LEASE_TIMEOUT, metavar="SECONDS",
                       help="the crawl's BLOOMDUPE_LEASE_TIMEOUT: a worker that has not "
                            f"heartbeat for this long is not alive (default {LEASE_TIMEOUT:g})")
    group.add_argument("--filter-every", type=float, default=FILTER_EVERY, metavar="SECONDS",
                       help="read the filter's fill (a scan of every shard in Redis) at most "
                            f"this often (default {FILTER_EVERY:g})")


def add_metrics_options(parser: argparse.ArgumentParser, *, standalone: bool) -> None:
    group = parser.add_argument_group("metrics options")
    group.add_argument("--port", type=int, required=standalone, default=None, metavar="PORT",
                       help="serve /metrics on this port (0: any free one, printed)")
    group.add_argument("--host", default=DEFAULT_HOST, metavar="HOST",
                       help=f"address to listen on (default {DEFAULT_HOST})")
    _add_watch_options(group)


def add_top_options(parser: argparse.ArgumentParser, *, standalone: bool) -> None:
    group = parser.add_argument_group("top options")
    group.add_argument("--once", action="store_true", help="print one frame and exit")
    group.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                       help="seconds between two frames (default 1)")
    if standalone:
        _add_watch_options(group)


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
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _add_common(parser, suppress=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, text: str, several: bool = False) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=text, description=text)
        _add_common(sub, suppress=True, several=several)
        return sub

    command("info", "the filter's parameters, fill per generation and shard, estimated items, "
                    "false-positive rate, memory")
    command("stats", "crawl-wide counters (checked, new, duplicates, hit rate) and each "
                     "worker's, with when it was last seen")
    check = command("check", "whether each URL is in the filter (seen) or not (new), "
                             "without adding it")
    check.add_argument("urls", nargs="+", metavar="URL")
    add_check_options(check)
    forget = command("forget", "re-admit URLs: the next request for each counts as new, "
                               "once, on every worker (with or without a window)")
    forget.add_argument("urls", nargs="*", metavar="URL")
    add_check_options(forget)
    add_forget_options(forget)
    clear = command("clear", "delete the filter and its crawl stats (asks to type the key)")
    add_clear_options(clear)
    failed = command("failed", "requests that failed for good (after retries, or an HTTP "
                               "error status), kept in Redis; --requeue fetches them again")
    add_failed_options(failed)
    imp = command("import", "add the fingerprints of a scrapy-redis SET or of a JOBDIR's "
                            "requests.seen to the filter (created if absent)")
    add_import_options(imp, standalone=True)
    command("keys", "every Redis key of the crawl (filter shards, metadata, op logs, queue "
                    "shards, leases, failed requests, stats) with what it holds; reads only")
    served = command("metrics", "serve the crawl's figures to Prometheus at /metrics, read from "
                                "Redis at each scrape; --spider (or --key) may be repeated to "
                                "serve several crawls; runs until stopped", several=True)
    add_metrics_options(served, standalone=True)
    watched = command("top", "a live view of the crawl, refreshed every second: workers and "
                             "their pages/s, queue, leases put back, fill, estimated "
                             "false-positive rate, failed requests")
    add_top_options(watched, standalone=True)
    return parser


def standalone_defaults(args: argparse.Namespace) -> argparse.Namespace:
    values = vars(args)
    values.setdefault("redis_url", None)
    values.setdefault("cluster", False)
    values.setdefault("sentinels", None)
    values.setdefault("sentinel_master", None)
    values.setdefault("key", None)
    values.setdefault("spider", None)
    values.setdefault("key_template", None)
    values.setdefault("json", False)
    values["cluster"] = bool(values["cluster"])
    values["json"] = bool(values["json"])
    return args



#: Options of ``scrapy bloomdupe`` and the commands they apply to.
PROJECT_OPTIONS: dict[str, tuple[str, Any, tuple[str, ...]]] = {
    # dest: (option, default, commands)
    "method": ("--method", "GET", ("check", "forget")),
    "body": ("--body", None, ("check", "forget")),
    "file": ("--file", None, ("forget",)),
    "yes": ("--yes", False, ("clear",)),
    "requeue": ("--requeue", False, ("failed",)),
    "limit": ("--limit", None, ("failed",)),
    "from_set": ("--from-set", None, ("import",)),
    "from_jobdir": ("--from-jobdir", None, ("import",)),
    "batch_size": ("--batch-size", migrate.DEFAULT_BATCH_SIZE, ("import",)),
    "progress": ("--no-progress", True, ("import",)),
    "port": ("--port", None, ("metrics",)),
    "host": ("--host", DEFAULT_HOST, ("metrics",)),
    "once": ("--once", False, ("top",)),
    "interval": ("--interval", 1.0, ("top",)),
    "lease_timeout": ("--lease-timeout", LEASE_TIMEOUT, ("metrics", "top")),
    "filter_every": ("--filter-every", FILTER_EVERY, ("metrics", "top")),
}


def add_project_options(parser: argparse.ArgumentParser) -> None:
    """``scrapy bloomdupe``'s options, added to Scrapy's own (``-s``, ``--loglevel``, ...)."""
    group = parser.add_argument_group("filter options")
    group.add_argument("--key", metavar="KEY",
                       help="the filter's key, instead of BLOOMDUPE_KEY with the spider's name")
    group.add_argument("--json", action="store_true", default=False,
                       help="print JSON for scripts instead of tables")
    add_check_options(parser)
    add_forget_options(parser)
    add_clear_options(parser)
    add_failed_options(parser)
    add_import_options(parser, standalone=False)
    add_metrics_options(parser, standalone=False)
    add_top_options(parser, standalone=False)
