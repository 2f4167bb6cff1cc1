"""A client of the master that Redis Sentinel names, following it through failovers.

``BLOOMDUPE_SENTINELS`` lists the sentinels, ``BLOOMDUPE_SENTINEL_MASTER`` names
the master they watch. The client is redis-py's
``Sentinel(sentinels).master_for(name)``: each of its connections asks the
sentinels where the master is when it connects. After a failover a connection
to the old master fails (refused, reset, or ``READONLY`` from a demoted master,
which redis-py turns into a ``ConnectionError``), is dropped, and the next
attempt connects to the new master; the retries of :mod:`.link` and the outage
guard (:mod:`.outage`) wait meanwhile. Every command this package sends is safe
to repeat, so nothing is lost or done twice by the retry itself; what a
failover can lose is what asynchronous replication had not yet copied (see
``BLOOMDUPE_WAIT_REPLICAS`` and the README's guarantees).

The master's credentials and database come from ``REDIS_URL`` (its host and
port are not used: the sentinels name the master) and ``REDIS_PARAMS``; the
sentinels' own (``BLOOMDUPE_SENTINEL_PASSWORD``, ``BLOOMDUPE_SENTINEL_PARAMS``)
are separate, as Sentinel's ``requirepass`` usually differs from the master's.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio.connection as aio_connection
import redis.asyncio.sentinel as aio_sentinel
from redis.connection import SSLConnection, parse_url
from redis.exceptions import ReadOnlyError
from redis.maint_notifications import MaintNotificationsConfig
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection

from ..exceptions import ConfigError
from ..settings import SENTINELS_SETTING
from .onloop import await_only, bridged

if TYPE_CHECKING:
    from ..settings import RedisSettings
    from .onloop import AsyncNode

logger = logging.getLogger(__name__)

#: Socket timeouts of the connections to the sentinels (seconds): a sentinel that does
#: not answer is skipped for the next one quickly.
SENTINEL_SOCKET_TIMEOUT = 2.0
#: How often a connection that stays up asks the sentinels where the master is (seconds).
MASTER_CHECK_INTERVAL = 0.25
#: Times in a row a round trip is built again because the master changed meanwhile
#: (:class:`MasterChanged`) before it counts as Redis being unavailable.
MAX_MASTER_CHANGES = 5
#: Client arguments that name where the master is: the sentinels say that.
_ADDRESS_PARAMS = ("host", "port", "unix_socket_path", "path", "connection_pool")


class MasterConnection(SentinelManagedConnection):
    """A connection of the master that asks the sentinels where it is on every connect,
    and follows every change any connection of its client has seen.

    redis-py's ``SentinelManagedConnection`` asks only in ``connect()``, and

    * a command sent on a connection that was dropped (after an error, by a
      retry) reconnects through ``connect_check_health()``, to the address the
      connection had: the old master (redis-py issue 3874). Measured with a
      master SIGKILLed and started again: the workers wrote to it as it came
      back (writes lost when the sentinels made it a replica), then failed with
      ``READONLY`` for ever;
    * a connection that stays up (the filter and the queue each hold one)
      never asks again. After ``SENTINEL FAILOVER`` the old master stays a
      writable master until the sentinels turn it into a replica, about 10 s
      later: measured, a whole crawl went on writing there, and every write
      made after the failover was lost with it.

    So the client's pool asks the sentinels at most every
    :data:`MASTER_CHECK_INTERVAL` seconds, before a command (:func:`refresh`),
    and every connection to another server than the one they name is dropped
    before its next command and reconnects to the master: all connections of a
    client switch at once. Each switch adds one to the pool's epoch
    (:func:`master_epoch`), so that the queue can tell work that straddled a
    switch. The sentinels not answering is no reason to stop: connections are kept.

    A batch built for one master (:attr:`built_for`, its epoch: the queue's acks)
    is never sent to another: when the connection would go to the next master
    (a switch, or a retry that reconnects), :class:`MasterChanged` is raised
    instead, before anything is sent, and the batch is built again.
    """

    #: The master epoch the batch being sent was built for (None: any master). Set by
    #: :class:`~.link.Link` around one round trip.
    built_for: int | None = None
    #: redis-py's asynchronous class that :class:`AsyncMaster` connects with.
    async_twin = aio_connection.Connection

    def connect_check_health(self, check_health: bool = True,
                             retry_socket_connect: bool = True) -> None:
        pool = _pool_of(self.connection_pool)
        if getattr(self, "_sock", None) is None and pool.is_master:
            self.host, self.port = _learn(pool, pool.get_master_address())
        super().connect_check_health(check_health=check_health,
                                     retry_socket_connect=retry_socket_connect)

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        pool = _pool_of(self.connection_pool)
        if pool.is_master:
            if getattr(self, "_sock", None) is not None:
                address = _refresh(pool)
                if address is not None and (self.host, self.port) != address:
                    self.disconnect()  # reconnected below, to the master
            if self.built_for is not None:
                if getattr(self, "_sock", None) is None:
                    self.connect_check_health(check_health=False)  # asks the sentinels
                epoch = int(getattr(pool, "_bloomdupe_epoch", 0))
                if epoch != self.built_for:
                    raise MasterChanged(f"the Redis master changed (epoch {self.built_for} -> "
                                        f"{epoch}) between building a round trip and sending it")
        super().send_packed_command(command, check_health=check_health)


class MasterChanged(redis.RedisError):
    """A batch built for one master was about to be sent to the next one; nothing was
    sent. Not a ``ConnectionError``: no retry resends the same batch."""


def _pool_of(pool: Any) -> Any:
    """The client's pool behind ``pool``. redis-py (8.1 here) hands each connection a
    ``SentinelConnectionPoolProxy`` of it, not the pool: what a connection learns
    must be what :func:`master_epoch` reads from the client's pool. (Kept apart,
    the two learned of a failover up to a poll apart, and an ack could be judged
    against the old master and sent to the new one: a page lost in CI.)"""
    ref = getattr(pool, "connection_pool_ref", None)
    owner = ref() if ref is not None else None
    return owner if owner is not None else pool


_learning = threading.Lock()


def _learn(pool: Any, address: Any) -> tuple[str, int]:
    """Record ``address`` as the master's in ``pool``; a change is a new epoch."""
    host, port = str(address[0]), int(address[1])
    with _learning:  # the Redis thread and Scrapy's may learn at once: one new epoch
        known = getattr(pool, "_bloomdupe_master", None)
        if known is not None and known != (host, port):
            pool._bloomdupe_epoch = getattr(pool, "_bloomdupe_epoch", 0) + 1
            logger.warning("Redis Sentinel: the master of %r is now %s:%s (was %s:%s); every "
                           "connection follows it", pool.service_name, host, port, *known)
        pool._bloomdupe_master = (host, port)
        pool._bloomdupe_checked = time.monotonic()
    return host, port


