"""A client of the per-slot layout's scripts (scrapy_bloomdupe/frontier/slots.py) for
one shard and one worker, that the tests drive the scripts with one call at a time;
the scheduler's is :class:`scrapy_bloomdupe.frontier.leased.LeasedQueue`."""
from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_bloomdupe import keys, luascript
from scrapy_bloomdupe.frontier import slots

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

    PUSH_SCRIPT = slots.PUSH_SCRIPT
    POP_SCRIPT = slots.POP_SCRIPT
    ACK_SCRIPT = slots.ACK_SCRIPT
    REAP_SCRIPT = slots.REAP_SCRIPT
    BACKOFF_SCRIPT = slots.BACKOFF_SCRIPT
    HEARTBEAT_SCRIPT = luascript.read("scrapy_bloomdupe.frontier", "heartbeat.lua")

    def __init__(self, server: Redis | RedisCluster, tag: str, shard: int = 0, *,
                 owner: str | None = None, lease_timeout_ms: int = LEASE_TIMEOUT_MS) -> None:
        self.server = server
        self.tag, self.shard = tag, shard
        self.owner = owner or secrets.token_hex(6)
        self.lease_timeout_ms = lease_timeout_ms
        self.prefix = keys.slot_prefix(tag, shard)
        self.ready = keys.ready(tag, shard)
        self.leased = keys.slot_leased(tag, shard)
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
        #: Each lease popped, as its owner's list holds it (what an ack names), by field.
        self._held: dict[str, bytes] = {}

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

    def pop(self, count: int, *, jitter: float = 0.0, seed: int | None = None,
            number: int | None = None, declared: bool = False,
            horizon_ms: int = 0, jitters: dict[str, float] | None = None,
            freed: int = 0) -> Popped:
        """Lease up to ``count`` requests from the slots due now, or within
        ``horizon_ms`` (such a lease's ``start_ms`` says when it may start). ``number``
        (default: the next) is the pop's and ``seed`` the delay's randomness, both the
        same on a retry; ``jitter`` how much a delay varies (0.5: 0.5x-1.5x), and
        ``jitters`` the slots whose jitter is their own; ``freed`` the slots this worker's
        acks just freed (its share grows by as many). With ``declared``, read the ready
        set first and declare the due slots' hashes (a cluster's way; see the module's
        docstring)."""
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
            keys=[self.ready, self.leased, self.owners, self.defaults, self.waiting_count,
                  *slot_keys],
            args=[self.owner, number, count, self.prefix, repr(jitter), seed,
                  int(horizon_ms), freed, *(value for slot, own in (jitters or {}).items()
                                     for value in (keys.slot_name(slot), repr(own)))])
        now, nxt = int(reply[0]), int(reply[1])
        leases = [_lease(reply[j], reply[j + 1]) for j in range(2, len(reply), 2)]
        self._held.update((_text(reply[j]), b"%s|%s" % (reply[j].partition(b":")[2], reply[j + 1]))
                          for j in range(2, len(reply), 2))
        return Popped(now, None if nxt < 0 else nxt, leases)

    def ack(self, leases: Iterable[SlotLease | str]) -> int:
        """Finish ``leases`` (or their fields): frees their slots' room. Returns how
        many were still held."""
        fields = [lease if isinstance(lease, str) else lease.field for lease in leases]
        if not fields:
            return 0
        return int(self._scripts["ack"](keys=[self.ready, self.leased, self.defaults],
                                        args=[self.prefix, self.owner,
                                              *(self._held[field] for field in fields)]))

    def reap(self, *, release_own: bool = False) -> int:
        """Put back the leases of workers without a heartbeat for the lease timeout
        (and this worker's own with ``release_own``). Returns how many went back."""
        own = self.owner if release_own else ""
        counted, given = self._scripts["reap"](
            keys=[self.ready, self.leased, self.owners, self.defaults, self.waiting_count,
                  keys.queue(self.tag, self.shard)],
            args=[self.prefix, self.lease_timeout_ms, own, 1])[:2]
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


def leased(server: Redis, tag: str, shard: int = 0) -> int:
    """The requests leased from shard ``shard`` 's slots: its count, checked against
    the workers' lease lists."""
    count = int(server.get(keys.slot_leased(tag, shard)) or 0)
    lists = sum(int(server.llen(name))
                for name in server.scan_iter(keys.slot_held(tag, shard, "*")))
    assert count == lists, f"{count} counted leased, {lists} in the lists"
    return count


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _lease(field: bytes, value: bytes) -> SlotLease:
    head, name, entry_bytes = value.split(b"|", 2)
    priority, _, start = head.partition(b"@")
    return SlotLease(field.decode(), keys.slot_from_name(name.decode()), int(priority),
                     entry_bytes, int(start or 0))
