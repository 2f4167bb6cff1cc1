"""A check-and-add batch's script calls: grouped, sent in one round trip with the shard locks,
replies sorted out (:class:`Calls`, mixed into :class:`~.filter.BloomFilter`).

Items go in one call per shard, or per node on engines whose calls carry several shards (Lua's
sections), at most :data:`MAX_ITEMS_PER_SCRIPT` a call, each with an op id so a retry after a
lost reply is answered from the op log (:mod:`.oplog`). One round trip takes each shard's lock
(``SET NX PX``, :mod:`.lock`) and runs the calls. Redone: a call or section whose lock was busy,
after a pause; one refused for a stale generation or slice, with the new ones; a full shard's,
after growth; one a cluster master refused for a moved slot (nothing written), a call a shard.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from redis.exceptions import ResponseError

from .. import hashing
from ..exceptions import BloomDupeError
from ..transport.outage import TRANSIENT
from .engine import RidingSink, Section
from .lua import LOCK_BUSY, SHARD_MISSING, STALE_GENERATION

if TYPE_CHECKING:
    from ..exceptions import FilterLostError
    from ..sizing import Sizing
    from ..transport.link import Link
    from ..transport.outage import OutageGuard
    from .engine import Engine, Sink
    from .lock import LockCounters, ShardLocks

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Most items in one script call: about 1 ms of Redis time (a script blocks every client).
MAX_ITEMS_PER_SCRIPT = 256
#: Round trips in a row whose every call was told STALE_SLICE before one is a fault.
MAX_STALE_ROUNDS = 20
#: Per-item reply of an engine whose newest generation's shard refused the item (full).
_FULL = 70  # ord("F")
#: A window's slice grew in the call, which did not look at the item: asked again.
_GROWN = 71  # ord("G")
#: A multi-shard call lacked this item's shard lock: not looked at, asked again after a pause.
_BUSY = 66  # ord("B")
#: A call's reply: its master no longer holds one of its shards (see _not_local).
_NOT_LOCAL = object()


@dataclass
class _Unit:
    """One script call of a batch: one shard's items (or several shards' sections), its token."""

    token: bytes
    call: int
    sections: dict[int, Section]

    @property
    def shard(self) -> int:
        """The first section's shard (whose op log the call uses)."""
        return next(iter(self.sections))

    @property
    def indexes(self) -> list[int]:
        """The items' places in the batch, in the order of the call's reply."""
        return [i for section in self.sections.values() for i in section.indexes]


@dataclass
class _LockState:
    """Whether a batch still takes shard locks, and the pauses it may still wait."""

    use_lock: bool
    pauses: Iterator[float] | None


class CallCounters(Protocol):
    """What the calls count (in the filter's counters)."""

    checked: int
    new: int
    duplicates: int
    script_reloads: int
    stale_generation: int
    stale_slice: int
    full: int
    slice_growths: int
    regrouped: int
    lock: LockCounters


