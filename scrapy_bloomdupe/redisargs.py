"""``REDIS_PARAMS`` and ``BLOOMDUPE_SENTINEL_PARAMS`` checked at start, before anything connects.

redis-py takes an unknown key or a wrongly typed value silently and fails on the first
connection, deep in a socket call. Here each key is checked against the signature of the
installed redis-py's constructor it goes to (:class:`Target`), and each value against that
argument's annotation (or default). An error names the setting and the key, never the value
(it may be a password).
"""

from __future__ import annotations

import collections.abc
import difflib
import inspect
import types
import typing
from dataclasses import dataclass
from typing import Any

import redis
import redis.cluster
import redis.connection
import redis.sentinel

from .exceptions import ConfigError


@dataclass(frozen=True)
class Target:
    """Where client arguments go: ``name`` for messages, the keys it takes (None: any)."""

    name: str
    keys: frozenset[str] | None
    #: Said after an unknown key's name when it starts with ``ssl``.
    ssl_hint: str = ""


#: Arguments that are numbers of items or an index: a fraction cannot work.
_WHOLE = frozenset({"port", "db", "max_connections", "socket_read_size", "protocol",
                    "cluster_error_retry_attempts", "reinitialize_steps"})
#: Arguments formatted into an address or command: digits in a string work (``-s REDIS_PORT=``).
_DIGITS_OK = frozenset({"port", "db"})
#: Credentials a number works for (redis-py encodes it): ``{"password": 123456}`` in JSON.
_NUMBER_OK = frozenset({"password", "username"})
#: ``collections.abc`` origins whose value may be any list, tuple or set.
_SEQUENCES = (list, tuple, set, frozenset, collections.abc.Iterable,
              collections.abc.Sequence, collections.abc.Collection)
_NAMES = {int: "a number", float: "a number", bool: "True or False", str: "a string",
          bytes: "bytes", type(None): "None", list: "a list", dict: "a dict",
          collections.abc.Mapping: "a dict", type: "a class"}
_SIMPLE_TEXT = {"int": int, "float": float, "bool": bool, "str": str, "bytes": bytes,
                "None": type(None)}


def _inits(cls: type) -> list[Any]:
    """The ``__init__`` of every class in ``cls``'s MRO that defines one (a cooperative chain)."""
    return [klass.__dict__["__init__"] for klass in cls.__mro__
            if "__init__" in klass.__dict__ and klass is not object]


def _parameters(*functions: Any) -> dict[str, inspect.Parameter]:
    out: dict[str, inspect.Parameter] = {}
    for function in functions:
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):
            continue
        for p in signature.parameters.values():
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self":
                known = out.get(p.name)
                if known is None or known.annotation is inspect.Parameter.empty:
                    out[p.name] = p
    return out


def _keys(*classes: type, functions: tuple[Any, ...] = (), extra: tuple[str, ...] = ()
          ) -> frozenset[str]:
    inits = [init for cls in classes for init in _inits(cls)]
    return frozenset(_parameters(*inits, *functions)) | frozenset(extra)


def _takes_any_key(cls: type) -> bool:
    """A class of the user's whose first ``__init__`` in the MRO that is not redis-py's or
    ``object``'s takes ``**kwargs``: it may use keys no signature names."""
    for klass in cls.__mro__:
        if klass is object or klass.__module__.partition(".")[0] == "redis":
            return False
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            parameters = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            return True
        return any(p.kind is p.VAR_KEYWORD for p in parameters)
    return False


def _class_name(cls: type) -> str:
    return "redis.Redis" if cls is redis.Redis else f"{cls.__module__}.{cls.__qualname__}"


def client(redis_cls: Any = None) -> Target:
    """``redis_cls(**params)`` (``redis.Redis`` by default), no URL."""
    cls = redis_cls if isinstance(redis_cls, type) else redis.Redis
    if cls is not redis.Redis and _takes_any_key(cls):
        return Target(_class_name(cls), None)
    return Target(_class_name(cls), _keys(cls))


def from_url(url: str) -> Target:
    """``Redis.from_url(url, **params)``: to the URL's pool and its connections (by scheme)."""
    scheme = url.partition("://")[0].lower() if "://" in url else "redis"
    connection: type = {"rediss": redis.connection.SSLConnection,
                        "unix": redis.connection.UnixDomainSocketConnection
                        }.get(scheme, redis.connection.Connection)
    keys = _keys(connection, redis.connection.ConnectionPool,
                 extra=("single_connection_client", "connection_class"))
    hint = "" if scheme == "rediss" else "; TLS arguments need a rediss:// URL"
    return Target(f"a {scheme}:// URL's connections (redis-py's {connection.__name__})", keys,
                  hint)


def cluster() -> Target:
    """``RedisCluster(**params)``: its own arguments and those it gives its nodes' clients.
    ``db``, ``health_check_interval`` and the like are the client module's to refuse."""
    allowed = getattr(redis.cluster, "REDIS_ALLOWED_KEYS", ())
    keys = _keys(redis.cluster.RedisCluster, extra=(
        *allowed, "health_check_interval", "retry_on_error", "path", "db"))
    return Target("redis.cluster.RedisCluster", keys)


