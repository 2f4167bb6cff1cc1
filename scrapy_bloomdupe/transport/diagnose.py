"""Checking a Redis before use and saying clearly what is wrong: where a client points (no
credentials), a ping that turns fixable failures into one clear error, the server's mode and
version (:data:`OLDEST_REDIS`; any Valkey), persistence and eviction checks, and the ACL probe.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import redis
from redis.exceptions import RedisClusterException
from redis.sentinel import MasterNotFoundError

from .. import keys
from ..exceptions import BloomDupeError, ConfigError
from ..redaction import AUTHORITY_ENDS, redacted, scrub, split_userinfo
from ..settings import CLUSTER_SETTING, SENTINEL_MASTER_SETTING, SENTINELS_SETTING
from . import sentinel
from .cluster import is_cluster

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

logger = logging.getLogger(__name__)


def url_problem(url: str) -> str | None:
    """Why redis-py would misread ``url``'s user name or password, or None: ``urllib.parse``
    ends the authority at the first ``/``, ``?`` or ``#``, so one unencoded in a password makes
    the rest host, port or path (``redis://u:pa#ss@h/0``: host ``u``, port ``pa``). Refused
    before use, so no part of a password is ever shown as a host."""
    _, userinfo, _ = split_userinfo(url)
    if userinfo is None or not any(c in userinfo for c in AUTHORITY_ENDS):
        return None
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        netloc = ""
    if "@" in netloc:  # redis-py finds the user info; an "@" further on is in the path or query
        return None
    return ("the user name or password holds '/', '?' or '#' unencoded, which end a URL's "
            "host part: redis-py would read part of the password as the host or port. "
            "Percent-encode them (/ %2F, ? %3F, # %23, @ %40, % %25), for example with "
            "urllib.parse.quote(password, safe=''); an '@' in the query must be %40 too")


def describe(client: Redis | RedisCluster) -> str:
    """Where ``client`` points, without credentials."""
    if is_cluster(client):
        return _describe_cluster(client)
    if sentinel.is_sentinel_client(client):
        return sentinel.describe(client)
    kwargs = getattr(client, "connection_pool", None)
    kw = kwargs.connection_kwargs if kwargs is not None else {}
    # redacted: a host written as a URL with its password (REDIS_HOST = "u:pw@h")
    if "path" in kw:
        return redacted(f"unix://{kw['path']}")
    return redacted(f"{kw.get('host', '?')}:{kw.get('port', '?')} db {kw.get('db', 0)}")


def _describe_cluster(client: Any) -> str:
    try:
        masters = sorted(n.name for n in client.get_primaries())
    except Exception:  # describing must never fail
        masters = []
    if not masters:
        return "Redis Cluster"
    shown = ", ".join(masters[:3]) + (", ..." if len(masters) > 3 else "")
    return f"Redis Cluster ({len(masters)} masters: {shown})"


def find_cause(error: BaseException, kind: type[BaseException]) -> BaseException | None:
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


#: The oldest Redis supported: scripts check the ACL for every write before the first
#: (``redis.acl_check_cmd``, Redis 7.0), so a refused command never leaves half a batch.
OLDEST_REDIS = (7, 0)
#: Valkey numbers its own releases from 7.2 (a Redis 7.2.4 fork); all have that check.
OLDEST_VALKEY = (7, 2)


def server_name(said: dict[str, Any]) -> str:
    """``"Valkey"`` or ``"Redis"`` (for any other or none), from ``HELLO``'s ``server``."""
    return "Valkey" if str(said.get("server", "")).lower() == "valkey" else "Redis"


def too_old(version: str, server: str = "Redis") -> bool:
    """Whether ``version`` of ``server`` is older than :data:`OLDEST_REDIS` (Valkey:
    :data:`OLDEST_VALKEY`); a version that does not parse is let through."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) < (OLDEST_VALKEY if server == "Valkey" else OLDEST_REDIS)


def version_problem(where: str, said: dict[str, Any]) -> str | None:
    """Why the server at ``where`` (``said`` in ``HELLO``) is too old, or None."""
    version, name = str(said.get("version") or ""), server_name(said)
    if not too_old(version, name):
        return None
    oldest = OLDEST_VALKEY if name == "Valkey" else OLDEST_REDIS
    return (f"{name} at {where} is version {version}; scrapy-bloomdupe needs {name} "
            f"{'.'.join(map(str, oldest))} or later (its scripts check the ACL before their "
            f"first write). Upgrade {name}.")


def check(client: Redis | RedisCluster) -> None:
    """Ping Redis, turning failures a user can fix into one clear error; then check mode and
    version. A single-node client on a cluster node (``MOVED`` for most keys) is refused."""
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
    except MasterNotFoundError as e:
        raise BloomDupeError(
            f"No sentinel gives the address of the master: {where}: {str(e).rstrip('.')}. "
            f"Check {SENTINELS_SETTING} (sentinels that run and answer) and "
            f"{SENTINEL_MASTER_SETTING} (the name in their `sentinel monitor NAME ...`; "
            "`SENTINEL MASTERS` on a sentinel lists them)."
        ) from None
    except (redis.ConnectionError, redis.TimeoutError) as e:
        raise BloomDupeError(
            f"Cannot reach Redis at {where}: {str(e).rstrip('.')}. Start Redis or point "
            "REDIS_URL / BLOOMDUPE_REDIS_URL at it."
        ) from None
    except RedisClusterException as e:
        raise BloomDupeError(f"Redis Cluster at {where} cannot be used: {e}") from None
    except (TypeError, ValueError) as e:  # an argument redis-py took but cannot use
        pool = getattr(client, "connection_pool", None)
        kw = getattr(pool, "connection_kwargs", {})
        text = scrub(str(e), kw.get("password"), kw.get("ssl_password"))
        raise ConfigError("REDIS_PARAMS", None, f"redis-py cannot connect with these client "
                          f"arguments ({type(e).__name__}: {text}); check their names and "
                          "types") from None
    # One HELLO a server (exempt from ACLs): its mode, then its version.
    if is_cluster(client):
        cluster: Any = client
        heard = [(node, hello(node)) for node in
                 (cluster.get_redis_connection(primary) for primary in cluster.get_primaries())]
    else:
        said = hello(client)
        if said.get("mode") == "cluster":
            raise not_a_cluster_client(where)
        if said.get("mode") == "sentinel":
            raise ConfigError(
                "REDIS_URL", where,
                f"is a Redis Sentinel, not a Redis that holds data: list the sentinels in "
                f"{SENTINELS_SETTING} and name the master in {SENTINEL_MASTER_SETTING}",
            )
        heard = [(client, said)]
    for node, said in heard:
        problem = version_problem(describe(node), said)
        if problem:
            raise BloomDupeError(problem)


def not_a_cluster_client(where: str) -> ConfigError:
    return ConfigError(
        CLUSTER_SETTING, False,
        f"Redis at {where} is a Redis Cluster node: a single-node client gets MOVED "
        f"errors for the keys other masters hold. Set {CLUSTER_SETTING} = True",
    )


def hello(client: Redis | RedisCluster) -> dict[str, Any]:
    """What the server says of itself in ``HELLO`` (``mode``, ``version``, ...: str keys
    and values), from the connection's handshake or asked; empty when it does not say."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return {}
    conn = pool.get_connection()
    try:
        meta: Any = conn.handshake_metadata  # set by the RESP3 handshake (HELLO 3)
        if not meta:
            # RESP2: HELLO with no version only reports, it switches nothing.
            conn.send_command("HELLO")
            meta = conn.read_response()
    except redis.ResponseError:
        return {}
    except (redis.ConnectionError, redis.TimeoutError):
        conn.disconnect()
        return {}
    finally:
        pool.release(conn)
    if isinstance(meta, list):
        meta = dict(zip(meta[::2], meta[1::2], strict=False))
    if not isinstance(meta, dict):
        return {}

    def text(value: Any) -> Any:
        return value.decode() if isinstance(value, bytes) else value
    return {text(k): text(v) for k, v in meta.items()}


def cluster_start_error(where: str, e: RedisClusterException) -> BloomDupeError:
    """The one clear error for a cluster client that could not start."""
    text = str(e)
    cause = e.__cause__ or e.__context__
    detail = str(cause).rstrip(".") if cause is not None else text.rstrip(".")
    denied = find_cause(e, redis.exceptions.NoPermissionError)
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


def warn_if_not_durable(client: Redis | RedisCluster) -> None:
    """Warn when Redis keeps nothing on disk: a restart would forget every seen URL."""
    try:
        config = client.config_get("appendonly") | client.config_get("save")
    except redis.ResponseError as e:  # CONFIG is often not granted; then say nothing
        logger.debug("Cannot read Redis persistence settings: %s", e)
        return
    if not isinstance(config, dict) or "appendonly" not in config:
        return  # a cluster client answers per node
    if str(config.get("appendonly")) in ("no", "b'no'") and not config.get("save"):
        logger.warning(
            "The filter is kept for the next run (SCHEDULER_PERSIST, or the dupefilter "
            "alone) but Redis keeps nothing on disk (appendonly no, no save "
            "points): a Redis restart forgets the filter and the queue, and the crawl stops "
            "(it cannot resume) and must start over. Turn on AOF (appendonly yes) or RDB "
            "snapshots."
        )


# -- what the crawl may do there ----------------------------------------------------------


def refusal(where: str, error: BaseException) -> str:
    """One line for an error reply the crawl cannot go on after (``NOPERM``: the rule to add)."""
    text = str(error).split(" script: ")[0].rstrip(".")
    if isinstance(error, redis.exceptions.NoPermissionError) or "NOPERM" in text:
        command = re.search(r"run the '([^']+)' command", text)
        if command:
            name = command.group(1).lower()
            return (f"Redis at {where} refuses this user the command {name.upper()} "
                    f"(NOPERM: {text}). Add +{name} to the user's ACL; docs/security.md lists "
                    "every rule a crawl needs")
        if "key" in text:
            return (f"Redis at {where} refuses this user a key of the crawl (NOPERM: {text}). "
                    "Its ACL must allow the key patterns of docs/security.md (~K:* ~{K:* "
                    "for BLOOMDUPE_KEY K)")
        return (f"Redis at {where} refuses this user (NOPERM: {text}); grant the ACL of "
                "docs/security.md")
    if isinstance(error, redis.exceptions.OutOfMemoryError):
        return (f"Redis at {where} is full and refuses writes (OOM: {text}). Give it more "
                "memory (maxmemory) or free some")
    return f"Redis at {where} refused a command ({type(error).__name__}: {text})"


def probe_commands(key: str, engine: str = "lua", *, window: bool = False
                   ) -> list[tuple[Any, ...]]:
    """Every command a crawl sends (in scripts too), on probe keys it deletes at once.
    ``engine`` (``BLOOMDUPE_ENGINE``) picks bit or ``BF.*`` commands; ``window``
    (``BLOOMDUPE_WINDOW``) adds the slice expiry."""
    s, h, z, x, b, li = (keys.probe(key, kind) for kind in ("s", "h", "z", "x", "b", "l"))
    bits: list[tuple[Any, ...]] = [
        ("BITFIELD", s, "SET", "u1", 0, 0), ("BITFIELD_RO", s, "GET", "u1", 0),
        ("BITCOUNT", s),
    ] if engine == "lua" else [
        ("BF.RESERVE", b, "0.5", 1, "NONSCALING"), ("BF.INSERT", b, "NOCREATE", "ITEMS", "i"),
        ("BF.MEXISTS", b, "i"), ("BF.EXISTS", b, "i"), ("BF.INFO", b, "ITEMS"), ("DEL", b),
    ]
    return [
        ("SET", s, 0, "PX", 60_000), ("GET", s), ("MGET", s, s), ("STRLEN", s), ("EXISTS", s),
        *bits,
        ("INCRBY", s, 1), ("DECRBY", s, 1),
        ("HSET", h, "f", 1), ("HGET", h, "f"), ("HMGET", h, "f"), ("HGETALL", h),
        ("HINCRBY", h, "f", 1), ("HLEN", h), ("HDEL", h, "f"),
        # the queue's download slots (frontier/slots.py)
        ("RPUSH", li, "m"), ("LPUSH", li, "m"), ("LPOP", li, 1), ("LRANGE", li, 0, 0),
        ("LREM", li, 1, "m"),
        ("ZADD", z, 0, "m"), ("ZCARD", z), ("ZRANGE", z, 0, 0),
        ("ZRANGEBYSCORE", z, "-inf", "+inf"), ("ZREMRANGEBYRANK", z, 1, 1), ("ZREM", z, "m"),
        ("XADD", x, "MAXLEN", 1, "*", "f", "v"),
        *([("PEXPIREAT", s, 1 << 42)] if window else []),
        ("DEL", s, h, z, x, li),
    ]


def probe(client: Redis | RedisCluster, key: str, engine: str = "lua", *,
          window: bool = False, wait: bool = False) -> None:
    """Run :func:`probe_commands`, ``TIME``, ``SCRIPT LOAD``, ``EVALSHA`` (``WAIT 0 0`` with
    ``wait``) before any write: one error names every missing ACL rule."""
    commands = probe_commands(key, engine, window=window)
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    outcomes = [(c[0].lower(), r) for c, r in zip(
        commands, pipe.execute(raise_on_error=False), strict=True)]
    run: Any = client.execute_command  # redis-py leaves it unannotated
    where_to = {"target_nodes": "random"} if is_cluster(client) else {}
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("time", client.time), ("script|load", lambda: client.script_load(_PROBE_SCRIPT)),
        ("evalsha", lambda: client.evalsha(_PROBE_SHA, 1, keys.probe(key, "s")))]
    if wait:
        calls.append(("wait", lambda: run("WAIT", 0, 0, **where_to)))
    for name, call in calls:
        try:
            outcomes.append((name, call()))
        except redis.ResponseError as e:
            outcomes.append((name, e))
    where = describe(client)
    denied = [name for name, r in outcomes
              if isinstance(r, redis.exceptions.NoPermissionError) and "command" in str(r)]
    other = next((r for _, r in outcomes if isinstance(r, Exception)
                  and not (isinstance(r, redis.exceptions.NoPermissionError)
                           and "command" in str(r))), None)
    if denied:
        names = list(dict.fromkeys(denied))
        raise BloomDupeError(
            f"Redis at {where} refuses this user command(s) the crawl needs: "
            f"{', '.join(n.upper() for n in names)}. Add {' '.join('+' + n for n in names)} "
            "to its ACL (docs/security.md lists every rule)"
            + ("" if other is None else f"; and: {refusal(where, other)}"))
    if other is not None:
        raise BloomDupeError(refusal(where, other) + " (found checking the ACL at start)")


