"""One Redis client per crawler, shared by the scheduler, the dupefilter and the stats.

Settings, as in scrapy-redis: ``REDIS_URL`` (overridden by
``BLOOMDUPE_REDIS_URL``), ``REDIS_HOST``/``REDIS_PORT``/``REDIS_DB``, and
``REDIS_PARAMS`` (keyword arguments for the client, ``redis_cls`` included).

Redis Cluster: ``BLOOMDUPE_REDIS_CLUSTER = True`` (or ``REDIS_PARAMS``
``{"redis_cls": "redis.cluster.RedisCluster"}``) builds
``redis.cluster.RedisCluster.from_url(url, **params)``; the URL names any one
node (the client finds the others). Parameters a cluster client cannot take
are dropped (``health_check_interval``, ``retry_on_timeout``,
``retry_on_error``, ``db`` 0) or refused with a :class:`ConfigError` (another
``db``, a Unix socket, a ``connection_pool``). The ``retry`` is the cluster
client's own, which :class:`~scrapy_bloomdupe.cluster.ClusterLink` honours
(count and backoff) so a check-and-add rides out a master's failover; the
default, :func:`scrapy_bloomdupe.cluster.default_retry`, waits 10-19 s in all.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import RedisCluster as RedisClusterClient
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from scrapy.utils.misc import load_object

from . import cluster
from .exceptions import BloomDupeError, ConfigError
from .settings import parse_bool, parse_int

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

#: ``True``: connect with ``redis.cluster.RedisCluster`` (see the module docstring).
CLUSTER_SETTING = "BLOOMDUPE_REDIS_CLUSTER"
#: Replicas every check-and-add waits for (``WAIT n``) before its reply is used.
WAIT_SETTING = "BLOOMDUPE_WAIT_REPLICAS"
#: Client arguments a ``RedisCluster`` ignores (its node connections never retry;
#: it retries itself) or cannot take, dropped in cluster mode.
_CLUSTER_DROPPED = ("health_check_interval", "retry_on_timeout", "retry_on_error")

_clients: weakref.WeakKeyDictionary[Crawler, Redis | RedisCluster] = weakref.WeakKeyDictionary()


_SECRET_QUERY = {"password"}


def redacted(url: str) -> str:
    """``url`` with any password (``user:password@`` or ``?password=``) replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is not None:
        host = parts.netloc.rsplit("@", 1)[-1]
        parts = parts._replace(netloc=f"{parts.username or ''}:***@{host}")
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    if any(name.lower() in _SECRET_QUERY for name, _ in pairs):
        query = urlencode([(n, "***" if n.lower() in _SECRET_QUERY else v) for n, v in pairs],
                          safe="*")
        parts = parts._replace(query=query)
    return urlunsplit(parts)


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


def client_params(settings: BaseSettings) -> tuple[str | None, dict[str, Any]]:
    """The URL (or None) and keyword arguments the client is built from."""
    params = dict(DEFAULT_PARAMS)
    user_params = settings.get("REDIS_PARAMS") or {}
    if not isinstance(user_params, dict):
        raise ConfigError("REDIS_PARAMS", user_params, "must be a dict of redis client arguments")
    params.update(user_params)
    params.setdefault(
        "retry", _Retry(ExponentialWithJitterBackoff(base=0.05, cap=2.0), DEFAULT_RETRIES)
    )
    for setting, name in (("REDIS_HOST", "host"), ("REDIS_PORT", "port"), ("REDIS_DB", "db")):
        if settings.get(setting):
            params[name] = settings.get(setting)
    url = settings.get("BLOOMDUPE_REDIS_URL") or settings.get("REDIS_URL") or None
    if url is not None and not isinstance(url, str):
        raise ConfigError("REDIS_URL", url, "must be a redis:// or rediss:// URL string")
    return url, params


def from_settings(settings: BaseSettings) -> Redis | RedisCluster:
    """A new client built from ``settings``: a ``RedisCluster`` in cluster mode.

    ``BLOOMDUPE_WAIT_REPLICAS`` (default 0) is attached to the client for the
    check-and-add round trips (:func:`scrapy_bloomdupe.cluster.set_wait_replicas`).
    """
    client = _from_settings(settings)
    replicas = wait_replicas_setting(settings)
    if replicas:
        cluster.set_wait_replicas(client, replicas)
    return client


def wait_replicas_setting(settings: BaseSettings) -> int:
    """``BLOOMDUPE_WAIT_REPLICAS``: replicas each check-and-add waits for (``WAIT``)."""
    raw = settings.get(WAIT_SETTING)
    if raw is None or raw == "":
        return 0
    return parse_int(WAIT_SETTING, raw, minimum=0)


