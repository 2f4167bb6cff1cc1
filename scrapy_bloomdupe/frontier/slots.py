"""The per-slot queue layout: crawl-wide politeness and a compact frontier (issues 38, 39).

A first brick, not yet used by the scheduler (``SLOTS-STATUS.md`` says what is
left). On shard ``i`` (hash tag ``{K:i}``, :mod:`scrapy_bloomdupe.keys`):

* ``{K:i}:slot:<slot>:<priority>``: a list per download slot and priority in
  use, of compact entries (``frontier/entry.py``'s bytes, opaque here);
* ``{K:i}:slot:<slot>``: the slot's hash, only what differs from the default:
  ``flight`` (leased, by any worker; default 0), ``conc`` (its concurrency; 0 is
  no limit) and ``delay`` (ms), by default the shard's (``{K:i}:slotdefaults``,
  :meth:`SlotQueue.set_defaults`; else 0), ``next`` (its next allowed start,
  kept only when a delay puts it ahead) and ``backoff`` (paused until), both ms
  on Redis's clock; and, in a slot that has a hash, ``prios`` (the priorities
  in use, highest first, "" for none). A slot with nothing but requests of
  priority 0 waiting under the default limits has **no hash** (its list says
  it waits); how many wait is the lists' lengths (:meth:`SlotQueue.state`);
* ``{K:i}:ready``: the slots that have requests and room, scored by when each
  may go next (``max(next, backoff)``); a slot at its concurrency is not in it
  until an ack or a reap frees room;
* ``{K:i}:slotleases`` and ``{K:i}:owners``: leases and heartbeats as in
  ``frontier/queue.py``; a lease's value is ``<priority>|<slot>|<entry>``, so an
  ack frees the right slot's room and a reap puts the entry back at the head of
  the list it came from (a dead worker's with one more requeue counted, NUL
  ``rq`` <n> NUL before it, as ``frontier/entry.py`` splits it: a pop hands the
  entry back with that prefix).

A pop (``slot_pop.lua``) takes the slots due on Redis's clock, in the order
they became due, and from each the heads of its highest priorities, as many as
its room allows (one when it has a delay): so a slot at its limit or in its
delay never blocks the others (no head-of-line blocking), priorities are exact
within a slot, and across slots it is "due slots first, then priority". With a
horizon, it also takes the slots due within it ("claim ahead"): each such
lease carries its start (``SlotLease.start_ms``, its slot's next allowed start
or the end of its back-off; in the lease's value, ``<priority>@<start>``), and
the caller starts it no sooner. Each slot taken from gets its next allowed
start, its start plus its delay, times a factor in 0.5-1.5 with ``randomize``
(``RANDOMIZE_DOWNLOAD_DELAY``) drawn in the script from the seed the caller
passes. "Worker" politeness is the same layout
with the limits at 0 (no concurrency limit, no delay): the slots then take
turns, the one served longest ago first.

Retries: a push carries a push number (``{K:i}:slotpush:<client>`` remembers
the last), a pop a pop number (a retry returns the same leases and takes
nothing), acks, reaps and back-offs are idempotent.

Redis Cluster: every key above is in the shard's hash tag, so one Cluster slot.
The scripts declare the ready set, the lease hash and the owners; they build the
slots' hashes and lists from ``prefix + name`` (undeclared keys of the same hash
slot, which Redis 7 runs but the Cluster spec asks to declare). On a cluster
:meth:`SlotQueue.pop` with ``declared=True`` first reads the ready set
(``ZRANGE``) and then declares the due slots' hashes (the script checks them
again on its clock); declaring their lists too, the push's and the ack's slots,
and where a request whose slot's home is on another master goes (the inbox of
docs/design-notes.md) remain to build.

Memory (Redis 7.0.15, ``MEMORY USAGE`` of every key of the layout but the push
records, divided by the requests; a 65-byte entry: a 64-byte URL and the format
byte; one priority; ``tests/test_slots.py::test_memory_per_waiting_request``
holds the rows of 100 and 1,000 slots, to a bound; a filter key of one
character here, the test's longer key adds about 30 bytes a slot, in its keys' names):

======================  =========  =====================================
waiting requests        bytes a    of which lists / slot hashes / ready
                        request
======================  =========  =====================================
10,000 over 10 slots    69         69 / 0 / 0
10,000 over 100 slots   74         73 / 0 / 0.3
10,000 over 1,000       105        94 / 0 / 12
10,000 over 10,000      377        248 / 0 / 129
======================  =========  =====================================

against **168** for today's sorted set of compact entries (docs/capacity.md),
and 69 / 75 / 117 / 512 with a hash a slot (the first version). A slot costs
about 310 bytes of its own (its list's key and quicklist node, its member of
the ready set, a skiplist past 128 slots), and a hash (about 135 more) when it
has a request in flight, a limit of its own, a start or back-off ahead or
another priority than 0: so the layout wins where slots hold more than about
3 requests each and still loses where most hold one (a broad crawl over many
hosts): SLOTS-STATUS.md. A leased request costs 156-171 bytes (the lease hash,
as today's).

Redis CPU (``INFO commandstats``, the scripts' µs divided by the requests, 10,000
over three priorities, pops of 100 each acked; a shared 2-core machine): a push,
a pop and an ack cost 0.8, 1.9 and 1.0 µs a request over 1 slot without limits;
about 7, 6 and 5 over 100 slots of concurrency 2 (no defaults set, so every slot
has a hash); about 11, 11 and 5.6 over 10,000 slots of one request, 20-40%
more than with a hash a slot (the same commands, about 3 a slot touched, and
more Lua work a slot). Today's ``pop.lua`` and ``HDEL`` ack: 2.2 and 0.1.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import keys, luascript

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

#: How long a push's record outlives its last write; a retry must come before this.
RECORD_TTL_MS = 3_600_000
#: Default time without a heartbeat after which a worker's leases go back (ms).
LEASE_TIMEOUT_MS = 30_000


@dataclass(frozen=True)
class SlotEntry:
    """A request to queue: its download slot, its priority, the slot's limits."""

    slot: str
    priority: int
    entry: bytes
    #: Requests of the slot in flight at once, crawl-wide; 0 is no limit.
    concurrency: int = 0
    #: Time between two starts of the slot's requests, ms; 0 is none.
    delay_ms: int = 0


