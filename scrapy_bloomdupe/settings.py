"""Every setting this package reads (``BLOOMDUPE_*``, scrapy-redis's ``REDIS_*``), its default,
and the objects built from them, parsed once at start; each error names the setting and value
(setting-agnostic parsers: :mod:`.settingvalues`). :class:`BloomDupeConfig` is the filter's,
:class:`RedisSettings` the client's."""

from __future__ import annotations

import difflib
import importlib
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.cluster import RedisCluster

from . import redisargs, sizing
from .exceptions import ConfigError
from .keys import validate_key
from .settingvalues import (
    is_none,
    is_unset,
    parse_bool,
    parse_choice,
    parse_codes,
    parse_dict,
    parse_float,
    parse_int,
)

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

#: Defaults, also what ``BloomDupeAddon`` documents.
DEFAULTS: dict[str, Any] = {
    "BLOOMDUPE_CAPACITY": 10_000_000,
    "BLOOMDUPE_ERROR_RATE": 0.001,
    "BLOOMDUPE_SHARDS": None,
    "BLOOMDUPE_MAX_SHARD_BYTES": sizing.DEFAULT_MAX_SHARD_BYTES,
    "BLOOMDUPE_MAX_BYTES": sizing.DEFAULT_MAX_BYTES,
    "BLOOMDUPE_MAX_SHARDS": sizing.DEFAULT_MAX_SHARDS,
    "BLOOMDUPE_KEY": "%(spider)s:bloomdupe",
    "BLOOMDUPE_GROWTH": True,
    "BLOOMDUPE_WINDOW": None,
    "BLOOMDUPE_ENGINE": "auto",
    "BLOOMDUPE_LOCK": True,
    "BLOOMDUPE_LOCK_TTL": 1.0,
    "BLOOMDUPE_LOCK_WAIT": 1.5,
    "BLOOMDUPE_LOCAL_CACHE": 100_000,
    "BLOOMDUPE_REDIS_URL": None,
    "BLOOMDUPE_REDIS_CLUSTER": False,
    "BLOOMDUPE_WAIT_REPLICAS": None,  # 1 on a cluster with replicas, else 0 (transport.wait)
    "BLOOMDUPE_SENTINELS": None,
    "BLOOMDUPE_SENTINEL_MASTER": None,
    "BLOOMDUPE_SENTINEL_PASSWORD": None,
    "BLOOMDUPE_SENTINEL_PARAMS": None,
    "BLOOMDUPE_LOG_INTERVAL": 60.0,
    "BLOOMDUPE_STATS_INTERVAL": 10.0,
    "BLOOMDUPE_FINGERPRINT": "scrapy",
    "BLOOMDUPE_OUTAGE_TIMEOUT": 300.0,
    "BLOOMDUPE_ON_OUTAGE": "close",
    "BLOOMDUPE_LEASE_TIMEOUT": 30.0,
    "BLOOMDUPE_MAX_REQUEUES": 3,
    "BLOOMDUPE_DONE_GRACE": 3.0,
    "BLOOMDUPE_FAILED_LIMIT": 100_000,
    "BLOOMDUPE_REPORT_TTL": 7 * 86_400.0,
    "BLOOMDUPE_POLITENESS": "worker",
    "BLOOMDUPE_BACKOFF_CODES": [429, 503],
    "BLOOMDUPE_BACKOFF_MAX": 300.0,
    "BLOOMDUPE_BATCH": True,
    "BLOOMDUPE_BATCH_SIZE": 1000,
    "BLOOMDUPE_START_ONCE": True,
    "BLOOMDUPE_SCHEDULER": True,
    "BLOOMDUPE_METRICS_PORT": None,
    "BLOOMDUPE_METRICS_HOST": "0.0.0.0",
    "BLOOMDUPE_LIVE_INTERVAL": 5.0,
}

