#!/usr/bin/env python
"""The whole scrapy-bloomdupe demo in one command: ``python example_project/run_demo.py``.

It starts Redis (a throwaway ``redis-server`` with AOF persistence, unless
``--redis-url`` or ``$REDIS_URL`` names one), the local demo site
(``demo/site.py``), and ``--workers`` separate ``scrapy crawl site`` processes
that share one crawl through scrapy-redis's request queue and the Bloom filter.
While they run it shows progress; then it checks, from the site's own fetch
counts, that every page was fetched exactly once, and prints a summary,
including the filter's memory in Redis beside what scrapy-redis's SET of
fingerprints takes for the same URLs (measured in the same Redis).

Exit status 0 when every page was fetched exactly once and no worker crashed,
logged an error or (without ``--allow-warnings``) a warning; 1 otherwise.
Logs, stats and ``summary.json`` go to ``--out`` (a new temporary directory by
default).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from demo.site import DEFAULT_PAGES, DEFAULT_SEED, page_path  # noqa: E402
from harness.processes import Site, site_stats, start_site, stop  # noqa: E402

SPIDER = "site"
#: BLOOMDUPE_CAPACITY in demo/settings.py; bigger sites get 2x their page count.
SETTINGS_CAPACITY = 10_000
#: A log line that fails the demo: a warning or an error, Scrapy's or Python's.
BAD_LOG_LINE = re.compile(r"\] (WARNING|ERROR|CRITICAL):|Warning\b|Traceback \(most recent")


class DemoError(Exception):
    """The demo failed; the message says why."""


@dataclass
class Worker:
    index: int
    process: subprocess.Popen[bytes]
    log: Path
    out: Path
    stats_file: Path
    output: IO[bytes]
    stats: dict[str, Any] = field(default_factory=dict)
    bad_lines: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"worker-{self.index}"

    def tail(self, lines: int = 40) -> str:
        parts = []
        for path in (self.log, self.out):
            if path.exists() and path.stat().st_size:
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- last {len(text)} lines of {path} ---\n" + "\n".join(text))
        return "\n".join(parts) or f"({self.name} wrote no log)"


@dataclass
class Keys:
    """The Redis keys of one demo crawl."""

    bloom: str
    queue: str


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Run N Scrapy workers on one shared crawl of a local site and check "
                    "that every page was fetched exactly once.")
    parser.add_argument("--workers", type=int, default=4, help="scrapy crawl processes (4)")
    parser.add_argument("--pages", type=int, default=DEFAULT_PAGES,
                        help=f"pages on the demo site ({DEFAULT_PAGES})")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="the site's seed")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL"),
                        help="use this Redis (default $REDIS_URL; unset: start a throwaway "
                             "redis-server). The demo uses keys of its own there and deletes "
                             "them at the end")
    parser.add_argument("--out", type=Path, help="directory for logs, stats and summary.json")
    parser.add_argument("--idle-timeout", type=float, default=3.0,
                        help="BLOOMDUPE_DONE_GRACE: workers close once the shared queue has "
                             "been empty, with nothing leased, for this many seconds (3)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="give up (and fail) after this many seconds (300)")
    parser.add_argument("--set", dest="settings", action="append", default=[],
                        metavar="NAME=VALUE", help="extra Scrapy setting for every worker")
    parser.add_argument("--allow-warnings", action="store_true",
                        help="do not fail on warnings in the workers' logs")
    parser.add_argument("--keep-keys", action="store_true",
                        help="with --redis-url: leave the demo's keys in Redis (to look at "
                             "them with `bloomdupe info/stats --key <filter key>`)")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.pages < 1:
        parser.error("--workers and --pages must be at least 1")
    return args


# -- the pieces ---------------------------------------------------------------------


def start_worker(index: int, out: Path, settings: dict[str, str]) -> Worker:
    log = out / f"worker-{index}.log"
    stats_file = out / f"worker-{index}.stats.json"
    out_file = out / f"worker-{index}.out"
    command = [sys.executable, "-m", "scrapy", "crawl", SPIDER]
    all_settings = {**settings, "LOG_FILE": str(log), "DEMO_STATS_FILE": str(stats_file)}
    for name, value in all_settings.items():
        command += ["-s", f"{name}={value}"]
    output = out_file.open("wb")
    env = {**os.environ, "REDIS_URL": settings["REDIS_URL"]}
    process = subprocess.Popen(command, cwd=HERE, stdout=output, stderr=subprocess.STDOUT,
                               env=env)
    return Worker(index, process, log, out_file, stats_file, output)


def queue_length(client: redis.Redis, keys: Keys) -> int:
    """Requests waiting in the shared queue (its shards follow the filter's)."""
    from scrapy_bloomdupe.bloom import meta
    from scrapy_bloomdupe.frontier import queue

    shards = meta.read(client, keys.bloom).get("shards", 1)
    return queue.status(client, keys.bloom, shards)[0]


def set_memory(client: redis.Redis, key: str, members: list[str]) -> int:
    """What a Redis SET of ``members`` takes (MEMORY USAGE, every element counted)."""
    client.delete(key)
    try:
        for start in range(0, len(members), 1000):
            client.sadd(key, *members[start:start + 1000])
        return int(client.memory_usage(key, samples=0) or 0)
    finally:
        client.delete(key)


def page_fingerprints(site_url: str, pages: int) -> list[str]:
    """The pages' request fingerprints, as scrapy-redis's RFPDupeFilter stores them."""
    from scrapy.http import Request
    from scrapy.utils.request import fingerprint

    base = site_url.rstrip("/")
    return [fingerprint(Request(base + page_path(p))).hex() for p in range(pages)]


# -- running -------------------------------------------------------------------------


def watch(workers: list[Worker], site: Site, site_url: str,
          client: redis.Redis, keys: Keys, pages: int, timeout: float, started: float) -> None:
    """Show progress until every worker has exited; raise DemoError on a crash or timeout."""
    tty = sys.stdout.isatty()
    next_line = started
    while True:
        for w in workers:
            code = w.process.poll()
            if code not in (None, 0):
                how = (f"killed by {signal.Signals(-code).name}" if code < 0
                       else f"exit status {code}")
                raise DemoError(f"{w.name} crashed ({how})\n{w.tail()}")
        if site.process.poll() is not None:
            raise DemoError(f"the demo site exited (status {site.process.returncode})")
        alive = sum(w.process.poll() is None for w in workers)
        now = time.monotonic()
        if now >= next_line or not alive:
            try:
                fetched = site_stats(site_url)["fetches"]
                progress = (f"pages fetched {sum(1 for n in fetched if n):>{len(str(pages))}}"
                            f"/{pages}  fetches {sum(fetched)}")
            except OSError as e:  # a busy site: say so, try again next second
                progress = f"(site stats: {e})"
            try:
                queued: int | str = queue_length(client, keys)
            except redis.RedisError:  # Redis away: the workers wait it out, so do we
                queued = "? (Redis unavailable)"
            line = (f"{now - started:6.1f}s  {progress}  queue {queued}"
                    f"  workers alive {alive}/{len(workers)}")
            if tty:
                print("\r\033[K" + line, end="\n" if not alive else "", flush=True)
            else:
                print(line, flush=True)
            next_line += 1.0
        if not alive:
            return
        if now - started > timeout:
            raise DemoError(f"the crawl did not finish in {timeout:.0f}s\n"
                            + "\n".join(w.tail(15) for w in workers))
        time.sleep(0.1)


def collect(worker: Worker) -> None:
    """Read a finished worker's stats and log; raise DemoError if it did not finish well."""
    if worker.log.exists():
        worker.bad_lines = [line for line in worker.log.read_text(errors="replace").splitlines()
                            if BAD_LOG_LINE.search(line)]
    if worker.out.exists():
        worker.bad_lines += [line for line in worker.out.read_text(errors="replace").splitlines()
                             if BAD_LOG_LINE.search(line)]
    if not worker.stats_file.exists():
        raise DemoError(f"{worker.name} wrote no stats\n{worker.tail()}")
    worker.stats = json.loads(worker.stats_file.read_text())
    if worker.stats.get("finish_reason") != "finished":
        raise DemoError(f"{worker.name} closed with reason "
                        f"{worker.stats.get('finish_reason')!r}\n{worker.tail()}")


def run(args: argparse.Namespace) -> int:
    out = args.out or Path(tempfile.mkdtemp(prefix="bloomdupe-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"scrapy-bloomdupe demo: {args.workers} workers, {args.pages} pages; "
          f"logs and stats in {out}")
    redis_server = None
    site = None
    workers: list[Worker] = []
    client = None
    if args.redis_url:
        # Someone else's Redis: keys of our own, deleted at the end.
        prefix = f"bloomdupe-demo-{secrets.token_hex(4)}"
        keys = Keys(bloom=f"{prefix}:bloomdupe", queue=f"{prefix}:requests")
    else:
        keys = Keys(bloom=f"{SPIDER}:bloomdupe", queue=f"{SPIDER}:requests")
    try:
        if args.redis_url:
            redis_url = args.redis_url
        else:
            from scrapy_bloomdupe.testing import RedisServer

            # AOF on, as a real crawl needs (SCHEDULER_PERSIST keeps state in Redis);
            # fsync once a second, Redis's usual setting, rather than at every write.
            redis_server = RedisServer(persist=True, extra=["--appendfsync", "everysec"])
            redis_url = redis_server.start().url
        client = redis.Redis.from_url(redis_url)
        try:
            client.ping()
        except redis.RedisError as e:
            raise DemoError(f"cannot use Redis at {redis_url}: {e}") from None
        print(f"Redis at {redis_url} ({'given' if args.redis_url else 'started for the demo'}); "
              f"filter key {keys.bloom!r}; the shared queue's keys carry its hash tags")
        site = start_site(out, pages=args.pages, seed=args.seed)
        site_url = site.url
        print(f"Demo site at {site_url}")
        settings = {
            "REDIS_URL": redis_url,
            "DEMO_SITE_URL": site_url,
            "BLOOMDUPE_KEY": keys.bloom,
            "SCHEDULER_QUEUE_KEY": keys.queue,
            "BLOOMDUPE_DONE_GRACE": str(args.idle_timeout),
        }
        if 2 * args.pages > SETTINGS_CAPACITY:
            settings["BLOOMDUPE_CAPACITY"] = str(2 * args.pages)
        for item in args.settings:
            name, _, value = item.partition("=")
            settings[name] = value
        started = time.monotonic()
        workers = [start_worker(i, out, settings) for i in range(1, args.workers + 1)]
        pids = ", ".join(str(w.process.pid) for w in workers)
        print(f"Started {len(workers)} workers: scrapy crawl {SPIDER} (cwd {HERE}; pids {pids})")
        watch(workers, site, site_url, client, keys, args.pages, args.timeout, started)
        wall = time.monotonic() - started
        for w in workers:
            collect(w)
        return report(args, out, workers, site_url, client, keys, wall)
    except (DemoError, RuntimeError) as e:  # RuntimeError: redis-server would not start
        print(f"\nDEMO FAILED: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nInterrupted.", file=sys.stderr)
        return 130
    finally:
        for w in workers:
            stop(w.process)
            w.output.close()
        if site is not None:
            site.stop()
        if client is not None:
            if args.redis_url and workers and args.keep_keys:
                print(f"Kept the demo's keys: `bloomdupe info --key {keys.bloom}`, "
                      f"`bloomdupe stats --key {keys.bloom}`; `bloomdupe clear --key "
                      f"{keys.bloom}` and the {{{keys.bloom}:*}} keys delete them.")
            elif args.redis_url and workers:
                try:
                    cleanup(client, keys)
                except redis.RedisError as e:
                    print(f"Could not delete the demo's keys ({keys.bloom}*): {e}",
                          file=sys.stderr)
            client.close()
        if redis_server is not None:
            redis_server.close()


def cleanup(client: redis.Redis, keys: Keys) -> None:
    """Delete the demo's keys from a Redis that is not ours."""
    from scrapy_bloomdupe.bloom.filter import BloomFilter
    from scrapy_bloomdupe.exceptions import FilterMismatchError

    try:
        bloom = BloomFilter.open(client, keys.bloom, None)
    except FilterMismatchError:  # no filter was made (the workers failed at start)
        pass
    else:
        from scrapy_bloomdupe.frontier import queue

        queue.clear(client, keys.bloom, bloom.sizing.shards)  # every key the queue made
        bloom.clear()
        bloom.close()


# -- the summary ---------------------------------------------------------------------


def kib(n: float) -> str:
    return f"{n / 1024:,.1f} KiB"


def report(args: argparse.Namespace, out: Path, workers: list[Worker], site_url: str,
           client: redis.Redis, keys: Keys, wall: float) -> int:
    from scrapy_bloomdupe.bloom.filter import BloomFilter

    site = site_stats(site_url)
    fetches: list[int] = site["fetches"]
    pages = len(fetches)
    twice = [p for p, n in enumerate(fetches) if n > 1]
    never = [p for p, n in enumerate(fetches) if n == 0]

    def total(stat: str) -> int:
        return sum(int(w.stats.get(stat, 0)) for w in workers)

    bloom = BloomFilter.open(client, keys.bloom, None)
    try:
        info = bloom.info()
    finally:
        bloom.close()
    fingerprints = page_fingerprints(site_url, pages)
    set_bytes = set_memory(client, f"{keys.bloom}:scratch-set:{secrets.token_hex(4)}",
                           fingerprints)
    crawl_time = (site["last_fetch"] - site["first_fetch"]) if site["first_fetch"] else 0.0
    capacity = info.sizing.capacity
    bloom_bytes = max(info.memory_bytes, 1)
    set_at_capacity = set_bytes / len(fingerprints) * capacity

    print("\nPer worker")
    header = (f"  {'worker':<9}{'pages':>7}{'checked':>9}{'new':>7}{'filtered':>10}"
              f"{'hit rate':>10}{'lock waits':>12}  finish")
    print(header)
    for w in workers:
        s = w.stats
        print(f"  {w.name:<9}{s.get('downloader/response_count', 0):>7}"
              f"{s.get('bloomdupe/checked', 0):>9}{s.get('bloomdupe/new', 0):>7}"
              f"{s.get('dupefilter/filtered', 0):>10}{s.get('bloomdupe/hit_rate', 0):>10.1%}"
              f"{s.get('bloomdupe/lock/waits', 0):>12}  {s.get('finish_reason')}")

    rows = [
        ("pages on the site", f"{pages:,}"),
        ("fetches", f"{sum(fetches):,}"),
        ("URLs checked by the filter", f"{total('bloomdupe/checked'):,}"),
        ("duplicates filtered", f"{total('dupefilter/filtered'):,}  "
         f"({total('bloomdupe/local_hits'):,} answered by the workers' local caches, "
         "without Redis)"),
        ("pages fetched twice", f"{len(twice)}"),
        ("pages never fetched", f"{len(never)}"),
        ("Bloom filter in Redis", f"{kib(info.memory_bytes)}  (capacity "
         f"{info.sizing.capacity:,}, {info.sizing.shards} shard(s), fill "
         f"{info.fill_ratio:.1%}, est. {info.estimated_items:,.0f} items, "
         f"est. FPR {info.estimated_false_positive_rate:.1g})"),
        ("scrapy-redis SET, same URLs", f"{kib(set_bytes)}  ({len(fingerprints):,} sha1 "
         f"fingerprints, MEMORY USAGE; {set_bytes / max(info.memory_bytes, 1):.1f}x)"),
        # The filter's memory is fixed by its capacity; the SET's grows with every URL.
        ("at the filter's capacity", f"SET ~{kib(set_at_capacity)} for {capacity:,} URLs "
         f"(extrapolated from the measurement), {set_at_capacity / bloom_bytes:.0f}x the "
         f"filter's {kib(bloom_bytes)}"),
        ("time", f"{wall:.1f} s  (start of the workers to the last one's exit, "
         f"{args.idle_timeout:g} s idle wait included; first to last fetch "
         f"{crawl_time:.1f} s)"),
        ("throughput", f"{pages / crawl_time:,.0f} pages/s" if crawl_time else "-"),
    ]
    width = max(len(name) for name, _ in rows)
    print("\nSummary")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")

    problems = []
    if twice:
        problems.append(f"{len(twice)} page(s) fetched more than once, e.g. {twice[:10]}")
    if never:
        problems.append(f"{len(never)} page(s) never fetched, e.g. {never[:10]}")
    bad = [(w.name, line) for w in workers for line in w.bad_lines]
    if bad:
        shown = "\n".join(f"    {name}: {line}" for name, line in bad[:20])
        what = "warning/error line(s)"
        if args.allow_warnings and not any(" WARNING: " not in line for _, line in bad):
            print(f"\n{len(bad)} {what} in the worker logs (allowed):\n{shown}")
        else:
            problems.append(f"{len(bad)} {what} in the worker logs:\n{shown}")

    summary = {
        "ok": not problems,
        "problems": problems,
        "pages": pages,
        "fetch_counts": fetches,
        "fetched_twice": twice,
        "never_fetched": never,
        "total_fetches": sum(fetches),
        "duplicates_filtered": total("dupefilter/filtered"),
        "checked": total("bloomdupe/checked"),
        "new": total("bloomdupe/new"),
        "filter": info.as_dict(),
        "set_memory_bytes": set_bytes,
        "wall_seconds": wall,
        "crawl_seconds": crawl_time,
        "workers": [
            {"name": w.name, "returncode": w.process.returncode, "log": str(w.log),
             "stats_file": str(w.stats_file), "stats": w.stats, "bad_log_lines": w.bad_lines}
            for w in workers
        ],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    if problems:
        print("\nDEMO FAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print("\nOK: every page fetched exactly once.")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    def terminated(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # stop the workers, the site and Redis on the way out

    signal.signal(signal.SIGTERM, terminated)
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