def sentinel_master() -> Target:
    """The Sentinel master's connections (``Sentinel(..., **params).master_for()``); its
    address (``host``, ``port``...) is the client module's to refuse."""
    keys = _keys(redis.sentinel.SentinelManagedSSLConnection,
                 redis.sentinel.SentinelConnectionPool,
                 extra=("ssl", "host", "port", "unix_socket_path", "path", "connection_pool"))
    return Target("the Sentinel master's connections (redis-py's "
                  "SentinelManagedConnection)", keys)


def sentinels() -> Target:
    """The connections to the sentinels themselves: ``redis.Redis(host, port, **params)``."""
    return Target("redis.Redis (the connections to the sentinels)", _keys(redis.Redis))


# -- types ---------------------------------------------------------------------------------


def _annotations() -> dict[str, list[inspect.Parameter]]:
    """Every argument redis-py's constructors name, with each one's parameter of that name
    (``redis.Redis``'s first: the fullest annotations). A value any of them takes passes."""
    classes = (redis.Redis, redis.connection.SSLConnection,
               redis.connection.UnixDomainSocketConnection, redis.connection.ConnectionPool,
               redis.cluster.RedisCluster, redis.sentinel.SentinelConnectionPool)
    out: dict[str, list[inspect.Parameter]] = {}
    for init in (init for cls in classes for init in _inits(cls)):
        for name, parameter in _parameters(init).items():
            out.setdefault(name, []).append(parameter)
    return out


_KNOWN = _annotations()


def _kinds(annotation: Any) -> list[Any] | None:
    """The types an annotation allows, None when it allows anything (or cannot be read)."""
    if annotation is inspect.Parameter.empty or annotation is Any or annotation is object:
        return None
    if isinstance(annotation, str):  # a forward reference: only simple ones are read
        names = [n.strip() for n in annotation.replace("Optional[", "").rstrip("]")
                 .split("|")]
        if all(n in _SIMPLE_TEXT for n in names):
            return [_SIMPLE_TEXT[n] for n in names]
        return None
    if annotation is None or annotation is type(None):
        return [type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        kinds: list[Any] = []
        for arg in typing.get_args(annotation):
            more = _kinds(arg)
            if more is None:
                return None
            kinds += more
        return kinds
    if origin is not None:
        if origin is collections.abc.Callable:
            return [collections.abc.Callable]
        if origin in _SEQUENCES:
            return [list]
        return [origin] if isinstance(origin, type) else None
    return [annotation] if isinstance(annotation, type) else None


def _expected(parameter: inspect.Parameter) -> list[Any] | None:
    kinds = _kinds(parameter.annotation)
    if kinds is None and parameter.annotation is inspect.Parameter.empty:
        default = parameter.default
        if isinstance(default, (bool, int, float, str)):
            kinds = [type(default)]
    return kinds


def _fits(key: str, value: Any, kind: Any) -> bool:
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is str and key in _NUMBER_OK and isinstance(value, int):
        return not isinstance(value, bool)
    if kind in (int, float):
        if isinstance(value, str) and key in _DIGITS_OK:
            return value.strip().isdigit()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return not (key in _WHOLE and isinstance(value, float) and not value.is_integer())
    if kind is list:
        return isinstance(value, (list, tuple, set, frozenset))
    if kind is collections.abc.Callable:
        return callable(value)
    try:
        return isinstance(value, kind)
    except TypeError:  # not a class isinstance() takes
        return True


def _describe(key: str, kinds: list[Any]) -> str:
    words = []
    for kind in kinds:
        word = _NAMES.get(kind, f"a {getattr(kind, '__name__', kind)}")
        if kind in (int, float) and key in _WHOLE:
            word = "a whole number" + (" (or a string of digits)" if key in _DIGITS_OK else "")
        if word not in words:
            words.append(word)
    return " or ".join(words)


def check(setting: str, params: dict[str, Any], target: Target) -> None:
    """Raise a :class:`ConfigError` naming ``setting`` and the first key of ``params`` that
    ``target`` does not take, or whose value's type its argument cannot take."""
    for key, value in params.items():
        if not isinstance(key, str):
            raise ConfigError(setting, None, f"its keys must be argument names (strings), "
                              f"not {type(key).__name__}")
        if target.keys is not None and key not in target.keys:
            close = difflib.get_close_matches(key, sorted(target.keys), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            if key.startswith("ssl"):
                hint += target.ssl_hint
            raise ConfigError(setting, None, f"{key!r} is not an argument of {target.name}"
                              f"{hint}; correct its name or remove it")
        kinds: list[Any] | None = []
        for parameter in _KNOWN.get(key, ()):
            more = _expected(parameter)
            kinds = None if more is None or kinds is None else kinds + more
        if kinds and not any(_fits(key, value, kind) for kind in kinds):
            raise ConfigError(setting, None, f"{key!r} must be {_describe(key, kinds)}, not "
                              f"{type(value).__name__} (an argument of {target.name})")