#: The probe's script: no command inside, so only EVALSHA itself is checked.
_PROBE_SCRIPT = "return 1"
_PROBE_SHA = hashlib.sha1(_PROBE_SCRIPT.encode()).hexdigest()


class Masters(Protocol):
    """What :func:`check_eviction` needs of a :class:`~.link.Link` (which imports this)."""

    def on_masters(self, *command: Any) -> list[tuple[str, Any]]: ...


def check_eviction(link: Masters, *, warn: bool = True) -> None:
    """Refuse a Redis that may evict any key when full (``allkeys-*``): filter or queue lost,
    pages fetched twice or never. Warn on ``volatile-*`` (may evict the expiring op logs).
    The scheduler rechecks every few seconds (``warn`` off) to stop before any eviction.
    Skipped if ``CONFIG GET`` (one a master, via ``link``) is denied or no ``maxmemory``."""
    try:
        configs = link.on_masters("CONFIG GET", "maxmemory*")
    except redis.ResponseError as e:
        logger.debug("Cannot read Redis's maxmemory-policy (%s); not checked", e)
        return
    for where, config in configs:
        policy = str(config.get("maxmemory-policy", ""))
        if not int(config.get("maxmemory", 0) or 0) or policy == "noeviction":
            continue
        if policy.startswith("allkeys-"):
            raise BloomDupeError(
                f"Redis at {where} evicts any key when it is full (maxmemory-policy "
                f"{policy}): it would evict the crawl's filter or queue, and pages would be "
                "fetched twice or never. Set maxmemory-policy noeviction (CONFIG SET "
                "maxmemory-policy noeviction, or in redis.conf; then a full Redis stops the "
                "crawl with a clear error), or give the crawl a Redis of its own")
        if warn:
            logger.warning(
                "Redis at %s evicts keys that expire when it is full (maxmemory-policy %s): "
                "it may evict the op logs that make a retry after a lost reply safe. "
                "maxmemory-policy noeviction is safer for a crawl.", where, policy)
