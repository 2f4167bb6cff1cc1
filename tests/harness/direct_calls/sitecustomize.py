"""Loaded by a worker whose ``PYTHONPATH`` has this folder (tests/e2e/test_off_the_reactor.py).
While the scheduler's jobs run off the reactor (``RedisJobs.start`` to the crawl's
end) it records:

* ``direct``: each redis-py client or pipeline call made where the jobs run (the
  Redis thread, or the reactor's thread when they run on its asyncio loop): there
  should be none, the link carries the crawl's commands;
* ``blocking``: each round trip written on a blocking connection from the reactor's
  thread: there should be none (Scrapy's reactor never waits for Redis);
* ``awaited``: round trips awaited on ``redis.asyncio`` (``AsyncNode.round_trip``),
  and ``io``: where the jobs ran (``IOLoop`` or ``IOThread``);
* ``phases``: for the crawl's start and end (the scheduler's join, its leave and the
  filter's close), whether each ran while the jobs ran off the reactor, so under the
  two probes above.

It writes them as JSON to ``$DIRECT_CALLS_DIR/<pid>.json`` when the worker exits. It
observes; it changes no reply and no command."""

from __future__ import annotations

import atexit
import json
import os
import threading
import traceback
from collections import Counter
from typing import Any

OUT = os.environ.get("DIRECT_CALLS_DIR")
#: The name of the scheduler's Redis thread (scheduling/jobs.py's IOThread's ThreadPool).
REDIS_THREAD = "PoolThread-bloomdupe-redis"
found: dict[str, Any] = {"direct": Counter(), "blocking": Counter(), "awaited": 0, "io": None,
                         "phases": {}}
running = {"jobs": False}


def _caller() -> str:
    for frame in reversed(traceback.extract_stack(limit=40)[:-2]):
        if "scrapy_bloomdupe" in frame.filename and "sitecustomize" not in frame.filename:
            return f"{os.path.basename(frame.filename)}:{frame.lineno} {frame.name}"
    return "?"


def _where_jobs_run() -> bool:
    name = threading.current_thread().name
    if name.startswith(REDIS_THREAD):
        return True
    return running["jobs"] and found["io"] == "IOLoop" and name == "MainThread"


def _wrap(owner: Any, name: str, record: Any) -> None:
    original = getattr(owner, name)

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        record(self, args)
        return original(self, *args, **kwargs)

    setattr(owner, name, wrapped)


def _direct(what: Any) -> Any:
    def record(self: Any, args: Any) -> None:
        if _where_jobs_run():
            found["direct"][f"{what(self, args)} from {_caller()}"] += 1
    return record


def _blocking(self: Any, args: Any) -> None:
    if running["jobs"] and threading.current_thread().name == "MainThread":
        found["blocking"][_caller()] += 1


def _awaited(self: Any, args: Any) -> None:
    found["awaited"] += 1


def _phase(name: str) -> Any:
    def record(self: Any, args: Any) -> None:
        found["phases"][name] = running["jobs"]
    return record


if OUT:
    import redis.client
    import redis.cluster
    import redis.connection

    from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter
    from scrapy_bloomdupe.scheduling import jobs, shared
    from scrapy_bloomdupe.transport import onloop

    _wrap(redis.client.Redis, "execute_command", _direct(lambda _s, args: str(args[0])))
    _wrap(redis.cluster.RedisCluster, "execute_command", _direct(lambda _s, args: str(args[0])))
    _wrap(redis.client.Pipeline, "execute", _direct(lambda self, _a: "a pipeline of " + ",".join(
        sorted({str(c[0][0]) for c in self.command_stack}))))
    _wrap(redis.cluster.ClusterPipeline, "execute", _direct(lambda _s, _a: "a cluster pipeline"))
    _wrap(redis.connection.AbstractConnection, "send_packed_command", _blocking)
    _wrap(onloop.AsyncNode, "round_trip", _awaited)
    _wrap(shared.SharedCrawl, "join", _phase("join"))
    _wrap(shared.SharedCrawl, "close", _phase("leave"))
    _wrap(RedisBloomDupeFilter, "close_now", _phase("filter closed"))

    start = jobs.RedisJobs.start

    def started(self: Any, **kwargs: Any) -> bool:
        if not start(self, **kwargs):
            return False
        found["io"] = type(self.io).__name__
        running["jobs"] = True
        return True

    jobs.RedisJobs.start = started  # type: ignore[method-assign]

    for runner in (jobs.IOLoop, jobs.IOThread):
        _wrap(runner, "stop", lambda _self, _args: running.update(jobs=False))

    @atexit.register
    def _write() -> None:
        with open(os.path.join(OUT, f"{os.getpid()}.json"), "w") as out:
            json.dump(found, out)
