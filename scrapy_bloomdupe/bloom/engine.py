"""What the engine-neutral front (:mod:`.filter`) asks of an engine: :mod:`.lua` (``BITFIELD``)
or :mod:`.native` (RedisBloom's ``BF.*``). Both check-and-add scripts share their first KEYS and
ARGV and their steps around their own body (op log, :mod:`.oplog`; lock fence, :mod:`.lock`;
generation check; ``bloomdupe forget``'s items; an optional sink). Reply: one character an item
(``'1'`` new, ``'0'`` seen, ``'F'`` full shard) or ``LOCK_BUSY`` / ``STALE_GENERATION`` /
``SHARD_MISSING``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from .. import keys
from . import oplog
from .info import GenerationInfo

if TYPE_CHECKING:
    from .. import sizing
    from ..transport.link import Link
    from .info import FilterInfo, ShardInfo


class Sink(Protocol):
    """The crawl's queue, where a check-and-add script queues the items it found new
    (``frontier/sink.lua``). A section of ``shard`` carries :meth:`sink_keys` (same hash tag
    as the shard), :meth:`sink_prefix` and each item's :meth:`sink_item`."""

    def sink_keys(self, shard: int) -> Sequence[str]:
        """The five keys of the queue shard that filter shard ``shard`` 's items go to."""

    def sink_prefix(self, shard: int) -> str:
        """What that queue shard's download slots' keys start with."""

    def sink_item(self, shard: int, entry: Any) -> Sequence[Any]:
        """An item's five sink arguments from its ``add_many`` ``entry``, on shard ``shard``."""


@runtime_checkable
class RidingSink(Sink, Protocol):
    """A sink whose waiting commands (the queue's acks) may ride a check-and-add's round trip."""

    def riders(self, reached: Callable[[tuple[Any, ...]], bool]
               ) -> tuple[list[tuple[Any, ...]], int | None]:
        """Waiting commands that ``reached`` says cost no extra round trip, and their Sentinel
        epoch (None: any); rebuilt on :class:`~..transport.sentinel.MasterChanged`."""

    def riders_sent(self) -> None:
        """The last :meth:`riders` went through: they are not sent again."""

    def rider_scripts(self) -> tuple[str, ...]:
        """Every script a rider may run, for reloading where Redis lost it."""


@dataclass
class Section:
    """One shard's items in a call: arguments, sink arguments, places in the batch."""

    shard: int
    args: list[Any] = field(default_factory=list)
    sink_args: list[Any] = field(default_factory=list)
    indexes: list[int] = field(default_factory=list)


class Engine(Protocol):
    """One filter's shards in every generation, and the script that checks and adds."""

    def __init__(self, link: Link, key: str, shards: int, client_id: str) -> None: ...

    def set_generations(self, generations: list[sizing.Sizing]) -> None:
        """Use these generations (oldest first) from now on."""

    def shard_key(self, index: int, generation: int = 0) -> str:
        """The key that holds shard ``index``'s bits in ``generation``."""

    def item_args(self, shard: int, h1: int, h2: int) -> Sequence[Any]:
        """An item's arguments in a call, from its seeded hash halves."""

    #: Whether one call may carry the items of several shards (:class:`Section`).
    sections: bool

    def group_of(self, shard: int) -> Any:
        """The batch's call for ``shard``'s items: the shard, or (:attr:`sections`) a master."""

    def check_add_command(self, token: bytes, call: int, ack: int,
                          sections: Sequence[Section], sink: Sink | None = None
                          ) -> tuple[Any, ...]:
        """The ``EVALSHA`` of one call: one section, or several if :attr:`sections`."""

    def run(self, command: tuple[Any, ...]) -> Any:
        """One :meth:`check_add_command` on its own (loading the script if Redis lacks it)."""

    def load_script(self) -> None:
        """Load the scripts into Redis (after a restart flushed them)."""

    def scripts(self) -> list[str | bytes | memoryview]:
        """The scripts :meth:`load_script` loads (for loading on a given connection)."""

    def create_shards(self, generation: int, plan: sizing.Sizing, *,
                      existing: bool = False) -> None:
        """Create the missing shards of ``generation``; refuse ones of another size, and
        with ``existing`` (the filter is ready) any missing one (:class:`FilterLostError`)."""

    def shard_names(self) -> list[str]:
        """Every key of the shards, for deleting the filter."""

    def newest_items(self) -> float:
        """Items in the newest generation (estimated or counted)."""

    def contains_many(self, halves: Sequence[tuple[int, int]]) -> list[bool]:
        """Whether each item is in some generation; writes nothing."""

    def shard_infos(self) -> list[list[ShardInfo]]:
        """Per generation, each shard's figures."""

    # -- what a recrawl window (bloom/window.py) does its own way --------------------

    def start(self) -> None:
        """Before a read-only filter's first read: set a window's slice clock from Redis."""

    def generation_infos(self) -> list[GenerationInfo]:
        """Each generation's figures, oldest first (a window's: every slice's)."""

    def missing(self, shards: Sequence[int]) -> str:
        """What a call on ``shards`` found gone (SHARD_MISSING), for the error."""

    def lost_keys(self) -> list[str]:
        """The filter's keys that should be in Redis and are not. Reads only."""

    def figures(self, info: FilterInfo) -> dict[str, float]:
        """A window's figures from the filter's :class:`~.info.FilterInfo`; {} without."""

    def deadline(self, shard: int, new: bool) -> int:
        """A window's: until when (Redis ms) an item just answered stays in a live slice."""

    def grew(self, shard: int) -> None:
        """A window's: a call answered that it made the current slice's next generation."""

    def adopt(self, shard: int, reply: Sequence[Any]) -> None:
        """A window's: a call answered STALE_SLICE (Redis's current slice, its time)."""


