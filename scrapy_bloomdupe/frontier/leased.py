"""The scheduler's shared queue (:class:`LeasedQueue`): leased, in download slots (layout and
scripts: :mod:`.slots`). With ``BLOOMDUPE_POLITENESS = "crawl"`` it holds Scrapy's per-site
limits crawl-wide; with ``"worker"`` (the default) every request waits in one slot, ``*``.
A pop takes only slots that have room and may go within :data:`CLAIM_AHEAD`, so a full or
backed-off slot holds no other back; a request taken ahead carries its start
(:attr:`~.queue.Lease.start_in`) and goes to Scrapy no sooner.

The filter's script pushes each new request straight into its slot (``sink.lua``), so none is
in the filter unqueued. The shard's sorted set (the *intake*) holds only what a cluster in
``"crawl"`` mode queues off its slot's home shard, and what an earlier layout left: a pop
moves it into the slots (:meth:`LeasedQueue.sort`). On a cluster each shard is popped in turn."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import keys
from ..transport.sentinel import master_epoch
from . import slots, undecodable
from .entry import Bad, split_requeues
from .queue import RECORD_TTL_MS, Lease, PriorityQueue, Reclaimed, pop_number

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster
    from scrapy import Request, Spider

    from .politeness import SlotPolicy

#: Intake entries one move takes (a script call each).
SORT_BATCH = 500
#: How many batches one pop moves at most before it pops (the rest: the next pops).
SORT_BATCHES = 20
#: A lease timeout no heartbeat reaches (ms): a reclaim puts back only this worker's leases.
NEVER_MS = 10**15
#: How far ahead a pop takes slots about to go (s, at least; see :func:`claim_horizon`): a
#: worker pops about once this long, not once a slot's start, and workers do not race.
CLAIM_AHEAD = 0.2


@dataclass(frozen=True)
class Migrated:
    """What :meth:`LeasedQueue.migrate` did: requests moved, stopped workers' leases put back."""

    moved: int
    leases_back: int


@dataclass(frozen=True)
class ShardKeys:
    """One queue shard's keys of the download slots (:mod:`.slots`), and its intake."""

    intake: str
    ready: str
    leased: str
    defaults: str
    waiting: str
    prefix: str
    robots: str
    strikes: str
    #: This worker's record of its slot pushes (moves from the intake need none: its ZREM).
    slot_push_record: str
    owners: str

    @classmethod
    def of(cls, tag: str, shard: int, owner: str) -> ShardKeys:
        return cls(keys.queue(tag, shard), keys.ready(tag, shard), keys.slot_leased(tag, shard),
                   keys.slot_defaults(tag, shard), keys.slot_waiting(tag, shard),
                   keys.slot_prefix(tag, shard), keys.slot_robots(tag, shard),
                   keys.slot_strikes(tag, shard), keys.slot_push_record(tag, shard, owner),
                   keys.owners(tag, shard))


