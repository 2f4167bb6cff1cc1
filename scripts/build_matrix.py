#!/usr/bin/env python
"""Every earlier build of this package against this one, on one crawl, with real
``scrapy crawl`` workers: ``python scripts/build_matrix.py`` (docs/upgrading.md).

Each earlier build is a git worktree with its own venv, ``/work/old/<hash>`` (``--old``)::

    git worktree add /work/old/<hash> <hash>
    python3 -m venv /work/old/<hash>/.venv
    /work/old/<hash>/.venv/bin/pip install -e /work/old/<hash>

Each build's worker runs its own ``example_project`` (``scrapy crawl site``) against one
local demo site (this tree's) and one throwaway Redis, flushed between runs. For each
earlier build four runs, each with a fresh site and Redis:

``upgrade``   the earlier build crawls part of the site and stops (SIGTERM); this build
              then finishes the crawl.
``rollback``  this build crawls part of the site and stops; the earlier build starts on
              its state; then this build again, to finish what is left.
``old live``  the earlier build crawls; this build starts beside it; the earlier build
              goes on to its end.
``new live``  this build crawls; the earlier build starts beside it; this build goes on.

The table gives each run's pages fetched and never fetched (when the phases are over),
pages fetched twice, each phase's exit code (``hung`` for a worker stopped after
``--timeout``) and the CRITICAL line of a worker that refused. What must hold: no exit
0 with pages left, no hang, never fetched 0 at the end.

``--fixtures DIR`` instead writes, for each earlier build, the crawl's state in Redis as
that build leaves it mid-crawl, with its worker still live (``DIR/<hash>.json``: every
key, its type and value, the binary ones base64): the fixtures of
``tests/test_builds.py``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from harness.processes import start_site  # noqa: E402

from scrapy_bloomdupe.testing import RedisServer  # noqa: E402

#: The builds landed since 2026-11-27 (the last commit of stops 40 to 46), oldest first.
BUILDS = ["af26940", "2c7473c", "1c6922c", "a0e426e", "89d58dd", "14eaab8", "68cfe88"]
NEW = "this"
SCENARIOS = ["upgrade", "rollback", "old live", "new live"]
CRITICAL = re.compile(r"\] CRITICAL: (.*)")


@dataclass
class Build:
    name: str
    root: Path

    @property
    def python(self) -> Path:
        return self.root / ".venv" / "bin" / "python"


@dataclass
class Phase:
    build: str
    code: int | str = "-"
    refusal: str = ""


@dataclass
class Run:
    old: str
    scenario: str
    phases: list[Phase] = field(default_factory=list)
    fetched: int = 0
    never: int = 0
    twice: int = 0
    pages: int = 0


class Crawl:
    """One run's site and Redis, and the workers started on them."""

    def __init__(self, args: argparse.Namespace, server: RedisServer, out: Path) -> None:
        self.args, self.server, self.out = args, server, out
        self.client = redis.Redis.from_url(server.url)
        self.client.flushall()
        out.mkdir(parents=True, exist_ok=True)
        self.site = start_site(out, pages=args.pages, delay=args.site_delay)
        self.count = 0
        self.processes: list[subprocess.Popen[bytes]] = []

    def fetches(self) -> list[int]:
        fetches: list[int] = self.site.stats()["fetches"]
        return fetches

    def start(self, build: Build) -> tuple[subprocess.Popen[bytes], Path]:
        self.count += 1
        log = self.out / f"{self.count}-{build.name}.log"
        settings = {"REDIS_URL": self.server.url, "DEMO_SITE_URL": self.site.url,
                    "LOG_FILE": str(log), "LOG_LEVEL": "INFO",
                    "CONCURRENT_REQUESTS": str(self.args.concurrency),
                    "BLOOMDUPE_LEASE_TIMEOUT": str(self.args.lease_timeout),
                    "BLOOMDUPE_DONE_GRACE": "1", "SCHEDULER_PERSIST": "True",
                    "DEMO_STATS_FILE": str(self.out / f"{self.count}.stats.json")}
        command = [str(build.python), "-m", "scrapy", "crawl", "site"]
        for name, value in settings.items():
            command += ["-s", f"{name}={value}"]
        output = (self.out / f"{self.count}-{build.name}.out").open("wb")
        process = subprocess.Popen(command, cwd=build.root / "example_project", stdout=output,
                                   stderr=subprocess.STDOUT,
                                   env={**os.environ, "REDIS_URL": self.server.url})
        output.close()
        self.processes.append(process)
        return process, log

    def until_fetched(self, share: float, process: subprocess.Popen[bytes]) -> None:
        """Wait until ``share`` of the pages were fetched (or the worker exited)."""
        deadline = time.monotonic() + self.args.timeout
        while time.monotonic() < deadline and process.poll() is None:
            if sum(1 for n in self.fetches() if n) >= share * self.args.pages:
                return
            time.sleep(0.1)

    def finish(self, process: subprocess.Popen[bytes], log: Path, build: str, *,
               stop: bool = False) -> Phase:
        """The worker's exit (SIGTERM first with ``stop``), ``hung`` past the timeout."""
        if stop and process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            code: int | str = process.wait(self.args.timeout)
        except subprocess.TimeoutExpired:
            code = "hung"
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        text = log.read_text(errors="replace") if log.exists() else ""
        found = CRITICAL.findall(text)
        return Phase(build, code, found[0] if found else "")

    def close(self) -> None:
        for process in self.processes:  # only what this crawl started, by its Popen
            if process.poll() is None:
                process.kill()
                process.wait()
        self.site.stop()
        self.client.close()


