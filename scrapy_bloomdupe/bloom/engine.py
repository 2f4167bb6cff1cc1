"""What the engine-neutral front (:mod:`.filter`) asks of an engine.

An engine holds a filter's bits and runs its check-and-add script: :mod:`.lua`
(``BITFIELD`` on plain strings) and :mod:`.native` (RedisBloom's ``BF.*``).
Both build the script from the same parts (the op log's replay and record,
:mod:`.oplog`; the lock's fence, :mod:`.lock`; an optional sink) around their
own body, whose reply is one character an item (``'1'`` new, ``'0'`` seen,
``'F'`` refused by a full shard) or ``LOCK_BUSY`` / ``STALE_GENERATION``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from .. import keys
from ..transport.diagnose import acl_guard
from . import lock, oplog

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster
    from redis.commands.core import Script

    from .. import sizing
    from .info import ShardInfo


class Sink(Protocol):
    """Where a check-and-add also puts the items it found new, in the same script.

    ``SINK_LUA`` runs after the engine's body, with the Lua locals ``out``
    (``'1'`` for each new item, in order), ``sink_at`` (the index in ``ARGV`` of
    the first item's sink arguments, :data:`SINK_ARGS` of them an item) and
    ``sink_key``; ``sink_key(shard)`` names that key for a shard (it must carry
    the shard's hash tag). The frontier's queue is one.
    """

    SINK_LUA: str
    #: The one command ``SINK_LUA`` writes with (on ``sink_key``), lower case.
    SINK_COMMAND: str

    def sink_key(self, shard: int) -> str: ...


#: Sink arguments per item.
SINK_ARGS = 2


class Engine(Protocol):
    """One filter's shards in every generation, and the script that checks and adds."""

    def __init__(self, client: Redis | RedisCluster, key: str, shards: int,
                 client_id: str) -> None: ...

    def set_generations(self, generations: list[sizing.Sizing]) -> None:
        """Use these generations (oldest first) from now on."""

    def shard_key(self, index: int, generation: int = 0) -> str:
        """The key that holds shard ``index``'s bits in ``generation``."""

    def item_args(self, shard: int, h1: int, h2: int) -> Sequence[Any]:
        """An item's arguments in a call, from its seeded hash halves."""

    def check_add_command(self, shard: int, token: bytes, call: int, ack: int,
                          args: Sequence[Any], items: int, sink: Sink | None = None,
                          sink_args: Sequence[Any] = ()) -> tuple[Any, ...]:
        """The ``EVALSHA`` of one call, for a round trip."""

    def check_add(self, shard: int, token: bytes, call: int, ack: int,
                  args: Sequence[Any], items: int) -> Any:
        """One call on its own."""

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


#: The start of both engines' ``BODY``: ``G`` (ARGV[5]) generations' keys are
#: KEYS[4..3+G]. Returns -3 (SHARD_MISSING) when one of them is gone (flushed,
#: evicted, deleted: never re-created empty) and -2 (STALE_GENERATION) when the
#: shard already has more than G generations, both having written nothing; else
#: records G in the shard's generation marker (KEYS[2]) when it is new there.
GENERATIONS = """\
local G = tonumber(ARGV[5])
if redis.call('EXISTS', unpack(KEYS, 4, 3 + G)) < G then
  if token ~= '' then redis.call('DEL', KEYS[3]) end
  return -3
end
local stored = tonumber(redis.call('GET', KEYS[2]) or '1')
if stored > G then
  if token ~= '' then redis.call('DEL', KEYS[3]) end
  return -2
elseif stored < G then
  redis.call('SET', KEYS[2], G)
end
"""


class ScriptedEngine:
    """What both engines share: the check-and-add script (``CHECK_ADD_SCRIPT``: the op
    log's replay, the lock's fence, the engine's ``BODY``, the op log's record), its
    variants with a sink, and the ``EVALSHA`` that calls it. An engine gives
    ``BODY``, ``CHECK_ADD_SCRIPT``, :meth:`_script_keys` and, in ``_gen_args``, the
    arguments about its generations that every call carries."""

    BODY: ClassVar[str]
    CHECK_ADD_SCRIPT: ClassVar[str]

    def __init__(self, client: Redis | RedisCluster, key: str, shards: int,
                 client_id: str) -> None:
        self.client = client
        self.key = key
        self.shards = shards
        self.script = client.register_script(self.CHECK_ADD_SCRIPT)
        self.sha = self.script.sha
        self._sink_scripts: dict[str, Script] = {}
        self._fixed_keys = [
            (keys.op_log(key, i, client_id), keys.generation_marker(key, i), keys.lock(key, i))
            for i in range(shards)
        ]
        self.generations: list[sizing.Sizing] = []
        self._gen_args: list[Any] = []

    def _script_keys(self, shard: int) -> list[str]:
        """KEYS of a call on ``shard``: the fixed three, then its keys per generation."""
        raise NotImplementedError

    def _sink_script(self, sink: Sink) -> Script:
        script = self._sink_scripts.get(sink.SINK_LUA)
        if script is None:
            # An ACL that lost the sink's command mid-crawl is refused before the first
            # write, never between the engine's write and the push.
            guard = acl_guard(sink.SINK_COMMAND, "KEYS[#KEYS]", "0", "0")
            text = (oplog.REPLAY + lock.FENCE + guard + self.BODY + sink.SINK_LUA
                    + oplog.RECORD)
            script = self._sink_scripts[sink.SINK_LUA] = self.client.register_script(text)
        return script

    def check_add_command(self, shard: int, token: bytes, call: int, ack: int,
                          args: Sequence[Any], items: int, sink: Sink | None = None,
                          sink_args: Sequence[Any] = ()) -> tuple[Any, ...]:
        """The ``EVALSHA`` of one call of ``items`` items, for a round trip."""
        script_keys = self._script_keys(shard)
        sha = self.sha
        if sink is not None:
            script_keys.append(sink.sink_key(shard))
            sha = self._sink_script(sink).sha
        return ("EVALSHA", sha, len(script_keys), *script_keys, token, call, ack,
                oplog.OP_LOG_TTL_MS, *self._gen_args, items, *args, *sink_args)

    def check_add(self, shard: int, token: bytes, call: int, ack: int,
                  args: Sequence[Any], items: int) -> Any:
        """One call on its own (loading the script if Redis lacks it)."""
        return self.script(keys=self._script_keys(shard),
                           args=[token, call, ack, oplog.OP_LOG_TTL_MS, *self._gen_args,
                                 items, *args])

    def load_script(self) -> None:
        for script in self.scripts():
            self.client.script_load(script)

    def scripts(self) -> list[str | bytes | memoryview]:
        """The check-and-add script and its sinks' (as :meth:`load_script` loads them)."""
        return [self.CHECK_ADD_SCRIPT, *(s.script for s in self._sink_scripts.values())]