class LeasedQueue(PriorityQueue):
    """The scheduler's queue (``SCHEDULER_QUEUE_CLASS``'s default, also by its old paths):
    :class:`~.queue.PriorityQueue`'s leases and retry-safe calls, in download slots.
    ``policy`` names a request's slot and limits (``"worker"``: :class:`~.politeness.OneSlot`)."""

    SLOT_SCRIPTS = (("slot_push", slots.PUSH_SCRIPT), ("slot_pop", slots.POP_SCRIPT),
                    ("slot_ack", slots.ACK_SCRIPT), ("slot_reap", slots.REAP_SCRIPT),
                    ("slot_backoff", slots.BACKOFF_SCRIPT), ("slot_claim", slots.CLAIM_SCRIPT),
                    ("slot_count", slots.COUNT_SCRIPT))

    def __init__(self, server: Redis | RedisCluster, spider: Spider, key: str,
                 serializer: Any = None, *, policy: SlotPolicy, **kwargs: Any) -> None:
        super().__init__(server, spider, key, serializer, **kwargs)
        self.policy = policy
        for name, text in self.SLOT_SCRIPTS:
            self._scripts[name] = server.register_script(text)
            self.link.knows(text)
        self.k = [ShardKeys.of(self.tag, shard, self.owner) for shard in range(self.shards)]
        #: Unacked leases by field, as the owner's list in Redis holds them (an ack names them).
        self._held: dict[str, bytes] = {}
        #: Whether each shard's intake may hold requests (the last look found some).
        self._intake_seen = [True] * self.shards
        self._defaults_sent = [False] * self.shards
        #: How far ahead a pop takes (s; see CLAIM_AHEAD).
        self.horizon = claim_horizon(policy)
        #: slot_pop.lua's pairs of a slot's name and its own jitter (DOWNLOAD_SLOTS).
        self._jitters = [value for slot, jitter in policy.jitters().items()
                         for value in (keys.slot_name(slot), repr(jitter))]
        #: After each shard's last pop: when (monotonic) its next slot is within the horizon
        #: (None: none has requests and room), and whether requests wait in its slots.
        self._due: list[float | None] = [None] * self.shards
        self._slots_wait = [False] * self.shards
        #: After each shard's last pop: the requests waiting there (intake and slots).
        self._waiting_seen: list[int | None] = [None] * self.shards
        #: A cluster's intake move whose pushes or end may not have run: (shard, pushes,
        #: entries), sent again with the same push numbers before the next move.
        self._unfinished_move: tuple[int, list[tuple[Any, ...]], list[bytes]] | None = None
        #: An unfiltered push whose reply did not come (push_many): entries, args by home.
        self._unanswered_slot_push: tuple[list[Any], dict[int, list[Any]]] | None = None
        self._move_number = 0

    @property
    def next_due(self) -> float | None:
        """Seconds until the next slot is within the horizon; None: none has work and room."""
        dues = [due for due in self._due if due is not None]
        return max(0.0, min(dues) - time.monotonic()) if dues else None

    @property
    def waiting_seen(self) -> int | None:
        """Requests waiting (not leased) as the last pops saw each shard; None before any."""
        seen = [n for n in self._waiting_seen if n is not None]
        return sum(seen) if seen else None

    @property
    def slots_waiting(self) -> bool:
        """Whether requests wait in the slots (for room, or a start), as the last pops saw."""
        return any(self._slots_wait)

    def home(self, name: str) -> int:
        """The shard keeping slot ``name`` 's requests, state and leases (0 unless crawl-wide)."""
        return slots.home_shard(name, self.shards) if self.policy.crawl_wide else 0

    # -- the filter's side: its check-and-add queues into the slots ----------------------

    def sink_entry(self, request: Request) -> tuple[int, bytes, str, int, int]:
        """What sink.lua queues for ``request``: score, bytes, slot name and limits (asked of
        Scrapy's downloader here, on the reactor's thread, as Scrapy's scheduler would)."""
        score, member = self.entry(request)
        limits = self.policy.of(request)
        return score, member, keys.slot_name(limits.slot), limits.concurrency, limits.delay_ms

    def sink_item(self, shard: int, entry: Any) -> tuple[Any, ...]:
        """Into the slot's list, or the intake if :attr:`moves` and its home is not ``shard``."""
        score, member, name, concurrency, delay = entry
        if self.moves and self.home(name) != shard:
            return ("", score, "", "", member)
        return (name, -score, concurrency, delay, member)

    @property
    def moves(self) -> bool:
        """Whether the filter may queue into an intake (a cluster in ``"crawl"`` mode)."""
        return self.policy.crawl_wide and self.shards > 1

    # -- the intake into the slots ------------------------------------------------------

    def sort(self, batches: int = SORT_BATCHES, shard: int = 0) -> int:
        """Move up to ``batches`` batches of ``shard`` 's intake into its slots, best first;
        returns how many moved (none twice). Undecodable entries are retired."""
        if self.moves:
            return self._move(batches, shard)
        k, looked, moved = self.k[shard], 0, 0
        for _ in range(batches):
            found, robots = self.link.calls([
                ("ZRANGE", k.intake, 0, SORT_BATCH - 1, "WITHSCORES"),
                ("HGETALL", k.robots)])
            if not found:
                break
            by_home, bad = self._slot_args(_pairs(found), [robots])  # (home: this shard)
            if bad:
                self._retire(shard, "queued", bad)
            if by_home:
                (queued,) = self._execute([
                    ("EVALSHA", self._scripts["slot_push"].sha, 5, k.ready,
                     k.slot_push_record, k.defaults, k.waiting, k.intake, "",
                     RECORD_TTL_MS, k.prefix, *by_home[0])], acks=False)
                moved += int(queued)
            looked += len(found)
            if len(found) < SORT_BATCH:
                break
        self._intake_seen[shard] = looked > 0 and looked % SORT_BATCH == 0
        return moved

    def _slot_args(self, pairs: list[tuple[bytes, int]], robots: list[dict[Any, Any]]
                   ) -> tuple[dict[int, list[Any]], list[Bad]]:
        """slot_push.lua's arguments for ``(entry, score)`` s by home shard (delay at least the
        slot's robots.txt Crawl-delay), and the entries that do not decode."""
        by_home: dict[int, list[Any]] = {}
        bad: list[Bad] = []
        for member, score in pairs:
            try:
                request = self.codec.decode(split_requeues(member)[1])
            except Exception as e:  # the serializer's, whatever it is
                bad.append((member, score, member, e))
                continue
            limits = self.policy.of(request)
            name = keys.slot_name(limits.slot)
            home = self.home(name)
            delay = max(limits.delay_ms, int(robots[home].get(name.encode(), 0)))
            by_home.setdefault(home, []).extend(
                [name, -score, limits.concurrency, delay, member])
        return by_home, bad

    def _move(self, batches: int, shard: int) -> int:
        """A cluster's move of ``shard`` 's intake to the slots' home shards: ``slot_claim.lua``
        leases a batch to this worker (back to the intake if it dies), ``slot_push.lua`` pushes
        each home's share (numbered: never twice), ``slot_ack.lua`` ends the move. A kill in
        between moves them again, never loses them."""
        self._finish_move()
        k, looked, moved = self.k[shard], 0, 0
        robots: list[dict[Any, Any]] = []
        for _ in range(batches):
            found, *robots = self.link.calls([
                ("ZRANGE", k.intake, 0, SORT_BATCH - 1, "WITHSCORES"),
                *(("HGETALL", other.robots) for other in self.k)])
            if not found:
                break
            claim: list[Any] = []
            for member, score in _pairs(found):
                claim += [score, member]
            moving = self._execute([("EVALSHA", self._scripts["slot_claim"].sha, 3, k.intake,
                                     k.leased, k.owners, self.owner, *claim)], acks=False)[0]
            entries = [bytes(e) for e in moving]
            by_home, bad = self._slot_args([_moving(e) for e in entries], robots)
            pushes = []
            for home, args in sorted(by_home.items()):
                self._move_number += 1
                h = self.k[home]
                pushes.append(("EVALSHA", self._scripts["slot_push"].sha, 4, h.ready,
                               h.slot_push_record, h.defaults, h.waiting, self._move_number,
                               RECORD_TTL_MS, h.prefix, *args))
            if bad:  # recorded as failed; the move's end takes them out of the list
                self._retire(shard, "queued", bad)
            self._unfinished_move = (shard, pushes, entries)
            self._finish_move()
            looked, moved = looked + len(found), moved + len(entries) - len(bad)
            if len(found) < SORT_BATCH:
                break
        self._intake_seen[shard] = looked > 0 and looked % SORT_BATCH == 0
        return moved

    def _finish_move(self) -> None:
        """Push (again: the same numbers) and end the last move, if it did not end."""
        if self._unfinished_move is None:
            return
        shard, pushes, entries = self._unfinished_move
        if pushes:
            self._execute(pushes, acks=False)
        if entries:  # none: another worker's move took the whole batch first
            k = self.k[shard]
            self._execute([("EVALSHA", self._scripts["slot_ack"].sha, 3, k.ready, k.leased,
                            k.defaults, k.prefix, self.owner, *entries)], acks=False)
        self._unfinished_move = None

    # -- a layout an earlier build left ------------------------------------------------

    def migrate(self) -> Migrated:
        """One-shot, at a worker's start: move into the slots what an earlier layout left:
        stopped workers' leases in the old lease hash (``reap.lua``; a live one's when it
        stops), then the shards' sorted sets (:meth:`sort`)."""
        back, moved = 0, 0
        for shard, k in enumerate(self.k):
            if self.link.call("HLEN", self._leases[shard]):
                (old,) = self._execute([("EVALSHA", self._scripts["reap"].sha, 3, k.intake,
                                         self._leases[shard], k.owners,
                                         self.lease_timeout_ms, "", k.leased)], acks=False)
                back += len(old)
            self._intake_seen[shard] = True
            while self._intake_seen[shard]:
                moved += self.sort(shard=shard)
        return Migrated(moved, back)

    # -- popping -------------------------------------------------------------------------

    def _pop_from(self, shard: int, count: int) -> list[Lease]:
        """Lease up to ``count`` requests from ``shard`` 's slots (its intake moved first),
        with its master's pending acks. Sets :attr:`next_due` and :attr:`slots_waiting`."""
        leases: list[Lease] = []
        for _ in range(2):
            if self._intake_seen[shard]:
                self.sort(shard=shard)
            leases = self._pop_slots(shard, count)
            if leases or not self._intake_seen[shard]:
                break
        return leases

    def _shards_waiting(self) -> list[int]:
        """The shards with requests in their intake or their slots (a cluster's)."""
        sizes = self.link.calls([command for k in self.k for command in (
            ("ZCARD", k.intake), ("GET", k.waiting))])
        return [i for i in range(self.shards) if int(sizes[2 * i]) or int(sizes[2 * i + 1] or 0)]

    def _pop_slots(self, shard: int, count: int) -> list[Lease]:
        self._pop_shard = shard  # a retry after a lost reply: the same shard, the same number
        k, number = self.k[shard], self._pop_number
        seed = int.from_bytes(hashlib.blake2b(f"{self.owner}:{number}".encode(),
                                              digest_size=4).digest(), "big") % 2**31
        with self._acks_lock:  # the slots this round trip's acks free (see slot_pop.lua)
            freed = len({self._held[f].split(b"|", 3)[2] for f, _ in self._acks.get(shard, ())
                         if f in self._held})
        pop = ("EVALSHA", self._scripts["slot_pop"].sha, 5, k.ready, k.leased, k.owners,
               k.defaults, k.waiting, self.owner, number, count, k.prefix,
               repr(self.policy.jitter), seed, round(self.horizon * 1000), freed,
               *self._jitters)
        commands = self._ack_commands(self.link.reaches([pop]))  # acks bound for this master only
        if not self._defaults_sent[shard]:
            defaults = self.policy.defaults()
            commands.append(("HSET", k.defaults, "conc", defaults.concurrency,
                             "delay", defaults.delay_ms,
                             "mode", "crawl" if self.policy.crawl_wide else "worker"))
        commands += [pop, ("ZCARD", k.intake), ("GET", k.waiting)]
        with self._acks_lock:
            self._unanswered_pops.add(number)
        reply, intake, waiting = self._execute(commands)[-3:]
        self._acks_sent()
        self._defaults_sent[shard] = True
        self._pop_number += 1  # only once the reply is in: a retry replays
        self._pop_shard = None
        self._intake_seen[shard] = int(intake) > 0
        self._slots_wait[shard] = int(waiting or 0) > 0
        self._waiting_seen[shard] = int(intake) + int(waiting or 0)
        now, due = int(reply[0]), int(reply[1])
        self._due[shard] = None if due < 0 else time.monotonic() + max(
            0, due - now - round(self.horizon * 1000)) / 1000
        epoch = master_epoch(self.server)
        fields = [raw.decode() for raw in reply[2::2]]
        self._held.update((field, b"%s|%s" % (field.partition(":")[2].encode(), value))
                          for field, value in zip(fields, reply[3::2], strict=True))
        starts = {field: max(0, _start_ms(value) - now) / 1000
                  for field, value in zip(fields, reply[3::2], strict=True)}
        shaped = [_as_queued(value) for value in reply[3::2]]
        decoded, bad = self.codec.decode_replies(shaped, fields)
        leases = [Lease(shard, str(field), request, epoch, requeues, starts[str(field)])
                  for field, requeues, request in decoded]
        if bad:
            self._retire_leased(shard, bad)
        with self._acks_lock:
            self._taken.update((lease.field, shard) for lease in leases)
            self._unanswered_pops.discard(number)
        return leases

    def _retire_leased(self, shard: int, bad: list[Bad]) -> None:
        """Record undecodable leased entries as failed, then ack them (a crash repeats one)."""
        retired, round_trips = undecodable.retire_round_trips(
            serializer=self.serializer, tag=self.tag, shard=shard, same_slot=False,
            script=self._scripts["retire"].sha, limit=self.failed_limit, where="lease",
            bad=bad)
        self._execute(round_trips[0], acks=False)
        self._execute([self._ack_command(shard, [str(ident) for ident, *_ in bad])],
                      acks=False)
        with self._acks_lock:
            self._retired.extend(retired)

    def status(self) -> tuple[int, int]:
        """(requests waiting, requests leased) over every shard, each counter checked against
        its lists (``slot_count.lua``): the crawl's end rests on this."""
        replies = self.link.calls([
            ("EVALSHA", self._scripts["slot_count"].sha, 6, k.ready, k.waiting, k.leased,
             k.owners, k.intake, self._leases[i], keys.slot_held(self.tag, i, ""),
             k.prefix + "*:*") for i, k in enumerate(self.k)])
        return (sum(int(w) + int(e) for w, _, e in replies),
                sum(int(leased) for _, leased, _ in replies))

    def rider_scripts(self) -> tuple[str, ...]:
        """``slot_ack.lua``, which a check-and-queue carrying acks reloads where Redis lost it."""
        return (slots.ACK_SCRIPT,)

    def _ack_command(self, shard: int, fields: list[str]) -> tuple[Any, ...]:
        # A field not held stays leased until a reclaim (fetched twice, never lost). Lookups only.
        held = [self._held[field] for field in fields if field in self._held]
        k = self.k[shard]
        return ("EVALSHA", self._scripts["slot_ack"].sha, 3, k.ready, k.leased, k.defaults,
                k.prefix, self.owner, *held)

    def _acks_sent(self) -> None:
        super()._acks_sent()
        with self._acks_lock:  # forget the leases no longer taken, nor acked on the way
            live = set(self._taken).union(self._stale_fields, *(
                (field for field, _ in acks) for acks in self._acks.values()))
            if len(live) < len(self._held):  # (a pop's reply being read: not yet taken)
                self._held = {f: e for f, e in self._held.items()
                              if f in live or pop_number(f) in self._unanswered_pops}

    # -- back-off ------------------------------------------------------------------------

    def backoff(self, slot: str, until_ms: int) -> int:
        """Pause ``slot`` for every worker until ``until_ms`` (Redis's clock; a later
        pause already set stays). Returns when its pause ends."""
        name = keys.slot_name(slot)
        k = self.k[self.home(name)]
        return int(self.link.call("EVALSHA", self._scripts["slot_backoff"].sha, 3, k.ready,
                                  k.prefix + name, k.defaults, k.prefix, name, until_ms))

    def robots_delay(self, slot: str, delay_ms: int) -> None:
        """robots.txt's Crawl-delay ``delay_ms`` for ``slot``, for requests queued from now."""
        name = keys.slot_name(slot)
        self.link.call("HSET", self.k[self.home(name)].robots, name, int(delay_ms))

    def redis_time_ms(self) -> int:
        """Redis's clock, ms (a cluster's latest master's: a back-off ends no sooner)."""
        seconds, micros = max(reply for _, reply in self.link.on_masters("TIME"))
        return int(seconds) * 1000 + int(micros) // 1000

    # -- leases that come back -------------------------------------------------------------

    def _slot_reap(self, shard: int, own: str, keep: list[str], *, dead: bool = True
                   ) -> tuple[Any, ...]:
        """slot_reap.lua on ``shard``: the dead's leases (if ``dead``), ``own`` 's but ``keep``."""
        timeout, k = self.lease_timeout_ms if dead else NEVER_MS, self.k[shard]
        return ("EVALSHA", self._scripts["slot_reap"].sha, 6, k.ready, k.leased, k.owners,
                k.defaults, k.waiting, k.intake, k.prefix, timeout, own, int(dead), *keep)

    def reap(self, *, release_own: bool = False) -> list[tuple[int, Request]]:
        """As the default queue's, for the slots' leases (back at their lists' head); an earlier
        build's leases in the old lease hash come back once their worker stops (``reap.lua``)."""
        own = self.owner if release_own else ""
        commands = self._ack_commands()
        commands += [self._slot_reap(shard, own, []) for shard in range(self.shards)]
        commands += [("HLEN", self._leases[shard]) for shard in range(self.shards)]
        replies = self._execute(commands)[-2 * self.shards:]
        self._acks_sent()
        # One that does not decode stays where it is: the next pop retires it.
        slots, _bad = self.codec.decode_replies(
            [_as_queued(value) for counted, *_ in replies[:self.shards] for value in counted])
        back = [(requeues, request) for _, requeues, request in slots]
        for shard, k in enumerate(self.k):
            if int(replies[shard][2]):  # entries of a move: back in the intake
                self._intake_seen[shard] = True
            if int(replies[self.shards + shard]):
                (old,) = self._execute([("EVALSHA", self._scripts["reap"].sha, 3, k.intake,
                                         self._leases[shard], k.owners,
                                         self.lease_timeout_ms, own, k.leased)], acks=False)
                self._intake_seen[shard] |= bool(old)
                decoded, bad = self.codec.decode_replies(old)
                back += [(requeues, request) for _, requeues, request in decoded]
                if bad:
                    self._retire(shard, "queued", bad)
        return back

    def reclaim(self, held: Any = ()) -> Reclaimed:
        """As the default queue's (see :meth:`~.queue.PriorityQueue.reclaim`)."""
        with self._acks_lock:
            keep = dict(self._taken)
        keep.update((lease.field, lease.shard) for lease in held)
        if self._unfinished_move is not None:  # its entries: pushed and ended by the next move
            keep[f"{self.owner}:m"] = self._unfinished_move[0]
        kept = [sorted(f for f, shard in keep.items() if shard == i) for i in range(self.shards)]
        commands = self._ack_commands()
        commands += [self._slot_reap(i, self.owner, kept[i], dead=False)
                     for i in range(self.shards)]
        replies = self._execute(commands)[-self.shards:]
        self._acks_sent()
        for shard, reply in enumerate(replies):
            self._intake_seen[shard] |= int(reply[2]) > 0
        return self._reclaimed([f for _, own, _ in replies for f in own])

    def push_many(self, requests: Any) -> None:
        """Queue ``requests`` past the filter (``dont_filter``, a requeue) into their slots,
        one ``slot_push.lua`` a home shard. Retry-safe: called again with the same requests,
        it reuses the push number, so a push whose reply was lost is not done twice."""
        entries = [self.sink_entry(request) for request in requests]
        if self._unanswered_slot_push is None or self._unanswered_slot_push[0] != entries:
            self._push_number += 1
            self._next_shard = (self._next_shard + 1) % self.shards
            groups: dict[int, list[Any]] = {}
            for score, member, name, concurrency, delay in entries:
                home = self.home(name) if self.policy.crawl_wide else self._next_shard
                groups.setdefault(home, []).extend([name, -score, concurrency, delay, member])
            self._unanswered_slot_push = (entries, groups)
        commands = []
        for home, args in sorted(self._unanswered_slot_push[1].items()):
            k = self.k[home]
            commands.append(("EVALSHA", self._scripts["slot_push"].sha, 5, k.ready,
                             k.slot_push_record, k.defaults, k.waiting, k.robots,
                             self._push_number, RECORD_TTL_MS, k.prefix, *args))
        self._execute(commands, acks=False)
        self._unanswered_slot_push = None

    def adopt(self, legacy: str, batch: int = 500) -> int:
        moved = super().adopt(legacy, batch)
        if moved:
            self._intake_seen = [True] * self.shards
        return moved