def run_one(args: argparse.Namespace, server: RedisServer, old: Build, new: Build,
            scenario: str) -> Run:
    crawl = Crawl(args, server, args.out / old.name / scenario.replace(" ", "-"))
    run = Run(old.name, scenario, pages=args.pages)
    try:
        first, second = (old, new) if scenario in ("upgrade", "old live") else (new, old)
        process, log = crawl.start(first)
        crawl.until_fetched(args.share, process)
        if scenario in ("upgrade", "rollback"):
            run.phases.append(crawl.finish(process, log, first.name, stop=True))
            later, later_log = crawl.start(second)
            run.phases.append(crawl.finish(later, later_log, second.name))
        else:  # both live: the second starts while the first crawls
            later, later_log = crawl.start(second)
            run.phases.append(crawl.finish(later, later_log, second.name))
            run.phases.insert(0, crawl.finish(process, log, first.name))
        if scenario == "rollback" and any(n == 0 for n in crawl.fetches()):
            # What the earlier build left: this build finishes it (nothing may be lost).
            last, last_log = crawl.start(new)
            run.phases.append(crawl.finish(last, last_log, new.name))
        fetches = crawl.fetches()
        run.fetched = sum(1 for n in fetches if n)
        run.never = sum(1 for n in fetches if n == 0)
        run.twice = sum(1 for n in fetches if n > 1)
    finally:
        crawl.close()
    return run


def dump(client: redis.Redis) -> dict[str, Any]:
    """Every key of the database: its type and value (bytes as base64)."""
    def b64(value: bytes) -> str:
        return base64.b64encode(value).decode()
    found: dict[str, Any] = {}
    for name in sorted(client.scan_iter(count=1000)):
        kind = client.type(name).decode()
        value: Any
        if kind == "string":
            value = b64(client.get(name) or b"")
        elif kind == "hash":
            value = {b64(k): b64(v) for k, v in client.hgetall(name).items()}
        elif kind == "zset":
            value = [[b64(m), s] for m, s in client.zrange(name, 0, -1, withscores=True)]
        elif kind == "list":
            value = [b64(v) for v in client.lrange(name, 0, -1)]
        elif kind == "set":
            value = sorted(b64(v) for v in client.smembers(name))
        else:  # a stream (the failed record): not part of what a start reads
            continue
        found[b64(name)] = {"type": kind, "value": value}
    return found


def write_fixture(args: argparse.Namespace, server: RedisServer, old: Build) -> Path:
    """The state ``old`` 's worker leaves mid-crawl, taken while it is live."""
    crawl = Crawl(args, server, args.out / old.name / "fixture")
    try:
        process, log = crawl.start(old)
        crawl.until_fetched(args.share, process)
        time.sleep(1.0)  # a heartbeat or two
        keys = dump(crawl.client)
        now = crawl.client.time()
        crawl.finish(process, log, old.name, stop=True)
    finally:
        crawl.close()
    commit = subprocess.run(["git", "-C", str(old.root), "rev-parse", "HEAD"],
                            capture_output=True, text=True, check=True).stdout.strip()
    path = args.fixtures / f"{old.name}.json"
    path.write_text(json.dumps({"build": commit, "taken_ms": now[0] * 1000 + now[1] // 1000,
                                **reads(old.root), "keys": keys}, indent=0, sort_keys=True)
                    + "\n")
    return path