OUTAGE_ACTIONS = ("close", "allow")
#: ``BLOOMDUPE_POLITENESS``: Scrapy's per-process limits, or the crawl's (frontier/leased.py).
POLITENESS = ("worker", "crawl")
#: ``BLOOMDUPE_ENGINE`` values: ``"auto"`` picks ``"redisbloom"`` for a new filter on a
#: server with the BF.* commands, ``"lua"`` otherwise; a stored filter keeps its own.
ENGINES = ("auto", "lua", "redisbloom")
#: ``BLOOMDUPE_FINGERPRINT`` values (see :mod:`scrapy_bloomdupe.fingerprint`).
FINGERPRINT_MODES = ("scrapy", "scrapy-redis")
#: ``True``: connect with ``redis.cluster.RedisCluster``.
CLUSTER_SETTING = "BLOOMDUPE_REDIS_CLUSTER"
#: Replicas every check-and-add waits for (``WAIT n``) before its reply is used.
WAIT_SETTING = "BLOOMDUPE_WAIT_REPLICAS"
#: Redis Sentinel: the sentinels (``host:port``) and the name of the master they watch.
SENTINELS_SETTING = "BLOOMDUPE_SENTINELS"
SENTINEL_MASTER_SETTING = "BLOOMDUPE_SENTINEL_MASTER"
#: The schemes of a Redis URL, as redis-py's ``parse_url`` has them.
URL_SCHEMES = ("redis://", "rediss://", "unix://")

logger = logging.getLogger(__name__)


def unknown_names(settings: BaseSettings) -> list[tuple[str, str | None]]:
    """Unknown ``BLOOMDUPE_*`` settings set (a typo is otherwise silent), with nearest names."""
    prefix = "BLOOMDUPE_"
    known = sorted(name[len(prefix):] for name in DEFAULTS)  # the prefix would match all
    found = []
    for name in sorted(str(n) for n in settings):
        if name.startswith(prefix) and name not in DEFAULTS:
            near = difflib.get_close_matches(name[len(prefix):], known, n=1)
            found.append((name, prefix + near[0] if near else None))
    return found


def warn_unknown_names(settings: BaseSettings) -> None:
    """One WARNING naming any unknown ``BLOOMDUPE_*`` settings (:func:`unknown_names`)."""
    found = unknown_names(settings)
    if found:
        logger.warning("Unknown setting%s, not used (the default applies): %s. The settings "
                       "are listed in docs/settings.md", "s" if len(found) > 1 else "",
                       "; ".join(name + (f" (did you mean {near}?)" if near else "")
                                 for name, near in found))


def _get(settings: BaseSettings, name: str) -> Any:
    value = settings.get(name)
    return DEFAULTS[name] if is_none(value) else value


