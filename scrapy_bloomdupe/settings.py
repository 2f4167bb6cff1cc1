"""Every ``BLOOMDUPE_*`` setting, its default, and the one config object built from them.

:meth:`BloomDupeConfig.from_settings` parses and validates everything once, at
start; each error names the setting and the value it got.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import fingerprint, sizing
from .exceptions import ConfigError
from .filter import validate_key

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

#: Defaults, also what ``BloomDupeAddon`` documents.
DEFAULTS: dict[str, Any] = {
    "BLOOMDUPE_CAPACITY": 10_000_000,
    "BLOOMDUPE_ERROR_RATE": 0.001,
    "BLOOMDUPE_SHARDS": None,
    "BLOOMDUPE_MAX_SHARD_BYTES": sizing.DEFAULT_MAX_SHARD_BYTES,
    "BLOOMDUPE_KEY": "%(spider)s:bloomdupe",
    "BLOOMDUPE_GROWTH": True,
    "BLOOMDUPE_LOCK": True,
    "BLOOMDUPE_LOCK_TTL": 1.0,
    "BLOOMDUPE_LOCK_WAIT": 1.5,
    "BLOOMDUPE_LOCAL_CACHE": 100_000,
    "BLOOMDUPE_REDIS_URL": None,
    # Read by connection.py when it builds the client:
    "BLOOMDUPE_REDIS_CLUSTER": False,
    "BLOOMDUPE_WAIT_REPLICAS": 0,
    "BLOOMDUPE_LOG_INTERVAL": 60.0,
    "BLOOMDUPE_STATS_INTERVAL": 10.0,
    "BLOOMDUPE_FINGERPRINT": "scrapy",
    "BLOOMDUPE_OUTAGE_TIMEOUT": 300.0,
    "BLOOMDUPE_ON_OUTAGE": "close",
}

OUTAGE_ACTIONS = ("close", "allow")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _get(settings: BaseSettings, name: str) -> Any:
    value = settings.get(name)
    return DEFAULTS[name] if value is None else value


def parse_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool):
        raise ConfigError(name, value, "must be a whole number, not a boolean")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str):
        try:
            value = int(value.strip().replace("_", ""))
        except ValueError:
            raise ConfigError(name, value, "must be a whole number") from None
    if not isinstance(value, int):
        raise ConfigError(name, value, "must be a whole number")
    if value < minimum:
        raise ConfigError(name, value, f"must be at least {minimum}")
    return value


def parse_float(name: str, value: Any, *, low: float, high: float = math.inf,
                low_open: bool = False, high_open: bool = False) -> float:
    if isinstance(value, bool):
        raise ConfigError(name, value, "must be a number, not a boolean")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(name, value, "must be a number") from None
    if math.isnan(number) or number < low or (low_open and number == low) or number > high \
            or (high_open and number == high):
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        raise ConfigError(name, value, f"must be in {left}{low}, {high}{right}")
    return number


def parse_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigError(name, value, "must be true or false")


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

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> BloomDupeConfig:
        capacity = parse_int("BLOOMDUPE_CAPACITY", _get(settings, "BLOOMDUPE_CAPACITY"))
        error_rate = parse_float("BLOOMDUPE_ERROR_RATE", _get(settings, "BLOOMDUPE_ERROR_RATE"),
                                 low=0, high=1, low_open=True, high_open=True)
        raw_shards = _get(settings, "BLOOMDUPE_SHARDS")
        shards = None if raw_shards in (None, "") else parse_int("BLOOMDUPE_SHARDS", raw_shards)
        max_shard_bytes = parse_int("BLOOMDUPE_MAX_SHARD_BYTES",
                                    _get(settings, "BLOOMDUPE_MAX_SHARD_BYTES"), minimum=8)
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
        fingerprint_mode = fingerprint.validate(_get(settings, "BLOOMDUPE_FINGERPRINT"))
        outage_timeout = parse_float("BLOOMDUPE_OUTAGE_TIMEOUT",
                                     _get(settings, "BLOOMDUPE_OUTAGE_TIMEOUT"), low=0)
        on_outage = _get(settings, "BLOOMDUPE_ON_OUTAGE")
        if on_outage not in OUTAGE_ACTIONS:
            raise ConfigError("BLOOMDUPE_ON_OUTAGE", on_outage,
                              f"must be one of {', '.join(OUTAGE_ACTIONS)}")
        try:
            plan = sizing.plan(capacity, sizing.first_generation_error_rate(error_rate, growth),
                               shards, max_shard_bytes)
        except ConfigError as e:  # name the value the user wrote, not the derived one
            value = error_rate if e.setting == "BLOOMDUPE_ERROR_RATE" else e.value
            raise ConfigError(e.setting, value, e.reason) from None
        return cls(capacity, error_rate, shards, max_shard_bytes, key, growth, lock, lock_ttl,
                   lock_wait, local_cache, log_interval, stats_interval, fingerprint_mode,
                   outage_timeout, on_outage, plan)

    def key_for(self, spider_name: str) -> str:
        return str(self.key % {"spider": spider_name})