def _from_settings(settings: BaseSettings) -> Redis | RedisCluster:
    url, params = client_params(settings)
    redis_cls = params.pop("redis_cls", None)
    if isinstance(redis_cls, str):
        redis_cls = load_object(redis_cls)
    # scrapy-redis's queues store pickled bytes: responses must stay bytes.
    params.pop("decode_responses", None)
    if cluster_mode(settings, redis_cls):
        user_params = settings.get("REDIS_PARAMS") or {}
        return _cluster_client(url, params, redis_cls or RedisClusterClient,
                               user_retry="retry" in user_params)
    if redis_cls is None:
        redis_cls = redis.Redis
    try:
        if url:
            return redis_cls.from_url(url, **params)  # type: ignore[no-any-return]
        return redis_cls(**params)  # type: ignore[no-any-return]
    except ValueError as e:
        shown = redacted(url) if url else repr(params.get("host", "localhost"))
        raise ConfigError("REDIS_URL", shown, str(e)) from None


def cluster_mode(settings: BaseSettings, redis_cls: Any = None) -> bool:
    """Whether ``settings`` ask for a Redis Cluster client.

    ``BLOOMDUPE_REDIS_CLUSTER`` (a bool) decides; unset, a ``redis_cls`` in
    ``REDIS_PARAMS`` that is a ``RedisCluster`` means yes.
    """
    if redis_cls is None:
        user_params = settings.get("REDIS_PARAMS") or {}
        redis_cls = user_params.get("redis_cls") if isinstance(user_params, dict) else None
        if isinstance(redis_cls, str):
            redis_cls = load_object(redis_cls)
    is_cluster_cls = isinstance(redis_cls, type) and issubclass(redis_cls, RedisClusterClient)
    raw = settings.get(CLUSTER_SETTING)
    if raw is None or raw == "":
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


def cluster_params(params: dict[str, Any], *, user_retry: bool = False) -> dict[str, Any]:
    """``params`` (as made by :func:`client_params`) fitted to ``RedisCluster``.

    Drops what a cluster client ignores or refuses but that means nothing
    here; refuses what cannot work with a :class:`ConfigError`. Without a
    ``retry`` of the user's, the cluster gets :func:`cluster.default_retry`;
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
        out["retry"] = cluster.default_retry()
        if attempts is not None:
            out["retry"].update_retries(int(attempts))
    return out


def _cluster_client(url: str | None, params: dict[str, Any], redis_cls: Any, *,
                    user_retry: bool) -> RedisCluster:
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
        raise ConfigError("REDIS_URL", where, str(e)) from None
    except RedisClusterException as e:
        raise _cluster_start_error(where, e) from None


def _cluster_start_error(where: str, e: RedisClusterException) -> BloomDupeError:
    """The one clear error for a cluster client that could not start."""
    text = str(e)
    cause = e.__cause__ or e.__context__
    detail = str(cause).rstrip(".") if cause is not None else text.rstrip(".")
    denied = _find_cause(e, redis.exceptions.NoPermissionError)
    if denied is not None:
        return BloomDupeError(
            f"Redis Cluster at {where} refused a command to this user ({denied}); grant the "
            "ACL of docs/security.md (on a cluster also +cluster|slots +command), on every node"
        )
    if "Cluster mode is not enabled" in text or "cluster support disabled" in text:
        return ConfigError(
            CLUSTER_SETTING, True,
            f"Redis at {where} is not a Redis Cluster node (cluster support disabled). "
            f"Set {CLUSTER_SETTING} = False (and drop a RedisCluster redis_cls from "
            "REDIS_PARAMS) for a single Redis, or point REDIS_URL / BLOOMDUPE_REDIS_URL at "
            "a cluster node",
        )
    if "db" in text and "cluster mode" in text:
        return ConfigError("REDIS_URL", where, "the database must be 0 on a Redis Cluster")
    if "Unix Domain Socket" in text:
        return ConfigError("REDIS_URL", where, "a Redis Cluster client connects over TCP only")
    if isinstance(cause, redis.AuthenticationError) or any(
            mark in text for mark in ("WRONGPASS", "NOAUTH", "invalid password",
                                      "already authenticated", "Authentication")):
        return BloomDupeError(
            f"Redis Cluster at {where} refused the credentials. Check the user and password "
            "in REDIS_URL / BLOOMDUPE_REDIS_URL or REDIS_PARAMS."
        )
    if isinstance(cause, (redis.ConnectionError, redis.TimeoutError)) or "connect" in text:
        return BloomDupeError(
            f"Cannot reach Redis Cluster at {where}: {detail}. Start the cluster or "
            "point REDIS_URL / BLOOMDUPE_REDIS_URL at one of its nodes."
        )
    return BloomDupeError(f"Cannot start a Redis Cluster client for {where}: {text}")


def get_client(crawler: Crawler) -> Redis | RedisCluster:
    """The crawler's shared client, made on first use."""
    client = _clients.get(crawler)
    if client is None:
        client = from_settings(crawler.settings)
        _clients[crawler] = client
    return client