def reads(root: Path) -> dict[str, int | None]:
    """What a build reads, from its source: the filter's format versions up to
    (``meta_reads``), and the state's format records up to (``format_reads``; None for
    a build that reads no record)."""
    package = root / "scrapy_bloomdupe"
    version = re.search(r"^FORMAT_VERSION = (\d+)", (package / "bloom" / "meta.py").read_text(),
                        re.MULTILINE)
    entry = package / "frontier" / "entry.py"
    text = entry.read_text() if entry.exists() else ""
    record = re.search(r"^FORMAT = (\d+)", text, re.MULTILINE)
    assert version is not None, root
    return {"meta_reads": int(version.group(1)),
            "format_reads": int(record.group(1)) if record and "def claim_format" in text
            else None}


def table(runs: list[Run]) -> str:
    rows = ["| earlier build | run | pages fetched | never fetched | fetched twice | exit "
            "codes, in order | refusal (CRITICAL line) |", "|---|---|---:|---:|---:|---|---|"]
    for run in runs:
        codes = ", ".join(f"{p.build} {p.code}" for p in run.phases)
        refusals = " / ".join(f"{p.build}: {p.refusal}" for p in run.phases if p.refusal)
        rows.append(f"| {run.old} | {run.scenario} | {run.fetched}/{run.pages} | "
                    f"{run.never} | {run.twice} | {codes} | {refusals or '-'} |")
    return "\n".join(rows)


def failures(runs: list[Run]) -> list[str]:
    """What must not happen: a hang, an exit 0 with pages left, pages never fetched."""
    found = []
    for run in runs:
        where = f"{run.old} {run.scenario}"
        if any(p.code == "hung" for p in run.phases):
            found.append(f"{where}: a worker hung")
        if run.never:
            found.append(f"{where}: {run.never} page(s) never fetched")
        if run.scenario in ("old live", "new live"):
            joined = run.phases[1]
            if joined.code == 0 and run.phases[0].code == 0 and run.never:
                found.append(f"{where}: exit 0 with pages left")
    return found


def say(text: str, *, err: bool = False) -> None:
    """A line of the script's output."""
    stream = sys.stderr if err else sys.stdout
    stream.write(text + "\n")
    stream.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, default=Path("/work/old"),
                        help="where the earlier builds' worktrees are (default /work/old)")
    parser.add_argument("--builds", nargs="*", default=BUILDS,
                        help="the earlier builds, by their worktree's name")
    parser.add_argument("--scenarios", nargs="*", default=SCENARIOS, choices=SCENARIOS)
    parser.add_argument("--pages", type=int, default=300)
    parser.add_argument("--site-delay", type=float, default=0.03,
                        help="seconds the site takes a page")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--share", type=float, default=0.3,
                        help="share of the pages fetched before the second build starts")
    parser.add_argument("--lease-timeout", type=float, default=4.0)
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds a worker may take before it counts as hung")
    parser.add_argument("--out", type=Path, default=None, help="logs (default: a temp dir)")
    parser.add_argument("--fixtures", type=Path, default=None,
                        help="write each build's mid-crawl state here instead")
    args = parser.parse_args(argv)
    # Stopped: what it started (Redis, the site, workers) is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.out = args.out or Path(tempfile.mkdtemp(prefix="build-matrix-"))
    new = Build(NEW, ROOT)
    olds = [Build(name, args.old / name) for name in args.builds]
    missing = [str(b.python) for b in [new, *olds] if not b.python.exists()]
    if missing:
        say(f"build_matrix: no venv at {', '.join(missing)} (see the docstring)", err=True)
        return 2
    runs: list[Run] = []
    with RedisServer(maxmemory="256mb") as server:
        for old in olds:
            if args.fixtures is not None:
                args.fixtures.mkdir(parents=True, exist_ok=True)
                say(f"{old.name}: {write_fixture(args, server, old)}")
                continue
            for scenario in args.scenarios:
                run = run_one(args, server, old, new, scenario)
                runs.append(run)
                say(table([run]).splitlines()[-1])
    if args.fixtures is not None:
        return 0
    say(f"\nlogs: {args.out}\n")
    say(table(runs))
    bad = failures(runs)
    for line in bad:
        say(f"FAILED: {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
