from __future__ import annotations

import logging
from typing import Any

import pytest
import redis
from helpers import crawler_for
from scrapy.settings import Settings

from scrapy_bloomdupe import connection
from scrapy_bloomdupe.exceptions import ConfigError
from scrapy_bloomdupe.settings import DEFAULTS, BloomDupeConfig, RedisSettings, unknown_names


def config(**values: Any) -> BloomDupeConfig:
    return BloomDupeConfig.from_settings(Settings(values))


def test_defaults() -> None:
    c = config()
    assert c.capacity == DEFAULTS["BLOOMDUPE_CAPACITY"]
    assert c.error_rate == 0.001
    assert c.lock is True
    assert c.key_for("books") == "books:bloomdupe"
    assert c.plan.capacity == c.capacity
    assert c.engine == "auto"


@pytest.mark.parametrize("value", ["auto", "lua", "redisbloom", " RedisBloom "])
def test_engine_names(value: str) -> None:
    assert config(BLOOMDUPE_ENGINE=value).engine == value.strip().lower()


def test_command_line_strings_are_parsed() -> None:
    # `scrapy crawl -s NAME=VALUE` passes strings.
    c = config(BLOOMDUPE_CAPACITY="2_000_000", BLOOMDUPE_ERROR_RATE="0.0001",
               BLOOMDUPE_SHARDS="4", BLOOMDUPE_LOCK="false", BLOOMDUPE_LOCK_TTL="0.5",
               BLOOMDUPE_LOCK_WAIT="0", BLOOMDUPE_KEY="crawl-%(spider)s")
    assert (c.capacity, c.error_rate, c.shards, c.lock, c.lock_ttl, c.lock_wait) == (
        2_000_000, 0.0001, 4, False, 0.5, 0.0)
    assert c.key_for("x") == "crawl-x"


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("BLOOMDUPE_CAPACITY", 0),
        ("BLOOMDUPE_CAPACITY", -1),
        ("BLOOMDUPE_CAPACITY", "lots"),
        ("BLOOMDUPE_CAPACITY", 1.5),
        ("BLOOMDUPE_CAPACITY", True),
        ("BLOOMDUPE_ERROR_RATE", 0),
        ("BLOOMDUPE_ERROR_RATE", 1),
        ("BLOOMDUPE_ERROR_RATE", 1.5),
        ("BLOOMDUPE_ERROR_RATE", "low"),
        ("BLOOMDUPE_ERROR_RATE", "nan"),
        ("BLOOMDUPE_SHARDS", 0),
        ("BLOOMDUPE_SHARDS", "two"),
        ("BLOOMDUPE_MAX_SHARD_BYTES", 1),
        ("BLOOMDUPE_MAX_SHARD_BYTES", 2**30),
        ("BLOOMDUPE_LOCK", "maybe"),
        ("BLOOMDUPE_GROWTH", "sometimes"),
        ("BLOOMDUPE_LOCK", 2),
        ("BLOOMDUPE_LOCK_TTL", 0),
        ("BLOOMDUPE_LOCK_TTL", "soon"),
        ("BLOOMDUPE_LOCK_WAIT", -1),
        ("BLOOMDUPE_LOCK_WAIT", 3600),
        ("BLOOMDUPE_LOCAL_CACHE", -1),
        ("BLOOMDUPE_LOCAL_CACHE", "big"),
        ("BLOOMDUPE_KEY", ""),
        ("BLOOMDUPE_KEY", "{tagged}"),
        ("BLOOMDUPE_KEY", "%(name)s"),
        ("BLOOMDUPE_KEY", 5),
        ("BLOOMDUPE_LOG_INTERVAL", -5),
        ("BLOOMDUPE_STATS_INTERVAL", 0),
        ("BLOOMDUPE_FINGERPRINT", "sha1"),
        ("BLOOMDUPE_OUTAGE_TIMEOUT", -1),
        ("BLOOMDUPE_OUTAGE_TIMEOUT", "forever"),
        ("BLOOMDUPE_ON_OUTAGE", "panic"),
        ("BLOOMDUPE_ENGINE", "bitfield"),
        ("BLOOMDUPE_ENGINE", 1),
        ("BLOOMDUPE_ERROR_RATE", 1e-70),
        ("BLOOMDUPE_MAX_BYTES", 0),
        ("BLOOMDUPE_MAX_BYTES", "lots"),
        ("BLOOMDUPE_MAX_SHARDS", 0),
        ("BLOOMDUPE_MAX_SHARDS", 2.5),
        # What cannot work: a 16 TiB filter, a million shards.
        ("BLOOMDUPE_CAPACITY", 10**13),
        ("BLOOMDUPE_SHARDS", 10**6),
    ],
)
def test_bad_values_name_setting_and_value(setting: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        config(**{setting: value})
    assert info.value.setting == setting
    assert str(info.value).startswith(f"{setting}={value!r}")


def test_limits_default_and_can_be_raised() -> None:
    c = config()
    assert (c.max_bytes, c.max_shards) == (4 * 1024**3, 4096)
    assert c.plan.max_bytes == 4 * 1024**3
    with pytest.raises(ConfigError) as info:
        config(BLOOMDUPE_CAPACITY=10**13)
    assert "BLOOMDUPE_MAX_BYTES" in info.value.reason
    with pytest.raises(ConfigError) as info:
        config(BLOOMDUPE_SHARDS=10**6)
    assert "BLOOMDUPE_MAX_SHARDS" in info.value.reason
    # An operator who means it raises the limits (from the command line too).
    c = config(BLOOMDUPE_CAPACITY=5_000_000_000, BLOOMDUPE_MAX_BYTES="16_000_000_000",
               BLOOMDUPE_SHARDS=10_000, BLOOMDUPE_MAX_SHARDS="10000")
    assert c.plan.shards == 10_000 and c.plan.max_bytes == 16_000_000_000


def test_command_line_values_read_as_python_settings_would_be() -> None:
    """``-s BLOOMDUPE_CAPACITY=1e7`` and ``-s BLOOMDUPE_SHARDS=None`` mean what
    ``BLOOMDUPE_CAPACITY = 1e7`` and ``BLOOMDUPE_SHARDS = None`` mean in settings.py."""
    c = config(BLOOMDUPE_CAPACITY="1e7", BLOOMDUPE_SHARDS="None")
    assert (c.capacity, c.shards) == (10_000_000, None)
    assert config(BLOOMDUPE_CAPACITY=1e7, BLOOMDUPE_SHARDS=None) == c
    assert config(BLOOMDUPE_CAPACITY="2.0e6", BLOOMDUPE_SHARDS="").capacity == 2_000_000
    c = config(BLOOMDUPE_LOCAL_CACHE="null", BLOOMDUPE_KEY="None")
    assert (c.local_cache, c.key) == (DEFAULTS["BLOOMDUPE_LOCAL_CACHE"], DEFAULTS["BLOOMDUPE_KEY"])
    with pytest.raises(ConfigError, match="must be a whole number"):
        config(BLOOMDUPE_CAPACITY="1.5e0")


def test_redis_params_as_a_json_string_as_scrapy_redis_reads_it() -> None:
    """scrapy-redis reads REDIS_PARAMS with ``getdict()``: ``-s 'REDIS_PARAMS={...}'``."""
    settings = RedisSettings.from_settings(Settings({
        "REDIS_PARAMS": '{"socket_timeout": 30, "redis_cls": "redis.Redis"}'}))
    assert settings.params == {"socket_timeout": 30}
    assert settings.redis_cls is redis.Redis and not settings.cluster
    assert RedisSettings.from_settings(Settings({"REDIS_PARAMS": "None"})).params == {}


@pytest.mark.parametrize(("value", "says"), [
    ("{socket_timeout: 30}", "is not valid JSON"),
    ("[1, 2]", "must be a dict (or a JSON object)"),
    (5, "must be a dict (or a JSON object)"),
])
def test_bad_redis_params_name_the_setting(value: Any, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        RedisSettings.from_settings(Settings({"REDIS_PARAMS": value}))
    assert info.value.setting == "REDIS_PARAMS" and says in str(info.value)


def test_a_misspelt_name_is_found_with_the_nearest_known_one() -> None:
    settings = Settings({"BLOOMDUPE_CAPACTIY": 1000, "BLOOMDUPE_CAPACITY": 5,
                         "BLOOMDUPE_NOTHING_LIKE_IT": 1, "DOWNLOAD_DELAY": 1})
    assert unknown_names(settings) == [("BLOOMDUPE_CAPACTIY", "BLOOMDUPE_CAPACITY"),
                                       ("BLOOMDUPE_NOTHING_LIKE_IT", None)]
    assert unknown_names(Settings({name: value for name, value in DEFAULTS.items()})) == []


def test_a_crawl_warns_once_of_a_misspelt_name(redis_url: str,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """Issue 49: ``-s BLOOMDUPE_CAPACTIY=1000`` ran with the default, without a word."""
    crawler = crawler_for(redis_url, BLOOMDUPE_CAPACTIY=1000)
    with caplog.at_level(logging.WARNING, logger="scrapy_bloomdupe"):
        connection.get_client(crawler)
        connection.get_client(crawler)  # every component asks: one warning a crawl
    lines = [r.getMessage() for r in caplog.records if "Unknown setting" in r.getMessage()]
    assert lines == ["Unknown setting, not used (the default applies): BLOOMDUPE_CAPACTIY "
                     "(did you mean BLOOMDUPE_CAPACITY?). The settings are listed in "
                     "docs/settings.md"]
