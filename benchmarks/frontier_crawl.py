#!/usr/bin/env python
"""A real crawl's frontier: Redis bytes a waiting or leased request, against scrapy-redis.

``python benchmarks/frontier_crawl.py`` (``--help`` for the options; the doc set:
``apt-get install -y python-django-doc``): a CrawlSpider (``benchmarks/docsite``) over
a directory of HTML, every worker SIGKILLed once the site has answered ``--pages``
pages, then ``MEMORY USAGE`` of every key but the filter's over the requests the
frontier holds. How, and the figures: docs/capacity.md (A real crawl's frontier).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from e2e import ROOT
from harness.processes import Site, Worker, start_server, start_worker
from report import median_rounds, progress, table

from scrapy_bloomdupe import keys
from scrapy_bloomdupe.bloom import meta
from scrapy_bloomdupe.frontier.queue import status
from scrapy_bloomdupe.testing import RedisServer

HERE = ROOT / "benchmarks"
DOCSITE = HERE / "docsite"
DOC_SETS = (Path("/usr/share/doc/python-django-doc/html"),
            Path("/usr/share/doc/python3-doc/html"))
SPIDER = "docs"
#: BLOOMDUPE_KEY's default for the spider; scrapy-redis's keys for it.
KEY = f"{SPIDER}:bloomdupe"
SCRAPY_REDIS_QUEUE = f"{SPIDER}:requests"
SCRAPY_REDIS_FILTER = f"{SPIDER}:dupefilter"
ADDON = json.dumps({"scrapy_bloomdupe.addon.BloomDupeAddon": 100})
CONTENDERS: dict[str, dict[str, str]] = {
    **{f"bloomdupe {mode}": {"ADDONS": ADDON, "BLOOMDUPE_POLITENESS": mode,
                             "BLOOMDUPE_CAPACITY": "100000"} for mode in ("worker", "crawl")},
    "scrapy-redis": {
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
        # Keeps a worker whose first look finds the shared queue empty.
        "EXTENSIONS": json.dumps({"harness.wait_for_queue.WaitForSharedQueue": 510}),
    },
}
#: The filter's keys of this package: ``{K:i}:bits``, ``{K:i}:bf`` and their
#: generations and slices (keys.py), and ``K:meta``.
BLOOM_FILTER_KEY = re.compile(r"^\{" + re.escape(KEY) + r":\d+\}:(bits|bf)(:.*)?$")
TYPES = {"list": "lists", "hash": "hashes", "zset": "sorted sets", "string": "strings"}


def is_bloom_filter_key(name: str) -> bool:
    return name == keys.meta(KEY) or BLOOM_FILTER_KEY.match(name) is not None


def wait_for_pages(site: Site, workers: list[Worker], timeout: float) -> None:
    """Until the site says it has answered the pages it was told to count."""
    assert site.process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([site.process.stdout], [], [], 0.2)[0]:
            line = site.process.stdout.readline().decode()
            if line.startswith("reached"):
                return
            raise RuntimeError(f"the doc site stopped: {line!r}")
        exited = [w for w in workers if w.process.poll() is not None]
        if exited:
            raise RuntimeError(f"{exited[0].name} exited ({exited[0].process.returncode}) "
                               f"before the kill\n{exited[0].tail()}")
    raise RuntimeError(f"the site did not answer its pages in {timeout:.0f} s\n"
                       + "\n".join(w.tail(10) for w in workers))


def frontier_bytes(client: redis.Redis, is_filter: Callable[[str], bool]
                   ) -> tuple[dict[str, tuple[int, int]], int]:
    """({key type: (keys, bytes)} of every key but the filter's, the filter's bytes)."""
    by_type: dict[str, tuple[int, int]] = {}
    filter_bytes = 0
    for key in client.scan_iter(count=1000):
        size = int(client.execute_command("MEMORY USAGE", key, "SAMPLES", 0) or 0)
        if is_filter(key.decode(errors="replace")):
            filter_bytes += size
            continue
        kind = client.type(key).decode()
        count, total = by_type.get(kind, (0, 0))
        by_type[kind] = (count + 1, total + size)
    return by_type, filter_bytes


def requests_held(name: str, client: redis.Redis) -> tuple[int, int]:
    """(waiting, leased) in the contender's frontier."""
    if name == "scrapy-redis":
        return int(client.zcard(SCRAPY_REDIS_QUEUE)), 0
    shards = int(meta.read(client, KEY).get("shards", 1) or 1)
    return status(client, KEY, shards)


