"""A crawl's Redis work on an asyncio loop (``transport/onloop.py``): a job's round trips
and pauses are awaited on the loop while other tasks run; one node's round trips on
``redis.asyncio``, and a link that awaits them inside a job of ``run_bridged``, against a
real Redis."""

from __future__ import annotations

import asyncio

import pytest
import redis
from redis.exceptions import ResponseError

from scrapy_bloomdupe.transport.link import Link
from scrapy_bloomdupe.transport.onloop import AsyncNode, await_only, bridged, pause, run_bridged


async def doubled(x: int) -> int:
    await asyncio.sleep(0.01)
    return 2 * x


async def refused() -> None:
    await asyncio.sleep(0)
    raise KeyError("refused")


def test_a_job_awaits_on_the_loop_and_gets_answers_and_errors_where_it_waits() -> None:
    def job() -> tuple[int, str]:
        assert bridged()
        answer = await_only(doubled(21))
        try:
            await_only(refused())
        except KeyError:
            return answer, "caught where it waited"
        raise AssertionError("not raised")

    assert asyncio.run(run_bridged(job)) == (42, "caught where it waited")
    assert not bridged()


def test_an_error_of_the_job_reaches_its_starter() -> None:
    def job() -> None:
        await_only(doubled(1))
        raise ValueError("the job's own")

    with pytest.raises(ValueError, match="the job's own"):
        asyncio.run(run_bridged(job))


def test_pauses_and_round_trips_let_the_loop_run_other_tasks() -> None:
    ticks: list[int] = []

    async def ticker() -> None:
        for i in range(5):
            ticks.append(i)
            await asyncio.sleep(0.01)

    def job() -> int:
        pause(0.1)  # asyncio.sleep inside a job: the ticker runs meanwhile
        return len(ticks)

    async def both() -> int:
        task = asyncio.ensure_future(ticker())
        seen = await run_bridged(job)
        await task
        return seen

    assert asyncio.run(both()) == 5


def test_jobs_interleave_on_one_loop() -> None:
    order: list[str] = []

    def job(name: str) -> str:
        order.append(f"{name} starts")
        await_only(asyncio.sleep(0.01))
        order.append(f"{name} ends")
        return name

    async def two() -> list[str]:
        return list(await asyncio.gather(run_bridged(lambda: job("a")),
                                         run_bridged(lambda: job("b"))))

    assert asyncio.run(two()) == ["a", "b"]
    assert order == ["a starts", "b starts", "a ends", "b ends"]


def test_outside_a_job_await_only_refuses_and_pause_sleeps() -> None:
    with pytest.raises(RuntimeError, match="outside a job"):
        await_only(doubled(1))
    pause(0.001)  # time.sleep


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