def _refresh(pool: Any) -> tuple[str, int] | None:
    """The master's address as the pool knows it, asking the sentinels first when
    :data:`MASTER_CHECK_INTERVAL` has passed (None: not known yet)."""
    if time.monotonic() - getattr(pool, "_bloomdupe_checked", 0.0) >= MASTER_CHECK_INTERVAL:
        pool._bloomdupe_checked = time.monotonic()
        try:
            _learn(pool, _ask(pool))
        except (redis.ConnectionError, redis.TimeoutError) as e:
            logger.debug("The sentinels did not say where the master is: %s", e)
    known: tuple[str, int] | None = getattr(pool, "_bloomdupe_master", None)
    return known


def _ask(pool: Any) -> Any:
    """Where the sentinels say the master is: awaited on ``redis.asyncio`` inside a job
    of :func:`~.onloop.run_bridged` (the crawl on Scrapy's asyncio reactor), else
    asked with the pool's own blocking sentinel clients."""
    if not bridged():
        return pool.get_master_address()
    return await_only(_async_sentinels(pool).discover_master(pool.service_name))


def _async_sentinels(pool: Any) -> aio_sentinel.Sentinel:
    """redis-py's asynchronous twin of the pool's ``Sentinel`` (same sentinels, same
    arguments), made once for the running loop."""
    loop = asyncio.get_running_loop()
    made: tuple[Any, aio_sentinel.Sentinel] | None = getattr(pool, "_bloomdupe_aio", None)
    if made is None or made[0] is not loop:
        manager = pool.sentinel_manager
        addresses = [(s.connection_pool.connection_kwargs.get("host", "localhost"),
                      s.connection_pool.connection_kwargs.get("port", 26379))
                     for s in manager.sentinels]
        twin = aio_sentinel.Sentinel(addresses, min_other_sentinels=manager.min_other_sentinels,
                                     sentinel_kwargs=dict(manager.sentinel_kwargs))
        made = (loop, twin)
        pool._bloomdupe_aio = made
    return made[1]


