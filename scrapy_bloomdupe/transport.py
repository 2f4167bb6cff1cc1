"""Send a batch of commands in one round trip, cheaply, with redis-py's retry.

redis-py's ``Pipeline.execute`` costs more per call than the Redis work of a
check-and-add (measured: about 170 us of Python a call, against 60 us for the
same bytes on a held connection). The filter sends one small batch for every
request Scrapy schedules, so it holds one connection from the client's pool
and writes the batch with the connection's own ``pack_commands``, reading one
reply per command. Retries use the connection's ``Retry`` object (the one the
client was configured with), reconnecting between attempts: every batch this
package sends is safe to send twice.

A cluster client has no single connection; there the batch goes through
redis-py's cluster pipeline, which routes each command to its slot's node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster
    from redis.connection import AbstractConnection


class Link:
    """One round trip per :meth:`execute`; error replies come back as exceptions."""

    def __init__(self, client: Redis | RedisCluster) -> None:
        self.client = client
        self._pool = getattr(client, "connection_pool", None)
        self._conn: AbstractConnection | None = None

    def execute(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        if self._pool is None:
            pipe = self.client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            return pipe.execute(raise_on_error=False)
        conn = self._connection()
        return conn.retry.call_with_retry(
            lambda: self._attempt(conn, commands), lambda _error: conn.disconnect()
        )

    def _connection(self) -> AbstractConnection:
        if self._conn is None:
            assert self._pool is not None
            self._conn = self._pool.get_connection()
        return self._conn

    @staticmethod
    def _attempt(conn: AbstractConnection, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        conn.send_packed_command(conn.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except ResponseError as e:
                replies.append(e)
        return replies

    def close(self) -> None:
        if self._conn is not None and self._pool is not None:
            self._pool.release(self._conn)
            self._conn = None
