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
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import ROOT, assert_finished_crawl_left, run_workers, take_fetches, wait_workers

PAGES = 200


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
                          timeout=180)
    assert_clean(results)
    for _, log in results:
        assert "is unavailable" not in log
        assert "The crawl is done" in log
        waited = float(log.split("no worker holds a lease (for ")[1].split("s,")[0])
        assert 10 <= waited < 12, log[-2000:]
    assert take_fetches(site) == [1] * PAGES


@pytest.mark.slow
@pytest.mark.parametrize("queue", ["scrapy_redis.queue.FifoQueue",
                                   "scrapy_redis.queue.PriorityQueue"])
def test_a_scrapy_redis_queue_keeps_redis_off_the_reactor(
        durable_redis: str, site: Any, tmp_path: Path, queue: str) -> None:
    """With a scrapy-redis queue class, two workers fetch every page once, and no Redis
    call (nor a wait for the scheduler's lock) ran on the reactor thread during the
    crawl: the checks, pushes, pops and idle looks all ran on the Redis thread
    (``tests/harness/reactor_wait.py``, loaded by the timed dupefilter, times them)."""
    timing = tmp_path / "timing"
    results = run_workers(durable_redis, site.url, tmp_path, 2,
                          f"SCHEDULER_QUEUE_CLASS={queue}", "BLOOMDUPE_DONE_GRACE=1",
                          "DUPEFILTER_CLASS=harness.timed.TimedRedisBloomDupeFilter",
                          f"BENCH_TIMING_DIR={timing}", env={"PYTHONPATH": str(ROOT / "tests")})
    assert_clean(results)
    assert take_fetches(site) == [1] * PAGES
    figures = [json.loads(path.read_text()) for path in timing.glob("*.json")]
    assert len(figures) == 2
    for worker in figures:
        assert worker["requests"] > 0  # the timed filter was the one used
        # The crawl's pops and checks ran on the Redis thread (so it ran, and the
        # harness counted what the reactor did meanwhile as the crawl's)...
        jobs = worker["redis_thread_jobs"]
        assert "fill.<locals>.job" in jobs and "_drain" in jobs, jobs
        # ... and the reactor made no Redis call (nor waited for the scheduler's lock)
        # while it ran: only the crawl's start and end did.
        on_reactor = {name: n for kind in ("reactor_redis", "reactor_locks")
                      for name, n in worker[kind].items() if not name.startswith("start/end")}
        assert on_reactor == {}, on_reactor


@pytest.mark.slow
def test_a_non_asyncio_reactor_takes_the_same_path(durable_redis: str, site: Any,
                                                   tmp_path: Path) -> None:
    """``TWISTED_REACTOR`` set to a reactor without asyncio (epoll): the same path, the
    Redis work on the scheduler's thread and none on the reactor during the crawl;
    two workers fetch every page once."""
    timing = tmp_path / "timing"
    results = run_workers(durable_redis, site.url, tmp_path, 2,
                          "TWISTED_REACTOR=twisted.internet.epollreactor.EPollReactor",
                          "BLOOMDUPE_DONE_GRACE=1",
                          "DUPEFILTER_CLASS=harness.timed.TimedRedisBloomDupeFilter",
                          f"BENCH_TIMING_DIR={timing}", env={"PYTHONPATH": str(ROOT / "tests")})
    assert_clean(results)
    assert all("EPollReactor" in log for _, log in results)
    assert take_fetches(site) == [1] * PAGES
    figures = [json.loads(path.read_text()) for path in timing.glob("*.json")]
    assert len(figures) == 2
    for worker in figures:
        jobs = worker["redis_thread_jobs"]
        assert "fill.<locals>.job" in jobs and "_drain" in jobs, jobs
        on_reactor = {name: n for kind in ("reactor_redis", "reactor_locks")
                      for name, n in worker[kind].items() if not name.startswith("start/end")}
        assert on_reactor == {}, on_reactor


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
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
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


FINGERPRINT_SPIDER = '''
import hashlib
from urllib.parse import parse_qs, urlsplit

import scrapy

from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter


class CategoryDupeFilter(RedisBloomDupeFilter):
    """One page per category: as a scrapy-redis project overrides request_fingerprint()
    (scrapy-splash's dupefilter does) to say which requests are the same."""

    def request_fingerprint(self, request):
        query = parse_qs(urlsplit(request.url).query)
        if "cat" not in query:
            return super().request_fingerprint(request)
        return hashlib.sha1(("cat=" + query["cat"][0]).encode()).hexdigest()


class CategorySpider(scrapy.Spider):
    name = "category"

    async def start(self):
        yield scrapy.Request(self.settings["DEMO_SITE_URL"])

    def parse(self, response):
        yield from response.follow_all(css="a")
'''