def describe(client: Redis | RedisCluster) -> str:
    """Where ``client`` points, without credentials."""
    if cluster.is_cluster(client):
        return _describe_cluster(client)
    kwargs = getattr(client, "connection_pool", None)
    kw = kwargs.connection_kwargs if kwargs is not None else {}
    if "path" in kw:
        return f"unix://{kw['path']}"
    return f"{kw.get('host', '?')}:{kw.get('port', '?')} db {kw.get('db', 0)}"


def _describe_cluster(client: Any) -> str:
    try:
        masters = sorted(n.name for n in client.get_primaries())
    except Exception:  # describing must never fail
        masters = []
    if not masters:
        return "Redis Cluster"
    shown = ", ".join(masters[:3]) + (", ..." if len(masters) > 3 else "")
    return f"Redis Cluster ({len(masters)} masters: {shown})"


def _find_cause(error: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first exception of ``kind`` among ``error``'s causes and contexts."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, kind):
            return e
        todo.extend((e.__cause__, e.__context__))
    return None


def check(client: Redis | RedisCluster) -> None:
    """Ping Redis; turn the failures a user can fix into one clear error.

    A single-node client pointed at a Redis Cluster node (it would get
    ``MOVED`` for most keys) is refused with a :class:`ConfigError` that says to
    set ``BLOOMDUPE_REDIS_CLUSTER = True``.
    """
    where = describe(client)
    try:
        client.ping()
    except redis.AuthenticationError as e:
        raise BloomDupeError(
            f"Redis at {where} refused the credentials ({e}). Check the user and password "
            "in REDIS_URL / BLOOMDUPE_REDIS_URL or REDIS_PARAMS."
        ) from None
    except redis.ResponseError as e:
        # redis-py's NoPermissionError drops the "NOPERM" prefix from the message.
        if isinstance(e, redis.exceptions.NoPermissionError) or "NOAUTH" in str(e) \
                or "NOPERM" in str(e):
            raise BloomDupeError(
                f"Redis at {where} needs a password or more permissions ({e}). Put the "
                "credentials in REDIS_URL (redis://user:password@host:port) and grant the ACL "
                "of docs/security.md."
            ) from None
        raise
    except (redis.ConnectionError, redis.TimeoutError) as e:
        raise BloomDupeError(
            f"Cannot reach Redis at {where}: {str(e).rstrip('.')}. Start Redis or point "
            "REDIS_URL / BLOOMDUPE_REDIS_URL at it."
        ) from None
    except RedisClusterException as e:
        raise BloomDupeError(f"Redis Cluster at {where} cannot be used: {e}") from None
    if not cluster.is_cluster(client) and server_mode(client) == "cluster":
        raise not_a_cluster_client(where)


def not_a_cluster_client(where: str) -> ConfigError:
    return ConfigError(
        CLUSTER_SETTING, False,
        f"Redis at {where} is a Redis Cluster node: a single-node client gets MOVED "
        f"errors for the keys other masters hold. Set {CLUSTER_SETTING} = True",
    )


def server_mode(client: Redis | RedisCluster) -> str | None:
    """``"standalone"``, ``"cluster"`` or ``"sentinel"`` as the server says (``HELLO``);
    None when it does not say (HELLO is exempt from ACLs, but older servers lack it)."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return "cluster" if cluster.is_cluster(client) else None
    conn = pool.get_connection()
    try:
        meta: Any = conn.handshake_metadata  # set by the RESP3 handshake (HELLO 3)
        if not meta:
            # RESP2: HELLO with no version only reports, it switches nothing.
            conn.send_command("HELLO")
            meta = conn.read_response()
    except redis.ResponseError:
        return None
    except (redis.ConnectionError, redis.TimeoutError):
        conn.disconnect()
        return None
    finally:
        pool.release(conn)
    if isinstance(meta, list):
        meta = dict(zip(meta[::2], meta[1::2], strict=False))
    if not isinstance(meta, dict):
        return None
    mode = meta.get(b"mode", meta.get("mode"))
    return mode.decode() if isinstance(mode, bytes) else (str(mode) if mode else None)
