"""Every setting this package reads, in one table: its kind of value and its parser.

A row's parser is the one a component calls while Scrapy builds it, so :func:`check` fails
as a crawl does: one :class:`~.exceptions.ConfigError` naming the setting (passwords hidden:
:mod:`.redaction`). Defaults: :data:`~.settings.DEFAULTS`; docs: ``docs/settings.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import redaction
from .settings import (
    BloomDupeConfig,
    FrontierConfig,
    MetricsConfig,
    RedisSettings,
    batch_size,
    report_ttl,
    use_scheduler,
)

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

#: Kinds of value (what :attr:`Setting.kind` may be).
KINDS = ("whole number", "number", "bool", "choice", "key template", "string", "URL",
         "host", "client arguments", "password", "sentinels", "port", "status codes")


@dataclass(frozen=True)
class Setting:
    """One setting: its name, its kind of value (one of :data:`KINDS`) and its parser."""

    name: str
    kind: str
    #: Reads it (with its group) as the crawl does; raises a ConfigError on a bad value.
    parse: Callable[[BaseSettings], Any]

    @property
    def may_hold_secret(self) -> bool:
        return redaction.may_hold_secret(self.name)


_FILTER = BloomDupeConfig.from_settings
_FRONTIER = FrontierConfig.from_settings
_METRICS = MetricsConfig.from_settings
_REDIS = RedisSettings.from_settings

#: Every setting this package reads, by name: its :class:`Setting` (kind, parser).
SETTINGS: dict[str, Setting] = {s.name: s for s in (
    # the filter (the dupefilter, the stats extension)
    Setting("BLOOMDUPE_CAPACITY", "whole number", _FILTER),
    Setting("BLOOMDUPE_ERROR_RATE", "number", _FILTER),
    Setting("BLOOMDUPE_SHARDS", "whole number", _FILTER),
    Setting("BLOOMDUPE_MAX_SHARD_BYTES", "whole number", _FILTER),
    Setting("BLOOMDUPE_MAX_BYTES", "whole number", _FILTER),
    Setting("BLOOMDUPE_MAX_SHARDS", "whole number", _FILTER),
    Setting("BLOOMDUPE_KEY", "key template", _FILTER),
    Setting("BLOOMDUPE_GROWTH", "bool", _FILTER),
    Setting("BLOOMDUPE_WINDOW", "number", _FILTER),
    Setting("BLOOMDUPE_ENGINE", "choice", _FILTER),
    Setting("BLOOMDUPE_LOCK", "bool", _FILTER),
    Setting("BLOOMDUPE_LOCK_TTL", "number", _FILTER),
    Setting("BLOOMDUPE_LOCK_WAIT", "number", _FILTER),
    Setting("BLOOMDUPE_LOCAL_CACHE", "whole number", _FILTER),
    Setting("BLOOMDUPE_LOG_INTERVAL", "number", _FILTER),
    Setting("BLOOMDUPE_STATS_INTERVAL", "number", _FILTER),
    Setting("BLOOMDUPE_FINGERPRINT", "choice", _FILTER),
    Setting("BLOOMDUPE_OUTAGE_TIMEOUT", "number", _FILTER),
    Setting("BLOOMDUPE_ON_OUTAGE", "choice", _FILTER),
    # the shared queue (the scheduler)
    Setting("BLOOMDUPE_LEASE_TIMEOUT", "number", _FRONTIER),
    Setting("BLOOMDUPE_MAX_REQUEUES", "whole number", _FRONTIER),
    Setting("BLOOMDUPE_DONE_GRACE", "number", _FRONTIER),
    Setting("BLOOMDUPE_FAILED_LIMIT", "whole number", _FRONTIER),
    Setting("BLOOMDUPE_REPORT_TTL", "number", report_ttl),
    Setting("BLOOMDUPE_POLITENESS", "choice", _FRONTIER),
    Setting("BLOOMDUPE_BACKOFF_CODES", "status codes", _FRONTIER),
    Setting("BLOOMDUPE_BACKOFF_MAX", "number", _FRONTIER),
    Setting("BLOOMDUPE_START_ONCE", "bool", _FRONTIER),
    # the batch middleware, the add-on, a worker's figures
    Setting("BLOOMDUPE_BATCH", "bool", batch_size),
    Setting("BLOOMDUPE_BATCH_SIZE", "whole number", batch_size),
    Setting("BLOOMDUPE_SCHEDULER", "bool", use_scheduler),
    Setting("BLOOMDUPE_METRICS_PORT", "port", _METRICS),
    Setting("BLOOMDUPE_METRICS_HOST", "host", _METRICS),
    Setting("BLOOMDUPE_LIVE_INTERVAL", "number", _METRICS),
    # where Redis is, and how to connect (the client every component shares)
    Setting("BLOOMDUPE_REDIS_URL", "URL", _REDIS),
    Setting("BLOOMDUPE_REDIS_CLUSTER", "bool", _REDIS),
    Setting("BLOOMDUPE_WAIT_REPLICAS", "whole number", _REDIS),
    Setting("BLOOMDUPE_SENTINELS", "sentinels", _REDIS),
    Setting("BLOOMDUPE_SENTINEL_MASTER", "string", _REDIS),
    Setting("BLOOMDUPE_SENTINEL_PASSWORD", "password", _REDIS),
    Setting("BLOOMDUPE_SENTINEL_PARAMS", "client arguments", _REDIS),
    # scrapy-redis's, read as scrapy-redis reads them
    Setting("REDIS_URL", "URL", _REDIS),
    Setting("REDIS_HOST", "host", _REDIS),
    Setting("REDIS_PORT", "whole number", _REDIS),
    Setting("REDIS_DB", "whole number", _REDIS),
    Setting("REDIS_PARAMS", "client arguments", _REDIS),
)}


def check(settings: BaseSettings) -> None:
    """Parse every setting as a crawl does; the first bad one raises its ConfigError (no I/O)."""
    for parse in dict.fromkeys(s.parse for s in SETTINGS.values()):
        parse(settings)