class ScriptedEngine:
    """Both engines' ``EVALSHA`` of their ``CHECK_ADD_SCRIPT``. An engine gives the script,
    :meth:`_script_keys` and ``_gen_args`` (its generations' arguments, in every call)."""

    CHECK_ADD_SCRIPT: ClassVar[str]
    #: One shard a call: its script's KEYS are those of one shard.
    sections = False

    def __init__(self, link: Link, key: str, shards: int, client_id: str) -> None:
        #: Carries the engine's commands during a crawl (the filter's link).
        self.link = link
        self.client = client = link.client
        self.key = key
        self.shards = shards
        self.script = client.register_script(self.CHECK_ADD_SCRIPT)
        self.sha = self.script.sha
        self._fixed_keys = [
            (keys.op_log(key, i, client_id), keys.generation_marker(key, i), keys.lock(key, i),
             keys.forgotten(key, i))
            for i in range(shards)
        ]
        self.generations: list[sizing.Sizing] = []
        self._gen_args: list[Any] = []

    def _script_keys(self, shard: int) -> list[str]:
        """KEYS of a call on ``shard``: the fixed four, then its keys per generation."""
        raise NotImplementedError

    def check_add_command(self, token: bytes, call: int, ack: int,
                          sections: Sequence[Section], sink: Sink | None = None
                          ) -> tuple[Any, ...]:
        """The ``EVALSHA`` of one call (of one section), for a round trip."""
        (section,) = sections
        shard = section.shard
        script_keys = self._script_keys(shard)
        head: list[Any] = []
        if sink is not None:
            script_keys.extend(sink.sink_keys(shard))
            head.append(sink.sink_prefix(shard))
        return ("EVALSHA", self.sha, len(script_keys), *script_keys,
                *self._args(shard, token, call, ack, len(section.indexes)), *section.args,
                *head, *section.sink_args)

    def run(self, command: tuple[Any, ...]) -> Any:
        """One :meth:`check_add_command` on its own (loading the script if Redis lacks it)."""
        return self.link.call(*command)  # the link loads the script again if Redis lost it

    def _args(self, shard: int, token: bytes, call: int, ack: int, items: int) -> list[Any]:
        """A call's ARGV before its items: the op log's, the generations', the count."""
        return [token, call, ack, oplog.OP_LOG_TTL_MS, *self._gen_args, items]

    def load_script(self) -> None:
        for script in self.scripts():
            self.client.script_load(script)

    def scripts(self) -> list[str | bytes | memoryview]:
        """The check-and-add script (as :meth:`load_script` loads it)."""
        return [self.script.script]

    def group_of(self, shard: int) -> Any:
        """Which script call of a batch the items of ``shard`` go in: one a shard."""
        return shard

    # -- without a window (bloom/window.py overrides these) ----------------------------

    def shard_key(self, index: int, generation: int = 0) -> str:
        raise NotImplementedError

    def shard_infos(self) -> list[list[ShardInfo]]:
        raise NotImplementedError

    def start(self) -> None:
        """Nothing to set up without a window."""

    def generation_infos(self) -> list[GenerationInfo]:
        return [GenerationInfo(g, plan, shards) for g, (plan, shards) in
                enumerate(zip(self.generations, self.shard_infos(), strict=True))]

    def missing(self, shards: Sequence[int]) -> str:
        names = [self.shard_key(shard, g) for shard in shards
                 for g in range(len(self.generations))]
        if len(shards) > 1:  # a call of several shards: name one gone, count the others
            there = self.link.calls([("EXISTS", name) for name in names])
            gone = [name for name, n in zip(names, there, strict=True) if not n] or names
            more = f" (and {len(gone) - 1} more of its keys)" if len(gone) > 1 else ""
            return f"{gone[0]} is gone{more}"
        return " or ".join(names) + " is gone"

    def lost_keys(self) -> list[str]:
        names = [self.shard_key(i, g) for g in range(len(self.generations))
                 for i in range(self.shards)]
        there = self.link.calls([("EXISTS", name) for name in names])
        return [name for name, n in zip(names, there, strict=True) if not n]

    def figures(self, info: FilterInfo) -> dict[str, float]:
        return {}

    def deadline(self, shard: int, new: bool) -> int:
        raise NotImplementedError("a window's: items are cached for good without one")

    def grew(self, shard: int) -> None:
        raise NotImplementedError("a window's: only its time slices grow in the script")

    def adopt(self, shard: int, reply: Sequence[Any]) -> None:
        raise NotImplementedError("a window's: only it has time slices")
