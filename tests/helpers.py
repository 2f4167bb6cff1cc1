"""What several test files need: paths, a demo spider, fingerprints, cluster clients, a
pool of spawned workers, bad values of every setting, a crawl that cannot start and the
download slots of a crawl-wide crawl.

Importable as ``helpers`` from every test directory (``pythonpath = ["tests"]`` in
pyproject.toml), also in the worker processes the tests spawn (they inherit
``sys.path``). Fixtures live in ``tests/conftest.py``.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import redis
from harness import zygote
from harness.local_cluster import LocalCluster
from harness.reactor_ticks import longest_gap
from racing import BARRIER_TIMEOUT as BARRIER_TIMEOUT  # the tests' own, re-exported
from racing import fp as fp
from racing import fps as fps
from redis.cluster import RedisCluster
from scrapy import Spider
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler
from slotqueue import SlotEntry, SlotQueue
from twisted.internet.defer import Deferred, maybeDeferred, succeed

from scrapy_bloomdupe import connection, hashing, keys, sizing
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.bloom.lock import ShardLocks
from scrapy_bloomdupe.bloom.lua import LOCK_BUSY, SHARD_MISSING, STALE_GENERATION
from scrapy_bloomdupe.scheduling.jobs import IOThread
from scrapy_bloomdupe.testing import RedisServer, free_port

# -- paths ------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_PROJECT = ROOT / "example_project"
HARNESS = Path(__file__).resolve().parent / "harness"
RUN_DEMO = EXAMPLE_PROJECT / "run_demo.py"

#: A failover case CI leaves out (each mode, engine and event runs once there); with
#: ``BLOOMDUPE_ALL_FAILOVERS=1`` every combination runs.
ALL_FAILOVERS_ONLY = pytest.mark.skipif(
    not os.environ.get("BLOOMDUPE_ALL_FAILOVERS"),
    reason="set BLOOMDUPE_ALL_FAILOVERS=1 for every combination")


# -- a spider and its crawler -------------------------------------------------------------


class DemoSpider(Spider):
    name = "demo"


def crawler_for(redis_url: str, spider: type[Spider] = DemoSpider, **settings: Any) -> Any:
    """A crawler of ``spider`` on ``redis_url``, its spider made (as Scrapy makes it before
    the components); ``settings`` are added to (or override) the base ones."""
    base = {"REDIS_URL": redis_url, "BLOOMDUPE_CAPACITY": 10_000,
            "SPIDER_MIDDLEWARES": {"scrapy_bloomdupe.middleware.BloomDupeBatchMiddleware": 10}}
    crawler = get_crawler(spider, {**base, **settings})
    crawler.spider = crawler._create_spider()
    return crawler


class EngineWith:
    """What this package's components read of Scrapy's engine: its public ``scheduler``
    (Scrapy 2.19), through which they reach the crawl's dupefilter. For a test that
    builds components by hand, without a crawl: ``crawler.engine = EngineWith(s)``."""

    def __init__(self, scheduler: Any) -> None:
        self._scheduler = scheduler

    @property
    def scheduler(self) -> Any:
        return self._scheduler


# -- time and Scrapy's engine, under a test's control ------------------------------------


class Clock:
    """A monotonic clock that moves only when the test says (``clock.now += 5``), as in
    redis-py's tests/test_lock.py: the ``clock`` of the scheduler's parts."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Call:
    """A delayed call asked for by the code under test, run when the test says."""

    def __init__(self, delay: float, func: Any) -> None:
        self.delay, self.func, self.cancelled = delay, func, False

    def cancel(self) -> None:
        self.cancelled = True


class Calls:
    """The ``later`` of the scheduler's parts (Scrapy's ``call_later`` otherwise): the
    delayed calls they ask for, kept in ``asked`` until the test runs them."""

    def __init__(self) -> None:
        self.asked: list[Call] = []

    def __call__(self, delay: float, func: Any) -> Call:
        call = Call(delay, func)
        self.asked.append(call)
        return call

    def pending(self) -> list[Call]:
        return [c for c in self.asked if not c.cancelled]

    def run(self) -> float:
        """Run the one pending call (cancelled ones are dropped); its delay."""
        (call,) = self.pending()
        self.asked.clear()
        call.func()
        return call.delay


