#!/usr/bin/env python
"""What a real Redis does to a crawl: one row per event, with real ``scrapy crawl`` workers.

``python tests/harness/operator_events.py [ROW ...]`` (all rows by default; ``--list``
names them) prints a table. Each row starts a fresh Redis (``--maxmemory`` capped,
as every Redis here), the demo site with ``--pages`` pages, and 2 workers of the
example project together; once the site has served a quarter of its pages it
does the row's event to Redis (fills its memory, changes its eviction policy,
restarts it empty, flushes it, deletes the filter's metadata or a shard, takes a
command away from the crawl's ACL user), and waits for the workers to exit.
Where they stopped on an error, it then does what the error line tells the
operator to do (gives Redis its memory back, restores the ACL, clears what is
left with ``bloomdupe clear``) and starts 2 workers again, until they finish.

Per row: each phase's exit codes, whether the stopping workers said why (the
error line), pages fetched twice and pages never fetched (from the site's own
counts, over both phases). Never fetched must be 0 at the end, and a page may be
fetched twice only after a worker exited non-zero with its error line: nothing
silent. tests/e2e/test_operator.py runs every row with these functions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

if __package__ in (None, ""):  # run as a script: make ``harness`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import kill_workers as kw
from harness import processes
from scrapy_bloomdupe import keys
from scrapy_bloomdupe.testing import RedisServer

KEY = kw.KEY
PAGES = 300
#: The site's delay per page: the crawl takes a few seconds, so the event lands mid-crawl.
DELAY = 0.2
LEASE_TIMEOUT = 3.0
OUTAGE_TIMEOUT = 4.0
USER, PASSWORD = "crawler", "crawler-pw"
#: Every command the crawl needs (docs/security.md), for the ACL rows.
ACL_COMMANDS = (
    "ping", "evalsha", "script|load", "time", "get", "mget", "set", "del", "exists", "strlen",
    "bitfield", "bitcount", "bitfield_ro", "memory|usage", "hgetall", "hset", "hincrby",
    "zadd", "zcard", "zrange", "zremrangebyrank", "hget", "hdel", "hlen", "zrangebyscore",
    "zrem", "xadd", "scan", "config|get", "type", "info",
    "rpush", "lpush", "lpop", "lrange", "lrem", "hmget", "incrby", "decrby", "expire", "xlen",
)


#: A log line of this package's, before its level.
OURS = r"\[scrapy_bloomdupe[.\w]*\] "


@dataclass
class Phase:
    exit_codes: list[int | None]
    finish_reasons: list[Any]
    #: The workers' ERROR/CRITICAL lines from this package (the reason they stopped).
    errors: list[str]
    warnings: list[str]
    #: The stacks of the workers that had not exited by the phase's deadline.
    hung: list[str] = field(default_factory=list)


@dataclass
class Row:
    name: str
    event: str
    phases: list[Phase] = field(default_factory=list)
    fetched_twice: int = 0
    never_fetched: int = 0
    #: Pages fetched before the first phase ended.
    fetched_first: int = 0
    seconds: float = 0.0

    @property
    def silent(self) -> bool:
        """A page skipped, or fetched twice, with no worker saying why (exit 0)."""
        first = self.phases[0]
        said = any(c not in (0, None) for c in first.exit_codes) and bool(first.errors)
        return self.never_fetched > 0 or (self.fetched_twice > 0 and not said)


class Lab:
    """A Redis, the demo site and the workers of one row."""

    def __init__(self, out: Path, *, pages: int = PAGES, acl: bool = False,
                 redis_args: Sequence[str] = ()) -> None:
        self.out = out
        self.pages = pages
        self.server = RedisServer(extra=list(redis_args)).start()
        self.admin = redis.Redis.from_url(self.server.url)
        self.url = self.server.url
        if acl:
            self.set_acl(ACL_COMMANDS)
            self.url = f"redis://{USER}:{PASSWORD}@127.0.0.1:{self.server.port}/0"
        self.site = processes.start_site(out, pages=pages, delay=DELAY)
        self.started = 0

    def set_acl(self, commands: Sequence[str]) -> None:
        self.admin.execute_command(
            "ACL", "SETUSER", USER, "reset", "on", f">{PASSWORD}", f"~{KEY}:*",
            f"~{{{KEY}:*", "resetchannels", "-@all", *(f"+{c}" for c in commands))

    def workers(self, count: int, **extra: str) -> list[processes.Worker]:
        settings = kw.worker_settings(self.url, self.site.url, pages=self.pages,
                                      lease_timeout=LEASE_TIMEOUT, extra={
                                          "BLOOMDUPE_OUTAGE_TIMEOUT": str(OUTAGE_TIMEOUT),
                                          **extra})
        crew = []
        for _ in range(count):
            self.started += 1
            crew.append(processes.start_worker(self.started, self.out, settings))
        return crew

    def fetched(self) -> int:
        return sum(1 for n in self.site.stats()["fetches"] if n)

    def wait_fetched(self, pages: int, crew: list[processes.Worker], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.fetched() < pages:
            if all(w.process.poll() is not None for w in crew) or time.monotonic() > deadline:
                return
            time.sleep(0.05)

    def close(self) -> None:
        self.site.stop()
        self.admin.close()
        self.server.close()


def finish(crew: list[processes.Worker], timeout: float = 90) -> Phase:
    deadline = time.monotonic() + timeout
    hung: list[str] = []
    try:
        while any(w.process.poll() is None for w in crew) and time.monotonic() < deadline:
            time.sleep(0.1)
        hung = [stacks for w in crew if (stacks := w.dump_stacks())]
    finally:
        for w in crew:
            w.close()  # by its Popen: SIGTERM, then SIGKILL
    lines = [line for w in crew for line in w.log_lines(OURS + r"(ERROR|CRITICAL)")]
    warned = [line for w in crew for line in w.log_lines(OURS + "WARNING")]
    return Phase([w.process.returncode for w in crew], [w.stats().get("finish_reason")
                                                      for w in crew], lines, warned, hung)


def bloomdupe_clear(url: str) -> None:
    script = Path(sys.executable).with_name("bloomdupe")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "scrapy_bloomdupe.cli"]
    done = subprocess.run([*command, "clear", "--key", KEY, "--yes"], capture_output=True,
                          text=True, timeout=180, env={"REDIS_URL": url, "PATH": "/usr/bin:/bin"})
    if done.returncode not in (0, 1):  # 1: nothing left to clear
        raise RuntimeError(f"bloomdupe clear: {done.stdout}{done.stderr}")


# -- the rows ------------------------------------------------------------------------------


def _fill_memory(lab: Lab) -> None:
    """maxmemory down to half of what Redis uses now: every write is refused (OOM), also
    once the queue has drained a little and op logs have expired."""
    used = int(lab.admin.info("memory")["used_memory"])
    lab.admin.config_set("maxmemory", used // 2)


def _give_memory_back(lab: Lab) -> None:
    lab.admin.config_set("maxmemory", "1gb")


def _restart_empty(lab: Lab) -> None:
    lab.server.kill()  # SIGKILL, no persistence: it comes back empty
    lab.server.start()


#: name -> (what happens, the event, the operator's fix before phase 2 or None, and
#: how long the event lasts before the fix when the workers are left running).
@dataclass
class Event:
    what: str
    act: Callable[[Lab], None]
    fix: Callable[[Lab], None] | None = None
    #: Fix while phase 1 still runs, after this many seconds (a passing event).
    fix_after: float | None = None
    redis_args: tuple[str, ...] = ()
    acl: bool = False
    #: A third worker joins right after the event.
    joiner: bool = False


def _clear(lab: Lab) -> None:
    bloomdupe_clear(lab.server.url)


EVENTS: dict[str, Event] = {
    "oom-passing": Event(
        "maxmemory reached (noeviction) for 2 s, then raised", _fill_memory,
        _give_memory_back, fix_after=2.0),
    "oom-lasting": Event(
        f"maxmemory reached (noeviction) past BLOOMDUPE_OUTAGE_TIMEOUT={OUTAGE_TIMEOUT:g}",
        _fill_memory, _give_memory_back),
    "allkeys-lru-at-start": Event(
        "maxmemory-policy allkeys-lru before the crawl", lambda lab: None, None,
        redis_args=("--maxmemory-policy", "allkeys-lru")),
    "allkeys-lru-mid-crawl": Event(
        "maxmemory-policy set to allkeys-lru mid-crawl",
        lambda lab: lab.admin.config_set("maxmemory-policy", "allkeys-lru"),
        lambda lab: lab.admin.config_set("maxmemory-policy", "noeviction")),
    "volatile-lru-squeezed": Event(
        "maxmemory-policy volatile-lru, maxmemory reached for 2 s", _fill_memory,
        _give_memory_back, fix_after=2.0, redis_args=("--maxmemory-policy", "volatile-lru")),
    "restart-empty": Event("Redis restarted without persistence", _restart_empty, _clear),
    "flushdb": Event("FLUSHDB mid-crawl", lambda lab: lab.admin.flushdb(), _clear),
    "meta-deleted-then-join": Event(
        ":meta deleted, then one more worker joins",
        lambda lab: lab.admin.delete(keys.meta(KEY)), _clear, joiner=True),
    "shard-deleted": Event(
        "one shard deleted", lambda lab: lab.admin.delete(keys.bits(KEY, 0)), _clear),
    "acl-revoked-zadd": Event(
        "ACL: zadd taken away mid-crawl",
        lambda lab: lab.set_acl([c for c in ACL_COMMANDS if c != "zadd"]),
        lambda lab: lab.set_acl(ACL_COMMANDS), acl=True),
}
#: ACL rows: the crawl's user lacks one command from the start.
ACL_LACKING = ("get", "mget", "bitfield", "zadd", "del", "zrange")
for _command in ACL_LACKING:
    EVENTS[f"acl-lacking-{_command}"] = Event(
        f"ACL lacking {_command} from the start",
        lambda lab, c=_command: lab.set_acl([x for x in ACL_COMMANDS if x != c]),  # type: ignore[misc]
        None, acl=True)


def run_row(name: str, out: Path) -> Row:
    event = EVENTS[name]
    out.mkdir(parents=True, exist_ok=True)
    row = Row(name, event.what)
    started = time.monotonic()
    lab = Lab(out, acl=event.acl, redis_args=event.redis_args)
    try:
        at_start = name.startswith("acl-lacking") or name.endswith("-at-start")
        if at_start:
            event.act(lab)
            row.phases.append(finish(lab.workers(1), timeout=180))
            row.fetched_first = lab.fetched()
            if event.acl:
                lab.set_acl(ACL_COMMANDS)
            else:
                lab.admin.config_set("maxmemory-policy", "noeviction")
        else:
            crew = lab.workers(2)
            lab.wait_fetched(lab.pages // 4, crew)
            event.act(lab)
            if event.joiner:
                crew += lab.workers(1)
            if event.fix_after is not None and event.fix is not None:
                time.sleep(event.fix_after)
                event.fix(lab)
            row.phases.append(finish(crew))
            row.fetched_first = lab.fetched()
            if event.fix is not None and event.fix_after is None:
                event.fix(lab)
        if any(code != 0 for code in row.phases[0].exit_codes):
            row.phases.append(finish(lab.workers(2)))  # after the operator's fix
        fetches = lab.site.stats()["fetches"]
        row.never_fetched = sum(1 for n in fetches if n == 0)
        row.fetched_twice = sum(1 for n in fetches if n > 1)
    finally:
        lab.close()
    row.seconds = round(time.monotonic() - started, 1)
    return row


def table(rows: list[Row]) -> str:
    lines = ["| event | phase 1 exit codes | said why | pages twice | pages never "
             "| after the fix | silent |",
             "|---|---|---|---:|---:|---|---|"]
    for r in rows:
        first = r.phases[0]
        why = first.errors[0] if first.errors else "-"
        why = why.split("] ", 1)[-1][:90]
        after = (f"exit {r.phases[1].exit_codes}" if len(r.phases) > 1 else "-")
        lines.append(f"| {r.event} | {first.exit_codes} | {why} | {r.fetched_twice} | "
                     f"{r.never_fetched} | {after} | {'YES' if r.silent else 'no'} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="*", help="rows to run (default: all)")
    parser.add_argument("--list", action="store_true", help="name the rows and exit")
    parser.add_argument("--json", type=Path, help="write every row's figures here")
    opts = parser.parse_args(argv)
    if opts.list:
        for name, event in EVENTS.items():
            print(f"{name}: {event.what}")
        return 0
    names = opts.rows or list(EVENTS)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bloomdupe-operator-") as tmp:
        for name in names:
            row = run_row(name, Path(tmp) / name)
            rows.append(row)
            print(f"{name}: {row.seconds}s, twice {row.fetched_twice}, never "
                  f"{row.never_fetched}, exits {[p.exit_codes for p in row.phases]}",
                  file=sys.stderr, flush=True)
    print(table(rows))
    if opts.json:
        opts.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 1 if any(r.silent for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
