"""Queue entries that cannot be turned back into requests, and their retirement.

An entry is decoded on its own when a pop takes it (or a reap puts it back). Decoding can fail
for good (a deploy renamed a callback, removed a request class, changed the serializer, or the
bytes are not a request), so such an entry is *retired*: moved, raw, with the reason, to the
failed requests' record (``bloomdupe failed``; ``--requeue`` queues it again once it can be
decoded), and taken out of the lease hash (or the queue) so no lease timeout or reclaim brings
it back. The requests leased with it go on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import keys, luascript
from . import entry, failed

RETIRE_SCRIPT = luascript.read(__package__, "retire.lua")
#: A URL in the bytes of an entry that cannot be decoded (see :func:`readable`).
URL_IN_BYTES = re.compile(rb"https?://[\x21-\x7e]+")


@dataclass(frozen=True)
class Retired:
    """An entry retired: what could be read of it, and why not decoded (reason, error alone)."""

    url: str
    method: str
    reason: str
    error: str


def stored(member: bytes) -> bytes:
    """What the record keeps of a queued member: its entry (requeue count dropped), or all of it."""
    try:
        return entry.split_requeues(member)[1]
    except ValueError:
        return member


def readable(serializer: Any, payload: bytes) -> tuple[str, str]:
    """The URL and method of an entry that cannot be decoded, as far as readable: from the
    serializer's dict, a JSON one, else the first URL in the bytes; ``""`` where none is found."""
    compact = entry.peek(serializer, payload)
    if compact is not None:
        return compact
    for loads in (serializer.loads, json.loads):
        try:
            loaded = loads(payload)
        except Exception:  # best effort: the next way to read it
            continue
        if isinstance(loaded, dict) and isinstance(loaded.get("url"), str):
            method = loaded.get("method")
            return loaded["url"], method if isinstance(method, str) else ""
    found = URL_IN_BYTES.search(payload)
    return (found.group().decode("ascii") if found else ""), ""


def reason(error: str) -> str:
    return f"its queue entry cannot be decoded into a request ({error})"


def retire_round_trips(*, serializer: Any, tag: str, shard: int, same_slot: bool,
                       script: str, limit: int, where: str, bad: Sequence[entry.Bad]
                       ) -> tuple[list[Retired], list[list[tuple[Any, ...]]]]:
    """What retiring ``bad`` (entries of queue shard ``shard`` of crawl ``tag``) logs, and the
    round trips that do it, in order. ``where``: ``"lease"`` (a pop's entries, in the lease
    hash) or ``"queued"`` (a reap's, back in the queue).

    ``same_slot`` (one node; shard 0 of a cluster): one call of ``script`` (retire.lua), which
    records an entry only if it removed it: safe to repeat after a lost reply, and an entry
    another worker took meanwhile is left to it (its reply says which it retired: log those).
    Else (the record on another master) the record goes first, then the removal: a crash or
    retry in between records an entry twice (a requeue of both queues it once), never loses it."""
    retired: list[Retired] = []
    rows: list[tuple[str | bytes, str, str, str, int, bytes]] = []
    for ident, score, member, error in bad:
        payload = stored(member)
        url, method = readable(serializer, payload)
        said = f"{type(error).__name__}: {error}"
        why = reason(said)
        retired.append(Retired(url, method, why, said))
        rows.append((ident, url, method, why, score, payload))
    leases, queue = keys.leases(tag, shard), keys.queue(tag, shard)
    if same_slot:
        args = [value for row in rows for value in (where, *row)]
        return retired, [[("EVALSHA", script, 3, leases, queue, keys.failed(tag), limit,
                           *args)]]
    records = [failed.record_command(tag, url=url, method=method, reason=why, score=score,
                                     request=payload, limit=limit)
               for _, url, method, why, score, payload in rows]
    idents = [row[0] for row in rows]
    removal = ("HDEL", leases, *idents) if where == "lease" else ("ZREM", queue, *idents)
    return retired, [records, [removal]]
