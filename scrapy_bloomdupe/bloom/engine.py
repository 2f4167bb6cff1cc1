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
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

    from .. import sizing
    from .info import ShardInfo
    from .lua import Sink


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
