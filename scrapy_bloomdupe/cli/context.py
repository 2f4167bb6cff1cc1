"""What every ``bloomdupe`` command works on: Redis, the filter's key, where output goes.

Made by ``bloomdupe COMMAND`` (:func:`standalone_context`, no project needed) or by
``scrapy bloomdupe COMMAND SPIDER`` (:func:`project_context`, the project's settings).
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

from .. import connection, fingerprint, keys, migrate, sizing
from ..bloom import meta
from ..bloom.filter import BloomFilter
from ..exceptions import BloomDupeError, ConfigError
from ..redaction import redacted
from ..settings import DEFAULTS, FINGERPRINT_MODES, BloomDupeConfig, RedisSettings
from ..transport.cluster import is_cluster
from ..transport.diagnose import describe
from ..transport.sentinel import is_sentinel_client
from .output import emit_json

if TYPE_CHECKING:
    from redis.cluster import RedisCluster
    from scrapy.settings import BaseSettings
    from scrapy.utils.request import RequestFingerprinterProtocol

PROG = "bloomdupe"
DEFAULT_REDIS_URL = "redis://localhost:6379/0"
DEFAULT_KEY_TEMPLATE = str(DEFAULTS["BLOOMDUPE_KEY"])
COMMANDS = ("info", "stats", "check", "forget", "clear", "failed", "import", "keys", "metrics",
            "top")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageProblem(Exception):
    """A bad command line (exit status 2)."""


class FilterAbsent(BloomDupeError):
    """No filter at the key."""


class DamagedFilter(BloomDupeError):
    """The filter's metadata cannot be read (exit status 1, one line)."""


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
    prog: str = PROG  # for messages: "bloomdupe" or "scrapy bloomdupe"
    spider: str | None = None  # the spider's name, when given
    #: Every crawl's key (``bloomdupe metrics`` serves several); ``(key,)`` by default.
    crawls: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.crawls = self.crawls or (self.key,)

    def print(self, text: str = "") -> None:
        print(text, file=self.out)

    def note(self, text: str) -> None:
        print(text, file=self.err, flush=True)

    def emit(self, data: dict[str, Any]) -> None:
        emit_json(self.out, data)


def _listed(value: str | list[str] | None) -> list[str]:
    """``--key``/``--spider``: one value, or a list where the command takes several."""
    if not value:
        return []
    return list(value) if isinstance(value, list) else [value]


def _crawl_keys(args: argparse.Namespace) -> list[str]:
    """The keys ``--key``, or ``--spider`` with ``--key-template``, name (validated)."""
    given, spiders = _listed(args.key), _listed(args.spider)
    if given and spiders:
        raise UsageProblem("give --key KEY or --spider NAME, not both")
    if args.key_template and not spiders:
        raise UsageProblem("--key-template applies to --spider NAME only")
    if not given and not spiders:
        raise UsageProblem("which filter? give --key KEY, or --spider NAME (key "
                           f"{DEFAULT_KEY_TEMPLATE!r})")
    template = args.key_template or DEFAULT_KEY_TEMPLATE
    found = list(given)
    for spider in spiders:
        try:
            found.append(str(template % {"spider": spider}))
        except (KeyError, ValueError, TypeError) as e:
            raise UsageProblem(f"--key-template {template!r} is not a valid %-template "
                               f"(only %(spider)s is known): {e}") from None
    for key in found:
        try:
            keys.validate_key(key)
        except ConfigError as e:
            raise UsageProblem(f"bad key {key!r}: {e.reason}") from None
    return list(dict.fromkeys(found))


def standalone_context(args: argparse.Namespace, out: TextIO, err: TextIO) -> Context:
    crawls = _crawl_keys(args)
    key = crawls[0]
    spiders = _listed(args.spider)
    url = args.redis_url or os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
    values: dict[str, Any] = {"REDIS_URL": url}
    if args.cluster:
        values["REDIS_PARAMS"] = {"redis_cls": "redis.cluster.RedisCluster"}
    for setting, given in (("BLOOMDUPE_SENTINELS", args.sentinels),
                           ("BLOOMDUPE_SENTINEL_MASTER", args.sentinel_master),
                           ("BLOOMDUPE_SENTINEL_PASSWORD", None)):
        value = given or os.environ.get(setting)
        if value:
            values[setting] = value
    settings = Settings(values)
    client = connection.from_settings(settings)
    where = describe(client) if is_sentinel_client(client) else redacted(url)
    return Context(client, key, where, settings, False, None, args.json, out, err,
                   spider=spiders[0] if spiders else None, crawls=tuple(crawls))


