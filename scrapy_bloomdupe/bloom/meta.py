"""A filter's stored parameters (``keys.meta``): created once, joined by every other worker.

The hash holds what every worker must share (format, sizes, seed, growth, fingerprint mode,
generations, engine, ...), created atomically by the first; a worker configured otherwise
gets a :class:`~scrapy_bloomdupe.exceptions.FilterMismatchError` naming each setting."""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, Any

from .. import keys, luascript, sizing
from ..exceptions import FilterMismatchError, NewerFilterError

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

#: The newest format this release reads and writes. 2: window slices grow by items
#: (:func:`~scrapy_bloomdupe.sizing.slice_generation`); 3: workers record their builds
#: (frontier/builds.py), so older builds refuse it. 1 or 2 is written as 3 (:func:`fence`).
FORMAT_VERSION = 3


def format_version(window: sizing.Window | None, growth: bool) -> int:
    """The format version a new filter is stored with (see :data:`FORMAT_VERSION`)."""
    return FORMAT_VERSION


def slice_growth(stored: dict[str, Any]) -> int:
    """How a stored window's slices grow: ``slice_growth`` if set, else by format version."""
    if "slice_growth" in stored:
        return int(stored["slice_growth"])
    return (sizing.SLICE_GROWTH_BY_ITEMS if int(stored.get("version", 1)) >= 2
            else sizing.SLICE_GROWTH_DOUBLING)


def fence(client: Redis | RedisCluster, key: str, stored: dict[str, Any]) -> None:
    """Write a joined filter of an earlier format as :data:`FORMAT_VERSION`, so older builds
    refuse the crawl from now on; ``stored`` is updated."""
    version = int(stored.get("version", 1))
    if version >= FORMAT_VERSION:
        return
    fields: dict[Any, Any] = {"version": FORMAT_VERSION}
    if version < 2:
        fields["slice_growth"] = sizing.SLICE_GROWTH_DOUBLING
    client.hset(keys.meta(key), mapping=fields)
    stored.update(fields)


#: Fields that must agree between the stored filter and a worker, by setting.
SHARED_FIELDS = {
    "version": "format version",
    "capacity": "BLOOMDUPE_CAPACITY",
    "error_rate": "BLOOMDUPE_ERROR_RATE",
    "shards": "BLOOMDUPE_SHARDS",
    "bits_per_shard": "bits per shard",
    "hashes": "hashes",
    "growth": "BLOOMDUPE_GROWTH",
    "fingerprint": "BLOOMDUPE_FINGERPRINT",
}
_TEXT_FIELDS = ("fingerprint", "engine")
#: The engine of a filter stored before engines had a name.
DEFAULT_ENGINE = "lua"
#: Fields no other tool's ``*:meta`` hash is likely to have both of.
_IDENTIFYING_FIELDS = ("bits_per_shard", "seed")
_FLOAT_FIELDS = ("error_rate", "created")

CREATE_SCRIPT = luascript.read(__package__, "create_meta.lua")


def is_filter_meta(client: Redis | RedisCluster, name: bytes | str) -> bool:
    """Whether the hash ``name`` is a filter's metadata (not another tool's ``*:meta``)."""
    return all(client.hexists(name, field) for field in _IDENTIFYING_FIELDS)


def read(client: Redis | RedisCluster, key: str) -> dict[str, Any]:
    """The stored fields, decoded ({} when there is no filter at ``key``)."""
    return decode(client.hgetall(keys.meta(key)))


def engine_of(stored: dict[str, Any]) -> str:
    """The engine holding a stored filter's bits (``"lua"`` if older than the field)."""
    return str(stored.get("engine", DEFAULT_ENGINE))


