"""Processes of the example project that tests, benchmarks and the demo run alike: the
demo site (``python -m demo.site``) and ``scrapy crawl site`` workers, started from
``example_project`` and stopped by their own ``Popen`` (never by name)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from harness import zygote

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "example_project"
SPIDER = "site"
CRAWLED = b"DEBUG: Crawled ("


def stop(process: subprocess.Popen[bytes] | zygote.Forked, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL: only the process we started, by its Popen."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class Site:
    process: subprocess.Popen[bytes]
    url: str
    port: int

    def stats(self) -> dict[str, Any]:
        return site_stats(self.url)

    def stop(self) -> None:
        stop(self.process)
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_site(out: Path, *, pages: int, seed: int = 2024, delay: float = 0.0,
               failing: int = 0, port: int = 0, hosts: int = 1, throttle: int = 0,
               timeout: float = 30.0) -> Site:
    """``python -m demo.site`` (cwd example_project); ``port`` 0 picks a free one."""
    return start_server(
        ["demo.site", "--port", str(port), "--pages", str(pages), "--seed", str(seed),
         "--delay", str(delay), "--failing", str(failing), "--hosts", str(hosts),
         "--throttle", str(throttle)], out, timeout=timeout)


def start_server(args: list[str], out: Path, *, cwd: Path = PROJECT,
                 timeout: float = 30.0) -> Site:
    """``python -m <args>`` (cwd ``cwd``), a site that prints ``... at http://...`` once
    it listens; its errors in ``out/site.err``.

    A port just freed by a previous site may still be taken for a moment: tried
    again until ``timeout``."""
    deadline = time.monotonic() + timeout
    for attempt in itertools.count(1):
        err = out / f"site-{attempt}.err" if attempt > 1 else out / "site.err"
        with err.open("ab") as err_file:
            process = subprocess.Popen([sys.executable, "-m", *args], cwd=cwd,
                                       stdout=subprocess.PIPE, stderr=err_file)
        assert process.stdout is not None
        line = process.stdout.readline().decode()  # "Demo site with N pages at http://..."
        match = re.search(r"at (http://\S+)", line)
        if match:
            url = match.group(1)
            return Site(process, url, urlsplit(url).port or 80)
        stop(process)
        process.stdout.close()
        if time.monotonic() > deadline or "Address already in use" not in err.read_text():
            raise RuntimeError(f"the site {args[0]} did not start: {line!r}\n"
                               + err.read_text(errors="replace")[-2000:])
        time.sleep(0.5)
    raise AssertionError("unreachable")


def site_stats(site_url: str) -> dict[str, Any]:
    with urllib.request.urlopen(site_url + "__stats", timeout=10) as reply:
        result: dict[str, Any] = json.load(reply)
        return result


@dataclass
class Worker:
    """One ``scrapy crawl site`` process, and what its log says it crawled."""

    index: int
    process: subprocess.Popen[bytes] | zygote.Forked  # (forked in the tests)
    log: Path
    stats_file: Path
    output: IO[bytes]
    crawled: int = 0
    last_crawl: float | None = None
    exited_at: float | None = None
    _log_pos: int = 0

    @property
    def name(self) -> str:
        return f"worker-{self.index}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def read_log(self, now: float) -> None:
        """Count the pages this worker's (DEBUG) log says it crawled since last time."""
        try:
            with self.log.open("rb") as f:
                f.seek(self._log_pos)
                chunk = f.read()
        except FileNotFoundError:
            return
        end = chunk.rfind(b"\n") + 1  # whole lines only
        if end:
            new = chunk[:end].count(CRAWLED)
            self._log_pos += end
            if new:
                self.crawled += new
                self.last_crawl = now

    def stats(self) -> dict[str, Any]:
        try:
            result: dict[str, Any] = json.loads(self.stats_file.read_text())
            return result
        except (FileNotFoundError, ValueError):
            return {}

    def log_lines(self, pattern: str) -> list[str]:
        if not self.log.exists():
            return []
        rx = re.compile(pattern)
        return [line for line in self.log.read_text(errors="replace").splitlines()
                if rx.search(line)]

    def tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return f"({self.name} wrote no log)"
        text = self.log.read_text(errors="replace").splitlines()
        text = [line for line in text if CRAWLED.decode() not in line
                and "Scraped from" not in line and not line.startswith(("{", "'"))]
        return f"--- {self.log} (last {lines} lines, crawl lines left out) ---\n" + \
            "\n".join(text[-lines:])

    def dump_stacks(self, lines: int = 120) -> str:
        """A worker still running when it should have exited: SIGABRT, on which Python's
        faulthandler (PYTHONFAULTHANDLER) writes every thread's stack to its output, then
        the end of that output (empty once it has exited)."""
        if self.process.poll() is not None:
            return ""
        self.process.send_signal(signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)
        self.output.flush()
        text = self.log.with_suffix(".out").read_text(errors="replace").splitlines()
        return f"--- {self.name} hung; its threads' stacks ---\n" + "\n".join(text[-lines:])

    def close(self) -> None:
        stop(self.process)
        self.output.close()


def start_worker(index: int, out: Path, settings: dict[str, str], *, project: Path = PROJECT,
                 spider: str = SPIDER) -> Worker:
    """``scrapy crawl site`` (cwd example_project; or ``spider`` of another ``project``)
    with ``-s`` settings, a log file and a stats file (the demo's StatsToJson extension)."""
    log = out / f"worker-{index}.log"
    stats_file = out / f"worker-{index}.stats.json"
    command = [sys.executable, "-m", "scrapy", "crawl", spider]
    for name, value in {**settings, "LOG_FILE": str(log),
                        "DEMO_STATS_FILE": str(stats_file)}.items():
        command += ["-s", f"{name}={value}"]
    output = (out / f"worker-{index}.out").open("wb")
    # faulthandler: a worker that hangs can be made to print every thread's stack
    # (dump_stacks) before it is stopped.
    env = {**os.environ, "REDIS_URL": settings["REDIS_URL"], "PYTHONFAULTHANDLER": "1"}
    process = zygote.popen(command, cwd=project, stdout=output, stderr=subprocess.STDOUT,
                           env=env)
    return Worker(index, process, log, stats_file, output)


