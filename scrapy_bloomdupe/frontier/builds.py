"""The builds on one crawl: each worker records its own in its heartbeat, and a starting worker
looks at them (and the state's format record) to know whether it may run beside them
(:func:`~scrapy_bloomdupe.versions.refusal`).

A build is the package version and the state format it writes (:data:`~.entry.STATE_FORMAT`).
``heartbeat.lua`` writes it into ``keys.builds`` in the same step as the heartbeat, so an owner
without a build is a worker of a build before 0.2.0, which records none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import __version__, keys, luascript
from ..versions import Build
from . import entry

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

#: This worker's build.
OURS = Build(__version__, entry.STATE_FORMAT)

LOOK_SCRIPT = luascript.read(__package__, "builds.lua")


@dataclass(frozen=True)
class Builds:
    """What a look found: the state's format record (None: none), every recorded build
    by owner, and the builds of the live workers (None: a worker that records none)."""

    state: str | None
    recorded: dict[str, Build]
    live: list[tuple[str, Build | None]]

    @property
    def live_builds(self) -> list[Build | None]:
        return [build for _, build in self.live]


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def look(client: Redis | RedisCluster, tag: str, lease_timeout_ms: int, *,
         prune: bool = False) -> Builds:
    """The builds on the crawl ``tag`` (one script, Redis's clock); ``prune``: first forget the
    records of workers no longer among its owners."""
    script = client.register_script(LOOK_SCRIPT)
    state, flat, live = script(
        keys=[keys.queue_format(tag), keys.builds(tag), keys.owners(tag, 0)],
        args=[lease_timeout_ms, 1 if prune else 0])
    recorded: dict[str, Build] = {}
    for owner, text in zip(flat[::2], flat[1::2], strict=True):
        build = Build.parse(text)
        if build is not None:
            recorded[_text(owner)] = build
    return Builds(None if state is None else _text(state), recorded,
                  [(_text(owner), recorded.get(_text(owner))) for owner in live])