@dataclass(frozen=True)
class BloomDupeConfig:
    capacity: int
    error_rate: float
    shards: int | None
    max_shard_bytes: int
    key: str
    growth: bool
    lock: bool
    lock_ttl: float
    lock_wait: float
    local_cache: int
    log_interval: float
    stats_interval: float
    fingerprint: str
    outage_timeout: float
    on_outage: str
    plan: sizing.Sizing
    #: Largest size of the whole filter, every generation together (``BLOOMDUPE_MAX_BYTES``).
    max_bytes: int = sizing.DEFAULT_MAX_BYTES
    #: Most shards a filter may have (``BLOOMDUPE_MAX_SHARDS``).
    max_shards: int = sizing.DEFAULT_MAX_SHARDS
    #: Which engine holds a new filter's bits (``BLOOMDUPE_ENGINE``, one of :data:`ENGINES`).
    engine: str = "auto"
    #: The recrawl window (``BLOOMDUPE_WINDOW``); None: remember for good. With a window,
    #: ``plan`` is one time slice's sizing and growth does not apply.
    window: sizing.Window | None = None

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> BloomDupeConfig:
        capacity = parse_int("BLOOMDUPE_CAPACITY", _get(settings, "BLOOMDUPE_CAPACITY"))
        error_rate = parse_float("BLOOMDUPE_ERROR_RATE", _get(settings, "BLOOMDUPE_ERROR_RATE"),
                                 low=0, high=1, low_open=True, high_open=True)
        raw_shards = _get(settings, "BLOOMDUPE_SHARDS")
        shards = None if is_unset(raw_shards) else parse_int("BLOOMDUPE_SHARDS", raw_shards)
        max_shard_bytes = parse_int("BLOOMDUPE_MAX_SHARD_BYTES",
                                    _get(settings, "BLOOMDUPE_MAX_SHARD_BYTES"), minimum=8)
        max_bytes = parse_int("BLOOMDUPE_MAX_BYTES", _get(settings, "BLOOMDUPE_MAX_BYTES"))
        max_shards = parse_int("BLOOMDUPE_MAX_SHARDS", _get(settings, "BLOOMDUPE_MAX_SHARDS"))
        key = _get(settings, "BLOOMDUPE_KEY")
        if not isinstance(key, str):
            raise ConfigError("BLOOMDUPE_KEY", key, "must be a string")
        try:
            example = key % {"spider": "myspider"}
        except (KeyError, ValueError, TypeError) as e:
            raise ConfigError(
                "BLOOMDUPE_KEY", key, f"is not a valid %-template (only %(spider)s is known): {e}"
            ) from None
        validate_key(example)
        growth = parse_bool("BLOOMDUPE_GROWTH", _get(settings, "BLOOMDUPE_GROWTH"))
        lock = parse_bool("BLOOMDUPE_LOCK", _get(settings, "BLOOMDUPE_LOCK"))
        lock_ttl = parse_float("BLOOMDUPE_LOCK_TTL", _get(settings, "BLOOMDUPE_LOCK_TTL"),
                               low=0.001, high=3600)
        lock_wait = parse_float("BLOOMDUPE_LOCK_WAIT", _get(settings, "BLOOMDUPE_LOCK_WAIT"),
                                low=0, high=60)
        local_cache = parse_int("BLOOMDUPE_LOCAL_CACHE", _get(settings, "BLOOMDUPE_LOCAL_CACHE"),
                                minimum=0)
        log_interval = parse_float("BLOOMDUPE_LOG_INTERVAL",
                                   _get(settings, "BLOOMDUPE_LOG_INTERVAL"), low=0)
        stats_interval = parse_float("BLOOMDUPE_STATS_INTERVAL",
                                     _get(settings, "BLOOMDUPE_STATS_INTERVAL"), low=0.1)
        fingerprint_mode = parse_fingerprint(_get(settings, "BLOOMDUPE_FINGERPRINT"))
        outage_timeout = parse_float("BLOOMDUPE_OUTAGE_TIMEOUT",
                                     _get(settings, "BLOOMDUPE_OUTAGE_TIMEOUT"), low=0)
        engine = parse_engine(_get(settings, "BLOOMDUPE_ENGINE"))
        on_outage = _get(settings, "BLOOMDUPE_ON_OUTAGE")
        if on_outage not in OUTAGE_ACTIONS:
            raise ConfigError("BLOOMDUPE_ON_OUTAGE", on_outage,
                              f"must be one of {', '.join(OUTAGE_ACTIONS)}")
        window = parse_window(_get(settings, "BLOOMDUPE_WINDOW"))
        try:
            if window is not None:
                # Least-memory slices; each grows as a windowless filter does.
                window, plan = sizing.fit_window(window.window_ms, capacity, error_rate,
                                                 shards, max_shard_bytes, max_bytes,
                                                 max_shards)
            else:
                plan = sizing.plan(capacity,
                                   sizing.first_generation_error_rate(error_rate, growth),
                                   shards, max_shard_bytes, max_bytes, max_shards)
        except ConfigError as e:  # name the value the user wrote, not the derived one
            value = (error_rate if e.setting == "BLOOMDUPE_ERROR_RATE"
                     else capacity if e.setting == "BLOOMDUPE_CAPACITY" else e.value)
            raise ConfigError(e.setting, value, e.reason) from None
        return cls(capacity, error_rate, shards, max_shard_bytes, key, growth, lock, lock_ttl,
                   lock_wait, local_cache, log_interval, stats_interval, fingerprint_mode,
                   outage_timeout, on_outage, plan, max_bytes, max_shards, engine, window)

    def key_for(self, spider_name: str) -> str:
        return str(self.key % {"spider": spider_name})


