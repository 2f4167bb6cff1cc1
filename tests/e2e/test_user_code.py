"""What ordinary user code and ordinary operations must not cost: real ``scrapy runspider``
workers, the add-on, a real Redis and the demo site.

* A request that cannot be serialized into the shared queue (a lambda callback, a
  module-level function, a lock in ``meta``) costs that request only: one ERROR naming it
  and what to do, ``bloomdupe/unserializable``; never in the filter; the rest of its
  callback's output is crawled. With ``BLOOMDUPE_BATCH`` on and off, and from the start
  requests (``enqueue_request``).
* A callback that blocks longer than ``BLOOMDUPE_LEASE_TIMEOUT``: its request comes
  back at most ``BLOOMDUPE_MAX_REQUEUES`` times, is then recorded as failed, and the
  crawl ends; the stalled worker says so when it resumes.
* A spider kept open (``RedisSpider``) passes idle spells; a Ctrl-C mid-crawl with
  ``SCHEDULER_PERSIST`` off keeps the shared state, which the next run finishes.
* A worker paused (SIGSTOP) past the end of a persist-off crawl that its last worker
  cleared closes with exit 0 and one INFO line when it resumes.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helpers
import pytest
import redis
from helpers import (
    assert_finished_crawl_left,
    demo_site,
    start_runspider,
    take_fetches,
    wait_workers,
)

from scrapy_bloomdupe import keys
from scrapy_bloomdupe.frontier import failed
from scrapy_bloomdupe.frontier import queue as frontier_queue
from scrapy_bloomdupe.scheduling.upkeep import NAMED

ADDON = json.dumps({"scrapy_bloomdupe.addon.BloomDupeAddon": 100})
KEY = "user:bloomdupe"

#: Every worker here runs with the engine's private ``_slot`` hidden from code outside
#: Scrapy (this package included): the guarantees rest on Scrapy's public hooks only.
HIDE_SLOT = '''
import sys

from scrapy.core import engine as scrapy_engine


class ScrapyOnly:
    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        if not sys._getframe(1).f_globals.get("__name__", "").startswith("scrapy."):
            raise AttributeError("_slot is Scrapy's own")
        return obj.__dict__["_hidden_slot"]

    def __set__(self, obj, value):
        obj.__dict__["_hidden_slot"] = value


scrapy_engine.ExecutionEngine._slot = ScrapyOnly()
'''

USER_SPIDER = HIDE_SLOT + '''
import threading
import time
from urllib.parse import parse_qs, urlsplit

import scrapy


def module_level(response):
    pass


class UserSpider(scrapy.Spider):
    name = "user"

    async def start(self):
        base = self.settings.get("DEMO_SITE_URL")
        yield scrapy.Request(base)
        if self.settings.getbool("BAD_START"):
            yield scrapy.Request(base + "bad-start", callback=lambda r: None)

    def parse(self, response):
        yield {"url": response.url}
        if response.url == self.settings.get("DEMO_SITE_URL") and \\
                self.settings.getbool("BAD_CALLBACK"):
            yield scrapy.Request(response.urljoin("/bad-callback"), callback=module_level)
            yield scrapy.Request(response.urljoin("/bad-meta"),
                                 meta={"lock": threading.Lock()})
        block = self.settings.get("BLOCK_ID")
        # (the page by its id: a link may spell its query in either order)
        if block and parse_qs(urlsplit(response.url).query).get("id") == [str(block)]:
            time.sleep(self.settings.getfloat("BLOCK_SECONDS"))
        yield from response.follow_all(css="a")
'''

FEED_SPIDER = HIDE_SLOT + helpers.FEED_SPIDER


def settings(redis_url: str, site: Any, **extra: Any) -> dict[str, str]:
    base = {"ADDONS": ADDON, "REDIS_URL": redis_url, "DEMO_SITE_URL": site.url,
            "BLOOMDUPE_KEY": KEY, "BLOOMDUPE_CAPACITY": "10000", "SCHEDULER_PERSIST": "True",
            "BLOOMDUPE_DONE_GRACE": "1", "LOG_LEVEL": "INFO"}
    return {**base, **{k: str(v) for k, v in extra.items()}}


def start(tmp_path: Path, count: int, values: dict[str, str], spider: str = "user",
          first: int = 0) -> list[Any]:
    """``count`` workers of the ``user`` (a plain spider) or ``feed`` (a RedisSpider)."""
    path = tmp_path / f"{spider}_spider.py"
    path.write_text(USER_SPIDER if spider == "user" else FEED_SPIDER)
    return start_runspider(path, tmp_path, count, values, first=first)


def log(tmp_path: Path, i: int) -> str:
    return (tmp_path / f"worker-{i}.log").read_text(errors="replace")


def stat(text: str, name: str) -> int:
    """A stat from the dump Scrapy logs at close (0 when absent)."""
    found = re.search(rf"'{re.escape(name)}': (\d+)", text)
    return int(found.group(1)) if found else 0


def errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if "] ERROR:" in line or " ERROR: " in line]


def bloomdupe(*args: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "scrapy_bloomdupe.cli", *args, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# -- a request that cannot be serialized -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("case", ["batch", "no-batch", "start", "batch fifo", "start fifo"])
def test_a_request_that_cannot_be_serialized_costs_only_itself(
        durable_redis: str, tmp_path: Path, case: str) -> None:
    pages = 200
    # "fifo": with scrapy-redis's FifoQueue (checked and pushed on the Redis thread).
    case, fifo = case.removesuffix(" fifo"), case.endswith(" fifo")
    extra: dict[str, Any] = {"BAD_CALLBACK": case != "start", "BAD_START": case == "start",
                             "BLOOMDUPE_BATCH": case != "no-batch"}
    if fifo:
        extra["SCHEDULER_QUEUE_CLASS"] = "scrapy_redis.queue.FifoQueue"
    with demo_site(pages) as site:
        codes = wait_workers(start(tmp_path, 2, settings(durable_redis, site, **extra)), 120)
        fetches = take_fetches(site)
        not_found = site.stats()["not_found"]
    logs = [log(tmp_path, i) for i in range(2)]
    for code, text in zip(codes, logs, strict=True):
        assert code == 0, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
    # Every page of the site crawled, once; the bad requests never left the worker.
    assert [p for p, n in enumerate(fetches) if n != 1] == [], fetches
    assert not_found == 0
    both = "\n".join(logs)
    bad = ({"bad-start": "callback"} if case == "start" else
           {"bad-callback": "callback module_level is not a method",
            "bad-meta": "meta key 'lock' (a lock)"})
    each = 2 if case == "start" else 1  # every worker yields the start requests
    found = errors(both)
    assert len(found) == each * len(bad), found
    for path, what in bad.items():
        lines = [e for e in found if f"/{path}" in e]
        assert len(lines) == each, found
        for line in lines:
            assert "Cannot store" in line and what in line, line
            assert "Dropped this request only" in line and "methods of the spider" in line
    assert sum(stat(text, "bloomdupe/unserializable") for text in logs) == each * len(bad)
    # Not in the filter (it was never queued): a later good request for it is new.
    urls = [site.url + path for path in bad]
    checked = bloomdupe("check", "--key", KEY, "--redis-url", durable_redis, *urls)
    assert [r["seen"] for r in checked["results"]] == [False] * len(urls), checked
    # The stats add up: every request queued was counted once, and handed out once.
    assert sum(stat(t, "scheduler/enqueued/redis") for t in logs) == pages
    assert sum(stat(t, "scheduler/dequeued/redis") for t in logs) == pages


# -- start requests and redirects: enqueue_request, answered before Redis is -----------------

REDIRECT_SPIDER = HIDE_SLOT + '''
import scrapy
from scrapy import signals


class RedirectSpider(scrapy.Spider):
    name = "user"

    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.dropped, signal=signals.request_dropped)
        return spider

    def dropped(self, request, spider):
        self.crawler.stats.inc_value("test/request_dropped")

    async def start(self):
        # Every worker: each page through a redirect, and the home page twice.
        base = self.settings.get("REDIRECT_URL")
        yield scrapy.Request(self.settings.get("DEMO_SITE_URL"))
        yield scrapy.Request(self.settings.get("DEMO_SITE_URL"))
        for page in range(self.settings.getint("PAGES")):
            yield scrapy.Request(f"{base}r/{page}")

    def parse(self, response):
        yield {"url": response.url}
        yield from response.follow_all(css="a")
'''


@pytest.fixture
def redirects() -> Iterator[Callable[[Any], str]]:
    """A server whose ``/r/<n>`` answers 302 to page n of the demo site given to
    ``set_site`` (which returns the server's URL)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    target: list[Any] = []

    class Redirect(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            page = int(self.path.rsplit("/", 1)[-1])
            self.send_response(302)
            site = target[0]
            page_path = sys.modules[type(site).__module__].page_path
            self.send_header("Location", site.url.rstrip("/") + page_path(page))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    thread = Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()

    def set_site(site: Any) -> str:
        target[:] = [site]
        return f"http://127.0.0.1:{server.server_port}/"

    try:
        yield set_site
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.slow
@pytest.mark.parametrize("queue", [None, "scrapy_redis.queue.FifoQueue"])
def test_start_requests_and_redirects_are_queued_once_and_their_drops_add_up(
        durable_redis: str, tmp_path: Path, redirects: Callable[[Any], str],
        queue: str | None) -> None:
    # enqueue_request answers before Redis does: a start request or a redirect found seen
    # before is dropped afterwards, with request_dropped and dupefilter/filtered. The
    # same with a scrapy-redis queue class (its checks and pushes on the Redis thread).
    pages = 150
    extra = {"SCHEDULER_QUEUE_CLASS": queue} if queue else {}
    with demo_site(pages) as site:
        values = settings(durable_redis, site, REDIRECT_URL=redirects(site), PAGES=pages,
                          **extra)
        path = tmp_path / "redirect_spider.py"
        path.write_text(REDIRECT_SPIDER)
        codes = wait_workers(start_runspider(path, tmp_path, 2, values), 120)
        fetches = take_fetches(site)
    logs = [log(tmp_path, i) for i in range(2)]
    for code, text in zip(codes, logs, strict=True):
        assert code == 0, text[-3000:]
        assert "Traceback" not in text and " ERROR: " not in text, text[-3000:]
    assert [p for p, n in enumerate(fetches) if n != 1] == [], fetches
    # Each page and each redirecting URL queued once, and handed out once.
    assert sum(stat(t, "scheduler/enqueued/redis") for t in logs) == 2 * pages
    assert sum(stat(t, "scheduler/dequeued/redis") for t in logs) == 2 * pages
    for text in logs:
        # Every request dropped as a duplicate was signalled: callbacks' links (by the
        # batch middleware) and start requests and redirects (by the scheduler).
        assert stat(text, "test/request_dropped") == stat(text, "dupefilter/filtered") > 0
    # The second copy of each start request, at least, was found seen before.
    assert sum(stat(t, "dupefilter/filtered") for t in logs) >= pages + 3


# -- a callback that blocks past the lease timeout -------------------------------------------


@pytest.mark.slow
def test_a_request_that_keeps_coming_back_is_recorded_failed_and_the_crawl_ends(
        durable_redis: str, tmp_path: Path) -> None:
    pages, block, limit = 120, 5, 2
    with demo_site(pages, delay=0.02) as site:
        # Blocked four lease timeouts: the others see it silent whatever the load. Three
        # workers: a worker back from a stall does not reap for a lease timeout (it may
        # have been as silent as the others), so with two, the first staller missed the
        # second's stall when that began less than a lease timeout after its own ended
        # (the page's second fetch then ran to its end: not recorded; a CI run).
        values = settings(durable_redis, site, BLOOMDUPE_LEASE_TIMEOUT=2,
                          BLOOMDUPE_MAX_REQUEUES=limit, BLOCK_ID=block, BLOCK_SECONDS=8,
                          CONCURRENT_REQUESTS=4)
        codes = wait_workers(start(tmp_path, 3, values), 150)
        fetches = take_fetches(site)
    logs = [log(tmp_path, i) for i in range(3)]
    both = "\n".join(logs)
    assert codes == [0, 0, 0], both[-4000:]
    # The blocking page came back at most BLOOMDUPE_MAX_REQUEUES times, then was
    # recorded; every other page was fetched (some twice: the stalled workers' others).
    assert 1 <= fetches[block] <= limit, fetches[block]
    client = redis.Redis.from_url(durable_redis)
    records = failed.read(client, KEY)
    client.close()
    recorded = [r for r in records if re.search(rf"[?&]id={block}(&|$)", r.url)]
    assert len(recorded) == 1, records
    assert "lease expired" in recorded[0].reason and "MAX_REQUEUES" in recorded[0].reason
    others = {int(m) for r in records for m in re.findall(r"[?&]id=(\d+)", r.url)}
    assert [p for p, n in enumerate(fetches) if n == 0 and p not in others] == []
    # It was put back each time its worker stalled, and recorded at the limit.
    assert re.search(rf"<GET [^>]*[?&]id={block}(&cat=\d)?> came back to the queue {limit} "
                     "times", both), both
    # The WARNING that puts leases back names them, and how often: the first NAMED of
    # them, then how many more. A stalled worker holds more leases than its
    # CONCURRENT_REQUESTS (its buffer; pages downloaded whose callbacks, or the queuing
    # of their output, had not ended; acks waiting for their round trip), so the
    # blocked page is not always among those named.
    # The first of them (the logs' timestamps; each worker logs its own): the first
    # stall's, where every lease comes back for the first time.
    put_back = sorted(re.findall(r"^(\S+ \S+) \S+ WARNING: (Put (\d+) request\(s\) back in the "
                                 r"shared queue: leased by a worker that stopped [^\n]*)",
                                 both, re.MULTILINE))
    assert put_back, both
    _, line, count_text = put_back[0]
    count = int(count_text)
    named = re.findall(r"http://\S+ \((\d+)x\)", line)
    assert named == ["1"] * min(count, NAMED), line
    if count > NAMED:
        assert f"; and {count - NAMED} more" in line, line
    # The stalled worker says so when it resumes.
    assert re.search(r"This worker was silent for \d+\.\ds, longer than "
                     r"BLOOMDUPE_LEASE_TIMEOUT", both)


# -- a spider kept open, stopped mid-crawl with SCHEDULER_PERSIST off ------------------------


@pytest.mark.slow
def test_a_spider_kept_open_keeps_the_shared_state_when_stopped_mid_crawl(
        redis_url: str, tmp_path: Path) -> None:
    pages = 300
    client = redis.Redis.from_url(redis_url)
    with demo_site(pages, delay=0.1) as site:
        values = settings(redis_url, site, SCHEDULER_PERSIST=False, CONCURRENT_REQUESTS=4,
                          MAX_IDLE_TIME_BEFORE_CLOSE=0)
        workers = start(tmp_path, 2, values, spider="feed")
        try:
            time.sleep(7)  # idle spells, the queue empty, before the first start URL
            client.lpush("feed:start_urls", site.url)
            deadline = time.monotonic() + 180
            while sum(site.fetches) < pages // 4 and time.monotonic() < deadline:
                time.sleep(0.1)
            for worker in workers:
                worker.send_signal(signal.SIGINT)  # Ctrl-C, mid-crawl
            codes = wait_workers(workers, 180)
        finally:
            wait_workers(workers, 0)
        first = [log(tmp_path, i) for i in range(2)]
        assert codes == [0, 0], first[0][-3000:]
        for text in first:
            # Once, in the idle spell before the start URL came.
            assert text.count("The crawl is done") <= 1, text[-3000:]
            assert "kept for the others" in text
        # Kept: the filter and its queue, for the next run.
        assert client.exists(keys.meta(KEY))
        waiting, leased = frontier_queue.status(client, KEY, 1)
        assert waiting > 0 and leased == 0
        # The next run (closing once idle) finishes the crawl: nothing was lost.
        again = settings(redis_url, site, SCHEDULER_PERSIST=False, CONCURRENT_REQUESTS=8,
                         MAX_IDLE_TIME_BEFORE_CLOSE=3)
        codes = wait_workers(start(tmp_path, 2, again, spider="feed", first=2), 120)
        fetches = take_fetches(site)
    second = [log(tmp_path, i) for i in (2, 3)]
    assert codes == [0, 0], second[0][-3000:]
    # RedisSpider's start request is dont_filter (fetched again when linked); every
    # page fetched; only the few in flight at the Ctrl-C fetched twice.
    assert [p for p, n in enumerate(fetches) if n == 0] == []
    assert sum(n > 1 for n in fetches[1:]) <= 2 * 8, fetches
    # Done with SCHEDULER_PERSIST off: the last worker deleted it all.
    assert not client.exists(keys.meta(KEY))
    client.close()


# -- a worker paused past the end of the crawl -----------------------------------------------


@pytest.mark.slow
def test_a_worker_paused_past_the_end_of_a_cleared_crawl_exits_0(
        redis_url: str, tmp_path: Path) -> None:
    pages = 200
    with demo_site(pages, delay=0.05) as site:
        values = settings(redis_url, site, SCHEDULER_PERSIST=False, BLOOMDUPE_LEASE_TIMEOUT=3,
                          CONCURRENT_REQUESTS=4)
        workers = start(tmp_path, 2, values)
        paused, other = workers
        try:
            deadline = time.monotonic() + 180
            while sum(site.fetches) < pages // 5 and time.monotonic() < deadline:
                time.sleep(0.05)
            paused.send_signal(signal.SIGSTOP)
            other.wait(120)  # finishes the crawl alone, and clears it (the last one)
            time.sleep(1)
            paused.send_signal(signal.SIGCONT)
            codes = wait_workers(workers, 180)
        finally:
            if paused.poll() is None:
                paused.send_signal(signal.SIGCONT)
            wait_workers(workers, 0)
        fetches = take_fetches(site)
    logs = [log(tmp_path, i) for i in range(2)]
    assert "Spider closed (finished)" in logs[1], logs[1][-3000:]
    assert codes == [0, 0], logs[0][-3000:]
    assert errors(logs[0]) == [], logs[0][-3000:]
    assert "finished while this worker was away" in logs[0], logs[0][-3000:]
    assert "kept for the others" not in logs[0]
    assert "silent for" not in logs[1]
    assert [p for p, n in enumerate(fetches) if n == 0] == []
    # The paused worker wrote nothing back: only the mark of the finished crawl is left,
    # and the report its last worker kept (BLOOMDUPE_REPORT_TTL).
    client = redis.Redis.from_url(redis_url)
    assert_finished_crawl_left(client, KEY)
    client.close()


# -- a worker killed mid-crawl, with the engine's private slot hidden -----------------------


@pytest.mark.slow
def test_sigkill_of_a_working_worker_loses_nothing_on_public_hooks_only(
        durable_redis: str, tmp_path: Path) -> None:
    pages, concurrency = 300, 8
    with demo_site(pages, delay=0.1) as site:
        values = settings(durable_redis, site, BLOOMDUPE_LEASE_TIMEOUT=3,
                          CONCURRENT_REQUESTS=concurrency)
        workers = start(tmp_path, 3, values)
        try:
            deadline = time.monotonic() + 180
            while sum(site.fetches) < pages // 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            workers[0].kill()  # SIGKILL, mid-crawl, pages in flight
            # Every lease in Redis now: the killed worker's and the live ones'.
            client = redis.Redis.from_url(durable_redis)
            leased = frontier_queue.status(client, KEY, 1)[1]
            client.close()
            codes = wait_workers(workers, 120)
        finally:
            wait_workers(workers, 0)
        fetches = take_fetches(site)
    logs = [log(tmp_path, i) for i in range(3)]
    assert codes[1:] == [0, 0], logs[1][-3000:]
    for text in logs[1:]:
        assert "Traceback" not in text and errors(text) == [], text[-3000:]
    assert [p for p, n in enumerate(fetches) if n == 0] == []
    # Only what the killed worker held (leased: in flight, prefetched, or done with its
    # ack not yet sent) is fetched again: at most the leases in Redis at the kill.
    twice = [p for p, n in enumerate(fetches) if n > 1]
    assert len(twice) <= leased, (leased, twice)
