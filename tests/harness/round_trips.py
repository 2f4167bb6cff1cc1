"""A worker's Redis round trips, and what each carried, for the Redis CPU benchmark.

A developer's instrument, imported by :mod:`harness.timed` (so every benchmark
worker has it): it counts every command or pipeline the process writes to a redis-py
connection, blocking or ``redis.asyncio`` (``send_packed_command``, through any
client, from when it is imported):
its round trips, and by server port what each carried (``"pop+HDEL"``: the package's
scripts by file name, other commands by name), so that ``benchmarks/redis_cpu.py`` can
say where a cluster's round trips go. It only wraps the real method.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from redis.asyncio.connection import AbstractConnection as AsyncConnection
from redis.connection import AbstractConnection

#: Writes of commands to Redis by this process: its round trips.
ROUND_TRIPS = [0]
#: The same by "<port> <what they carried>" (see _carried).
CARRIED: Counter[str] = Counter()
_send_packed_command = AbstractConnection.send_packed_command
#: The package's scripts by SHA1: their file names.
_SCRIPTS = {hashlib.sha1(path.read_bytes()).hexdigest().encode(): path.stem for path in
            (Path(__file__).resolve().parent.parent / "scrapy_bloomdupe").glob("*/*.lua")}
#: A packed command's name, and the SHA1 that follows EVALSHA.
_COMMAND = re.compile(rb"\*\d+\r\n\$\d+\r\n([A-Za-z_.]+)\r\n(?:\$40\r\n([0-9a-f]{40})\r\n)?")


def _carried(packed: Any) -> str:
    """``"pop+HDEL"``: the distinct scripts and commands in one write."""
    data = b"".join(packed) if isinstance(packed, list) else bytes(packed)
    names = {_SCRIPTS.get(sha, "script") if sha else name.decode().upper()
             for name, sha in _COMMAND.findall(data)}
    return "+".join(sorted(names, key=lambda n: (n.isupper(), n)))


def _counted_send(self: Any, packed: Any, *args: Any, **kwargs: Any) -> Any:
    ROUND_TRIPS[0] += 1
    CARRIED[f"{getattr(self, 'port', '-')} {_carried(packed)}"] += 1
    return _send_packed_command(self, packed, *args, **kwargs)


AbstractConnection.send_packed_command = _counted_send  # type: ignore[method-assign]
_send_packed_async = AsyncConnection.send_packed_command


async def _counted_send_async(self: Any, packed: Any, *args: Any, **kwargs: Any) -> Any:
    ROUND_TRIPS[0] += 1
    CARRIED[f"{getattr(self, 'port', '-')} {_carried(packed)}"] += 1
    return await _send_packed_async(self, packed, *args, **kwargs)


# The crawl's round trips on redis.asyncio (one node, the asyncio reactor).
AsyncConnection.send_packed_command = _counted_send_async  # type: ignore[method-assign]


def carried(directory: Path, ports: dict[str, str], pages: int) -> dict[str, dict[str, float]]:
    """The workers' round trips a page, by what they carried, per master (``ports``: its
    name by port), from the timing files (:mod:`harness.timed`)."""
    out: dict[str, dict[str, float]] = {}
    for path in (directory / "timing").glob("*.json"):
        for key, count in json.loads(path.read_text()).get("carried", {}).items():
            port, _, what = key.partition(" ")
            if port in ports:
                row = out.setdefault(what, {})
                row[ports[port]] = row.get(ports[port], 0.0) + count / pages
    return out


def carried_table(ours: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: each contender's round trips a page by what they carried, and a
    cluster's figures per master."""
    lines: list[str] = []
    kinds = sorted({k for r in ours for k in r["carried"]},
                   key=lambda k: -max(sum(r["carried"].get(k, {}).values()) for r in ours))
    lines += ["", "The workers' round trips a page, by what they carried (scripts by file, "
              "other commands by name; on the cluster the total, then per master):", "",
              "| carried | " + " | ".join(r["contender"] for r in ours) + " |",
              "|---|" + "---:|" * len(ours)]
    for kind in kinds:
        cells = []
        for r in ours:
            per = r["carried"].get(kind, {})
            cells.append("" if not per else f"{sum(per.values()):.3f}" if len(r["masters"]) == 1
                         else f"{sum(per.values()):.3f} ("
                         + " / ".join(f"{per.get(f'm{i + 1}', 0):.2f}"
                                      for i in range(len(r["masters"]))) + ")")
        if max(sum(r["carried"].get(kind, {}).values()) for r in ours) >= 0.01:
            lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    for r in ours:
        if len(r["masters"]) > 1:
            lines += ["", f"{r['contender']}, per master: " + "; ".join(
                f"m{i + 1} {m['cpu_us']:.1f} µs, {m['reads']:.2f} round trips, "
                f"{sum(c for c, _ in m['commands'].values()):.1f} commands"
                for i, m in enumerate(r["masters"]))]
    return lines