def replaced_dupefilter_key(settings: BaseSettings) -> str | None:
    """scrapy-redis's ``SCHEDULER_DUPEFILTER_KEY`` if set: unused (``BLOOMDUPE_KEY`` is)."""
    value = settings.get("SCHEDULER_DUPEFILTER_KEY")
    return None if is_unset(value) else str(value)


#: Shortest ``BLOOMDUPE_WINDOW`` (seconds): a slice of it is a few Redis round trips long.
MIN_WINDOW = 1.0


def parse_window(value: Any) -> sizing.Window | None:
    """``BLOOMDUPE_WINDOW`` (seconds, None: no window) as a :class:`sizing.Window`."""
    if is_unset(value):
        return None
    seconds = parse_float("BLOOMDUPE_WINDOW", value, low=MIN_WINDOW)
    return sizing.Window(round(seconds * 1000))


def parse_fingerprint(mode: object) -> str:
    if mode not in FINGERPRINT_MODES:
        raise ConfigError("BLOOMDUPE_FINGERPRINT", mode,
                          f"must be one of {', '.join(FINGERPRINT_MODES)}")
    return str(mode)


def parse_engine(engine: object) -> str:
    return parse_choice("BLOOMDUPE_ENGINE", engine, ENGINES)


def report_ttl(settings: BaseSettings) -> float:
    """``BLOOMDUPE_REPORT_TTL``: seconds a finished crawl's report (failed requests, counters)
    outlives the rest of its state (``SCHEDULER_PERSIST`` off); 0: deleted with it."""
    return parse_float("BLOOMDUPE_REPORT_TTL", _get(settings, "BLOOMDUPE_REPORT_TTL"),
                       low=0, high=366 * 86_400)


def batch_size(settings: BaseSettings) -> int | None:
    """The batch middleware's chunk size, or None when ``BLOOMDUPE_BATCH`` turns it off."""
    if not parse_bool("BLOOMDUPE_BATCH", _get(settings, "BLOOMDUPE_BATCH")):
        return None
    return parse_int("BLOOMDUPE_BATCH_SIZE", _get(settings, "BLOOMDUPE_BATCH_SIZE"))


@dataclass(frozen=True)
class FrontierConfig:
    """The shared queue's settings: leases, the end of a crawl, failed requests."""

    #: Seconds without a heartbeat after which a worker's leases go back to the queue.
    lease_timeout: float
    #: Seconds the queue must stay empty, with no lease held, before the crawl is done.
    done_grace: float
    #: Failed requests kept (the oldest go first).
    failed_limit: int
    #: Lease expiries a request may have before it is recorded as failed, not handed out.
    max_requeues: int = 3
    #: "crawl" politeness (docs/politeness.md): whose limits, back-off codes, longest back-off.
    politeness: str = "worker"
    backoff_codes: tuple[int, ...] = (429, 503)
    backoff_max: float = 300.0
    #: Fetch a start request once a crawl, not once a worker (filtered despite dont_filter).
    start_once: bool = True

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> FrontierConfig:
        return cls(
            parse_float("BLOOMDUPE_LEASE_TIMEOUT", _get(settings, "BLOOMDUPE_LEASE_TIMEOUT"),
                        low=1, high=86_400),
            parse_float("BLOOMDUPE_DONE_GRACE", _get(settings, "BLOOMDUPE_DONE_GRACE"),
                        low=0, high=3600),
            parse_int("BLOOMDUPE_FAILED_LIMIT", _get(settings, "BLOOMDUPE_FAILED_LIMIT"),
                      minimum=0),
            parse_int("BLOOMDUPE_MAX_REQUEUES", _get(settings, "BLOOMDUPE_MAX_REQUEUES"),
                      minimum=1),
            parse_choice("BLOOMDUPE_POLITENESS", _get(settings, "BLOOMDUPE_POLITENESS"),
                         POLITENESS, " (Scrapy's per-site limits each worker for itself, or "
                         "held for the whole crawl)"),
            parse_codes("BLOOMDUPE_BACKOFF_CODES", _get(settings, "BLOOMDUPE_BACKOFF_CODES")),
            parse_float("BLOOMDUPE_BACKOFF_MAX", _get(settings, "BLOOMDUPE_BACKOFF_MAX"),
                        low=1, high=86_400),
            start_once=parse_bool("BLOOMDUPE_START_ONCE", _get(settings, "BLOOMDUPE_START_ONCE")),
        )