@pytest.mark.slow
def test_an_overridden_request_fingerprint_is_honoured(
        durable_redis: str, site: Any, tmp_path: Path) -> None:
    """Two workers with the add-on (the batch middleware checks the links) and a
    dupefilter subclass whose ``request_fingerprint()`` takes every page of a category
    for the same: one page per category is fetched. ``SCHEDULER_DUPEFILTER_KEY`` is
    said, at start, to be replaced by ``BLOOMDUPE_KEY``."""
    (tmp_path / "category.py").write_text(FINGERPRINT_SPIDER)
    settings = ["ADDONS=" + json.dumps({"scrapy_bloomdupe.addon.BloomDupeAddon": 100}),
                "DUPEFILTER_CLASS=category.CategoryDupeFilter", "SCHEDULER_PERSIST=True",
                "SCHEDULER_DUPEFILTER_KEY=%(spider)s:seen",
                f"DEMO_SITE_URL={site.url}", f"REDIS_URL={durable_redis}",
                "BLOOMDUPE_CAPACITY=10000", "BLOOMDUPE_DONE_GRACE=1",
                "TELNETCONSOLE_ENABLED=False"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    processes = [subprocess.Popen(
        [sys.executable, "-m", "scrapy", "runspider", "category.py",
         "-s", f"LOG_FILE={tmp_path / f'worker-{i}.log'}",
         *(a for s in settings for a in ("-s", s))],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for i in range(2)]
    codes = wait_workers(processes, 180)
    results = [(code, (tmp_path / f"worker-{i}.log").read_text())
               for i, code in enumerate(codes)]
    assert_clean(results)
    fetches = take_fetches(site)
    fetched = [page for page, n in enumerate(fetches) if n]
    assert max(fetches) == 1
    # The start page, and one page of each of the 7 categories it leads to.
    assert fetched[0] == 0 and 2 <= len(fetched) <= 8, fetched
    assert len({page % 7 for page in fetched[1:]}) == len(fetched) - 1, fetched
    for _, log in results:
        assert "CategoryDupeFilter.request_fingerprint() (overridden)" in log
        assert "Disabled scrapy_bloomdupe.extension.BloomDupeStats" not in log
        assert ("WARNING: SCHEDULER_DUPEFILTER_KEY ('%(spider)s:seen') is scrapy-redis's and "
                "is not used: BLOOMDUPE_KEY names the Bloom filter's keys (here "
                "'category:bloomdupe')") in log


@pytest.mark.slow
def test_flush_on_start_with_persist_starts_afresh_and_keeps_a_working_filter(
        durable_redis: str, site: Any, tmp_path: Path) -> None:
    """A persisted crawl; then a run with ``SCHEDULER_FLUSH_ON_START`` (and
    ``SCHEDULER_PERSIST``, the demo's): it forgets the old crawl and fetches every page
    again, once; then a run without it finds every page seen. Before, the flushing run
    deleted the filter it had just opened, and every later worker stopped with a
    ``FilterMismatchError``."""
    client = redis.Redis.from_url(durable_redis)
    assert_clean(run_workers(durable_redis, site.url, tmp_path, 2))
    assert take_fetches(site) == [1] * PAGES
    seed = client.hget("site:bloomdupe:meta", "seed")
    # Something left over in the queue is forgotten too.
    client.zadd("{site:bloomdupe:0}:queue", {b"not a request": 0})

    assert_clean(run_workers(durable_redis, site.url, tmp_path, 1,
                             "SCHEDULER_FLUSH_ON_START=True", first=2))
    assert take_fetches(site) == [1] * PAGES
    assert client.hget("site:bloomdupe:meta", "seed") != seed  # a new filter

    results = run_workers(durable_redis, site.url, tmp_path, 2, first=3)
    assert_clean(results)
    assert take_fetches(site) == [0] * PAGES
    client.close()


@pytest.mark.slow
@pytest.mark.parametrize("queue", [None, "scrapy_redis.queue.FifoQueue"])
def test_persist_off_as_in_scrapy_redis_every_worker_finishes(
        durable_redis: str, site: Any, tmp_path: Path, queue: str | None) -> None:
    """``SCHEDULER_PERSIST = False`` (scrapy-redis's default) with three workers, on the
    default queue and on a scrapy-redis one: every worker finishes (none takes the
    filter, deleted at the end, for lost state), and the last to close deletes the
    queue and the filter."""
    extra = [f"SCHEDULER_QUEUE_CLASS={queue}"] if queue else []
    results = run_workers(durable_redis, site.url, tmp_path, 3, "SCHEDULER_PERSIST=False",
                          *extra)
    assert_clean(results)
    assert take_fetches(site) == [1] * PAGES
    client = redis.Redis.from_url(durable_redis)
    # All deleted but the mark that tells a worker paused past the end what happened,
    # and the crawl's report (BLOOMDUPE_REPORT_TTL).
    assert_finished_crawl_left(client, "site:bloomdupe")
    client.close()


@pytest.mark.slow
def test_scrapys_own_dupefilter_under_this_scheduler(durable_redis: str, site: Any,
                                                    tmp_path: Path) -> None:
    """``DUPEFILTER_CLASS = "scrapy.dupefilters.RFPDupeFilter"`` (Scrapy's, in the
    worker's memory) with this scheduler and ``SCHEDULER_PERSIST`` off: one worker
    fetches every page once, and the last worker out clears the shared queue and
    closes without an error (its close raised AttributeError: the filter has no
    ``clear``); with ``SCHEDULER_FLUSH_ON_START`` as well."""
    results = run_workers(durable_redis, site.url, tmp_path, 1,
                          "DUPEFILTER_CLASS=scrapy.dupefilters.RFPDupeFilter",
                          "SCHEDULER_PERSIST=False", "BLOOMDUPE_DONE_GRACE=1")
    assert_clean(results)
    assert take_fetches(site) == [1] * PAGES
    assert redis.Redis.from_url(durable_redis).keys("*queue*") == []
    # SCHEDULER_FLUSH_ON_START too (scrapy-redis's flush() cleared the dupefilter with
    # clear(), which Scrapy's has not: the worker stopped at its start).
    (tmp_path / "flush").mkdir()
    results = run_workers(durable_redis, site.url, tmp_path / "flush", 1,
                          "DUPEFILTER_CLASS=scrapy.dupefilters.RFPDupeFilter",
                          "SCHEDULER_FLUSH_ON_START=True", "BLOOMDUPE_DONE_GRACE=1")
    assert_clean(results)
    assert take_fetches(site) == [1] * PAGES
