"""Build one redis-py client from :class:`~scrapy_bloomdupe.settings.RedisSettings`.

A single node gets ``redis.Redis`` (or the user's ``redis_cls``). Redis Sentinel
(``BLOOMDUPE_SENTINELS``) gets a client of the master the sentinels name
(:mod:`.sentinel`). Redis Cluster
(``BLOOMDUPE_REDIS_CLUSTER = True``, or a ``RedisCluster`` ``redis_cls``) gets
``redis.cluster.RedisCluster.from_url(url, **params)``; the URL names any one
node (the client finds the others). Parameters a cluster client cannot take
are dropped (``health_check_interval``, ``retry_on_timeout``,
``retry_on_error``, ``db`` 0) or refused with a :class:`ConfigError` (another
``db``, a Unix socket, a ``connection_pool``). The ``retry`` is the cluster
client's own, which :class:`~scrapy_bloomdupe.transport.cluster.ClusterLink`
honours (count and backoff) so a check-and-add rides out a master's failover;
the default, :func:`~scrapy_bloomdupe.transport.cluster.default_retry`, waits
10-19 s in all. These retries serve the command line and other callers without
an outage guard: a crawl's Redis jobs run inside the guard, which is their one
retry layer (:mod:`.outage`).
"""

from __future__ import annotations

from contextlib import suppress
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import RedisCluster as RedisClusterClient
from redis.exceptions import RedisClusterException
from redis.maint_notifications import MaintNotificationsConfig
from redis.retry import Retry

from ..exceptions import ConfigError
from ..redaction import scrub, split_userinfo
from . import sentinel
from .cluster import default_retry
from .diagnose import cluster_start_error, url_problem

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

    from ..settings import RedisSettings

#: Client defaults. Every command this package sends is safe to repeat (the
#: check-and-add is idempotent by op id), so redis-py's retry may resend it.
DEFAULT_PARAMS: dict[str, Any] = {
    "socket_timeout": 10,
    "socket_connect_timeout": 10,
    "health_check_interval": 30,
}
DEFAULT_RETRIES = 5

#: Client arguments a ``RedisCluster`` ignores (its node connections never retry;
#: it retries itself) or cannot take, dropped in cluster mode.
_CLUSTER_DROPPED = ("health_check_interval", "retry_on_timeout", "retry_on_error")


class _Retry(Retry):
    """redis-py's ``Retry`` for quick blips only: not a refused password, not a timeout.

    redis-py's AuthenticationError is a ConnectionError, so a plain Retry
    resends a wrong password for seconds before the user hears of it. And a
    timeout (a blackholed or overloaded Redis) retried here is retried again by
    the connection's own handshake, each attempt a whole socket timeout:
    measured 65 s of stall with a 0.5 s timeout. Timeouts go straight to the
    outage guard (outage.py), which waits them out with one clock.
    """

    def call_with_retry(self, do: Any, fail: Any, is_retryable: Any = None,
                        with_failure_count: bool = False) -> Any:
        def retryable(error: Exception) -> bool:
            if isinstance(error, (redis.AuthenticationError, redis.TimeoutError)):
                return False
            return is_retryable is None or bool(is_retryable(error))

        return super().call_with_retry(do, fail, retryable, with_failure_count)


def no_maint_notifications() -> MaintNotificationsConfig:
    """redis-py 8's maintenance notifications, off. By default (``"auto"``, with RESP3,
    redis-py 8's default protocol) every new connection asks for them with ``CLIENT
    MAINT_NOTIFICATIONS``, a command of Redis Cloud and Redis Software that Redis 7,
    Redis 8 Community and Valkey do not have: a round trip lost and a DEBUG line
    ("Failed to enable maintenance notifications") a connection, 4 a worker. A
    ``maint_notifications_config`` in ``REDIS_PARAMS`` (or
    ``BLOOMDUPE_SENTINEL_PARAMS``) is used instead."""
    return MaintNotificationsConfig(enabled=False)


def client_params(config: RedisSettings) -> dict[str, Any]:
    """The keyword arguments a client is built with: our defaults under the user's."""
    params = {**DEFAULT_PARAMS, "maint_notifications_config": no_maint_notifications(),
              **config.params}
    params.setdefault(
        "retry", _Retry(ExponentialWithJitterBackoff(base=0.05, cap=2.0), DEFAULT_RETRIES)
    )
    # scrapy-redis's queues store pickled bytes: responses must stay bytes.
    params.pop("decode_responses", None)
    return params