def one_crawl(name: str, args: argparse.Namespace, round_: int) -> dict[str, Any]:
    directory = args.out / f"{re.sub(r'[^a-z0-9]+', '-', name.lower())}-{round_}"
    directory.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with RedisServer(maxmemory=args.maxmemory) as server:
        site = start_server(["docspider.site", "--root", str(args.docs), "--delay",
                             str(args.page_delay), "--notify", str(args.pages)],
                            directory, cwd=DOCSITE)
        workers: list[Worker] = []
        try:
            common = {"REDIS_URL": server.url, "DOCSITE_URL": site.url,
                      "SCHEDULER_PERSIST": "True", "LOG_LEVEL": "INFO"}
            workers = [start_worker(i, directory, {**common, **CONTENDERS[name]},
                                    project=DOCSITE, spider=SPIDER) for i in range(args.workers)]
            wait_for_pages(site, workers, args.timeout)
            for worker in workers:
                worker.process.kill()  # SIGKILL, by its PID
            for worker in workers:
                worker.process.wait()
            pages = int(site.stats()["pages"])
        finally:
            for worker in workers:
                worker.close()
            site.stop()
        with redis.Redis.from_url(server.url) as client:
            is_filter = ((lambda k: k == SCRAPY_REDIS_FILTER) if name == "scrapy-redis"
                         else is_bloom_filter_key)
            by_type, filter_bytes = frontier_bytes(client, is_filter)
            waiting, leased = requests_held(name, client)
            version = str(client.info("server")["redis_version"])
    total = sum(b for _, b in by_type.values())
    progress(f"  {name}: {pages} pages, {waiting + leased} requests ({waiting} waiting, "
             f"{leased} leased), {total:,} bytes, {time.monotonic() - started:.0f} s")
    return {"name": name, "round": round_, "pages": pages, "waiting": waiting,
            "leased": leased, "requests": waiting + leased, "bytes": total,
            "by_type": by_type, "filter_bytes": filter_bytes, "redis": version,
            "logs": str(directory)}


def per_request(row: dict[str, Any]) -> float:
    return float(row["bytes"]) / row["requests"] if row["requests"] else float("inf")


def report(rows: list[dict[str, Any]], args: argparse.Namespace, seconds: float) -> str:
    repeated = args.repeat > 1
    rows = median_rounds(rows, lambda r: r["name"], per_request)
    theirs = next((r for r in rows if r["name"] == "scrapy-redis" and r["requests"]), None)
    kinds = [*TYPES, *sorted({k for r in rows for k in r["by_type"]} - set(TYPES))]
    header = ["contender", "pages at the kill", "waiting", "leased", "requests",
              "frontier bytes", "bytes a request" + (" (median; each round)" if repeated
                                                     else ""), "x scrapy-redis's",
              *(f"{TYPES.get(k, k)} (keys)" for k in kinds)]
    body = []
    for r in rows:
        per = per_request(r) if r["requests"] else None
        each = (" (" + ", ".join(f"{x:.0f}" for x in r["rounds"]) + ")") if repeated else ""
        body.append([r["name"], r["pages"], r["waiting"], r["leased"], r["requests"],
                     f"{r['bytes']:,}", "" if per is None else f"{per:.0f}{each}",
                     f"{per / per_request(theirs):.2f}" if per is not None and theirs else "",
                     *(f"{r['by_type'][k][1]:,} ({r['by_type'][k][0]})" if k in r["by_type"]
                       else "0" for k in kinds)])
    return "\n".join([
        f"`python benchmarks/frontier_crawl.py --pages {args.pages} --workers {args.workers} "
        f"--page-delay {args.page_delay:g}" + (f" --repeat {args.repeat}" if repeated else "")
        + f"`: {args.docs} served on 127.0.0.1, every worker SIGKILLed once the site had "
        f"answered {args.pages} pages; Redis {rows[0]['redis'] if rows else '?'}; "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}, {seconds:.0f} s", "",
        table(header, body), "", "Left out as the filter's: "
        + ", ".join(f"{r['name']} {r['filter_bytes']:,} bytes" for r in rows)
        + ". Issue 39's target: at most 150 bytes a request, and at most 1/3 of "
        "scrapy-redis's."])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=150,
                        help="pages the site answers before every worker is SIGKILLed")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--page-delay", type=float, default=0.3,
                        help="seconds before the site answers a page")
    parser.add_argument("--docs", type=Path,
                        default=next((d for d in DOC_SETS if (d / "index.html").exists()), None),
                        help="the HTML to crawl (default: python-django-doc's, else "
                             "python3-doc's)")
    parser.add_argument("--contenders", default=",".join(CONTENDERS),
                        help="comma-separated, of: " + ", ".join(CONTENDERS))
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a contender's crawl may take to reach --pages")
    parser.add_argument("--maxmemory", default="256mb", help="each Redis's cap")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "frontier_crawl",
                        help="the workers' logs, a folder a contender")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of every contender, in turn; the table shows each "
                             "contender's round with the median bytes a request")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.docs is None or not (args.docs / "index.html").exists():
        parser.error(f"no doc set at {args.docs}: apt-get install -y python-django-doc "
                     "(or give --docs DIR)")
    names = [n.strip() for n in args.contenders.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown:
        parser.error(f"unknown contender(s) {unknown}; known: {list(CONTENDERS)}")
    # The workers import the scrapy-redis contender's extension from the harness.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")]))
    started = time.monotonic()
    rows = [one_crawl(name, args, round_) for round_ in range(args.repeat) for name in names]
    print(report(rows, args, time.monotonic() - started))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
