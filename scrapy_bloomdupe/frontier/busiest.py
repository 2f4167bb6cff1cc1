"""The busiest download slots of a ``BLOOMDUPE_POLITENESS = "crawl"`` crawl, for ``bloomdupe
top``, ``info`` and ``metrics``. Read-only, at most four round trips however many slots (a crawl
can have 100,000, so not every hash is read). The slots looked at:

* those with requests in flight, counted from the workers' lease lists (bounded by concurrency);
  past :data:`IN_FLIGHT`, those with the most (ties in lease order);
* the first and last :data:`READY_ENDS` of the ready set: the soonest to go, and the last, where a
  backed-off slot sits (scored by its back-off's end).

Busiest first: by in flight, then waiting, then name; a slot with room in the middle of a long
ready set is not seen. On a cluster every shard's (a slot on its home shard; ``"worker"`` mode's
slot ``*``: shard 0's). The first round trip uses only the crawler's least-privilege ACL
(docs/security.md); reading slots needs ``LRANGE``, ``HMGET`` and ``LLEN`` too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import keys
from ..transport.cluster import is_cluster
from ..transport.link import link_to
from .politeness import ONE_SLOT
from .slots import home_shard

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
    #: Slots in the ready set: requests waiting and room, now or after a delay or back-off.
    ready_slots: int


def busiest_slots(target: Redis | RedisCluster | Link, tag: str, limit: int = BUSIEST,
                  shards: int = 1) -> BusySlots | None:
    """The ``limit`` busiest download slots of crawl ``tag``, or None when it has none yet."""
    with link_to(target) as link:
        single = not is_cluster(link.client)
        indexes = [0] if single else list(range(shards))
        # Only least-privilege ACL commands here (docs/security.md): a slotless crawl reads.
        first_trip = link.calls([command for i in indexes for command in (
            ("EXISTS", keys.ready(tag, i), keys.slot_leased(tag, i), keys.slot_defaults(tag, i),
             keys.slot_waiting(tag, i)),
            ("ZCARD", keys.ready(tag, i)), ("ZRANGE", keys.owners(tag, i), 0, -1),
            ("ZRANGE", keys.ready(tag, i), 0, READY_ENDS - 1),
            ("ZRANGE", keys.ready(tag, i), -READY_ENDS, -1),
            ("HGETALL", keys.slot_defaults(tag, i)))])
        per = [first_trip[6 * j:6 * j + 6] for j in range(len(indexes))]
        if not any(int(found) for found, *_ in per):
            return None
        held = link.calls([("LRANGE", keys.slot_held(tag, i, _text(owner)), 0, -1)
                           for i, (_, _, owners, *_) in zip(indexes, per, strict=True)
                           for owner in owners])
        flight = Counter(_lease_slot(lease) for leases in held for lease in leases)
        # (shard, name) of the slots read: the most in flight, each shard's ready ends.
        homes = {name: i for i, (_, _, _, first, last, _) in zip(indexes, per, strict=True)
                 for name in map(_text, [*first, *last])}
        names = list(dict.fromkeys([*(name for name, _ in flight.most_common(IN_FLIGHT)),
                                    *homes]))
        shard_of = {name: homes.get(name, _home(name, len(indexes))) for name in names}
        # Each slot on its home shard; "worker" mode's one slot on every shard, summed.
        one = keys.slot_name(ONE_SLOT)
        reads = [(name, shard) for name in names
                 for shard in (indexes if name == one else [shard_of[name]])]
        commands: list[tuple[Any, ...]] = [("TIME",)] if single else []
        for name, shard in reads:
            at = keys.slot_prefix(tag, shard) + name
            commands += [("HMGET", at, *FIELDS), ("LLEN", at + ":0")]
        replies = link.calls(commands)
        if single:
            seconds, micros = replies.pop(0)
        else:
            seconds, micros = max(reply for _, reply in link.on_masters("TIME"))
        now = int(seconds) * 1000 + int(micros) // 1000
        read_states = [[_text(v) if v is not None else None for v in replies[2 * j]]
                       for j in range(len(reads))]
        read_waiting = [int(replies[2 * j + 1]) for j in range(len(reads))]
        # Priorities other than 0 (only a slot with a hash has them): one more trip.
        others = [(j, prio) for j, state in enumerate(read_states) if state[0]
                  for prio in state[0].split(",") if prio and prio != "0"]
        if others:
            lengths = link.calls([
                ("LLEN", f"{keys.slot_prefix(tag, reads[j][1])}{reads[j][0]}:{prio}")
                for j, prio in others])
            for (j, _), length in zip(others, lengths, strict=True):
                read_waiting[j] += int(length)
        state_of: dict[str, list[str | None]] = {}
        counted: Counter[str] = Counter()
        for (name, _), state, length in zip(reads, read_states, read_waiting, strict=True):
            state_of.setdefault(name, state)
            counted[name] += length
        states = [state_of[name] for name in names]
        waiting = [counted[name] for name in names]
    # Each shard's default limits, or any shard's if it has none yet (all are the same).
    limits = {i: {_text(k): _text(v) for k, v in found[5].items()}
              for i, found in zip(indexes, per, strict=True)}
    anywhere = next((found for found in limits.values() if found), {})

    def default(name: str, field: str) -> str:
        return (limits[shard_of[name]] or anywhere).get(field, "0")

    slots = [SlotFigures(
        keys.slot_from_name(name), flight.get(name, 0), int(state[2] or default(name, "conc")),
        waiting[j], int(state[3] or default(name, "delay")) / 1000,
        max(0, int(state[4] or 0) - now) / 1000, max(0, int(state[5] or 0) - now) / 1000)
        for j, (name, state) in enumerate(zip(names, states, strict=True))]
    slots.sort(key=lambda s: (-s.in_flight, -s.waiting, s.slot))
    # ``"worker"`` mode's one slot is in the ready set of each shard it waits on: once.
    one_in = sum(1 for (_, _, _, first, last, _) in per if one in map(_text, [*first, *last]))
    ready = sum(int(found) for _, found, *_ in per) - max(0, one_in - 1)
    return BusySlots(slots[:limit], len(flight), ready)


def _home(name: str, shards: int) -> int:
    """A slot's home shard (:func:`.slots.home_shard`); 0 for ``"worker"`` mode's ``*``."""
    return home_shard(name, shards) if name != keys.slot_name(ONE_SLOT) else 0


def _lease_slot(lease: bytes | str) -> str:
    """The slot's name in a lease ``<pop>.<j>|<priority>|<slot>|<entry>`` (entry: any bytes)."""
    if isinstance(lease, str):
        return lease.split("|", 3)[2]
    return lease.split(b"|", 3)[2].decode()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def slot_status(target: Redis | RedisCluster | Link, tag: str) -> tuple[str, int, int, int]:
    """(politeness mode that last filled the slots of crawl ``tag`` or "", requests waiting
    and leased in slots, requests in the queue's other keys: intake and old lease hash),
    summed over every shard."""
    with link_to(target) as link:
        mode, shards = link.calls([("HGET", keys.slot_defaults(tag, 0), "mode"),
                                   ("HGET", keys.meta(tag), "shards")])
        count = int(shards or 1) if is_cluster(link.client) else 1
        counts = link.calls([command for i in range(count) for command in (
            ("GET", keys.slot_waiting(tag, i)), ("GET", keys.slot_leased(tag, i)),
            ("ZCARD", keys.queue(tag, i)), ("HLEN", keys.leases(tag, i)))])
    text = mode.decode() if isinstance(mode, bytes) else str(mode or "")
    total = [sum(int(n or 0) for n in counts[k::4]) for k in range(4)]
    return text, total[0], total[1], total[2] + total[3]