def use_scheduler(settings: BaseSettings) -> bool:
    """``BLOOMDUPE_SCHEDULER``: whether the add-on sets this package's scheduler."""
    return parse_bool("BLOOMDUPE_SCHEDULER", _get(settings, "BLOOMDUPE_SCHEDULER"))


@dataclass(frozen=True)
class MetricsConfig:
    """A worker's figures: written to Redis every ``live_interval`` s (``bloomdupe top``), and
    served to Prometheus on a port of ``ports`` when ``BLOOMDUPE_METRICS_PORT`` is set."""

    #: First and last port to try (``(0, 0)``: any free port); None: no server.
    ports: tuple[int, int] | None
    host: str
    live_interval: float

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> MetricsConfig:
        host = _get(settings, "BLOOMDUPE_METRICS_HOST")
        if not isinstance(host, str) or not host.strip():
            raise ConfigError("BLOOMDUPE_METRICS_HOST", host, "must be an address to listen on, "
                              "such as '0.0.0.0' or '127.0.0.1'")
        return cls(parse_metrics_port(settings.get("BLOOMDUPE_METRICS_PORT")), host.strip(),
                   parse_float("BLOOMDUPE_LIVE_INTERVAL",
                               _get(settings, "BLOOMDUPE_LIVE_INTERVAL"), low=0.1, high=3600))


def parse_metrics_port(value: Any) -> tuple[int, int] | None:
    """``BLOOMDUPE_METRICS_PORT``: None (off), a port, ``"A-B"`` (first free), or 0 (any)."""
    if is_unset(value):
        return None
    bad = ConfigError("BLOOMDUPE_METRICS_PORT", value, "is not a port, a range 'A-B' or 0")
    if isinstance(value, bool):
        raise bad
    if isinstance(value, int):
        first = last = value
    elif isinstance(value, str):
        parts = [part.strip() for part in value.split("-")]
        if len(parts) > 2 or not all(part.isdigit() for part in parts):
            raise bad
        first, last = int(parts[0]), int(parts[-1])
    elif isinstance(value, (list, tuple)) and len(value) == 2 \
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        first, last = value
    else:
        raise bad
    if (first, last) == (0, 0):
        return 0, 0
    if not 0 < first <= last < 65536:
        raise ConfigError("BLOOMDUPE_METRICS_PORT", value,
                          "must be 0, a port in 1-65535 or a range 'A-B' with A <= B")
    return first, last


