"""The crawl's shared request queue: leased, sharded like the filter, safe to retry.

A worker that takes a request from the queue does not remove it from Redis: it
moves it into the shard's lease hash under its own name (its *owner* id), and
deletes it from there (an *ack*) only once the work it started is safe (the
scheduler decides when: the request's callback output is queued, or the
request failed for good and was recorded). Each worker marks itself alive in
every shard's owner set (a heartbeat, Redis's own clock); a worker that has
not done so for ``lease_timeout`` seconds is dead, and any live worker puts
its leases back in the queue (:meth:`PriorityQueue.reap`), without a second
filter check. So a worker killed mid-crawl (OOM, preemption, ``kill -9``)
loses nothing: what it held is fetched again by the others.

Shards: on a Redis Cluster the queue is sharded like the filter (hash tags), so every
master carries part of the pushes and pops; on one node (or a Sentinel master) it
has one shard, 0. This class keeps its requests in sorted sets (the layout of
2026-11-27, and the intake of :class:`~.leased.LeasedQueue`, the scheduler's queue,
which keeps them in download slots' lists). A new request is queued by the script
that checks it against the filter (``frontier/sink.lua``). Every call is safe to
repeat after a lost reply: a pop carries this worker's pop number, an unfiltered
push a push number; acks and heartbeats are idempotent.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_redis.queue import Base as RedisQueueBase

from .. import keys, luascript
from ..transport.cluster import is_cluster
from ..transport.link import Link, link_to
from ..transport.sentinel import master_epoch
from . import adopt, builds, entry, undecodable
from .entry import Bad

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster
    from scrapy import Request, Spider

#: How long an unfiltered push's record outlives its last write (a retry comes before).
RECORD_TTL_MS = 3_600_000
#: How long a worker on a scrapy-redis queue class counts as live without leaving (ms).
JOINED_MS = 86_400_000
#: Default time without a heartbeat after which a worker's leases go back.
LEASE_TIMEOUT = 30.0
#: Default length limit of the failed requests' record (BLOOMDUPE_FAILED_LIMIT's).
FAILED_LIMIT = 100_000


@dataclass(frozen=True)
class Lease:
    """A request this worker took: where its lease lives, and the request."""

    shard: int
    field: str
    request: Request
    #: The client's master epoch when it was taken (:func:`~..transport.sentinel.master_epoch`):
    #: a lease taken before a failover is not acked after it (its work may be lost
    #: with the old master); :meth:`PriorityQueue.reclaim` puts it back instead.
    epoch: int = 0
    #: How often this request's lease expired before (its holder stopped heartbeating).
    requeues: int = 0
    #: Seconds after the pop's answer before it may start (crawl-wide politeness takes
    #: a slot's next request ahead of its start: frontier/leased.py); 0: at once.
    start_in: float = 0.0


@dataclass(frozen=True)
class Reclaimed:
    """What :meth:`PriorityQueue.reclaim` put back in the queue, by why this worker no
    longer held it."""

    #: Acks dropped: the master changed (its epoch) since the lease was taken.
    failover: int = 0
    #: Leases of pops whose replies this worker never read (an error on the way).
    lost_pops: int = 0
    #: Acked, yet still in Redis: the ack went to a master a failover replaced.
    lost_acks: int = 0

    @property
    def total(self) -> int:
        return self.failover + self.lost_pops + self.lost_acks


class PriorityQueue(RedisQueueBase):  # type: ignore[misc]
    """scrapy-redis's priority queue, with leases, shards and retry-safe calls: the base
    of the scheduler's :class:`~.leased.LeasedQueue`, and the sorted-set layout of the
    queue an earlier build left. ``SCHEDULER_QUEUE_CLASS`` naming this class (or
    ``scrapy_bloomdupe.cluster.PriorityQueue``, its old name) gets the scheduler's
    :class:`~.leased.LeasedQueue`. ``tag`` is the filter's key (the shards'
    hash tags), ``shards`` the filter's shard count; ``key`` (scrapy-redis's
    ``SCHEDULER_QUEUE_KEY``) is used only when no ``tag`` is given."""

    #: The queue's scripts, each a file in this package headed by its KEYS and ARGV.
    PUSH_SCRIPT = luascript.read(__package__, "push.lua")
    POP_SCRIPT = luascript.read(__package__, "pop.lua")
    HEARTBEAT_SCRIPT = luascript.read(__package__, "heartbeat.lua")
    REAP_SCRIPT = luascript.read(__package__, "reap.lua")
    LEAVE_SCRIPT = luascript.read(__package__, "leave.lua")
    RECLAIM_SCRIPT = luascript.read(__package__, "reclaim.lua")
    MERGE_SCRIPT = luascript.read(__package__, "merge.lua")
    RETIRE_SCRIPT = undecodable.RETIRE_SCRIPT

    def __init__(self, server: Redis | RedisCluster, spider: Spider, key: str,
                 serializer: Any = None, *, tag: str | None = None, shards: int = 1,
                 lease_timeout: float = LEASE_TIMEOUT, wait_replicas: int = 0,
                 failed_limit: int = FAILED_LIMIT) -> None:
        super().__init__(server, spider, key, serializer)
        #: What an entry of the queue is (frontier/entry.py): written and read by it.
        self.codec = entry.Codec(self.serializer, spider)
        self.tag = tag or self.key
        #: The filter's shard count; the queue's (:attr:`shards`) is the same on a
        #: cluster and 1 on one node (see the module's docstring).
        self.filter_shards = shards
        self.shards = shards if is_cluster(server) else 1
        self.lease_timeout_ms = max(1, round(lease_timeout * 1000))
        #: How many other workers were live at this worker's last heartbeat (None: none yet).
        self.others_live: int | None = None
        self.failed_limit = failed_limit
        #: This worker, as its leases name it.
        self.owner = secrets.token_hex(6)
        #: The queue's round trips (and its WAIT): see :class:`~..transport.link.Link`.
        self.link = Link(server, wait_replicas=wait_replicas)
        self._scripts = {name: server.register_script(text) for name, text in (
            ("push", self.PUSH_SCRIPT), ("pop", self.POP_SCRIPT),
            ("heartbeat", self.HEARTBEAT_SCRIPT), ("reap", self.REAP_SCRIPT),
            ("reclaim", self.RECLAIM_SCRIPT), ("leave", self.LEAVE_SCRIPT),
            ("merge", self.MERGE_SCRIPT), ("retire", self.RETIRE_SCRIPT))}
        # Loaded again by the link where a round trip is answered NOSCRIPT.
        self.link.knows(*(script.script for script in self._scripts.values()))
        shard_range = range(self.shards)
        self._queues = [keys.queue(self.tag, i) for i in shard_range]
        self._leases = [keys.leases(self.tag, i) for i in shard_range]
        self._owners = [keys.owners(self.tag, i) for i in shard_range]
        self._push_records = [keys.push_record(self.tag, i, self.owner) for i in shard_range]
        self._pop_number = 1
        self._push_number = 0
        self._unanswered_push: tuple[int, list[Any]] | None = None
        self._next_shard = 0
        self._pop_shard: int | None = None
        #: Shards the last look (ZCARD) found requests in, not yet popped from since.
        self._waiting: list[int] = []
        #: Acks not yet sent, per shard: (field, epoch), sent with the next round trip.
        self._acks: dict[int, list[tuple[str, int]]] = {}
        #: How many acks of each shard the last round trip carried (see _acks_sent), how
        #: many of those were stale (dropped), how many ``HDEL`` s lead the round trip,
        #: and the master epoch they were built for.
        self._acks_carried: dict[int, int] = {}
        self._acks_stale = 0
        self._acks_built: tuple[int, int | None] = (0, None)
        #: Acks are added from Scrapy's reactor while the calls run on the scheduler's
        #: Redis thread (scheduling/jobs.py).
        self._acks_lock = threading.Lock()
        #: Leases this worker's pops took (their replies came) and not acked since: the
        #: field and its shard (see reclaim).
        self._taken: dict[str, int] = {}
        #: Acks not sent because the master changed since their lease was taken.
        self.stale = 0
        #: Their fields (until a reclaim puts them back), and those of the last round
        #: trip's acks (see _ack_commands).
        self._stale_fields: set[str] = set()
        self._stale_built: list[str] = []
        #: Numbers of pops sent whose replies this worker never read (see reclaim).
        self._unanswered_pops: set[int] = set()
        #: Entries retired since the scheduler last asked (see take_retired).
        self._retired: list[undecodable.Retired] = []

    # -- the filter's side: the sink of its check-and-add ---------------------------

    def sink_keys(self, shard: int) -> list[str]:
        """The keys of the queue shard (shard 0's on one node) where the filter's script
        queues the new requests of filter shard ``shard`` (``frontier/sink.lua``)."""
        q = shard % self.shards
        return [self._queues[q], keys.ready(self.tag, q), keys.slot_defaults(self.tag, q),
                keys.slot_waiting(self.tag, q), keys.slot_robots(self.tag, q)]

    def sink_prefix(self, shard: int) -> str:
        return keys.slot_prefix(self.tag, shard % self.shards)

    def sink_entry(self, request: Request) -> tuple[int, bytes, str, int, int]:
        """What the filter's script queues for ``request``: its score, bytes, slot, limits."""
        return (*self.entry(request), "", 0, 0)

    def sink_item(self, shard: int, entry: Any) -> tuple[Any, ...]:
        return ("", entry[0], "", "", entry[1])  # into the sorted set, by its score

    def merge_shards(self) -> int:
        """On one node, move what the queue's other shards hold (a crawl queued by an
        earlier version, one queue shard a filter shard) into shard 0; one script call,
        at the worker's start. Returns how many requests and leases moved."""
        if self.shards == self.filter_shards:
            return 0
        others = [name for i in range(1, self.filter_shards) for name in (
            keys.queue(self.tag, i), keys.leases(self.tag, i), keys.owners(self.tag, i))]
        names = [self._queues[0], self._leases[0], self._owners[0], *others]
        return int(self.link.call("EVALSHA", self._scripts["merge"].sha, len(names), *names))

    def entry(self, request: Request) -> tuple[int, bytes]:
        """What the sink queues for ``request``: its score and its bytes."""
        return entry.score(request), self.codec.encode(request)

    def _encode_request(self, request: Request) -> bytes:
        return self.codec.encode(request)

    # -- pushing and popping ---------------------------------------------------------

    def push(self, request: Request) -> None:
        self.push_many([request])  # without a filter check (dont_filter, a requeue)

    def push_many(self, requests: Sequence[Request]) -> None:
        """Queue ``requests`` on one shard in one round trip, retry-safe: called again
        with the same requests after a failure, it reuses the push number, so a push
        that ran but whose reply was lost is not done twice."""
        args: list[Any] = []
        for request in requests:
            args.extend(self.entry(request))
        if self._unanswered_push is None or self._unanswered_push[1] != args:
            self._push_number += 1
            self._next_shard = (self._next_shard + 1) % self.shards
            self._unanswered_push = (self._next_shard, args)
        shard = self._unanswered_push[0]
        commands = [("EVALSHA", self._scripts["push"].sha, 2, self._queues[shard],
                     self._push_records[shard], self._push_number, RECORD_TTL_MS, *args)]
        self._execute(commands)
        self._unanswered_push = None

    def pop(self, timeout: int = 0) -> Request | None:  # scrapy-redis's: one, leased
        return next((lease.request for lease in self.pop_leases(1)), None)

    def pop_leases(self, count: int) -> list[Lease]:
        """Lease up to ``count`` requests from the next shard in turn, sending the pending
        acks in the same round trip. When that shard is empty (a shallow queue), one
        round trip of ``ZCARD`` s finds the shards that have requests, and only those
        are tried, now and by the next pops until none is left: an idle worker costs
        Redis one command a shard now and then, not a script call and a round trip a
        shard."""
        if self._pop_shard is not None:
            first = self._pop_shard
        elif self._waiting:
            first = self._waiting.pop(0)
        else:
            first = self._next_shard
            self._next_shard = (first + 1) % self.shards
        leases = self._pop_from(first, count)
        if leases or self.shards == 1:
            return leases
        self._waiting = [i for i in self._shards_waiting() if i != first]
        while self._waiting:
            leases = self._pop_from(self._waiting.pop(0), count)
            if leases:
                return leases
        return []

    def _shards_waiting(self) -> list[int]:
        sizes = self.link.calls([("ZCARD", name) for name in self._queues])
        return [i for i, n in enumerate(sizes) if n]

    def _pop_from(self, shard: int, count: int) -> list[Lease]:
        self._pop_shard = shard  # a retry after a lost reply: the same shard, the same number
        number = self._pop_number
        pop = ("EVALSHA", self._scripts["pop"].sha, 3, self._queues[shard], self._leases[shard],
               self._owners[shard], self.owner, number, count)
        # The acks of other masters of a cluster wait for a round trip that goes there.
        commands = self._ack_commands(self.link.reaches([pop]))
        commands.append(pop)
        with self._acks_lock:
            self._unanswered_pops.add(number)
        entries = self._execute(commands)[-1]
        self._acks_sent()  # (and they are idempotent)
        self._pop_number += 1  # only once the reply is in: a retry replays
        self._pop_shard = None
        epoch = master_epoch(self.server)
        decoded, bad = self.codec.decode_replies(
            entries, [f"{self.owner}:{number}.{j}" for j in range(len(entries))])
        leases = [Lease(shard, str(field), request, epoch, requeues)
                  for field, requeues, request in decoded]
        if bad:
            self._retire(shard, "lease", bad)
        with self._acks_lock:
            self._taken.update((lease.field, shard) for lease in leases)
            self._unanswered_pops.discard(number)
        return leases

    # -- leases ----------------------------------------------------------------------

    def ack(self, leases: Iterable[Lease]) -> None:
        """The work of these leases is safe: forget them (with the next round trip).

        Not a lease taken before the master changed (a Sentinel failover): what its
        work wrote may have gone to the old master, and be lost. It stays leased,
        and :meth:`reclaim` puts it back in the queue (:attr:`stale` counts them)."""
        with self._acks_lock:
            for lease in leases:
                self._acks.setdefault(lease.shard, []).append((lease.field, lease.epoch))
                self._taken.pop(lease.field, None)

    def pending_acks(self) -> int:
        """Acks not yet known to be in Redis (waiting, or on their way): their leases
        still count as this worker's if it dies now."""
        with self._acks_lock:
            return sum(len(acks) for acks in self._acks.values())

    def send_acks(self) -> None:
        """Send the pending acks now, in one round trip (none: nothing sent)."""
        commands = self._ack_commands()
        if commands:
            self._execute(commands)
        self._acks_sent()

    def heartbeat(self) -> None:
        """Mark this worker alive in every shard, and send the pending acks; the replies
        count the other live workers (:attr:`others_live`)."""
        commands = self._ack_commands()
        for shard, owners in enumerate(self._owners):  # shard 0's records the build too
            named = (owners, keys.builds(self.tag))[:2 if shard == 0 else 1]
            commands.append(("EVALSHA", self._scripts["heartbeat"].sha, len(named), *named,
                             self.owner, str(builds.OURS), self.lease_timeout_ms))
        replies = self._execute(commands)
        self._acks_sent()
        self.others_live = max(int(n) for n in replies[len(replies) - len(self._owners):])

    def reap(self, *, release_own: bool = False) -> list[tuple[int, Request]]:
        """Put the leases of dead workers back in the queue (with ``release_own``, this
        worker's own too: what it took and is giving back, not counted as a requeue).
        Returns the dead workers' requests put back, each with how often its lease
        has expired now."""
        own = self.owner if release_own else ""
        commands = self._ack_commands()
        for shard in range(self.shards):
            commands.append(("EVALSHA", self._scripts["reap"].sha, 3, self._queues[shard],
                             self._leases[shard], self._owners[shard],
                             self.lease_timeout_ms, own))
        replies = self._execute(commands)
        self._acks_sent()
        back: list[tuple[int, Request]] = []
        for shard, members in enumerate(replies[len(replies) - self.shards:]):
            decoded, bad = self.codec.decode_replies(members)
            back.extend((requeues, request) for _, requeues, request in decoded)
            if bad:
                self._retire(shard, "queued", bad)
        return back

    def leave(self) -> bool:
        """Leave the crawl (stop counting as one of its live workers); True when no other
        live worker is left: then this one is the last, and may clear what is shared."""
        (last,) = self._execute([("EVALSHA", self._scripts["leave"].sha, 1, self._owners[0],
                                  self.owner, self.lease_timeout_ms)])
        return bool(last)

    def reclaim(self, held: Iterable[Lease] = ()) -> Reclaimed:
        """Put back in the queue this worker's leases in Redis that it does not hold
        (neither taken by a pop whose reply came and not acked since, nor in ``held``):
        after a failover, or a pop that failed on its way back; unclaimed, they would
        keep the crawl open for ever. Returns how many went back, by why."""
        fields: dict[int, list[str]] = {}
        with self._acks_lock:
            taken = dict(self._taken)
        taken.update((lease.field, lease.shard) for lease in held)
        for field, shard in taken.items():
            fields.setdefault(shard, []).append(field)
        commands = self._ack_commands()
        for shard in range(self.shards):
            commands.append(("EVALSHA", self._scripts["reclaim"].sha, 2, self._queues[shard],
                             self._leases[shard], self.owner, *fields.get(shard, ())))
        replies = self._execute(commands)
        self._acks_sent()
        return self._reclaimed([raw for reply in replies[len(replies) - self.shards:]
                                for raw in reply])

    def _reclaimed(self, fields: list[Any]) -> Reclaimed:
        """What a reclaim put back (its leases' ``fields``), by why this worker no longer
        held each; the stale acks and unanswered pops it settled are forgotten."""
        failover = lost_pops = lost_acks = 0
        with self._acks_lock:
            for raw in fields:
                field = raw.decode() if isinstance(raw, bytes) else str(raw)
                if field in self._stale_fields:
                    failover += 1
                elif pop_number(field) in self._unanswered_pops:
                    lost_pops += 1
                else:
                    lost_acks += 1
            # Whatever of theirs Redis held is back in the queue now.
            self._stale_fields.clear()
            self._unanswered_pops.clear()
        return Reclaimed(failover, lost_pops, lost_acks)

    def take_retired(self) -> list[undecodable.Retired]:
        """The entries retired since the last call (for the scheduler to count and log)."""
        with self._acks_lock:
            retired, self._retired = self._retired, []
            return retired

    def _retire(self, shard: int, where: str, bad: Sequence[Bad]) -> None:
        """Retire entries that cannot be decoded (:mod:`.undecodable`)."""
        same_slot = self.shards == 1 or shard == 0
        retired, round_trips = undecodable.retire_round_trips(
            serializer=self.serializer, tag=self.tag, shard=shard, same_slot=same_slot,
            script=self._scripts["retire"].sha, limit=self.failed_limit, where=where, bad=bad)
        replies = [self._execute(commands, acks=False) for commands in round_trips]
        ours = replies[0][0] if same_slot else [1] * len(retired)  # retire.lua's: 1 if it did
        with self._acks_lock:
            self._retired.extend(r for r, retiring in zip(retired, ours, strict=True) if retiring)

    def status(self) -> tuple[int, int]:
        return status(self.link, self.tag, self.shards)  # (waiting, leased), every shard

    def __len__(self) -> int:
        return self.status()[0]

    def riders(self, reached: Callable[[tuple[Any, ...]], bool]
               ) -> tuple[list[tuple[Any, ...]], int | None]:
        """The pending acks that ``reached`` says go where a check-and-queue's round trip
        goes anyway (the filter sends them with it; see :class:`~..bloom.engine.RidingSink`),
        and the master epoch they were built for. Only acks already pending ride: a page
        is acked once its output's check-and-queue has answered, so never in the round
        trip that queues its links."""
        commands = self._ack_commands(reached)
        return commands, self._acks_built[1]

    def riders_sent(self) -> None:
        self._acks_sent()

    def rider_scripts(self) -> tuple[str, ...]:
        """The acks (``HDEL`` s here) run no script."""
        return ()

    def _ack_commands(self, reached: Callable[[tuple[Any, ...]], bool] | None = None
                      ) -> list[tuple[Any, ...]]:
        """``HDEL`` s of the pending acks (only of shards whose ``HDEL`` is ``reached``),
        leading the round trip; an ack is sent only to the master its lease was taken
        from (the round trip is bound to it: see :meth:`_execute`)."""
        epoch = master_epoch(self.server)
        commands: list[tuple[Any, ...]] = []
        with self._acks_lock:
            pending = {shard: list(acks) for shard, acks in self._acks.items()
                       if reached is None or reached(self._ack_command(shard, []))}
        self._acks_carried = {shard: len(acks) for shard, acks in pending.items()}
        self._acks_stale = 0
        self._stale_built = []
        for shard, acks in pending.items():
            fields = [field for field, taken in acks if taken == epoch]
            self._acks_stale += len(acks) - len(fields)
            self._stale_built += [field for field, taken in acks if taken != epoch]
            if fields:
                commands.append(self._ack_command(shard, fields))
        self._acks_built = (len(commands), epoch if commands else None)
        return commands

    def _ack_command(self, shard: int, fields: list[str]) -> tuple[Any, ...]:
        """The command that acks ``fields`` of ``shard``."""
        return ("HDEL", self._leases[shard], *fields)

    def _acks_sent(self) -> None:
        """Forget the acks the last round trip carried (not those added since)."""
        with self._acks_lock:
            for shard, count in self._acks_carried.items():
                del self._acks.get(shard, [])[:count]
            self._acks = {shard: acks for shard, acks in self._acks.items() if acks}
            self._stale_fields.update(self._stale_built)
        self.stale += self._acks_stale
        self._stale_built = []
        self._acks_carried, self._acks_stale, self._acks_built = {}, 0, (0, None)

    def send(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Commands of this worker's own (a failure record) in one round trip on the
        queue's link, with its ``WAIT`` if the crawl waits for replicas; an error reply
        is raised."""
        return self._execute(list(commands), acks=False)

    def _execute(self, commands: list[tuple[Any, ...]], *, acks: bool = True) -> list[Any]:
        """One round trip (scripts flushed from Redis are loaded again by the link, which
        repeats it: every command in it is safe to repeat); an error reply is raised.
        Its leading acks (:meth:`_ack_commands`) were built for one master: when the
        client has moved to another (a Sentinel failover) they are built again, without
        the acks of leases taken from the old one. Callers read replies from the end.
        ``acks``: the round trip starts with :meth:`_ack_commands` (built just now)."""
        if not acks:
            replies = self.link.execute(commands)
        else:
            attempts = 0

            def build() -> tuple[list[tuple[Any, ...]], int | None]:
                nonlocal attempts
                if attempts:
                    count = self._acks_built[0]
                    commands[:count] = self._ack_commands()  # the stale ones left out now
                attempts += 1
                return commands, self._acks_built[1]
            replies = self.link.execute_bound(build)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def adopt(self, legacy: str, batch: int = 500) -> int:
        """Take over the requests waiting in a scrapy-redis queue at ``legacy``, past the
        filter (see :func:`.adopt.take_over`); returns how many moved."""
        return adopt.take_over(self.link, legacy, self._queue_batch, batch)

    def _queue_batch(self, entries: list[tuple[int, Any]]) -> None:
        shard = self._next_shard
        self._next_shard = (shard + 1) % self.shards
        self.link.call("ZADD", self._queues[shard],
                       *(x for score, member in entries for x in (score, member)))

    # -- ending ----------------------------------------------------------------------

    def close(self) -> None:
        """Give back what this worker took and did not hand out; forget its records.

        The scheduler acks every request whose work is done before this."""
        self.reap(release_own=True)
        self.forget()

    def forget(self) -> None:
        """Take this worker's name out of the owner sets and delete its push records
        (alone: a worker leaving a crawl whose state is gone)."""
        commands: list[tuple[Any, ...]] = []
        for shard in range(self.shards):  # in one round trip (one a master on a cluster)
            commands += [("ZREM", self._owners[shard], self.owner),
                         ("DEL", self._push_records[shard])]
        self._execute(commands)
        self.link.close()

    def detach(self) -> None:
        """Let go of the connection without a word to Redis (a worker stopped on an
        error: what it holds comes back after the lease timeout)."""
        self.link.close()

    def clear(self, report_ttl: float = 0) -> None:
        """Delete the whole queue, on every filter shard (see :func:`clear`)."""
        clear(self.link, self.tag, self.filter_shards, report_ttl)


def pop_number(field: str) -> int:
    """The pop number in a lease's field, ``"<owner>:<pop>.<j>"``."""
    return int(field.rsplit(":", 1)[1].split(".", 1)[0])


def join(client: Redis | RedisCluster, tag: str, member: str) -> None:
    """Count ``member`` (a worker on a scrapy-redis queue class, which does not
    heartbeat) as one of the crawl's workers until it :func:`leave` s, or for a day
    (one that never left, killed, stops counting then)."""
    client.zadd(keys.owners(tag, 0), {member: time.time() * 1000 + JOINED_MS})


def leave(client: Redis | RedisCluster, tag: str, member: str, lease_timeout_ms: int) -> bool:
    """``member`` leaves the crawl tagged ``tag``; True when no other live worker is left
    in it (see :meth:`PriorityQueue.leave`)."""
    script = client.register_script(PriorityQueue.LEAVE_SCRIPT)
    return bool(script(keys=[keys.owners(tag, 0)], args=[member, lease_timeout_ms]))


def clear(target: Redis | RedisCluster | Link, tag: str, shards: int, ttl: float = 0) -> None:
    """Delete the queue tagged ``tag`` (the filter's key) of ``shards`` shards, whoever
    made it (either layout): waiting requests, leases, owners, push records, the format
    and builds records, failed requests (with ``ttl``, a finished crawl's report: they
    expire in ``ttl`` seconds); through ``target``'s link (a crawl's: its last job)."""
    with link_to(target) as link:
        names = [keys.queue_format(tag), keys.builds(tag)] + ([] if ttl else [keys.failed(tag)])
        for shard in range(shards):
            names += [keys.queue(tag, shard), keys.leases(tag, shard), keys.owners(tag, shard),
                      *link.scan(keys.push_record(tag, shard, "*"))]
            names += [keys.ready(tag, shard), keys.slot_leased(tag, shard),
                      keys.slot_defaults(tag, shard), keys.slot_waiting(tag, shard),
                      keys.slot_strikes(tag, shard), keys.slot_robots(tag, shard)]
            for pattern in (keys.slot_prefix(tag, shard) + "*", keys.slot_held(tag, shard, "*"),
                            keys.slot_push_record(tag, shard, "*")):
                names += link.scan(pattern)
        link.calls([("DEL", name) for name in names]
                   + ([("EXPIRE", keys.failed(tag), max(1, round(ttl)))] if ttl else []))


def shard_status(target: Redis | RedisCluster | Link, tag: str, shards: int
                 ) -> list[tuple[int, int]]:
    """(requests waiting, requests leased) of each shard of the queue tagged ``tag``
    (the filter's key), in one round trip of ``target``'s link. Reads only."""
    with link_to(target) as link:
        replies = link.calls([
            command for shard in range(shards)
            for command in (("ZCARD", keys.queue(tag, shard)), ("HLEN", keys.leases(tag, shard)),
                            ("GET", keys.slot_waiting(tag, shard)),
                            ("GET", keys.slot_leased(tag, shard)))])
    # The download slots' requests (frontier/leased.py: counted) and their leases.
    return [(int(replies[4 * i]) + int(replies[4 * i + 2] or 0),
             int(replies[4 * i + 1]) + int(replies[4 * i + 3] or 0)) for i in range(shards)]


def status(target: Redis | RedisCluster | Link, tag: str, shards: int) -> tuple[int, int]:
    """(requests waiting, requests leased) of the whole queue tagged ``tag``."""
    per_shard = shard_status(target, tag, shards)
    return sum(q for q, _ in per_shard), sum(leased for _, leased in per_shard)