def claim_horizon(policy: SlotPolicy) -> float:
    """How far ahead a pop takes: :data:`CLAIM_AHEAD`, or the longest gap between a slot's
    starts (delay times 1 + jitter), so the worker whose ack frees a slot takes its next
    request in the same pop (else every worker would wake to race for it)."""
    if not policy.crawl_wide:
        return 0.0  # one slot without limits: everything it takes may start now
    limits = [policy.defaults(), *(policy.limits(slot) for slot in policy.per_slot)]
    longest = max(each.delay_ms / 1000 * (1 + each.jitter) for each in limits)
    return max(CLAIM_AHEAD, longest)


def _pairs(found: list[Any]) -> list[tuple[bytes, int]]:
    """``ZRANGE ... WITHSCORES`` 's reply (pairs, or a flat list) as (entry, score) s."""
    pairs = found if isinstance(found[0], (list, tuple)) else list(
        zip(found[0::2], found[1::2], strict=True))
    return [(bytes(member), int(float(score))) for member, score in pairs]


def _moving(element: bytes) -> tuple[bytes, int]:
    """An entry in a move, ``m|<score>|<entry>`` (slot_claim.lua), as (entry, score)."""
    score, _, member = element[2:].partition(b"|")
    return member, int(score)


def _as_queued(value: bytes) -> bytes:
    """A slot lease's ``<priority>[@<start>]|<slot>|<entry>`` as ``<score>|<entry>``."""
    head, _, rest = value.partition(b"|")
    entry = rest.partition(b"|")[2]
    return b"%d|%s" % (-int(head.partition(b"@")[0]), entry)


def _start_ms(value: bytes) -> int:
    """When a slot lease taken ahead may start (ms, Redis's clock; 0: at once)."""
    return int(value.partition(b"|")[0].partition(b"@")[2] or 0)