class Calls:
    """The script calls of a check-and-add (see the module's docstring)."""

    if TYPE_CHECKING:
        key: str
        sizing: Sizing
        seed: int
        use_lock: bool
        generations: list[Sizing]
        engine: Engine
        locks: ShardLocks
        counters: CallCounters
        outage: OutageGuard | None
        link: Link
        _lock_keys: list[str]
        _next_op: int

        def _reload(self) -> None: ...

        def _lost(self, what: str) -> FilterLostError: ...

        def _grow_for_full(self, used: int) -> None: ...

    def _check_add(self, halves: Mapping[int, tuple[int, int]], indexes: Sequence[int],
                   op: int, ack: int, results: list[bool], lock_state: _LockState,
                   sink: Sink | None, entry: Callable[[int, int], Sequence[Any]] | None) -> None:
        """Check-and-add the items at ``indexes``, writing their answers into ``results``:
        a round trip per lock wait, redone for items a new generation refused."""
        remaining = indexes
        stale_rounds = 0
        while remaining:
            generations = len(self.generations)
            pending = self._group(halves, remaining, op, entry)
            refused: list[int] = []
            full: list[int] = []
            stale: list[int] = []
            regrow: list[int] = []
            while pending:
                replies = self._round_trip(pending, ack, lock_state.use_lock, sink)
                busy = []
                busy_items: list[int] = []
                moved: list[int] = []
                #: The locks a refused call took stay with its items (its token).
                moved_tokens: dict[int, bytes] = {}
                for unit, reply in zip(pending, replies, strict=True):
                    if reply is _NOT_LOCAL:
                        moved.extend(unit.indexes)
                        moved_tokens.update(dict.fromkeys(unit.sections, unit.token))
                    elif reply == LOCK_BUSY:
                        busy.append(unit)
                    elif reply == STALE_GENERATION:
                        refused.extend(unit.indexes)
                    elif reply == SHARD_MISSING:
                        raise self._lost(self.engine.missing(list(unit.sections)))
                    elif isinstance(reply, list):  # STALE_SLICE: Redis's slice and time
                        self._adopt_slice(unit.shard, reply)
                        stale.extend(unit.indexes)
                    else:
                        grown = False
                        for index, flag in zip(unit.indexes, reply, strict=True):
                            if flag == _FULL:
                                full.append(index)
                            elif flag == _GROWN:
                                grown = True
                                regrow.append(index)
                            elif flag == _BUSY:
                                busy_items.append(index)
                            else:
                                results[index] = flag == 49  # ord("1")
                        if grown:
                            self.engine.grew(unit.shard)
                waited_for = bool(busy or busy_items)  # locks held by others: pause
                if busy_items or moved:
                    # A multi-shard call went ahead on shards whose lock it held (reply in the
                    # op log): the rest go again as new calls; a moved slot's call (nothing
                    # written) goes again a call a shard, routes reloaded.
                    first = self._next_op
                    self._next_op += max(busy_items + moved) + 1
                    busy.extend(self._group(halves, busy_items, first, entry))
                    if moved:
                        self.counters.regrouped += 1
                        self.link.refresh_routes()
                        busy.extend(self._group(halves, moved, first, entry,
                                                tokens=moved_tokens))
                    ack = first
                pending = busy
                pauses = lock_state.pauses
                if waited_for and pauses is not None and next(pauses, None) is None:
                    logger.warning(
                        "Shard lock(s) %s stayed busy for BLOOMDUPE_LOCK_WAIT=%ss; checking "
                        "without the lock (the check-and-add script is atomic on its own)",
                        sorted({self._lock_keys[u.shard] for u in pending}), self.locks.wait,
                    )
                    lock_state.use_lock = False
            if refused:
                # Another worker added a generation: redo those items with it.
                self.counters.stale_generation += 1
                self._guarded(self._reload)
            if stale:
                # New or grown slice: redo with Redis's view, same op ids (nothing written).
                # Each answer brings that view, so an endless run is a fault, not a race.
                self.counters.stale_slice += 1
                stale_rounds = stale_rounds + 1 if len(stale) == len(remaining) else 0
                if stale_rounds > MAX_STALE_ROUNDS:
                    raise BloomDupeError(
                        f"Bloom filter {self.key}: {stale_rounds} calls in a row were told "
                        "the time slices had changed, with Redis's slices sent each time; "
                        "a worker of another version of scrapy-bloomdupe may share the "
                        "filter. Stop the crawl and check the workers' versions")
                refused.extend(stale)
            if full:
                # Newest shard full: redo in a new generation as new calls (the old ids'
                # op log holds the refusals).
                self.counters.full += 1
                self._grow_for_full(generations)
                refused.extend(full)
            if regrow:
                # A window's slice grew in the call: redo the unlooked items, as after full.
                self.counters.slice_growths += 1
                refused.extend(regrow)
            if full or regrow:
                op = ack = self._next_op
                self._next_op += max(indexes) + 1
            remaining = refused

    def _guarded(self, call: Callable[[], T]) -> T:
        """``call``, waiting out Redis outages when the filter has an outage guard."""
        return call() if self.outage is None else self.outage.call(call)

    def _group(self, halves: Mapping[int, tuple[int, int]], indexes: Sequence[int],
               first_op: int, entry: Callable[[int, int], Sequence[Any]] | None = None, *,
               tokens: Mapping[int, bytes] | None = None) -> list[_Unit]:
        """Script calls for these items under the current generations: per shard (or per
        ``group_of``), at most ``MAX_ITEMS_PER_SCRIPT`` items each; with ``tokens``, a call a
        shard using its lock token. An item's op id is ``first_op`` plus its index, a call's
        its first item's: the same on every retry."""
        shards = self.sizing.shards
        engine = self.engine
        groups: dict[int, Any] = {}
        open_units: dict[Any, _Unit] = {}
        sizes: dict[Any, int] = {}
        units: list[_Unit] = []
        for index in indexes:
            h1, h2 = halves[index]
            shard = hashing.shard_of(h1, shards)
            group = groups.get(shard)
            if group is None:
                group = groups[shard] = shard if tokens is not None else engine.group_of(shard)
            unit = open_units.get(group)
            if unit is None or sizes[group] >= MAX_ITEMS_PER_SCRIPT:
                token = (b"" if not self.use_lock else tokens[shard] if tokens is not None
                         else self.locks.new_token())
                unit = open_units[group] = _Unit(token, first_op + index, {})
                sizes[group] = 0
                units.append(unit)
            section = unit.sections.get(shard)
            if section is None:
                section = unit.sections[shard] = Section(shard)
            section.args.extend(engine.item_args(shard, h1, h2))
            if entry is not None:
                section.sink_args.extend(entry(index, shard))
            section.indexes.append(index)
            sizes[group] += 1
        return units

    def _round_trip(self, units: list[_Unit], ack: int, use_lock: bool,
                    sink: Sink | None = None) -> list[Any]:
        """One round trip: per unit (the shard locks' SET NX PX and) the script; one reply a
        unit. Scripts flushed from Redis (restart, failover) are reloaded and the round trip
        repeated with the same tokens and op ids (idempotent). A sink's waiting commands (the
        queue's acks) ride along where free (on a cluster, to the scripts' masters)."""
        ttl_ms = self.locks.ttl_ms
        engine = self.engine
        commands: list[tuple[Any, ...]] = []
        for unit in units:
            token = unit.token if use_lock else b""
            if use_lock:
                commands.extend(("SET", self._lock_keys[shard], token, "NX", "PX", ttl_ms)
                                for shard in unit.sections)
            commands.append(engine.check_add_command(token, unit.call, ack,
                                                     list(unit.sections.values()), sink))
        checks = len(commands)
        riding = sink if isinstance(sink, RidingSink) else None
        if riding is not None:
            self.link.knows(*riding.rider_scripts())

        def with_riders() -> tuple[list[tuple[Any, ...]], int | None]:
            # Built each attempt: a retry or a new master may leave out acks the last carried.
            assert riding is not None
            riders, built_for = riding.riders(self.link.reaches(commands))
            return [*commands, *riders], built_for

        def send() -> list[Any]:
            if riding is None:
                return _refusals_raised(self.link.execute(commands))
            return _refusals_raised(self.link.execute_bound(with_riders))

        reloads = self.link.script_reloads
        raw = self._guarded(send)  # scripts the server lacked are loaded by the link
        self.counters.script_reloads += self.link.script_reloads - reloads
        raw = [_NOT_LOCAL if _not_local(r) else r for r in raw]
        for r in raw:
            if isinstance(r, Exception):
                raise r
        if riding is not None:
            riding.riders_sent()
            raw = raw[:checks]
        if not use_lock:
            return raw
        counters = self.locks.counters
        replies = []
        at = 0
        for unit in units:
            got = raw[at:at + len(unit.sections)]
            reply = raw[at + len(unit.sections)]
            at += len(unit.sections) + 1
            offset = 0
            for got_lock, section in zip(got, unit.sections.values(), strict=True):
                if got_lock:
                    counters.acquired += 1
                    # Taken by us, then gone before our script ran: it expired.
                    counters.lost += (reply[offset:offset + 1] == b"B"
                                      if isinstance(reply, bytes) else reply == LOCK_BUSY)
                offset += len(section.indexes)
            replies.append(reply)
        return replies

    def _adopt_slice(self, shard: int, reply: list[Any]) -> None:
        """A script answered STALE_SLICE: Redis's current slice on ``shard`` and its time."""
        self.engine.adopt(shard, reply)


def _not_local(reply: Any) -> bool:
    """Whether ``reply`` is a cluster master's refusal for a key of a slot it no longer holds
    (the call reads every key before writing, so it wrote nothing)."""
    return isinstance(reply, ResponseError) and "non local key" in str(reply)


def _refusals_raised(replies: list[Any]) -> list[Any]:
    """``replies``, or the first passing refusal (OOM, READONLY) raised for the outage guard,
    which resends the same commands: safe (op ids), as after a lost connection."""
    for reply in replies:
        if isinstance(reply, TRANSIENT):
            raise reply
    return replies
