#!/usr/bin/env python
"""A real site crawled to its end beside scrapy-redis: worker CPU a page, the crawl's end.

``python benchmarks/docs_crawl.py`` (``--help`` for the options; the doc set:
``apt-get install -y python-django-doc``): the CrawlSpider of ``benchmarks/docsite``
over a directory of HTML served locally, ``--workers`` ``scrapy crawl`` processes a
contender, each crawl run until every worker has exited by itself. It prints, a
contender: pages fetched (and any twice), the workers' CPU time a page (user + system,
start-up included, from the kernel's accounting of the reaped processes), and the
crawl's end: from the site's last page until the last worker has exited.
docs/benchmarks.md (A real site to its end) has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import sys
import time
from pathlib import Path
from typing import Any

from frontier_crawl import ADDON, DOC_SETS, DOCSITE, HERE, SPIDER
from harness.processes import Worker, start_server, start_worker
from report import median_rounds, progress, table

from scrapy_bloomdupe.testing import RedisServer

CPU_CLOCK = {"harness.cpu_clock.CpuClock": 0}
CONTENDERS: dict[str, dict[str, str]] = {
    "bloomdupe": {"ADDONS": ADDON, "EXTENSIONS": json.dumps(CPU_CLOCK)},
    "bloomdupe crawl": {"ADDONS": ADDON, "BLOOMDUPE_POLITENESS": "crawl",
                        "EXTENSIONS": json.dumps(CPU_CLOCK)},
    "scrapy-redis": {
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
        # Keeps a worker whose first look finds the shared queue empty (3 s, as this
        # package's BLOOMDUPE_DONE_GRACE).
        "EXTENSIONS": json.dumps({"harness.wait_for_queue.WaitForSharedQueue": 510,
                                  **CPU_CLOCK}),
    },
}


def children_cpu() -> float:
    """User + system seconds of every reaped child of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_for_exits(workers: list[Worker], timeout: float) -> dict[int, float]:
    """Each worker's exit time (time.time()), polled every 20 ms, until all have exited."""
    exits: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while len(exits) < len(workers):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the crawl did not end in {timeout:.0f} s\n"
                               + "\n".join(w.tail(10) for w in workers))
        for worker in workers:
            if worker.index not in exits and worker.process.poll() is not None:
                exits[worker.index] = time.time()
        time.sleep(0.02)
    return exits


def one_crawl(name: str, args: argparse.Namespace, round_: int) -> dict[str, Any]:
    directory = args.out / f"{re.sub(r'[^a-z0-9]+', '-', name.lower())}-{round_}"
    directory.mkdir(parents=True, exist_ok=True)
    with RedisServer(maxmemory=args.maxmemory) as server:
        site = start_server(["docspider.site", "--root", str(args.docs), "--delay",
                             str(args.page_delay)], directory, cwd=DOCSITE)
        workers: list[Worker] = []
        try:
            settings = {"REDIS_URL": server.url, "DOCSITE_URL": site.url,
                        "LOG_LEVEL": "INFO", **CONTENDERS[name]}
            cpu_before = children_cpu()
            started = time.time()
            workers = [start_worker(i, directory, {**settings, "CPU_CLOCK_FILE": str(
                directory / f"worker-{i}.cpu.json")}, project=DOCSITE, spider=SPIDER)
                for i in range(args.workers)]
            exits = wait_for_exits(workers, args.timeout)
            cpu = children_cpu() - cpu_before
            stats = site.stats()
        finally:
            for worker in workers:
                worker.close()
            site.stop()
    codes = [w.process.returncode for w in workers]
    clocks = [json.loads((directory / f"worker-{w.index}.cpu.json").read_text())
              for w in workers]
    errors = sum(len(w.log_lines(r"\] ERROR:|\] CRITICAL:")) for w in workers)
    last = float(stats["last"] or started)
    row = {"name": name, "round": round_, "pages": int(stats["pages"]),
           "unique": int(stats["unique"]), "cpu": cpu,
           "crawl_cpu": sum(c["closed"] - c["opened"] for c in clocks),
           "crawl": last - started,
           "end": max(exits.values()) - last, "first_exit": min(exits.values()) - last,
           "codes": codes, "errors": errors, "logs": str(directory)}
    progress(f"  {name}: {row['pages']} pages ({row['unique']} unique), worker CPU "
             f"{cpu:.1f} s ({row['crawl_cpu']:.1f} s open to close), crawl "
             f"{row['crawl']:.1f} s, end {row['end']:.2f} s, "
             f"exit codes {codes}, {errors} ERROR lines")
    return row


