"""A client of the master that Redis Sentinel names, following it through failovers.

``BLOOMDUPE_SENTINELS`` lists the sentinels, ``BLOOMDUPE_SENTINEL_MASTER`` names the master;
the client is redis-py's ``Sentinel(sentinels).master_for(name)``. After a failover a
connection to the old master fails (refused, reset, or ``READONLY``: a ``ConnectionError``)
and the retries (:mod:`.link`, :mod:`.outage`) reconnect to the new one. Every command is safe
to repeat; a failover can still lose what replication had not copied
(``BLOOMDUPE_WAIT_REPLICAS``). The master's credentials and db come from ``REDIS_URL`` (not its
host) and ``REDIS_PARAMS``; the sentinels' own from ``BLOOMDUPE_SENTINEL_PASSWORD`` and
``BLOOMDUPE_SENTINEL_PARAMS``."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio.client as aio_client
import redis.asyncio.connection as aio_connection
import redis.asyncio.sentinel as aio_sentinel
from redis.connection import SSLConnection, parse_url
from redis.exceptions import ReadOnlyError
from redis.maint_notifications import MaintNotificationsConfig
from redis.sentinel import Sentinel, SentinelManagedConnection

from ..exceptions import ConfigError
from ..settings import SENTINELS_SETTING
from .onloop import await_only, bridged

if TYPE_CHECKING:
    from ..settings import RedisSettings
    from .onloop import AsyncNode

#: Whether ``redis.asyncio`` clients take ``maint_notifications_config`` (redis-py 8.1+).
ASYNC_MAINT_NOTIFICATIONS = "maint_notifications_config" in inspect.signature(
    aio_client.Redis.__init__).parameters

logger = logging.getLogger(__name__)

#: Socket timeouts to the sentinels (s): one that does not answer is skipped quickly.
SENTINEL_SOCKET_TIMEOUT = 2.0
#: How often a connection that stays up asks the sentinels where the master is (seconds).
MASTER_CHECK_INTERVAL = 0.25
#: Round trips rebuilt in a row for a changed master before Redis counts as unavailable.
MAX_MASTER_CHANGES = 5
#: Client arguments that name where the master is: the sentinels say that.
_ADDRESS_PARAMS = ("host", "port", "unix_socket_path", "path", "connection_pool")


class MasterWatch:
    """Where one Sentinel client's master is, shared by all its connections (blocking and
    :class:`AsyncMaster`) so all switch at once; each change adds one to :attr:`epoch`, so
    the queue can tell work that straddled a switch. It asks ``discover_master`` on every
    connect and at most every :data:`MASTER_CHECK_INTERVAL` between; connections get it as
    the ``master_watch`` argument (nothing is stored on redis-py's objects)."""

    def __init__(self, sentinel: Sentinel, service_name: str,
                 sentinels: Sequence[tuple[str, int]], sentinel_kwargs: dict[str, Any]) -> None:
        self.sentinel = sentinel
        self.service_name = service_name
        self.sentinels = list(sentinels)
        self._sentinel_kwargs = sentinel_kwargs
        #: The master's (host, port) as last learned; None before the first answer.
        self.address: tuple[str, int] | None = None
        #: How many times the master changed since the client was made.
        self.epoch = 0
        #: When the sentinels were last asked (``time.monotonic()``).
        self.checked = -math.inf
        self._lock = threading.Lock()
        self._aio: tuple[asyncio.AbstractEventLoop, aio_sentinel.Sentinel] | None = None

    def ask_soon(self) -> None:
        """Ask the sentinels before the next round trip (a connection was lost)."""
        self.checked = -math.inf

    def learn(self, address: Any) -> tuple[str, int]:
        """Record ``address`` as the master's; a change is a new epoch."""
        host, port = str(address[0]), int(address[1])
        with self._lock:  # two threads may learn at once: one new epoch
            known = self.address
            if known is not None and known != (host, port):
                self.epoch += 1
                logger.warning("Redis Sentinel: the master of %r is now %s:%s (was %s:%s); "
                               "every connection follows it", self.service_name, host, port,
                               *known)
            self.address = (host, port)
            self.checked = time.monotonic()
        return host, port

    def ask(self, blocking: bool = False) -> tuple[str, int]:
        """Where the sentinels say the master is now (``MasterNotFoundError`` if none says):
        awaited inside a :func:`~.onloop.run_bridged` job unless ``blocking``."""
        if bridged() and not blocking:
            return self.learn(await_only(self._async().discover_master(self.service_name)))
        return self.learn(self.sentinel.discover_master(self.service_name))

    def refresh(self, blocking: bool = False) -> tuple[str, int] | None:
        """The master's address (None: unknown), asking first if due; silence keeps the last."""
        if time.monotonic() - self.checked >= MASTER_CHECK_INTERVAL:
            self.checked = time.monotonic()
            try:
                self.ask(blocking)
            except (redis.ConnectionError, redis.TimeoutError) as e:
                logger.debug("The sentinels did not say where the master is: %s", e)
        return self.address

    def _async(self) -> aio_sentinel.Sentinel:
        """redis-py's async ``Sentinel`` of the same sentinels, made once per running loop."""
        loop = asyncio.get_running_loop()
        if self._aio is None or self._aio[0] is not loop:
            kwargs = dict(self._sentinel_kwargs)
            if not ASYNC_MAINT_NOTIFICATIONS:  # redis-py 8.0's redis.asyncio: none to turn off
                kwargs.pop("maint_notifications_config", None)
            self._aio = (loop, aio_sentinel.Sentinel(self.sentinels, sentinel_kwargs=kwargs))
        return self._aio[1]

    def close_async(self, closing: Callable[[Coroutine[Any, Any, Any]], None]) -> None:
        """Close the asynchronous sentinels' connections (``closing`` runs each close)."""
        made, self._aio = self._aio, None
        if made is not None:
            for sentinel in made[1].sentinels:
                closing(sentinel.aclose())


class MasterConnection(SentinelManagedConnection):
    """A master connection that asks where the master is on every connect and follows any
    change its client's connections have seen (:class:`MasterWatch`). redis-py's
    ``SentinelManagedConnection`` asks only in ``connect()``: a dropped connection reconnects
    to the old master (redis-py issue 3874: writes lost, then ``READONLY`` for ever), and one
    that stays up never asks again (after ``SENTINEL FAILOVER`` the old master stays writable
    until demoted, losing those writes). So before a command the watch asks if it is due,
    and a connection elsewhere reconnects. A batch built for one master (:attr:`built_for`)
    is never sent to another: :class:`MasterChanged` is raised first, and it is rebuilt."""

    #: Master epoch the batch being sent was built for (None: any); set by :class:`~.link.Link`.
    built_for: int | None = None
    #: redis-py's asynchronous class that :class:`AsyncMaster` connects with.
    async_twin = aio_connection.Connection

    def __init__(self, *, master_watch: MasterWatch, **kwargs: Any) -> None:
        self.watch = master_watch
        super().__init__(**kwargs)

    def connect_check_health(self, check_health: bool = True,
                             retry_socket_connect: bool = True) -> None:
        if getattr(self, "_sock", None) is None:
            self.host, self.port = self.watch.ask(blocking=True)
        super().connect_check_health(check_health=check_health,
                                     retry_socket_connect=retry_socket_connect)

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if getattr(self, "_sock", None) is not None:
            address = self.watch.refresh(blocking=True)
            if address is not None and (self.host, self.port) != address:
                self.disconnect()  # reconnected below, to the master
        if self.built_for is not None:
            if getattr(self, "_sock", None) is None:
                self.connect_check_health(check_health=False)  # asks the sentinels
            if self.watch.epoch != self.built_for:
                raise MasterChanged(f"the Redis master changed (epoch {self.built_for} -> "
                                    f"{self.watch.epoch}) between building a round trip and "
                                    "sending it")
        super().send_packed_command(command, check_health=check_health)


class MasterChanged(redis.RedisError):
    """A batch built for one master was about to be sent to the next one; nothing was
    sent. Not a ``ConnectionError``: no retry resends the same batch."""


class AsyncMaster:
    """:class:`MasterConnection`'s twin on ``redis.asyncio``, inside a
    :func:`~.onloop.run_bridged` job: it follows the shared :class:`MasterWatch`, a batch for
    another epoch raises :class:`MasterChanged` unsent, and a lost connection or ``READONLY``
    is a ``ConnectionError`` after which the sentinels are asked first."""

    def __init__(self, pool: Any, node: AsyncNode) -> None:
        watch = pool.connection_kwargs.get("master_watch")
        assert isinstance(watch, MasterWatch), "a Sentinel client not made by build()"
        self._watch = watch
        self._node = node

    def round_trip(self, commands: Sequence[tuple[Any, ...]], built_for: int | None
                   ) -> list[Any]:
        watch = self._watch
        if not self._node.connected:  # as MasterConnection: every connect asks the sentinels
            watch.ask_soon()
        address = watch.refresh()
        if address is None:  # the sentinels did not answer yet: ask once more, or fail
            address = watch.ask()
        if built_for is not None and watch.epoch != built_for:
            raise MasterChanged(f"the Redis master changed (epoch {built_for} -> "
                                f"{watch.epoch}) between building a round trip and sending it")
        try:
            replies = await_only(self._node.round_trip(commands, address))
        except (redis.ConnectionError, redis.TimeoutError):
            watch.ask_soon()
            raise
        if any(isinstance(reply, ReadOnlyError) for reply in replies):
            watch.ask_soon()
            self._node.close()
            raise redis.ConnectionError(f"{address[0]}:{address[1]} is no longer the master "
                                        "(READONLY); asking the sentinels again")
        return replies

    def close(self) -> None:
        self._node.close()
        self._watch.close_async(self._node.closing)


def master_watch(client: Any) -> MasterWatch | None:
    """The :class:`MasterWatch` of a client made by :func:`build`; None for another."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    watch = kwargs.get("master_watch") if isinstance(kwargs, dict) else None
    return watch if isinstance(watch, MasterWatch) else None


def master_epoch(client: Any) -> int:
    """How often ``client``'s master has changed (asking first if due); 0 if not Sentinel."""
    watch = master_watch(client)
    if watch is None:
        return 0
    watch.refresh()
    return watch.epoch


class MasterSSLConnection(MasterConnection, SSLConnection):
    """:class:`MasterConnection` over TLS (``rediss://``)."""

    async_twin = aio_connection.SSLConnection


def build(config: RedisSettings, params: dict[str, Any]) -> redis.Redis:
    """A client of ``config.sentinel_master``, found through ``config.sentinels``;
    ``params`` are the master connections' arguments (:func:`.client.client_params`)."""
    kwargs = dict(params)
    for name in _ADDRESS_PARAMS:
        if name in kwargs:
            setting = {"host": "REDIS_HOST", "port": "REDIS_PORT"}.get(name, "REDIS_PARAMS")
            raise ConfigError(setting, kwargs[name] if setting != "REDIS_PARAMS" else None,
                              f"{name} cannot be used with {SENTINELS_SETTING}: the "
                              "sentinels say where the master is; remove it")
    if config.url:
        kwargs = {**url_params(config.url), **kwargs}
    sentinel_kwargs = {"socket_timeout": SENTINEL_SOCKET_TIMEOUT,
                       "socket_connect_timeout": SENTINEL_SOCKET_TIMEOUT,
                       # (a sentinel has no CLIENT MAINT_NOTIFICATIONS either: see client)
                       "maint_notifications_config": MaintNotificationsConfig(enabled=False),
                       **config.sentinel_params}
    kwargs["connection_class"] = MasterSSLConnection if kwargs.pop("ssl", False) \
        else MasterConnection
    manager = Sentinel(list(config.sentinels), sentinel_kwargs=sentinel_kwargs, **kwargs)
    assert config.sentinel_master is not None
    watch = MasterWatch(manager, config.sentinel_master, config.sentinels, sentinel_kwargs)
    client: redis.Redis = manager.master_for(config.sentinel_master,
                                             redis_class=config.redis_cls or redis.Redis,
                                             master_watch=watch)
    return client


def url_params(url: str) -> dict[str, Any]:
    """What ``REDIS_URL`` says of the master but where: user, password, db, TLS."""
    try:
        parsed = parse_url(url)
    except ValueError as e:
        raise ConfigError("REDIS_URL", url, str(e)) from None
    out = {name: parsed[name] for name in ("username", "password", "db") if name in parsed}
    connection_class = parsed.get("connection_class")
    if isinstance(connection_class, type) and issubclass(connection_class, SSLConnection):
        out["ssl"] = True
    out.update({k: v for k, v in parsed.items() if k.startswith("ssl_")})
    return out


def is_sentinel_client(client: Any) -> bool:
    return master_watch(client) is not None


def describe(client: Any) -> str:
    """``Sentinel master 'mymaster' db 0 (sentinels h1:26379, h2:26379)``: no credentials."""
    watch = master_watch(client)
    assert watch is not None
    db = client.connection_pool.connection_kwargs.get("db", 0)
    sentinels = ", ".join(f"{host}:{port}" for host, port in watch.sentinels)
    return f"Sentinel master {watch.service_name!r} db {db} (sentinels {sentinels or '?'})"