# -- Redis ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RedisSettings:
    """Where and how to connect: ``REDIS_URL`` (or ``BLOOMDUPE_REDIS_URL``),
    ``REDIS_HOST``/``PORT``/``DB``, ``REDIS_PARAMS`` (client kwargs; ``redis_cls`` taken out),
    the cluster, replica and Sentinel settings. :mod:`scrapy_bloomdupe.transport.client`
    builds the client."""

    url: str | None
    #: The user's client arguments (``REDIS_PARAMS`` with ``REDIS_HOST``/``PORT``/``DB``).
    params: dict[str, Any] = field(default_factory=dict)
    redis_cls: Any = None
    cluster: bool = False
    wait_replicas: int | None = None
    #: ``BLOOMDUPE_SENTINELS``: the sentinels' (host, port); empty without Sentinel.
    sentinels: tuple[tuple[str, int], ...] = ()
    #: ``BLOOMDUPE_SENTINEL_MASTER``: the master's name, as the sentinels know it.
    sentinel_master: str | None = None
    #: Connection kwargs for the sentinels (``BLOOMDUPE_SENTINEL_PARAMS`` and ``_PASSWORD``).
    sentinel_params: dict[str, Any] = field(default_factory=dict)
    #: The setting ``url`` came from, for errors: ``BLOOMDUPE_REDIS_URL`` or ``REDIS_URL``.
    url_setting: str = "REDIS_URL"

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> RedisSettings:
        params = redis_params(settings)
        url_setting = "BLOOMDUPE_REDIS_URL" if settings.get("BLOOMDUPE_REDIS_URL") \
            else "REDIS_URL"
        url = settings.get(url_setting) or None
        if url is not None and (not isinstance(url, str) or not url.startswith(URL_SCHEMES)):
            raise ConfigError(url_setting, url, "must be a URL that starts with "
                              f"{', '.join(URL_SCHEMES)} (what redis-py reads)")
        redis_cls = _load_class(params.pop("redis_cls", None))
        cluster = cluster_mode(settings, redis_cls)
        sentinels = parse_sentinels(_get(settings, SENTINELS_SETTING))
        # Checked before REDIS_HOST/PORT/DB join them: the keys are the user's.
        redisargs.check("REDIS_PARAMS", params, redisargs.sentinel_master() if sentinels
                        else redisargs.cluster() if cluster
                        else redisargs.from_url(url) if url else redisargs.client(redis_cls))
        params.update(_address(settings))
        master = _get(settings, SENTINEL_MASTER_SETTING)
        sentinel_params = parse_dict("BLOOMDUPE_SENTINEL_PARAMS",
                                     settings.get("BLOOMDUPE_SENTINEL_PARAMS"))
        redisargs.check("BLOOMDUPE_SENTINEL_PARAMS", sentinel_params, redisargs.sentinels())
        password = _get(settings, "BLOOMDUPE_SENTINEL_PASSWORD")
        if password is not None:
            if not isinstance(password, (str, int)) or isinstance(password, bool):
                raise ConfigError("BLOOMDUPE_SENTINEL_PASSWORD", password,
                                  f"must be a string, not {type(password).__name__}")
            sentinel_params["password"] = str(password)
        if sentinels:
            if cluster:
                raise ConfigError(SENTINELS_SETTING, ", ".join(f"{h}:{p}" for h, p in sentinels),
                                  f"cannot be used with a Redis Cluster ({CLUSTER_SETTING} or a "
                                  "RedisCluster redis_cls): Sentinel watches a single master")
            if not isinstance(master, str) or not master.strip():
                raise ConfigError(SENTINEL_MASTER_SETTING, master,
                                  "must name the master the sentinels watch (the name in "
                                  "their `sentinel monitor NAME ...`) when "
                                  f"{SENTINELS_SETTING} is set")
            master = master.strip()
        elif master is not None or sentinel_params:
            raise ConfigError(SENTINELS_SETTING, None,
                              "must list the sentinels (\"host:port\", ...) when "
                              f"{SENTINEL_MASTER_SETTING}, BLOOMDUPE_SENTINEL_PASSWORD or "
                              "BLOOMDUPE_SENTINEL_PARAMS is set")
        return cls(url, params, redis_cls, cluster, wait_replicas(settings), sentinels,
                   master if sentinels else None, sentinel_params, url_setting)


def _address(settings: BaseSettings) -> dict[str, Any]:
    """scrapy-redis's ``REDIS_HOST``, ``REDIS_PORT`` and ``REDIS_DB``, those set."""
    out: dict[str, Any] = {}
    host = settings.get("REDIS_HOST")
    if host:
        if not isinstance(host, str) or any(c in host for c in "@/"):
            raise ConfigError("REDIS_HOST", host, "must be a host name or address; put a "
                              "URL, with any user and password, in REDIS_URL")
        out["host"] = host
    if settings.get("REDIS_PORT"):
        out["port"] = parse_int("REDIS_PORT", settings.get("REDIS_PORT"))
        if out["port"] > 65535:
            raise ConfigError("REDIS_PORT", out["port"], "must be a port, 1-65535")
    if settings.get("REDIS_DB"):
        out["db"] = parse_int("REDIS_DB", settings.get("REDIS_DB"), minimum=0)
    return out


