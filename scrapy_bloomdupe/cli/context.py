"""What every ``bloomdupe`` command works on: Redis, the filter's key, where output goes.

Two front ends make one: the console script ``bloomdupe COMMAND ...``
(:func:`standalone_context`, no Scrapy project needed) and the Scrapy command
``scrapy bloomdupe COMMAND SPIDER ...`` (:func:`project_context`, the
project's settings with the spider's ``custom_settings`` and the add-ons).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

import redis
from scrapy import Spider
from scrapy.crawler import Crawler
from scrapy.settings import Settings
from scrapy.spiderloader import get_spider_loader
from scrapy.utils.project import inside_project

from .. import connection, fingerprint, keys, migrate
from ..bloom import meta
from ..bloom.filter import BloomFilter
from ..exceptions import BloomDupeError, ConfigError
from ..settings import DEFAULTS, BloomDupeConfig, RedisSettings
from ..transport.cluster import is_cluster
from ..transport.diagnose import describe, redacted
from .output import emit_json

if TYPE_CHECKING:
    from redis.cluster import RedisCluster
    from scrapy.settings import BaseSettings
    from scrapy.utils.request import RequestFingerprinterProtocol

PROG = "bloomdupe"
DEFAULT_REDIS_URL = "redis://localhost:6379/0"
DEFAULT_KEY_TEMPLATE = str(DEFAULTS["BLOOMDUPE_KEY"])
COMMANDS = ("info", "stats", "check", "clear", "failed", "import")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


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
        emit_json(self.out, data)


def standalone_context(args: argparse.Namespace, out: TextIO, err: TextIO) -> Context:
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
        keys.validate_key(key)
    except ConfigError as e:
        raise UsageProblem(f"bad key {key!r}: {e.reason}") from None
    url = args.redis_url or os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
    values: dict[str, Any] = {"REDIS_URL": url}
    if args.cluster:
        values["REDIS_PARAMS"] = {"redis_cls": "redis.cluster.RedisCluster"}
    settings = Settings(values)
    client = connection.from_settings(settings)
    return Context(client, key, redacted(url), settings, False, None, args.json, out, err)


def project_context(settings: Settings, spider: str | None, key: str | None,
                    json_out: bool, out: TextIO, err: TextIO) -> Context:
    """The context of ``scrapy bloomdupe``: the project's settings, with the spider's
    ``custom_settings`` and the add-ons applied as a crawl would apply them."""
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
        keys.validate_key(key)
    except ConfigError as e:
        raise UsageProblem(f"bad key {key!r}: {e.reason}") from None
    client = connection.from_settings(effective)
    url = RedisSettings.from_settings(effective).url
    where = redacted(url) if url else describe(client)
    return Context(client, key, where, effective, inside_project(), crawler, json_out, out, err)



# -- the filter -----------------------------------------------------------------------


def other_filters(client: redis.Redis | RedisCluster, limit: int = 10,
                  scans: int = 50) -> list[str]:
    """Keys of filters in this database (a bounded SCAN; single node only), for hints."""
    if is_cluster(client):
        return []
    try:
        return _scan_filters(client, limit, scans)
    except redis.ResponseError:  # SCAN not granted (a least-privilege ACL user): no hint
        return []


def _scan_filters(client: redis.Redis | RedisCluster, limit: int, scans: int) -> list[str]:
    found: list[str] = []
    cursor: int = 0
    for _ in range(scans):
        cursor, names = client.scan(cursor, match=keys.ALL_METAS, count=1000, _type="HASH")
        for name in names:
            text = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
            if meta.is_filter_meta(client, name):
                found.append(text[: -len(keys.META_SUFFIX)])
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
            f"{keys.meta(ctx.key)!r}).{hint} A filter is created by the first "
            "worker of a crawl, or by `import`.")
    return BloomFilter.open(ctx.client, ctx.key, None)


def fingerprinter_for(ctx: Context, mode: str) -> RequestFingerprinterProtocol:
    """Fingerprint as the filter's workers do (see :func:`fingerprint.for_tool`)."""
    return fingerprint.for_tool(ctx.crawler, mode)