@dataclass(frozen=True)
class SlotLease:
    """A request a pop took: its lease's field, slot, priority and entry."""

    field: str
    slot: str
    priority: int
    entry: bytes
    #: When it may start (ms, Redis's clock), when later than the pop's now; else 0.
    start_ms: int = 0


@dataclass(frozen=True)
class Popped:
    """What a pop answered: Redis's time, when the next slot may go, the leases."""

    now_ms: int
    #: When the first slot of the ready set may go (ms, Redis's clock); None when no
    #: slot has requests and room.
    next_ms: int | None
    leases: list[SlotLease]


class SlotQueue:
    """One shard's per-slot queue, for one worker (its ``owner`` id)."""

    PUSH_SCRIPT = luascript.read(__package__, "slot_push.lua")
    POP_SCRIPT = luascript.read(__package__, "slot_pop.lua")
    ACK_SCRIPT = luascript.read(__package__, "slot_ack.lua")
    REAP_SCRIPT = luascript.read(__package__, "slot_reap.lua")
    BACKOFF_SCRIPT = luascript.read(__package__, "slot_backoff.lua")
    HEARTBEAT_SCRIPT = luascript.read(__package__, "heartbeat.lua")

    def __init__(self, server: Redis | RedisCluster, tag: str, shard: int = 0, *,
                 owner: str | None = None, lease_timeout_ms: int = LEASE_TIMEOUT_MS) -> None:
        self.server = server
        self.tag, self.shard = tag, shard
        self.owner = owner or secrets.token_hex(6)
        self.lease_timeout_ms = lease_timeout_ms
        self.prefix = keys.slot_prefix(tag, shard)
        self.ready = keys.ready(tag, shard)
        self.leases = keys.slot_leases(tag, shard)
        self.owners = keys.owners(tag, shard)
        self.push_record = keys.slot_push_record(tag, shard, self.owner)
        self.defaults = keys.slot_defaults(tag, shard)
        self.waiting_count = keys.slot_waiting(tag, shard)
        self._scripts = {name: server.register_script(text) for name, text in (
            ("push", self.PUSH_SCRIPT), ("pop", self.POP_SCRIPT), ("ack", self.ACK_SCRIPT),
            ("reap", self.REAP_SCRIPT), ("backoff", self.BACKOFF_SCRIPT),
            ("heartbeat", self.HEARTBEAT_SCRIPT))}
        self._push_number = 0
        self._pop_number = 0

    def set_defaults(self, concurrency: int = 0, delay_ms: int = 0) -> None:
        """Set the shard's default limits of a slot (the crawl's, the same in every
        worker): a slot pushed with them keeps no limit in its hash (see the module's
        docstring). A slot that keeps no limit of its own follows a change at once."""
        self.server.hset(self.defaults, mapping={"conc": int(concurrency),
                                                 "delay": int(delay_ms)})

    # -- push --------------------------------------------------------------------

    def push(self, entries: Sequence[SlotEntry], number: int | None = None) -> int:
        """Queue ``entries`` in one script call; ``number`` (default: the next) is the
        push's, the same on a retry. Returns how many were queued, -1 on a retry of
        a push that ran."""
        if number is None:
            self._push_number += 1
            number = self._push_number
        args: list[Any] = [number, RECORD_TTL_MS, self.prefix]
        for item in entries:
            args += [keys.slot_name(item.slot), int(item.priority), int(item.concurrency),
                     int(item.delay_ms), item.entry]
        return int(self._scripts["push"](keys=[self.ready, self.push_record, self.defaults,
                                               self.waiting_count],
                                         args=args))

    # -- pop, ack, reap, back-off --------------------------------------------------

    def pop(self, count: int, *, randomize: bool = False, seed: int | None = None,
            number: int | None = None, declared: bool = False,
            horizon_ms: int = 0) -> Popped:
        """Lease up to ``count`` requests from the slots due now, or within
        ``horizon_ms`` (such a lease's ``start_ms`` says when it may start). ``number``
        (default: the next) is the pop's and ``seed`` the delay's randomness, both the
        same on a retry. With ``declared``, read the ready set first and declare the
        due slots' hashes (a cluster's way; see the module's docstring)."""
        if number is None:
            self._pop_number += 1
            number = self._pop_number
        if seed is None:
            seed = secrets.randbelow(2**31)
        slot_keys: list[str] = []
        if declared:
            names: list[Any] = list(self.server.zrange(self.ready, 0, count - 1))
            slot_keys = [self.prefix + _text(name) for name in names]
        reply = self._scripts["pop"](
            keys=[self.ready, self.leases, self.owners, self.defaults, self.waiting_count,
                  *slot_keys],
            args=[self.owner, number, count, self.prefix, int(randomize), seed,
                  int(horizon_ms)])
        now, nxt = int(reply[0]), int(reply[1])
        leases = [_lease(reply[j], reply[j + 1]) for j in range(2, len(reply), 2)]
        return Popped(now, None if nxt < 0 else nxt, leases)

    def ack(self, leases: Iterable[SlotLease | str]) -> int:
        """Finish ``leases`` (or their fields): frees their slots' room. Returns how
        many were still held."""
        fields = [lease if isinstance(lease, str) else lease.field for lease in leases]
        if not fields:
            return 0
        return int(self._scripts["ack"](keys=[self.ready, self.leases, self.defaults],
                                        args=[self.prefix, *fields]))

    def reap(self, *, release_own: bool = False) -> int:
        """Put back the leases of workers without a heartbeat for the lease timeout
        (and this worker's own with ``release_own``). Returns how many went back."""
        own = self.owner if release_own else ""
        counted, given = self._scripts["reap"](
            keys=[self.ready, self.leases, self.owners, self.defaults, self.waiting_count],
            args=[self.prefix, self.lease_timeout_ms, own, 1])
        return len(counted) + len(given)

    def heartbeat(self) -> None:
        """Mark this worker alive (Redis's clock; a pop does it too)."""
        self._scripts["heartbeat"](keys=[self.owners], args=[self.owner])

    def backoff(self, slot: str, until_ms: int) -> int:
        """Pause ``slot`` until ``until_ms`` (Redis's clock) for every worker. Returns
        when its back-off ends (a later one already set stays)."""
        name = keys.slot_name(slot)
        return int(self._scripts["backoff"](
            keys=[self.ready, self.prefix + name, self.defaults],
            args=[self.prefix, name, until_ms]))

    # -- reading ---------------------------------------------------------------------

    def state(self, slot: str) -> dict[str, str]:
        """``slot`` 's state, decoded: ``prios`` (in use, highest first), ``waiting``,
        ``flight``, ``conc``, ``delay``, ``next`` and ``backoff`` (see the module's
        docstring), defaults filled in and ``waiting`` counted from its lists; empty
        when the slot is unknown (no hash, nothing waiting)."""
        name = keys.slot_name(slot)
        raw: dict[Any, Any] = dict(self.server.hgetall(self.prefix + name))
        stored = {_text(k): _text(v) for k, v in raw.items()}
        prios = stored.get("prios")
        if prios is None:
            prios = "0" if self.server.exists(self.prefix + name + ":0") else ""
        if not stored and not prios:
            return {}
        defaults: dict[Any, Any] = dict(self.server.hgetall(self.defaults))
        limits = {_text(k): _text(v) for k, v in defaults.items()}
        waiting = sum(int(self.server.llen(self.prefix + name + ":" + p))
                      for p in prios.split(",") if p)
        return {"prios": prios, "waiting": str(waiting),
                "flight": stored.get("flight", "0"),
                "conc": stored.get("conc", limits.get("conc", "0")),
                "delay": stored.get("delay", limits.get("delay", "0")),
                "next": stored.get("next", "0"), "backoff": stored.get("backoff", "0")}

    def waiting(self, slot: str, priority: int) -> list[bytes]:
        """The entries waiting in ``slot`` 's list of ``priority``, head first."""
        found: list[Any] = list(self.server.lrange(
            keys.slot_list(self.tag, self.shard, keys.slot_name(slot), priority), 0, -1))
        return [bytes(item) for item in found]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _lease(field: bytes, value: bytes) -> SlotLease:
    head, name, entry_bytes = value.split(b"|", 2)
    priority, _, start = head.partition(b"@")
    return SlotLease(field.decode(), keys.slot_from_name(name.decode()), int(priority),
                     entry_bytes, int(start or 0))
