"""The crawl's shared request queue: leased, sharded like the filter, safe to retry.

A pop moves a request into the shard's lease hash under this worker's *owner* id; an *ack*
deletes it once its work is safe (output queued, or failure recorded). Workers heartbeat in
every shard's owner set; one silent for ``lease_timeout`` seconds is dead and any live worker
requeues its leases (:meth:`PriorityQueue.reap`), so a killed worker loses nothing. Sharded
by hash tag on a cluster, one shard on one node; requests sit in sorted sets (the intake of
:class:`~.leased.LeasedQueue`), queued by ``frontier/sink.lua``. Every call is safe to repeat
after a lost reply: pops and pushes carry numbers, acks and heartbeats are idempotent.
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
    #: Master epoch when taken (:func:`~..transport.sentinel.master_epoch`): a lease from
    #: before a failover is not acked but requeued (:meth:`PriorityQueue.reclaim`).
    epoch: int = 0
    #: How often this request's lease expired before.
    requeues: int = 0
    #: Seconds after the pop before it may start (crawl-wide politeness: frontier/leased.py).
    start_in: float = 0.0


@dataclass(frozen=True)
class Reclaimed:
    """What :meth:`PriorityQueue.reclaim` put back, by why this worker no longer held it."""

    #: Acks dropped: the master changed since the lease was taken.
    failover: int = 0
    #: Leases of pops whose replies this worker never read (an error on the way).
    lost_pops: int = 0
    #: Acked, yet still in Redis: the ack went to a master a failover replaced.
    lost_acks: int = 0

    @property
    def total(self) -> int:
        return self.failover + self.lost_pops + self.lost_acks


class PriorityQueue(RedisQueueBase):  # type: ignore[misc]
    """scrapy-redis's priority queue with leases, shards and retry-safe calls; base of (and,
    named in ``SCHEDULER_QUEUE_CLASS``, replaced by) :class:`~.leased.LeasedQueue`. ``tag``:
    the filter's key; ``shards``: its shard count; ``key`` is used only without a ``tag``."""

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
        #: Encodes and decodes the queue's entries (frontier/entry.py).
        self.codec = entry.Codec(self.serializer, spider)
        self.tag = tag or self.key
        #: The filter's shard count; :attr:`shards` is the same on a cluster, 1 on one node.
        self.filter_shards = shards
        self.shards = shards if is_cluster(server) else 1
        self.lease_timeout_ms = max(1, round(lease_timeout * 1000))
        #: How many other workers were live at this worker's last heartbeat (None: none yet).
        self.others_live: int | None = None
        self.failed_limit = failed_limit
        #: This worker, as its leases name it.
        self.owner = secrets.token_hex(6)
        #: The queue's round trips (and WAIT): :class:`~..transport.link.Link`.
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
        #: Acks per shard the last round trip carried, how many were stale (dropped), and
        #: (leading ``HDEL`` count, master epoch they were built for).
        self._acks_carried: dict[int, int] = {}
        self._acks_stale = 0
        self._acks_built: tuple[int, int | None] = (0, None)
        #: Acks come from Scrapy's reactor; calls run on the Redis thread (scheduling/jobs.py).
        self._acks_lock = threading.Lock()
        #: Leases taken by answered pops and not acked since: field -> shard (see reclaim).
        self._taken: dict[str, int] = {}
        #: Acks not sent because the master changed since their lease was taken.
        self.stale = 0
        #: Their fields until a reclaim, and those of the last round trip (_ack_commands).
        self._stale_fields: set[str] = set()
        self._stale_built: list[str] = []
        #: Numbers of pops sent whose replies this worker never read (see reclaim).
        self._unanswered_pops: set[int] = set()
        #: Entries retired since the scheduler last asked (see take_retired).
        self._retired: list[undecodable.Retired] = []

    # -- the filter's side: the sink of its check-and-add ---------------------------

    def sink_keys(self, shard: int) -> list[str]:
        """Keys of the queue shard where ``frontier/sink.lua`` queues filter shard ``shard``'s."""
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
        """On one node, move other queue shards' entries (old layout) to shard 0; returns count."""
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
        """Queue ``requests`` on one shard in one round trip. A retry with the same requests
        reuses the push number, so a push whose reply was lost is not done twice."""
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
        """Lease up to ``count`` requests from the next shard in turn, with the pending acks.
        When it is empty, one round trip of ``ZCARD`` s finds the non-empty shards, which
        this and later pops try first: an idle worker costs one cheap command a shard."""
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
        """Their work is safe: delete the leases with the next round trip. One taken before a
        failover (work maybe lost) is left for :meth:`reclaim` (:attr:`stale` counts them)."""
        with self._acks_lock:
            for lease in leases:
                self._acks.setdefault(lease.shard, []).append((lease.field, lease.epoch))
                self._taken.pop(lease.field, None)

    def pending_acks(self) -> int:
        """Acks not yet known to be in Redis: their leases are still this worker's."""
        with self._acks_lock:
            return sum(len(acks) for acks in self._acks.values())

    def send_acks(self) -> None:
        """Send the pending acks now, in one round trip (none: nothing sent)."""
        commands = self._ack_commands()
        if commands:
            self._execute(commands)
        self._acks_sent()

    def heartbeat(self) -> None:
        """Mark this worker alive in every shard, send pending acks; sets :attr:`others_live`."""
        commands = self._ack_commands()
        for shard, owners in enumerate(self._owners):  # shard 0's records the build too
            named = (owners, keys.builds(self.tag))[:2 if shard == 0 else 1]
            commands.append(("EVALSHA", self._scripts["heartbeat"].sha, len(named), *named,
                             self.owner, str(builds.OURS), self.lease_timeout_ms))
        replies = self._execute(commands)
        self._acks_sent()
        self.others_live = max(int(n) for n in replies[len(replies) - len(self._owners):])

    def reap(self, *, release_own: bool = False) -> list[tuple[int, Request]]:
        """Requeue dead workers' leases (with ``release_own`` this worker's too, not counted
        as requeues). Returns the dead workers' requests, each with its expiry count."""
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
        """Stop counting as live; True when no other is left (then it may clear what is shared)."""
        (last,) = self._execute([("EVALSHA", self._scripts["leave"].sha, 1, self._owners[0],
                                  self.owner, self.lease_timeout_ms)])
        return bool(last)

    def reclaim(self, held: Iterable[Lease] = ()) -> Reclaimed:
        """Requeue this worker's leases it does not hold (not from an answered pop, nor in
        ``held``), which would keep the crawl open for ever. Returns counts by cause."""
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
        """Count a reclaim's ``fields`` by cause; forget the stale acks and lost pops."""
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
        """Pending acks that ``reached`` lets ride a check-and-queue's round trip, and their
        epoch (:class:`~..bloom.engine.RidingSink`); never a page's own links' round trip."""
        commands = self._ack_commands(reached)
        return commands, self._acks_built[1]

    def riders_sent(self) -> None:
        self._acks_sent()

    def rider_scripts(self) -> tuple[str, ...]:
        """The acks (``HDEL`` s here) run no script."""
        return ()

    def _ack_commands(self, reached: Callable[[tuple[Any, ...]], bool] | None = None
                      ) -> list[tuple[Any, ...]]:
        """``HDEL`` s of the pending acks (of shards ``reached``), leading the round trip;
        only to the master the lease came from (see :meth:`_execute`)."""
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
        """Send ``commands`` in one round trip on the queue's link, with its ``WAIT``; raises."""
        return self._execute(list(commands), acks=False)

    def _execute(self, commands: list[tuple[Any, ...]], *, acks: bool = True) -> list[Any]:
        """One round trip, repeatable (the link reloads flushed scripts and repeats it); an
        error reply is raised. With ``acks``, it leads with :meth:`_ack_commands`, rebuilt
        without the old master's leases if the client failed over. Read replies from the end."""
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
        """Adopt the scrapy-redis queue at ``legacy`` (:func:`.adopt.take_over`); returns count."""
        return adopt.take_over(self.link, legacy, self._queue_batch, batch)

    def _queue_batch(self, entries: list[tuple[int, Any]]) -> None:
        shard = self._next_shard
        self._next_shard = (shard + 1) % self.shards
        self.link.call("ZADD", self._queues[shard],
                       *(x for score, member in entries for x in (score, member)))

    # -- ending ----------------------------------------------------------------------

    def close(self) -> None:
        """Give back what this worker holds (finished work is acked first); forget its records."""
        self.reap(release_own=True)
        self.forget()

    def forget(self) -> None:
        """Remove this worker from the owner sets and delete its push records."""
        commands: list[tuple[Any, ...]] = []
        for shard in range(self.shards):  # in one round trip (one a master on a cluster)
            commands += [("ZREM", self._owners[shard], self.owner),
                         ("DEL", self._push_records[shard])]
        self._execute(commands)
        self.link.close()

    def detach(self) -> None:
        """Drop the connection silently (on an error: leases come back after the timeout)."""
        self.link.close()

    def clear(self, report_ttl: float = 0) -> None:
        """Delete the whole queue, on every filter shard (see :func:`clear`)."""
        clear(self.link, self.tag, self.filter_shards, report_ttl)


def pop_number(field: str) -> int:
    """The pop number in a lease's field, ``"<owner>:<pop>.<j>"``."""
    return int(field.rsplit(":", 1)[1].split(".", 1)[0])


def join(client: Redis | RedisCluster, tag: str, member: str) -> None:
    """Count ``member`` (a scrapy-redis worker: no heartbeat) live until it leaves, or a day."""
    client.zadd(keys.owners(tag, 0), {member: time.time() * 1000 + JOINED_MS})


def leave(client: Redis | RedisCluster, tag: str, member: str, lease_timeout_ms: int) -> bool:
    """``member`` leaves; True when no other live worker is left (:meth:`PriorityQueue.leave`)."""
    script = client.register_script(PriorityQueue.LEAVE_SCRIPT)
    return bool(script(keys=[keys.owners(tag, 0)], args=[member, lease_timeout_ms]))


def clear(target: Redis | RedisCluster | Link, tag: str, shards: int, ttl: float = 0) -> None:
    """Delete the queue tagged ``tag`` (either layout) on ``shards`` shards, through
    ``target``'s link; with ``ttl``, the failed requests (the report) expire instead."""
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
    """(waiting, leased) of each shard of the queue tagged ``tag``, in one round trip."""
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
