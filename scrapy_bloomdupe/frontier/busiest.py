"""The busiest download slots of a crawl with ``BLOOMDUPE_POLITENESS = "crawl"``, read
for ``bloomdupe top``, ``bloomdupe info`` and ``bloomdupe metrics`` (issue 38).

Read-only, in at most four round trips whatever the number of slots (a crawl can
have 100,000: their hashes are not all read). The slots looked at are:

* every slot with requests in flight, counted from the workers' lease lists (as
  many leases as the crawl has requests leased, so bounded by the workers'
  concurrency); past :data:`IN_FLIGHT` such slots, those with the most in flight
  (ties broken in the leases' order, so a broad crawl of many workers may
  miss the one of them with the most waiting);
* the first and the last :data:`READY_ENDS` of the ready set: the slots that may go
  soonest (or waited longest for a worker) and those that may go last, which is
  where a backed-off slot with requests waiting sits (scored by its back-off's end).

Of those, the busiest come first: by requests in flight, then requests waiting
(the lengths of its lists), then name. A slot with requests waiting, none in
flight and room, in the middle of a long ready set, is not looked at: "busiest"
means most in flight, and among the slots with room, the ends of the queue of
slots. Only shard 0's slots (the crawl-wide queue runs on one node).

The first round trip has only commands of the crawler's least-privilege ACL
(docs/security.md), so a crawl without slots reads as it did; the slots are read
with ``LRANGE``, ``HMGET`` and ``LLEN`` as well.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import keys
from ..transport.cluster import is_cluster
from ..transport.link import link_to

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

    from ..transport.link import Link

#: Slots shown by default (``top``, ``info``, the metrics' cardinality).
BUSIEST = 10
#: At most this many of the slots with requests in flight are read (the most in flight).
IN_FLIGHT = 2_000
#: Slots read from each end of the ready set.
READY_ENDS = 50
#: A slot's hash fields read (frontier/slots.py's module docstring).
FIELDS = ("prios", "flight", "conc", "delay", "next", "backoff")


@dataclass(frozen=True)
class SlotFigures:
    """One download slot, as read."""

    slot: str
    #: Requests of the slot leased by a worker and not yet done, crawl-wide.
    in_flight: int
    #: Its concurrency limit, crawl-wide (0: none).
    concurrency: int
    #: Requests waiting in its lists.
    waiting: int
    #: Its delay between two starts, seconds.
    delay: float
    #: Seconds until its next allowed start (0: it may start now).
    next_start: float
    #: Seconds until its back-off ends (0: not backed off).
    backoff: float


@dataclass(frozen=True)
class BusySlots:
    """The busiest slots of a crawl and how many slots are busy or ready."""

    #: Busiest first (see the module's docstring), at most the number asked for.
    slots: list[SlotFigures]
    #: Slots with requests in flight.
    in_flight_slots: int
    #: Slots in the ready set: requests waiting and room, now or later (a delay, a
    #: back-off).
    ready_slots: int


def busiest_slots(target: Redis | RedisCluster | Link, tag: str, limit: int = BUSIEST
                  ) -> BusySlots | None:
    """The ``limit`` busiest download slots of the crawl tagged ``tag`` (the filter's
    key), or None when the crawl keeps no download slots (its politeness is not
    ``"crawl"``, or nothing was queued in that mode yet). Reads only."""
    ready, leased = keys.ready(tag, 0), keys.slot_leased(tag, 0)
    defaults, prefix = keys.slot_defaults(tag, 0), keys.slot_prefix(tag, 0)
    with link_to(target) as link:
        # The first round trip only with commands of the crawler's least-privilege ACL
        # (docs/security.md): a crawl without slots is read as before.
        found, ready_slots, owners, first, last, limits = link.calls([
            ("EXISTS", ready, leased, defaults, keys.slot_waiting(tag, 0)),
            ("ZCARD", ready), ("ZRANGE", keys.owners(tag, 0), 0, -1),
            ("ZRANGE", ready, 0, READY_ENDS - 1), ("ZRANGE", ready, -READY_ENDS, -1),
            ("HGETALL", defaults)])
        if not int(found):
            return None
        held = link.calls([("LRANGE", keys.slot_held(tag, 0, _text(owner)), 0, -1)
                           for owner in owners]) if owners else []
        flight = Counter(_lease_slot(lease) for leases in held for lease in leases)
        names = [name for name, _ in flight.most_common(IN_FLIGHT)]
        names = list(dict.fromkeys([*names, *map(_text, first), *map(_text, last)]))
        single = not is_cluster(link.client)
        commands: list[tuple[Any, ...]] = [("TIME",)] if single else []
        for name in names:
            commands += [("HMGET", prefix + name, *FIELDS), ("LLEN", prefix + name + ":0")]
        replies = link.calls(commands)
        if single:
            seconds, micros = replies.pop(0)
        else:
            seconds, micros = max(reply for _, reply in link.on_masters("TIME"))
        now = int(seconds) * 1000 + int(micros) // 1000
        states = [[_text(v) if v is not None else None for v in replies[2 * j]]
                  for j in range(len(names))]
        waiting = [int(replies[2 * j + 1]) for j in range(len(names))]
        # Priorities other than 0 (only a slot with a hash has them): one more trip.
        others = [(j, prio) for j, state in enumerate(states) if state[0]
                  for prio in state[0].split(",") if prio and prio != "0"]
        if others:
            lengths = link.calls([("LLEN", f"{prefix}{names[j]}:{prio}") for j, prio in others])
            for (j, _), length in zip(others, lengths, strict=True):
                waiting[j] += int(length)
    limits = {_text(k): _text(v) for k, v in limits.items()}
    conc, delay = limits.get("conc", "0"), limits.get("delay", "0")
    slots = [SlotFigures(
        keys.slot_from_name(name), flight.get(name, 0), int(state[2] or conc),
        waiting[j], int(state[3] or delay) / 1000,
        max(0, int(state[4] or 0) - now) / 1000, max(0, int(state[5] or 0) - now) / 1000)
        for j, (name, state) in enumerate(zip(names, states, strict=True))]
    slots.sort(key=lambda s: (-s.in_flight, -s.waiting, s.slot))
    return BusySlots(slots[:limit], len(flight), int(ready_slots))


def _lease_slot(lease: bytes | str) -> str:
    """The slot's name in a lease, ``<pop>.<j>|<priority>|<slot>|<entry>`` (the
    entry's bytes need not be text)."""
    if isinstance(lease, str):
        return lease.split("|", 3)[2]
    return lease.split(b"|", 3)[2].decode()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