def create_or_join(client: Redis | RedisCluster, key: str, plan: sizing.Sizing, *,
                   growth: bool, fingerprint: str, engine: str = DEFAULT_ENGINE,
                   requested: str = "auto", window: sizing.Window | None = None
                   ) -> dict[str, Any]:
    """Store a new filter's fields (fresh seed) unless one is there; return the stored ones.
    Raises :class:`FilterMismatchError` if they differ from ours or the engine is not
    ``requested`` (``"auto"``: either). With a ``window``, ``plan`` is one slice's."""
    ours: dict[str, Any] = {
        "version": format_version(window, growth),
        "capacity": plan.capacity,
        "error_rate": plan.error_rate,
        "shards": plan.shards,
        "bits_per_shard": plan.bits_per_shard,
        "hashes": plan.hashes,
        "growth": int(growth),
        "fingerprint": fingerprint,
    }
    if window is not None:
        ours.update(window_ms=window.window_ms, slices=window.slices)
    proposal = {**ours, "error_rate": repr(plan.error_rate), "generations": 1,
                "seed": secrets.randbits(32), "created": repr(time.time()), "engine": engine}
    flat: list[Any] = [x for kv in proposal.items() for x in kv]
    reply = client.register_script(CREATE_SCRIPT)(keys=[keys.meta(key)], args=flat)
    stored = decode(dict(zip(reply[::2], reply[1::2], strict=True)))
    if int(stored.get("version", 1)) > FORMAT_VERSION:
        raise NewerFilterError(key, stored["version"], FORMAT_VERSION)
    differences = {
        SHARED_FIELDS[name]: (_configured(name, stored.get(name), stored),
                              _configured(name, value, ours))
        for name, value in ours.items()
        if name in SHARED_FIELDS and stored.get(name) != value
        # Formats this release reads differ only with the window or growth (reported as
        # such); a window's filter made before format 2 is joined, its slices grow as then.
        and not (name == "version" and stored.get(name, 1) <= FORMAT_VERSION)
    }
    if stored_window(stored) != window:
        differences["BLOOMDUPE_WINDOW"] = (_seconds(stored_window(stored)), _seconds(window))
    stored_engine = stored.setdefault("engine", DEFAULT_ENGINE)
    if requested != "auto" and stored_engine != requested:
        differences["BLOOMDUPE_ENGINE"] = (stored_engine, requested)
    if differences:
        raise FilterMismatchError(key, differences)
    fence(client, key, stored)
    return stored


def mark_ready(client: Redis | RedisCluster, key: str) -> None:
    """Mark the first shards made (``ready``): a missing shard is lost state from then on."""
    client.hset(keys.meta(key), "ready", 1)


def stored_plan(stored: dict[str, Any], max_bytes: int | None = None) -> sizing.Sizing:
    """The first generation's sizing as stored, with this worker's ``BLOOMDUPE_MAX_BYTES``."""
    return sizing.Sizing(
        capacity=stored["capacity"],
        error_rate=stored["error_rate"],
        shards=stored["shards"],
        bits_per_shard=stored["bits_per_shard"],
        hashes=stored["hashes"],
        max_bytes=max_bytes,
    )


def stored_window(stored: dict[str, Any]) -> sizing.Window | None:
    """A stored filter's recrawl window (None: it remembers for good)."""
    if not stored.get("window_ms"):
        return None
    return sizing.Window(int(stored["window_ms"]), int(stored.get("slices",
                                                                  sizing.WINDOW_SLICES)))


def _seconds(window: sizing.Window | None) -> float | None:
    return None if window is None else window.window_ms / 1000


def _configured(name: str, value: Any, fields: dict[str, Any]) -> Any:
    """A stored field as the user configured it: growth keeps part of the error rate back,
    and with a window the capacity and rate are one slice's."""
    window = stored_window(fields)
    if window is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        if name == "capacity":
            return value * window.slices
        if name == "error_rate":
            return float(f"{value * window.live / (1 - sizing.TIGHTENING):.12g}")
    if name == "error_rate" and fields.get("growth") and isinstance(value, float):
        return float(f"{value / (1 - sizing.TIGHTENING):.12g}")
    return value


def decode(raw: dict[Any, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in raw.items():
        name = name.decode() if isinstance(name, bytes) else str(name)
        text = value.decode() if isinstance(value, bytes) else str(value)
        if name in _TEXT_FIELDS:
            out[name] = text
        else:
            out[name] = float(text) if name in _FLOAT_FIELDS else int(text)
    return out