def build(config: RedisSettings) -> Redis | RedisCluster:
    """A new client: a ``RedisCluster`` in cluster mode, else ``redis_cls`` or ``redis.Redis``."""
    url, params = config.url, client_params(config)
    if url and (problem := url_problem(url)):
        raise ConfigError(config.url_setting, url, problem)
    if config.sentinels:
        return sentinel.build(config, params)
    if config.cluster:
        return _cluster_client(url, params, config.redis_cls or RedisClusterClient,
                               user_retry="retry" in config.params,
                               url_setting=config.url_setting)
    redis_cls: Any = config.redis_cls or redis.Redis
    try:
        if url:
            return redis_cls.from_url(url, **params)  # type: ignore[no-any-return]
        return redis_cls(**params)  # type: ignore[no-any-return]
    except ValueError as e:
        if url:
            raise ConfigError(config.url_setting, url, scrub(str(e), *secrets(url, params))
                              ) from None
        raise ConfigError("REDIS_PARAMS", None, scrub(str(e), *secrets(url, params))) from None
    except TypeError as e:  # what redisargs could not see: a redis_cls of the user's
        raise ConfigError("REDIS_PARAMS", None, "the client refused its arguments ("
                          f"{scrub(str(e), *secrets(url, params))})") from None


def secrets(url: str | None, params: dict[str, Any]) -> list[Any]:
    """The passwords in ``url`` and ``params``: what an error of redis-py's must not show."""
    found = [params.get("password"), params.get("ssl_password")]
    if url:
        with suppress(ValueError):
            found.append(urlsplit(url).password)
        found.append(split_userinfo(url)[1])
    return found


def cluster_params(params: dict[str, Any], *, user_retry: bool = False) -> dict[str, Any]:
    """``params`` (as made by :func:`client_params`) fitted to ``RedisCluster``.

    Drops what a cluster client ignores or refuses but that means nothing
    here; refuses what cannot work with a :class:`ConfigError`. Without a
    ``retry`` of the user's, the cluster gets :func:`~.cluster.default_retry`;
    ``cluster_error_retry_attempts`` (deprecated by redis-py) becomes the
    count of that retry.
    """
    out = dict(params)
    for name in _CLUSTER_DROPPED:
        out.pop(name, None)
    db = out.pop("db", 0)
    if str(db) not in ("0", ""):
        raise ConfigError("REDIS_DB", db, "must be 0 on a Redis Cluster (it has no other database)")
    for name in ("connection_pool", "unix_socket_path", "path"):
        if name in out:
            raise ConfigError("REDIS_PARAMS", {name: "..."},
                              f"{name} cannot be used with a Redis Cluster client "
                              "(it connects to every node itself, over TCP)")
    attempts = out.pop("cluster_error_retry_attempts", None)
    if not user_retry:
        out["retry"] = default_retry()
        if attempts is not None:
            out["retry"].update_retries(int(attempts))
    return out


def _cluster_client(url: str | None, params: dict[str, Any], redis_cls: Any, *,
                    user_retry: bool, url_setting: str = "REDIS_URL") -> RedisCluster:
    params = cluster_params(params, user_retry=user_retry)
    if not url:  # as redis.Redis(): localhost:6379 unless REDIS_HOST / REDIS_PORT say
        params.setdefault("host", "localhost")
        params.setdefault("port", 6379)
    host, port = params.get("host", "localhost"), params.get("port", 6379)
    if url:
        try:
            parts = urlsplit(url)
            host, port = parts.hostname or host, parts.port or port
        except ValueError:
            pass
    where = f"{host}:{port}"
    try:
        if url:
            return redis_cls.from_url(url, **params)  # type: ignore[no-any-return]
        return redis_cls(**params)  # type: ignore[no-any-return]
    except ValueError as e:
        raise ConfigError(url_setting, where, scrub(str(e), *secrets(url, params))) from None
    except TypeError as e:
        raise ConfigError("REDIS_PARAMS", None, "the cluster client refused its arguments ("
                          f"{scrub(str(e), *secrets(url, params))})") from None
    except RedisClusterException as e:
        raise cluster_start_error(where, e) from None