class Engine:
    """What the scheduler's parts use of Scrapy's engine: its spider, ``crawl`` (how
    they wake it), whether it is idle, and ``close_spider_async``."""

    def __init__(self, spider: Spider, *, idle: bool = True) -> None:
        self.spider: Spider | None = spider
        self.idle = idle
        self.crawled: list[Any] = []
        self.closed: list[str] = []

    def crawl(self, request: Any) -> None:
        self.crawled.append(request)

    def spider_is_idle(self) -> bool:
        return self.idle

    def close_spider_async(self, *, reason: str) -> Deferred[None]:
        # A Deferred, not a coroutine: deferred_from_coro passes it on as it is, with no
        # reactor installed (tests/test_jobs.py installs asyncio's in a process of its own).
        self.closed.append(reason)
        return succeed(None)


class HeldRunner(IOThread):
    """A runner for the scheduler's jobs (``RedisJobs.io``) as during a crawl, with no
    reactor: each job is held, its ``Deferred`` unfired, until the test runs it
    (:meth:`run_held`), so that what happens when an answer comes later can be seen."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[tuple[Any, tuple[Any, ...], Deferred[Any]]] = []
        self._reactor = self  # its callLater (see IOThread._answered): at once

    @property
    def inline(self) -> bool:
        return False

    def callLater(self, _delay: float, func: Any, *args: Any) -> None:
        func(*args)

    def _dispatch(self, call: Any, *args: Any) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.held.append((call, args, d))
        return d

    def run_held(self) -> int:
        """Run the jobs held so far, in order, each answer back before the next job;
        how many."""
        jobs, self.held = self.held, []
        for call, args, d in jobs:
            maybeDeferred(call, *args).chainDeferred(d)
        return len(jobs)


# -- fingerprints -------------------------------------------------------------------------


def shard_of(bf: BloomFilter, fingerprint: bytes) -> int:
    """The shard of ``bf`` that ``fingerprint`` goes to."""
    h1, _ = hashing.halves(fingerprint, bf.seed)
    return hashing.shard_of(h1, bf.sizing.shards)


def first_plan(capacity: int, error_rate: float, shards: int = 2) -> sizing.Sizing:
    """The first generation's sizing of a filter with growth on."""
    return sizing.plan(capacity, sizing.first_generation_error_rate(error_rate, True), shards)


# -- the filter's lock, fence and op log, taken apart -----------------------------------


def lock_key_for(bf: BloomFilter, fingerprint: bytes) -> str:
    """The lock of the shard ``fingerprint`` goes to."""
    return keys.lock(bf.key, shard_of(bf, fingerprint))


def take_lock(locks: ShardLocks, name: str, token: bytes) -> bool:
    """One ``SET NX PX`` of lock ``name`` with ``token``, no waiting, as a worker's round
    trip takes it (and counts it): True when ``token`` now holds it."""
    got = bool(locks.link.call("SET", name, token, "NX", "PX", locks.ttl_ms))
    locks.counters.acquired += got
    return got


def add_with_token(bf: BloomFilter, fingerprint: bytes, token: bytes) -> bool | None:
    """A fenced check-and-add of ``fingerprint`` under a lock already taken with ``token``
    (:func:`take_lock`), the two steps a worker's round trip makes one: None, having
    written nothing, when the lock no longer holds ``token``, or when the script answered
    that the generation or slice moved on."""
    op = bf._next_op
    bf._next_op += 1
    (unit,) = bf._group({0: hashing.halves(fingerprint, bf.seed)}, [0], op)
    reply = bf.engine.run(bf.engine.check_add_command(
        token, unit.call, op, list(unit.sections.values())))
    if reply == SHARD_MISSING:
        raise bf._lost(bf.engine.missing([unit.shard]))
    if isinstance(reply, list):  # STALE_SLICE: nothing written, the lock released
        bf._adopt_slice(unit.shard, reply)
        return None
    if reply == b"G":  # the slice grew in the call, which did not look at the item
        assert bf.engine is not None
        bf.engine.grew(unit.shard)
        return None
    if reply in (LOCK_BUSY, STALE_GENERATION):
        bf.counters.lock.lost += reply == LOCK_BUSY
        return None
    new = bool(reply == b"1")
    bf.counters.checked += 1
    bf.counters.new += new
    bf.counters.duplicates += not new
    return new


