"""Blocking code on an asyncio loop (``transport/greenio.py``): a job's round trips and
pauses are awaited on the loop while other tasks run."""

from __future__ import annotations

import asyncio

import pytest

from scrapy_bloomdupe.transport.greenio import await_only, bridged, pause, run_bridged


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
