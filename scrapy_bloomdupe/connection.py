"""One Redis client per crawler, shared by the scheduler, the dupefilter and the stats.

Settings, as in scrapy-redis: ``REDIS_URL`` (overridden by
``BLOOMDUPE_REDIS_URL``), ``REDIS_HOST``/``REDIS_PORT``/``REDIS_DB``, and
``REDIS_PARAMS`` (keyword arguments for the client, ``redis_cls`` included).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry
from scrapy.utils.misc import load_object

from .exceptions import BloomDupeError, ConfigError

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

#: Client defaults. Every command this package sends is safe to repeat (the
#: check-and-add is idempotent by op id), so redis-py's retry may resend it.
DEFAULT_PARAMS: dict[str, Any] = {
    "socket_timeout": 10,
    "socket_connect_timeout": 10,
    "health_check_interval": 30,
}
DEFAULT_RETRIES = 5

_clients: weakref.WeakKeyDictionary[Crawler, Redis | RedisCluster] = weakref.WeakKeyDictionary()


def redacted(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[-1]}"))


def client_params(settings: BaseSettings) -> tuple[str | None, dict[str, Any]]:
    """The URL (or None) and keyword arguments the client is built from."""
    params = dict(DEFAULT_PARAMS)
    user_params = settings.get("REDIS_PARAMS") or {}
    if not isinstance(user_params, dict):
        raise ConfigError("REDIS_PARAMS", user_params, "must be a dict of redis client arguments")
    params.update(user_params)
    params.setdefault(
        "retry", Retry(ExponentialWithJitterBackoff(base=0.05, cap=2.0), DEFAULT_RETRIES)
    )
    for setting, name in (("REDIS_HOST", "host"), ("REDIS_PORT", "port"), ("REDIS_DB", "db")):
        if settings.get(setting):
            params[name] = settings.get(setting)
    url = settings.get("BLOOMDUPE_REDIS_URL") or settings.get("REDIS_URL") or None
    if url is not None and not isinstance(url, str):
        raise ConfigError("REDIS_URL", url, "must be a redis:// or rediss:// URL string")
    return url, params


def from_settings(settings: BaseSettings) -> Redis | RedisCluster:
    """A new client built from ``settings``."""
    url, params = client_params(settings)
    redis_cls = params.pop("redis_cls", redis.Redis)
    if isinstance(redis_cls, str):
        redis_cls = load_object(redis_cls)
    # scrapy-redis's queues store pickled bytes: responses must stay bytes.
    params.pop("decode_responses", None)
    try:
        if url:
            return redis_cls.from_url(url, **params)  # type: ignore[no-any-return]
        return redis_cls(**params)  # type: ignore[no-any-return]
    except ValueError as e:
        shown = redacted(url) if url else repr(params.get("host", "localhost"))
        raise ConfigError("REDIS_URL", shown, str(e)) from None


def get_client(crawler: Crawler) -> Redis | RedisCluster:
    """The crawler's shared client, made on first use."""
    client = _clients.get(crawler)
    if client is None:
        client = from_settings(crawler.settings)
        _clients[crawler] = client
    return client


def describe(client: Redis | RedisCluster) -> str:
    """Where ``client`` points, without credentials."""
    kwargs = getattr(client, "connection_pool", None)
    kw = kwargs.connection_kwargs if kwargs is not None else {}
    if "path" in kw:
        return f"unix://{kw['path']}"
    return f"{kw.get('host', '?')}:{kw.get('port', '?')} db {kw.get('db', 0)}"


def check(client: Redis | RedisCluster) -> None:
    """Ping Redis; turn the failures a user can fix into one clear error."""
    where = describe(client)
    try:
        client.ping()
    except redis.AuthenticationError as e:
        raise BloomDupeError(
            f"Redis at {where} refused the credentials ({e}). Check the user and password "
            "in REDIS_URL / BLOOMDUPE_REDIS_URL or REDIS_PARAMS."
        ) from None
    except redis.ResponseError as e:
        if "NOAUTH" in str(e) or "NOPERM" in str(e):
            raise BloomDupeError(
                f"Redis at {where} needs a password or more permissions ({e}). Put the "
                "credentials in REDIS_URL (redis://user:password@host:port) and grant the ACL "
                "in the README."
            ) from None
        raise
    except (redis.ConnectionError, redis.TimeoutError) as e:
        raise BloomDupeError(
            f"Cannot reach Redis at {where}: {str(e).rstrip('.')}. Start Redis or point "
            "REDIS_URL / BLOOMDUPE_REDIS_URL at it."
        ) from None