def parse_op_log(raw: bytes) -> tuple[int, dict[int, bytes]]:
    """An op log's ack and its recorded replies by call id (``bloom/oplog.py``)."""
    ack, *entries, _ = raw.split(b"|")
    calls = (entry.split(b":") for entry in entries)
    return int(ack), {int(call): reply for call, reply in calls}


# -- a server's configuration, for one test ---------------------------------------------


@contextmanager
def server_config(client: redis.Redis, name: str, value: str) -> Iterator[redis.Redis]:
    """``CONFIG SET name value`` on ``client``'s server for the block, the value it had
    restored afterwards (the server is shared with other tests)."""
    before = client.config_get(name)[name]
    client.config_set(name, value)
    try:
        yield client
    finally:
        client.config_set(name, before)


# -- a Redis Cluster ----------------------------------------------------------------------

#: Shards of the filters the cluster tests open.
CLUSTER_SHARDS = 12


def cluster_settings(url: str, **extra: Any) -> Settings:
    return Settings({"REDIS_URL": url, "BLOOMDUPE_REDIS_CLUSTER": True, **extra})


def cluster_client(url: str, **extra: Any) -> RedisCluster:
    """A cluster client built from Scrapy settings, as a crawl builds it."""
    client = connection.from_settings(cluster_settings(url, **extra))
    assert isinstance(client, RedisCluster)
    return client


def plan(shards: int = CLUSTER_SHARDS) -> sizing.Sizing:
    return sizing.plan(1_000_000, 0.001, shards=shards)


def node_clients(servers: LocalCluster) -> dict[str, redis.Redis]:
    """A plain client on each master, by ``host:port``."""
    return {f"127.0.0.1:{p}": servers.node(p).client() for p in servers.master_ports()}


def run_python(source: str) -> str:
    """The output of ``python -c source`` in a process of its own (one that installs a
    reactor, which a test process must not share), from the repository's root; its
    exit status must be 0."""
    done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                          timeout=180, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def run_tree(args: list[str], *, timeout: float, **options: Any
             ) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(args, capture_output=True, text=True)`` for a script that starts
    processes of its own (a benchmark's redis-server, the demo's site and workers): in a
    session of its own, so that a timeout stops all of them (its process group, by the
    script's PID), not the script alone, which left its redis-server running."""
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **options) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            raise subprocess.TimeoutExpired(args, timeout, out, err) from None
    return subprocess.CompletedProcess(args, process.returncode, out, err)


# -- the example project's demo site ----------------------------------------------------


@contextmanager
def demo_site(pages: int, **options: Any) -> Iterator[Any]:
    """The example project's demo site (``demo/site.py``), served from a thread of this
    process; its ``url``, ``base`` and fetch counts (``GET /__stats``). ``options``:
    ``DemoSite``'s (``delay``, ``failing``)."""
    sys.path.insert(0, str(EXAMPLE_PROJECT))
    try:
        server = importlib.import_module("demo.site").DemoSite(port=0, pages=pages, **options)
    finally:
        sys.path.remove(str(EXAMPLE_PROJECT))
    # (``serve``: with ``hosts``, each other host's mirror too, in threads of their own)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        for mirror in server.mirrors:
            mirror.shutdown()
            mirror.server_close()
        server.shutdown()
        server.server_close()
        thread.join(10)


# -- real `scrapy crawl` workers of the example project ---------------------------------