def cpu_a_page(row: dict[str, Any]) -> float:
    """The workers' CPU ms a page, from spider open to close."""
    return 1000 * float(row["crawl_cpu"]) / row["pages"] if row["pages"] else float("inf")


def process_cpu_a_page(row: dict[str, Any]) -> float:
    """The workers' CPU ms a page, whole processes (start-up and exit included)."""
    return 1000 * float(row["cpu"]) / row["pages"] if row["pages"] else float("inf")


def report(rows: list[dict[str, Any]], args: argparse.Namespace, seconds: float) -> str:
    by_cpu = {r["name"]: r for r in median_rounds(rows, lambda r: r["name"], cpu_a_page)}
    by_end = {r["name"]: r for r in median_rounds(rows, lambda r: r["name"],
                                                  lambda r: float(r["end"]))}
    theirs_cpu = by_cpu.get("scrapy-redis")
    theirs_end = by_end.get("scrapy-redis")
    body = []
    for name, r in by_cpu.items():
        e = by_end[name]
        each_cpu = ", ".join(f"{x:.1f}" for x in r["rounds"])
        each_end = ", ".join(f"{x:.2f}" for x in e["rounds"])
        body.append([
            name, r["pages"], r["pages"] - r["unique"], f"{cpu_a_page(r):.1f} ({each_cpu})",
            f"{cpu_a_page(r) / cpu_a_page(theirs_cpu):.2f}" if theirs_cpu else "",
            f"{process_cpu_a_page(r):.1f}",
            f"{process_cpu_a_page(r) / process_cpu_a_page(theirs_cpu):.2f}"
            if theirs_cpu else "",
            f"{r['crawl']:.1f}", f"{e['end']:.2f} ({each_end})",
            f"{e['end'] - theirs_end['end']:+.2f}" if theirs_end else "",
            " ".join(map(str, r["codes"])), r["errors"]])
    header = ["contender", "pages", "fetched twice", "worker CPU a page, spider open to "
              "close, ms (median; each round)", "x scrapy-redis's",
              "whole processes, ms", "x scrapy-redis's", "start to last page, s",
              "last page to last exit, s (median; each round)", "- scrapy-redis's, s",
              "exit codes", "ERROR lines"]
    return "\n".join([
        f"`python benchmarks/docs_crawl.py --workers {args.workers} --page-delay "
        f"{args.page_delay:g} --repeat {args.repeat}`: {args.docs} served on 127.0.0.1, "
        f"crawled to its end by {args.workers} workers a contender; "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}, {seconds:.0f} s", "",
        table(header, body), "", "Issue 48's goals: worker CPU a page at most 1.1x "
        "scrapy-redis's; the crawl's end at most scrapy-redis's + 1 s."])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--page-delay", type=float, default=0.02,
                        help="seconds before the site answers a page")
    parser.add_argument("--docs", type=Path,
                        default=next((d for d in DOC_SETS if (d / "index.html").exists()), None),
                        help="the HTML to crawl (default: python-django-doc's, else "
                             "python3-doc's)")
    parser.add_argument("--contenders", default=",".join(CONTENDERS),
                        help="comma-separated, of: " + ", ".join(CONTENDERS))
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds a contender's crawl may take to end")
    parser.add_argument("--maxmemory", default="256mb", help="each Redis's cap")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "docs_crawl",
                        help="the workers' logs, a folder a contender")
    parser.add_argument("--repeat", type=int, default=2,
                        help="rounds of every contender, in turn")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.docs is None or not (args.docs / "index.html").exists():
        parser.error(f"no doc set at {args.docs}: apt-get install -y python-django-doc "
                     "(or give --docs DIR)")
    names = [n.strip() for n in args.contenders.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown:
        parser.error(f"unknown contender(s) {unknown}; known: {list(CONTENDERS)}")
    # The workers import the scrapy-redis contender's extension from the harness; each
    # is its own process (not forked from the tests' zygote), so that the kernel counts
    # its CPU time, start-up included, as this process's child's.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(HERE.parent / "tests"), os.environ.get("PYTHONPATH")]))
    os.environ["BLOOMDUPE_TEST_EXEC"] = "1"
    started = time.monotonic()
    rows = [one_crawl(name, args, round_) for round_ in range(args.repeat) for name in names]
    print(report(rows, args, time.monotonic() - started))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
