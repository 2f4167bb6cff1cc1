"""scrapy-redis settings, used as a scrapy-redis user uses them: real ``scrapy crawl``
workers of the example project on the demo site, real Redis (issue 15).

Each test runs what a user ran and checks, from the site's own fetch counts,
that every page was fetched exactly once, and from the workers' logs that no
error was logged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
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


PERSIST_SPIDER = '''
import os

import scrapy


class PersistSpider(scrapy.Spider):
    """Keeps the crawl's state by setting ``persist`` on its scheduler, as some
    scrapy-redis projects do (SCHEDULER_PERSIST itself is off)."""

    name = "persist"

    async def start(self):
        if os.environ.get("KEEP") == "1":
            self.crawler.engine._slot.scheduler.persist = True
        yield scrapy.Request(self.settings["DEMO_SITE_URL"])

    def parse(self, response):
        yield from response.follow_all(css="a")
'''


@pytest.mark.slow
def test_persist_set_on_the_scheduler_instance_keeps_the_filter(
        durable_redis: str, site: Any, tmp_path: Path) -> None:
    spider = tmp_path / "persist.py"
    spider.write_text(PERSIST_SPIDER)
    client = redis.Redis.from_url(durable_redis)

    def crawl(keep: bool, name: str) -> None:
        env = {**os.environ, "KEEP": "1" if keep else "0"}
        env.pop("PYTHONPATH", None)
        result = subprocess.run(
            [sys.executable, "-m", "scrapy", "runspider", str(spider),
             "-s", f"LOG_FILE={tmp_path / name}", "-s", f"DEMO_SITE_URL={site.url}",
             "-s", f"REDIS_URL={durable_redis}", "-s", "SCHEDULER_PERSIST=False",
             "-s", "SCHEDULER=scrapy_bloomdupe.scheduler.Scheduler",
             "-s", "BLOOMDUPE_CAPACITY=10000", "-s", "BLOOMDUPE_DONE_GRACE=0.5",
             "-s", "TELNETCONSOLE_ENABLED=False"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
        assert_clean([(result.returncode, (tmp_path / name).read_text())])

    crawl(True, "first.log")
    assert take_fetches(site) == [1] * PAGES
    # Kept: the filter, and this worker's line in the crawl-wide stats.
    assert client.exists("persist:bloomdupe:meta", "{persist:bloomdupe:0}:bits") == 2
    assert client.hlen("persist:bloomdupe:workers") == 1
    # So a second run finds every page seen: nothing is fetched again.
    crawl(False, "second.log")
    assert take_fetches(site) == [0] * PAGES
    assert client.exists("persist:bloomdupe:meta") == 0  # not kept this time: cleared
    client.close()