def start_workers(redis_url: str, site_url: str, logs: Path, count: int, *settings: str,
                  spider: str = "site", first: int = 0,
                  env: dict[str, str] | None = None) -> list[Any]:
    """``count`` ``scrapy crawl`` processes of the example project on ``site_url``, each
    logging to ``logs/worker-<i>.log``; ``settings`` are ``NAME=VALUE`` for ``-s``,
    ``env`` more environment variables (``PYTHONPATH`` is not inherited)."""
    extra = env or {}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(REDIS_URL=redis_url, DEMO_SITE_URL=site_url, **extra)
    args = [a for s in ("TELNETCONSOLE_ENABLED=False", *settings) for a in ("-s", s)]
    processes = []
    for i in range(first, first + count):
        command = [sys.executable, "-m", "scrapy", "crawl", spider,
                   "-s", f"LOG_FILE={logs / f'worker-{i}.log'}", *args]
        processes.append(zygote.popen(command, cwd=EXAMPLE_PROJECT, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    return processes


def wait_workers(processes: list[Any], timeout: float = 120.0) -> list[int]:
    """Wait for ``processes`` (killing those still running after ``timeout`` seconds);
    their exit codes."""
    deadline = time.monotonic() + timeout
    try:
        for process in processes:
            with suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stderr is not None:
                process.stderr.close()
    return [process.returncode for process in processes]


def run_workers(redis_url: str, site_url: str, logs: Path, count: int, *settings: str,
                timeout: float = 120.0, first: int = 0,
                env: dict[str, str] | None = None) -> list[tuple[int, str]]:
    """:func:`start_workers`, then :func:`wait_workers`: each worker's exit code and log."""
    processes = start_workers(redis_url, site_url, logs, count, *settings, first=first,
                              env=env)
    codes = wait_workers(processes, timeout)
    return [(code, (logs / f"worker-{i}.log").read_text())
            for i, code in zip(range(first, first + count), codes, strict=True)]


def take_fetches(site: Any) -> list[int]:
    """The demo site's fetch count of each page since the last call (and reset them)."""
    with site.lock:
        fetches = list(site.fetches)
        site.fetches = [0] * len(fetches)
    return fetches


def start_runspider(spider: Path, logs: Path, count: int, settings: dict[str, str],
                    *, first: int = 0) -> list[Any]:
    """``count`` ``scrapy runspider SPIDER`` processes (cwd: the spider's folder), each
    logging to ``logs/worker-<i>.log``; ``settings`` for ``-s``. Stop them with
    :func:`wait_workers` (by their Popen, never by name)."""
    processes = []
    for i in range(first, first + count):
        command = [sys.executable, "-m", "scrapy", "runspider", str(spider),
                   "-s", f"LOG_FILE={logs / f'worker-{i}.log'}"]
        for name, value in {"TELNETCONSOLE_ENABLED": "False", **settings}.items():
            command += ["-s", f"{name}={value}"]
        processes.append(zygote.popen(command, cwd=spider.parent, env=dict(os.environ),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    return processes


#: A scrapy-redis ``RedisSpider`` (start URLs from the list ``feed:start_urls``) that
#: follows every link: a spider file for ``scrapy runspider``.
FEED_SPIDER = '''
from scrapy_redis.spiders import RedisSpider


class FeedSpider(RedisSpider):
    name = "feed"
    redis_key = "feed:start_urls"

    def parse(self, response):
        yield {"url": response.url}
        yield from response.follow_all(css="a")
'''


# -- bad values of every setting (scrapy_bloomdupe.settingstable) ---------------------------

#: In every bad value of a setting that may hold one: never to be shown.
BAD_PASSWORD = "Hunter2-Zq8v"
_PW = BAD_PASSWORD

#: Bad values by kind of setting, as ``-s NAME=VALUE`` gives them (strings).
BAD_BY_KIND: dict[str, tuple[str, ...]] = {
    "whole number": ("abc",),
    "number": ("abc",),
    "bool": ("maybe",),
    "choice": ("bogus",),
    "key template": ("%(name)s",),
    "string": ("mymaster",),  # a master without sentinels
    "URL": (f"http://:{_PW}@127.0.0.1:6379/0", f"redis//:{_PW}@127.0.0.1/0"),
    "host": (f"redis://:{_PW}@127.0.0.1",),
    "client arguments": (
        f'{{"password": "{_PW}", socket_timeout: 3}}',  # not JSON
        f'{{"password": "{_PW}", "socket_timeout": "3s"}}',  # a wrong type
        f'{{"pasword": "{_PW}"}}',  # an unknown key
        f'["password", "{_PW}"]',  # not an object
    ),
    "password": (_PW,),  # without sentinels
    "sentinels": (f"redis://:{_PW}@127.0.0.1:26379", f":{_PW}@127.0.0.1:26379"),
    "port": ("94x0",),
    "status codes": ("429,abc", "[999]"),
}
#: Where a setting's kind has no bad value that fits it (a host to listen on).
BAD_BY_NAME: dict[str, tuple[str, ...]] = {"BLOOMDUPE_METRICS_HOST": ("",)}


def bad_values(name: str, kind: str) -> tuple[str, ...]:
    """Bad values of the setting ``name`` (of ``kind``, its row in the settings table)."""
    return BAD_BY_NAME.get(name) or BAD_BY_KIND[kind]


# -- a crawl that cannot start -------------------------------------------------------------


def example_crawl(redis_url: str, *settings: str, pythonpath: Path | None = None
                  ) -> subprocess.CompletedProcess[str]:
    """``scrapy crawl site -s ...`` in the example project (its site is not running: a
    crawl that starts would fail on the first page, not at start); ``pythonpath``: a
    folder put on the worker's PYTHONPATH (a ``sitecustomize.py``, say)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(REDIS_URL=redis_url, DEMO_SITE_URL=f"http://127.0.0.1:{free_port()}/")
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    args = [a for s in settings for a in ("-s", s)]
    return zygote.run([sys.executable, "-m", "scrapy", "crawl", "site", *args],
                      cwd=EXAMPLE_PROJECT, timeout=120, env=env)


def assert_start_error_line(result: subprocess.CompletedProcess[str], says: str) -> str:
    """``result`` (of :func:`example_crawl`) exited 1 with one CRITICAL line that says
    ``says``, and nothing else at ERROR or above, no traceback; its output."""
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    lines = [line for line in output.splitlines() if "CRITICAL" in line or "ERROR" in line]
    assert len(lines) == 1, output
    assert "[scrapy_bloomdupe] CRITICAL: Cannot start the crawl: " in lines[0], output
    assert says in lines[0], output
    for noise in ("Traceback", "Engine slot not assigned", "Task exception was never retrieved",
                  "During handling"):
        assert noise not in output, output
    return output


# -- the download slots of a crawl with BLOOMDUPE_POLITENESS = "crawl" ----------------------

#: What :func:`busy_slots` leaves, busiest first: (slot, in flight, limit, waiting).
BUSY_SLOTS = [("one.test", 2, 2, 3), ("slow.test", 1, 1, 2), ("paused.test", 0, 1, 4),
              ("odd:80|x%", 0, 4, 3)]


def busy_slots(client: Any, tag: str, shards: int = 1) -> None:
    """Download slots in every state (frontier/slots.py), for the readers of them:
    ``one.test`` at its limit (2 in flight, 3 waiting), ``slow.test`` with a 30 s delay
    (1 in flight, 2 waiting), ``paused.test`` backed off for 60 s (4 waiting), and
    ``odd:80|x%`` (a name that needs escaping) under the default limit, 4, with two
    priorities waiting; the worker that leased them heartbeats. With ``shards`` (a
    cluster's), each slot on its home shard, as a crawl-wide queue puts it."""
    from scrapy_bloomdupe import keys
    from scrapy_bloomdupe.frontier.slots import home_shard

    queues: dict[int, SlotQueue] = {}

    def queue(slot: str) -> SlotQueue:
        home = home_shard(keys.slot_name(slot), shards)
        if home not in queues:
            queues[home] = SlotQueue(client, tag, home, owner="w1")
            queues[home].set_defaults(concurrency=4)
        return queues[home]

    def push(slot: str, n: int, concurrency: int, delay_ms: int = 0, priority: int = 0
             ) -> None:
        queue(slot).push([SlotEntry(slot, priority,
                                    f"\x01https://{slot}/{priority}/{j}".encode(),
                                    concurrency, delay_ms) for j in range(n)])

    push("one.test", 5, 2)
    push("slow.test", 3, 1, 30_000)
    assert sum(len(queue(slot).pop(10).leases) for slot in ("one.test", "slow.test")) == 3
    now = client.time()
    seconds, micros = next(iter(now.values())) if isinstance(now, dict) else now  # a cluster's
    queue("paused.test").backoff("paused.test", seconds * 1000 + micros // 1000 + 60_000)
    push("paused.test", 4, 1)
    push("odd:80|x%", 2, 4, priority=5)
    push("odd:80|x%", 1, 4)


def waiting_entries(client: Any, tag: str) -> list[bytes]:
    """The entries waiting in the queue of the crawl tagged ``tag`` (one node): in its
    sorted set (the filter's sink, the intake) and in its download slots' lists
    (frontier/leased.py), where the entries are moved once queued."""
    from scrapy_bloomdupe import keys

    found: list[bytes] = list(client.zrange(keys.queue(tag, 0), 0, -1))
    for name in client.scan_iter(match=keys.slot_prefix(tag, 0) + "*"):
        if client.type(name) == b"list":
            found += client.lrange(name, 0, -1)
    return found


class Freeze(NamedTuple):
    """What :func:`crawl_through_a_freeze` saw."""
    during: int  #: pages fetched while Redis was frozen
    total: list[int]  #: each page's fetches over the whole crawl
    longest_gap: float  #: seconds, the longest any worker's reactor did not turn in it


def crawl_through_a_freeze(site: Any, logs: Path, *settings: str, workers: int = 2,
                           after: int = 20, freeze: float = 5.0) -> Freeze:
    """``workers`` workers of the example project crawl ``site`` on a Redis of their own,
    which is frozen (SIGSTOP) for ``freeze`` seconds once ``after`` pages were fetched,
    then let go (SIGCONT). Checks that each worker exits 0 with no error in its log.
    Each worker runs :class:`harness.reactor_ticks.Ticks` beside the project's
    extensions."""
    ticks = logs / "ticks"
    ticks.mkdir()
    extensions = runpy.run_path(str(EXAMPLE_PROJECT / "demo" / "settings.py"))["EXTENSIONS"]
    extensions = json.dumps({**extensions, "reactor_ticks.Ticks": 0})
    with RedisServer() as server:
        assert server.process is not None
        processes = start_workers(server.url, site.url, logs, workers, *settings,
                                  "BLOOMDUPE_DONE_GRACE=1", f"EXTENSIONS={extensions}",
                                  env={"PYTHONPATH": str(HARNESS),
                                       "REACTOR_TICKS_DIR": str(ticks)})
        fetched = [0] * len(site.fetches)
        try:
            deadline = time.monotonic() + 180
            while sum(fetched) < after and time.monotonic() < deadline:
                time.sleep(0.02)
                fetched = [a + b for a, b in zip(fetched, take_fetches(site), strict=True)]
            assert sum(fetched) >= after, "the crawl did not start"
            os.kill(server.process.pid, signal.SIGSTOP)
            frozen = time.monotonic()
            try:
                time.sleep(freeze)
                during = take_fetches(site)
            finally:
                os.kill(server.process.pid, signal.SIGCONT)
                thawed = time.monotonic()
        finally:
            codes = wait_workers(processes, timeout=120)
        for i, code in enumerate(codes):
            log = (logs / f"worker-{i}.log").read_text()
            assert code == 0, log[-3000:]
            for bad in ("Traceback", "] ERROR:", "] CRITICAL:"):
                assert bad not in log, log[-3000:]
        total = [a + b + c for a, b, c in zip(fetched, during, take_fetches(site), strict=True)]
    return Freeze(sum(during), total, longest_gap(ticks, frozen, thawed))


def in_job(jobs: Any, fn: Any) -> Any:
    """``fn()`` as a job of ``jobs`` (``RedisJobs``), as the scheduler runs it: Redis calls
    are made only inside one. Outside a crawl the job runs at once; its answer."""
    answer: list[Any] = []
    jobs.run(fn, after_stop=True).addCallback(answer.append)
    assert answer, "the job ran at once (no runner started)"
    return answer[0]


# -- what a finished crawl leaves ---------------------------------------------------------


def assert_finished_crawl_left(client: Any, key: str) -> None:
    """After a crawl with ``SCHEDULER_PERSIST`` off ended: only its end mark and its
    report (crawl stats, failed requests) are left at ``key``, each expiring
    (``BLOOMDUPE_REPORT_TTL``)."""
    left = {name.decode() for name in client.keys("*")}
    allowed = {keys.finished(key), keys.stats(key), keys.workers(key), keys.failed(key)}
    assert keys.finished(key) in left and left <= allowed, left
    assert all(client.ttl(name) > 0 for name in left), {n: client.ttl(n) for n in left}
