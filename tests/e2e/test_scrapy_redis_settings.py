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