def parse_sentinels(value: Any) -> tuple[tuple[str, int], ...]:
    """``BLOOMDUPE_SENTINELS``: a list of ``"host:port"`` or ``(host, port)``, a string
    ``"h1:26379,h2:26379"`` or a JSON list. Empty when unset."""
    if is_unset(value):
        return ()
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError as e:
                raise ConfigError(SENTINELS_SETTING, value, f"is not a valid JSON list ({e})"
                                  ) from None
        else:
            value = [part for part in text.split(",") if part.strip()]
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(SENTINELS_SETTING, value,
                          'must be a list of "host:port" (or one string "h1:p1,h2:p2")')
    return tuple(_sentinel_address(item) for item in value)


def _sentinel_address(item: Any) -> tuple[str, int]:
    if isinstance(item, (list, tuple)) and len(item) == 2:
        host, port = item
    elif isinstance(item, str) and ":" in item:
        host, _, port = item.strip().rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host  # [::1]
    else:
        raise ConfigError(SENTINELS_SETTING, item, 'each sentinel must be "host:port"')
    if not isinstance(host, str) or not host.strip() or any(c in host for c in "@/"):
        raise ConfigError(SENTINELS_SETTING, item, 'each sentinel must be "host:port" (a '
                          "password goes in BLOOMDUPE_SENTINEL_PASSWORD)")
    try:
        number = int(port)
    except (TypeError, ValueError):
        raise ConfigError(SENTINELS_SETTING, item, "the port must be a number") from None
    if not 0 < number < 65536:
        raise ConfigError(SENTINELS_SETTING, item, "the port must be in 1-65535")
    return host.strip(), number


def redis_params(settings: BaseSettings) -> dict[str, Any]:
    """``REDIS_PARAMS``, a dict or a JSON object, copied."""
    return parse_dict("REDIS_PARAMS", settings.get("REDIS_PARAMS"))


def _load_class(value: Any) -> Any:
    """A ``redis_cls`` given as a dotted path, imported (as Scrapy's ``load_object``)."""
    if not isinstance(value, str):
        return value
    module, _, name = value.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError("REDIS_PARAMS", None,
                          f"its redis_cls cannot be imported ({e})") from None


def wait_replicas(settings: BaseSettings) -> int | None:
    """``BLOOMDUPE_WAIT_REPLICAS``: replicas each check-and-add waits for (``WAIT``);
    None when unset (:func:`~.transport.wait.replicas_to_wait` decides by the client)."""
    raw = settings.get(WAIT_SETTING)
    if is_unset(raw):
        return None
    return parse_int(WAIT_SETTING, raw, minimum=0)


def cluster_mode(settings: BaseSettings, redis_cls: Any = None) -> bool:
    """Whether to use a Redis Cluster client: ``BLOOMDUPE_REDIS_CLUSTER``, or when unset,
    whether ``REDIS_PARAMS``'s ``redis_cls`` is a ``RedisCluster``."""
    if redis_cls is None:
        redis_cls = _load_class(redis_params(settings).get("redis_cls"))
    is_cluster_cls = isinstance(redis_cls, type) and issubclass(redis_cls, RedisCluster)
    raw = settings.get(CLUSTER_SETTING)
    if is_unset(raw):
        return is_cluster_cls
    wanted = parse_bool(CLUSTER_SETTING, raw)
    if wanted and redis_cls is not None and not is_cluster_cls:
        raise ConfigError(
            "REDIS_PARAMS", {"redis_cls": redis_cls},
            f"redis_cls must be redis.cluster.RedisCluster (or a subclass) when "
            f"{CLUSTER_SETTING} is True; remove it to get RedisCluster",
        )
    if not wanted and is_cluster_cls:
        raise ConfigError(
            CLUSTER_SETTING, raw,
            "is False but REDIS_PARAMS['redis_cls'] is a RedisCluster; set "
            f"{CLUSTER_SETTING} = True (or remove redis_cls)",
        )
    return wanted
