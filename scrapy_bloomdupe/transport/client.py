"""Build one redis-py client from :class:`~scrapy_bloomdupe.settings.RedisSettings`.

A single node gets ``redis.Redis`` (or the user's ``redis_cls``), Sentinel a client of the
master the sentinels name (:mod:`.sentinel`), a cluster ``RedisCluster.from_url(url, **params)``
(the URL names any node). Parameters a cluster client cannot take are dropped or refused
(:func:`cluster_params`). The cluster client's ``retry`` (default
:func:`~scrapy_bloomdupe.transport.cluster.default_retry`), honoured by ``ClusterLink``, rides out
a master's failover for callers without an outage guard; a crawl's jobs have the guard as their
one retry layer (:mod:`.outage`).
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

#: Client defaults. Every command this package sends is safe to repeat, so retries may.
DEFAULT_PARAMS: dict[str, Any] = {
    "socket_timeout": 10,
    "socket_connect_timeout": 10,
    "health_check_interval": 30,
}
DEFAULT_RETRIES = 5

#: Client arguments a ``RedisCluster`` ignores or cannot take, dropped in cluster mode.
_CLUSTER_DROPPED = ("health_check_interval", "retry_on_timeout", "retry_on_error")


class _Retry(Retry):
    """redis-py's ``Retry`` for quick blips only: not a refused password (an
    AuthenticationError is a ConnectionError, so would be resent for seconds), not a timeout
    (retried again by the connection's handshake, each a whole socket timeout: a long stall).
    Timeouts go straight to the outage guard (outage.py), which waits them out on one clock."""

    def call_with_retry(self, do: Any, fail: Any, is_retryable: Any = None,
                        with_failure_count: bool = False) -> Any:
        def retryable(error: Exception) -> bool:
            if isinstance(error, (redis.AuthenticationError, redis.TimeoutError)):
                return False
            return is_retryable is None or bool(is_retryable(error))

        return super().call_with_retry(do, fail, retryable, with_failure_count)


def no_maint_notifications() -> MaintNotificationsConfig:
    """redis-py 8's maintenance notifications, off: by default each new connection sends
    ``CLIENT MAINT_NOTIFICATIONS``, which only Redis Cloud/Software know (a wasted round trip
    and a DEBUG line). A user's ``maint_notifications_config`` takes precedence."""
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
    """``params`` (from :func:`client_params`) fitted to ``RedisCluster``: harmless ones
    dropped, unworkable ones (a ``db`` but 0, a socket path, a pool) refused with
    :class:`ConfigError`. Without a user ``retry``, :func:`~.cluster.default_retry`, its count
    from ``cluster_error_retry_attempts`` (deprecated) if given."""
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
