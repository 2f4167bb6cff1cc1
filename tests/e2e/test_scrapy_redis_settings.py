"""scrapy-redis settings, used as a scrapy-redis user uses them: real ``scrapy crawl``
workers of the example project on the demo site, real Redis (issue 15).

Each test runs what a user ran and checks, from the site's own fetch counts,
that every page was fetched exactly once, and from the workers' logs that no
error was logged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import demo_site, run_workers, take_fetches

PAGES = 200


@pytest.fixture
def site() -> Iterator[Any]:
    with demo_site(PAGES) as server:
        yield server


def assert_clean(results: list[tuple[int, str]]) -> None:
    """Every worker exited 0, finished, and logged no error."""
    for code, log in results:
        assert code == 0, log[-3000:]
        assert "Spider closed (finished)" in log, log[-3000:]
        for bad in ("Traceback", "] ERROR:", "] CRITICAL:"):
            assert bad not in log, log[-3000:]


@pytest.mark.slow
def test_settings_given_on_the_command_line_as_scrapy_reads_them(
        durable_redis: str, site: Any, tmp_path: Path) -> None:
    """``-s 'REDIS_PARAMS={"socket_timeout": 30}'`` (scrapy-redis reads it with
    ``getdict()``), ``-s BLOOMDUPE_CAPACITY=1e7``, ``-s BLOOMDUPE_SHARDS=None``."""
    results = run_workers(durable_redis, site.url, tmp_path, 2,
                          "REDIS_PARAMS=" + json.dumps({"socket_timeout": 30}),
                          "BLOOMDUPE_CAPACITY=1e7", "BLOOMDUPE_SHARDS=None")
    assert_clean(results)
    assert all("capacity 10000000 at error rate" in log for _, log in results)
    assert take_fetches(site) == [1] * PAGES


@pytest.mark.slow
def test_a_blocking_queue_with_idle_before_close_longer_than_the_socket_timeout(
        durable_redis: str, site: Any, tmp_path: Path) -> None:
    """scrapy-redis's ``FifoQueue`` pops with ``BRPOP`` for ``SCHEDULER_IDLE_BEFORE_CLOSE``
    seconds; 10 s is the client's default socket timeout. The workers crawl, wait 10 s
    for more work once the queue is empty (as scrapy-redis's would), and close."""
    results = run_workers(durable_redis, site.url, tmp_path, 2,
                          "SCHEDULER_QUEUE_CLASS=scrapy_redis.queue.FifoQueue",
                          "SCHEDULER_IDLE_BEFORE_CLOSE=10", "BLOOMDUPE_DONE_GRACE=1",
                          timeout=60)
    assert_clean(results)
    for _, log in results:
        assert "is unavailable" not in log
        assert "The crawl is done" in log
        waited = float(log.split("no worker holds a lease (for ")[1].split("s,")[0])
        assert 10 <= waited < 12, log[-2000:]
    assert take_fetches(site) == [1] * PAGES