class AsyncMaster:
    """:class:`MasterConnection`'s twin on ``redis.asyncio``: a link's round trips to
    the master, inside a job of :func:`~.onloop.run_bridged`.

    Before each round trip the pool asks the sentinels where the master is (awaited,
    on every connect and at most every :data:`MASTER_CHECK_INTERVAL` seconds between,
    sharing what it learns and its epoch with the blocking connections); the
    connection follows the address they name. A batch built for another epoch raises
    :class:`MasterChanged` before anything is sent. A lost connection, or ``READONLY``
    from a demoted master, is a ``ConnectionError`` (as redis-py's
    ``SentinelManagedConnection`` makes it) after which the next round trip asks the
    sentinels first."""

    def __init__(self, pool: Any, node: AsyncNode) -> None:
        self._pool = pool
        self._node = node

    def round_trip(self, commands: Sequence[tuple[Any, ...]], built_for: int | None
                   ) -> list[Any]:
        pool = self._pool
        if not self._node.connected:  # as MasterConnection: every connect asks the sentinels
            pool._bloomdupe_checked = 0.0
        address = _refresh(pool)
        if address is None:  # the sentinels did not answer yet: ask once more, or fail
            address = _learn(pool, _ask(pool))
        epoch = int(getattr(pool, "_bloomdupe_epoch", 0))
        if built_for is not None and epoch != built_for:
            raise MasterChanged(f"the Redis master changed (epoch {built_for} -> {epoch}) "
                                "between building a round trip and sending it")
        try:
            replies = await_only(self._node.round_trip(commands, address))
        except (redis.ConnectionError, redis.TimeoutError):
            pool._bloomdupe_checked = 0.0  # ask the sentinels before the next one
            raise
        if any(isinstance(reply, ReadOnlyError) for reply in replies):
            pool._bloomdupe_checked = 0.0
            self._node.close()
            raise redis.ConnectionError(f"{address[0]}:{address[1]} is no longer the master "
                                        "(READONLY); asking the sentinels again")
        return replies

    def close(self) -> None:
        self._node.close()
        made = getattr(self._pool, "_bloomdupe_aio", None)
        self._pool._bloomdupe_aio = None
        if made is not None:
            for sentinel in made[1].sentinels:
                self._node.closing(sentinel.aclose())


def master_epoch(client: Any) -> int:
    """How many times ``client``'s master has changed since it was made (asking the
    sentinels first if it is time); 0 for a client that is not a Sentinel one."""
    pool = getattr(client, "connection_pool", None)
    if not isinstance(pool, SentinelConnectionPool):
        return 0
    _refresh(pool)
    return int(getattr(pool, "_bloomdupe_epoch", 0))


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
    client: redis.Redis = manager.master_for(config.sentinel_master,
                                             redis_class=config.redis_cls or redis.Redis)
    return client


def url_params(url: str) -> dict[str, Any]:
    """What ``REDIS_URL`` says of the master besides where it is: user, password,
    database, TLS (``rediss://``)."""
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
    return isinstance(getattr(client, "connection_pool", None), SentinelConnectionPool)


def describe(client: Any) -> str:
    """``Sentinel master 'mymaster' (sentinels h1:26379, h2:26379)``, no credentials."""
    pool = client.connection_pool
    sentinels = getattr(getattr(pool, "sentinel_manager", None), "sentinels", [])
    addresses = []
    for sentinel in sentinels:
        kw = sentinel.connection_pool.connection_kwargs
        addresses.append(f"{kw.get('host', '?')}:{kw.get('port', '?')}")
    db = pool.connection_kwargs.get("db", 0)
    return (f"Sentinel master {pool.service_name!r} db {db} (sentinels "
            f"{', '.join(addresses) or '?'})")
