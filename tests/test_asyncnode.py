"""One node's round trips on ``redis.asyncio`` (``transport/asyncnode.py``), and a link
that awaits them inside a job of ``greenio.run_bridged``, against a real Redis."""

from __future__ import annotations

import asyncio

import pytest
import redis
from redis.exceptions import ResponseError

from scrapy_bloomdupe.transport.asyncnode import AsyncNode
from scrapy_bloomdupe.transport.greenio import run_bridged
from scrapy_bloomdupe.transport.link import Link


def test_a_round_trip_returns_error_replies_and_reconnects_after_a_drop(
        client: redis.Redis) -> None:
    node = AsyncNode.of(client.connection_pool)
    assert node is not None

    async def trips() -> tuple[list[object], list[object]]:
        first = await node.round_trip([("SET", "k", "v"), ("INCR", "k"), ("GET", "k")])
        client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        with pytest.raises(redis.ConnectionError):
            await node.round_trip([("GET", "k")])
        again = await node.round_trip([("GET", "k")])  # on a new connection
        node.close()
        return first, again

    first, again = asyncio.run(trips())
    assert first[0] == b"OK" and first[2] == b"v"  # raw replies (Link.calls parses them)
    assert isinstance(first[1], ResponseError)
    assert again == [b"v"]


def test_only_redis_pys_own_connection_classes_have_a_twin(redis_url: str) -> None:
    class Mine(redis.Connection):
        pass

    pool = redis.ConnectionPool.from_url(redis_url, connection_class=Mine)
    assert AsyncNode.of(pool) is None
    assert AsyncNode.of(redis.ConnectionPool.from_url(redis_url)) is not None


def test_a_link_in_a_job_awaits_its_round_trips_without_blocking_the_loop(
        client: redis.Redis) -> None:
    """Redis holding every client's commands for 0.3 s (CLIENT PAUSE): a round trip of the
    link inside a job waits for it on the loop, and another task runs meanwhile."""
    link = Link(client)
    assert link.asynchronous

    async def crawl() -> tuple[object, int]:
        ticks = 0
        client.execute_command("CLIENT", "PAUSE", 300)

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticking = asyncio.ensure_future(ticker())
        answer = await run_bridged(lambda: link.call("PING"))
        seen = ticks
        ticking.cancel()
        link.close()
        return answer, seen

    answer, ticks = asyncio.run(crawl())
    assert answer is True
    assert ticks >= 10, "the loop ran while the round trip waited for Redis"