def project_context(settings: Settings, spider: str | None, key: str | None,
                    json_out: bool, out: TextIO, err: TextIO) -> Context:
    """``scrapy bloomdupe``'s context: project settings with the spider's and add-ons' applied."""
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
    return Context(client, key, where, effective, inside_project(), crawler, json_out, out, err,
                   "scrapy bloomdupe", spider)



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
    """Open ``ctx.key``'s filter, writing nothing; raises :class:`FilterAbsent` or
    :class:`DamagedFilter`."""
    if not migrate.filter_exists(ctx.client, ctx.key):
        others = other_filters(ctx.client)
        hint = (f" Filters there: {', '.join(repr(k) for k in others)}." if others
                else " There is no scrapy-bloomdupe filter there.")
        raise FilterAbsent(
            f"No Bloom filter at key {ctx.key!r} in Redis at {ctx.where} (no "
            f"{keys.meta(ctx.key)!r}).{hint} A filter is created by the first "
            "worker of a crawl, or by `import`.")
    check_meta(ctx)
    try:
        return BloomFilter.open(ctx.client, ctx.key, None, read_only=True)
    except (ValueError, KeyError, ArithmeticError) as e:  # what check_meta does not foresee
        raise _damaged(ctx, [f"{type(e).__name__}: {e}"]) from None


#: Fields of ``K:meta`` a filter cannot be used without.
REQUIRED_FIELDS = ("capacity", "error_rate", "shards", "bits_per_shard", "hashes", "seed")
#: Fields that must be whole numbers of at least 1 (``bits_per_shard``: at least 8).
_POSITIVE_FIELDS = {"capacity": 1, "shards": 1, "bits_per_shard": 8, "hashes": 1,
                    "generations": 1, "version": 1}


def check_meta(ctx: Context) -> dict[str, Any]:
    """The filter's decoded parameters; :class:`DamagedFilter` names every bad field."""
    raw = ctx.client.hgetall(keys.meta(ctx.key))
    fields: dict[str, Any] = {}
    problems: list[str] = []
    for name, value in raw.items():
        try:
            fields.update(meta.decode({name: value}))
        except (ValueError, UnicodeDecodeError):
            problems.append(f"{_text(name)} {_text(value)!r} is not a number")
    unreadable = {problem.split(" ", 1)[0] for problem in problems}
    problems += [f"no {name}" for name in REQUIRED_FIELDS
                 if name not in fields and name not in unreadable]
    for name, least in _POSITIVE_FIELDS.items():
        if name in fields and fields[name] < least:
            problems.append(f"{name} {fields[name]!r} is not at least {least}")
    if "hashes" in fields and fields["hashes"] > sizing.MAX_HASHES:
        problems.append(f"hashes {fields['hashes']!r} is over {sizing.MAX_HASHES}")
    rate = fields.get("error_rate")
    if rate is not None and not 0 < rate < 1:
        problems.append(f"error_rate {rate!r} is not between 0 and 1")
    if fields.get("fingerprint", "scrapy") not in FINGERPRINT_MODES:
        problems.append(f"fingerprint {fields['fingerprint']!r} is not one of "
                        f"{', '.join(FINGERPRINT_MODES)}")
    if fields.get("version", meta.FORMAT_VERSION) > meta.FORMAT_VERSION:
        problems.append(f"format version {fields['version']} is newer than this "
                        f"scrapy-bloomdupe reads ({meta.FORMAT_VERSION}): upgrade it")
    if problems:
        raise _damaged(ctx, problems)
    return fields


def _damaged(ctx: Context, problems: list[str]) -> DamagedFilter:
    return DamagedFilter(
        f"The Bloom filter's metadata {keys.meta(ctx.key)!r} in Redis at {ctx.where} is "
        f"damaged: {'; '.join(problems)}. Nothing was changed. Workers "
        "cannot use this filter either: restore the field(s), delete what is left "
        f"(`{ctx.prog} clear --key {ctx.key}`), or start a new filter under another "
        "BLOOMDUPE_KEY.")


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def missing_shards(ctx: Context, bloom: BloomFilter) -> list[str]:
    """Keys of the filter's shards missing from Redis (reads only). A worker would recreate
    them empty, and fetch again every URL they held."""
    return bloom.engine.lost_keys()  # with a window: its slices gone before their time


def report_missing(ctx: Context, missing: list[str]) -> None:
    """One line on stderr about the missing shards."""
    shown = ", ".join(repr(n) for n in missing[:5]) + (", ..." if len(missing) > 5 else "")
    ctx.note(f"{ctx.prog}: error: the Bloom filter {ctx.key!r} in Redis at {ctx.where} lacks "
             f"{len(missing)} shard(s): {shown} (deleted, or evicted by Redis's maxmemory "
             "policy?). The URLs they held are lost: the next worker to start creates them "
             "empty and fetches those URLs again. Nothing was written.")


def fingerprinter_for(ctx: Context, mode: str) -> RequestFingerprinterProtocol:
    """Fingerprint as the filter's workers do (see :func:`fingerprint.for_tool`)."""
    return fingerprint.for_tool(ctx.crawler, mode)
