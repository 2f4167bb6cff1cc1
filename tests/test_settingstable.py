"""The table of every setting, and a bad value of each failing as a crawl fails: one line.

Driven by :data:`scrapy_bloomdupe.settingstable.SETTINGS`: each row's bad values
(by its kind, ``helpers.bad_values``) go through the row's parser, the one the
crawl calls, and the error through the line a crawl shows
(:func:`~scrapy_bloomdupe.connection.start_error_line`). The same walk with real
``scrapy crawl`` processes is in ``e2e/test_start_errors.py`` (slow); three of its
crawls run here, in the fast lane: the two of issue 37 and a URL.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path

import pytest
import redis
from helpers import BAD_PASSWORD, assert_start_error_line, bad_values, example_crawl
from scrapy.settings import Settings

from scrapy_bloomdupe import redisargs
from scrapy_bloomdupe.connection import start_error_line
from scrapy_bloomdupe.exceptions import ConfigError
from scrapy_bloomdupe.settings import DEFAULTS
from scrapy_bloomdupe.settingstable import KINDS, SETTINGS, Setting, check

DOCS = Path(__file__).resolve().parent.parent / "docs" / "settings.md"

CASES = [pytest.param(setting, value, id=f"{setting.name}={value[:24]}")
         for setting in SETTINGS.values() for value in bad_values(setting.name, setting.kind)]


def test_the_table_lists_every_setting_once() -> None:
    documented = set(re.findall(r"^\| `(BLOOMDUPE_[A-Z_]+)`", DOCS.read_text(), re.M))
    ours = {name for name in SETTINGS if name.startswith("BLOOMDUPE_")}
    assert ours == set(DEFAULTS) == documented
    assert {"REDIS_URL", "REDIS_PARAMS", "REDIS_HOST", "REDIS_PORT", "REDIS_DB"} <= set(SETTINGS)
    assert all(s.kind in KINDS for s in SETTINGS.values())


def test_the_defaults_pass() -> None:
    check(Settings())


@pytest.mark.parametrize(("setting", "value"), CASES)
def test_a_bad_value_is_one_line_naming_the_setting(setting: Setting, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        check(Settings({setting.name: value}))
    line = start_error_line(info.value)
    assert "\n" not in line and setting.name in line, line
    # Its own parser (what the component reading it calls) fails the same way.
    with pytest.raises(ConfigError) as again:
        setting.parse(Settings({setting.name: value}))
    assert str(again.value) == str(info.value)
    if setting.may_hold_secret:
        texts = [line, repr(info.value), repr(info.value.args), repr(info.value.value),
                 "".join(traceback.format_exception(info.value))]
        assert not any(BAD_PASSWORD in text for text in texts), texts


@pytest.mark.parametrize(("name", "value", "says"), [
    ("REDIS_PARAMS", f'{{"password": "{BAD_PASSWORD}", x: 1}}', "REDIS_PARAMS: is not valid JSON"),
    ("REDIS_PARAMS", '{"socket_timeout": "3s"}',
     "REDIS_PARAMS: 'socket_timeout' must be a number or None, not str (an argument of "
     "a redis:// URL's connections"),
    ("REDIS_PARAMS", f'{{"pasword": "{BAD_PASSWORD}"}}',
     "REDIS_PARAMS: 'pasword' is not an argument of a redis:// URL's connections (redis-py's "
     "Connection) (did you mean 'password'?); correct its name or remove it"),
    ("REDIS_PARAMS", '{"ssl_ca_certs": "/ca.pem"}', "TLS arguments need a rediss:// URL"),
    ("REDIS_PARAMS", '{"port": 6379.5}', "'port' must be a whole number"),
    ("BLOOMDUPE_SENTINEL_PARAMS", '{"socket_timeout": "2s"}',
     "BLOOMDUPE_SENTINEL_PARAMS: 'socket_timeout' must be a number or None, not str (an "
     "argument of redis.Redis (the connections to the sentinels))"),
    ("REDIS_URL", f"http://u:{BAD_PASSWORD}@h/0",
     "REDIS_URL='http://u:***@h/0': must be a URL that starts with redis://"),
    ("BLOOMDUPE_REDIS_URL", f"h:{BAD_PASSWORD}@h:1",
     "BLOOMDUPE_REDIS_URL='h:***@h:1': must be a URL that starts with redis://"),
    ("REDIS_PORT", "abc", "REDIS_PORT='abc': must be a whole number"),
])
def test_what_a_bad_redis_setting_says(name: str, value: str, says: str) -> None:
    settings = {"REDIS_URL": "redis://127.0.0.1:6379/0", name: value}
    with pytest.raises(ConfigError) as info:
        check(Settings(settings))
    assert says in str(info.value)
    assert BAD_PASSWORD not in str(info.value)


@pytest.mark.parametrize(("params", "settings"), [
    ({"socket_timeout": 3, "retry_on_timeout": True, "health_check_interval": 0.5}, {}),
    ({"ssl_ca_certs": "/ca.pem", "ssl_cert_reqs": "none"}, {"REDIS_URL": "rediss://h:1/0"}),
    ({"ssl": True, "ssl_ca_certs": "/ca.pem", "password": 123456}, {}),
    ({"port": "6380", "db": "1", "redis_cls": "redis.Redis"}, {}),
    ({"read_from_replicas": True, "cluster_error_retry_attempts": 2},
     {"BLOOMDUPE_REDIS_CLUSTER": True}),
    ({"ssl": True, "socket_timeout": 1}, {"BLOOMDUPE_SENTINELS": "h:26379",
                                          "BLOOMDUPE_SENTINEL_MASTER": "m"}),
])
def test_what_redis_py_takes_passes(params: dict[str, object], settings: dict[str, object]
                                    ) -> None:
    check(Settings({"REDIS_PARAMS": params, **settings}))


@pytest.mark.parametrize(("name", "value", "says"), [
    pytest.param("REDIS_PARAMS", bad_values("REDIS_PARAMS", "client arguments")[0],
                 "REDIS_PARAMS: is not valid JSON", id="params-json"),
    pytest.param("REDIS_PARAMS", bad_values("REDIS_PARAMS", "client arguments")[1],
                 "REDIS_PARAMS: 'socket_timeout' must be a number or None, not str",
                 id="params-type"),
    pytest.param("REDIS_URL", bad_values("REDIS_URL", "URL")[0],
                 "REDIS_URL='http://:***@127.0.0.1:6379/0': must be a URL", id="url"),
])
def test_a_real_crawl_shows_one_line_without_the_password(redis_url: str, name: str,
                                                          value: str, says: str) -> None:
    output = assert_start_error_line(example_crawl(redis_url, f"{name}={value}"), says)
    assert BAD_PASSWORD not in output, output


class TenantRedis(redis.Redis):
    """A user's client class that reads keys of its own from ``**kwargs`` (named by no
    signature), and passes the rest on."""

    def __init__(self, **kwargs: object) -> None:
        self.tenant = kwargs.pop("tenant", "")
        super().__init__(**kwargs)  # type: ignore[arg-type]


class InheritedTenantRedis(TenantRedis):
    """Its ``**kwargs`` ``__init__`` inherited, not defined on the class (issue 49)."""


class PlainSubclass(redis.Redis):
    """A subclass without an ``__init__`` of its own: ``redis.Redis``'s keys only."""


@pytest.mark.parametrize("redis_cls", [TenantRedis, InheritedTenantRedis])
def test_a_redis_cls_taking_any_key_is_not_refused(redis_cls: type) -> None:
    redisargs.check("REDIS_PARAMS", {"tenant": "a", "socket_timeout": 3},
                    redisargs.client(redis_cls))
    name = f"{__name__}.{redis_cls.__qualname__}"
    check(Settings({"REDIS_PARAMS": {"redis_cls": name, "tenant": "a"}}))


def test_a_redis_cls_of_redis_py_keys_still_refuses_an_unknown_one() -> None:
    with pytest.raises(ConfigError, match="'tenant' is not an argument of"):
        redisargs.check("REDIS_PARAMS", {"tenant": "a"}, redisargs.client(PlainSubclass))
