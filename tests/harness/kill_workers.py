#!/usr/bin/env python
"""Fault campaign: SIGKILL working ``scrapy crawl`` workers mid-crawl; nothing is lost.

``python tests/harness/kill_workers.py`` (``--quick``: one run per case, a smaller
site). Each run of a case starts a fresh Redis (AOF on), a fresh demo site
(``example_project/demo/site.py`` with ``--delay``, so that workers hold
requests in flight) and 4 ``scrapy crawl site`` workers together, with a short
``BLOOMDUPE_LEASE_TIMEOUT``. At a random instant mid-crawl (between 20% and
70% of the pages fetched, from the site's ``/__stats``) it SIGKILLs ``k``
working workers (ones whose log shows a page crawled in the last second), then
waits for the live ones to exit on their own: the queue's leases of the dead
ones go back to the queue once they have been silent for the lease timeout,
and the live workers fetch them again.

Per run it records, from the site's own fetch counts: pages never fetched
(must be 0) and pages fetched twice or more (with the extra fetches); the live
workers' exit codes and finish reasons; seconds from the kill to the last live
worker's exit (must come within lease timeout + 30 s, else the run fails and
the workers are stopped); and the killed workers' in-flight bound: the leases
the dead workers held in Redis (``{K:i}:leases`` entries of the owners that
stop heartbeating at the kill, read between the kill and the reap), beside
``HLEN`` of the lease hash (all workers) just before the kill. A page fetched
twice must be one of the dead workers' leases, so the duplicates stay within
that bound; and within what the scheduler promises: ``CONCURRENT_REQUESTS`` and
the prefetch (a quarter of it) a killed worker.

Exit status 1 if any run lost a page, fetched more pages twice than the killed
workers held or than that promise, or a live worker did not exit 0 (finish
reason 'finished') in time; 0 otherwise. ``--json PATH`` writes every run.
Logs of failed runs are kept (their directory is printed, with the shared queue's
state at the end in ``redis-state.json``); ``--keep-logs``
keeps all. ``--set NAME=VALUE`` (repeatable) adds a Scrapy setting to every
worker (e.g. ``--set BLOOMDUPE_SHARDS=24``, ``--set BLOOMDUPE_LOCK=False``); the
header and the JSON's config name them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

if __package__ in (None, ""):  # run as a script: make ``harness`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.processes import SPIDER, Site, Worker, start_site, start_worker, stop

#: The filter's key (BLOOMDUPE_KEY): every run has a Redis of its own.
KEY = f"{SPIDER}:bloomdupe"
#: BLOOMDUPE_CAPACITY in the demo's settings.py; bigger sites get 2x their page count.
SETTINGS_CAPACITY = 10_000
#: A worker is "working" if its log shows a page crawled this recently (seconds).
RECENT = 1.0
#: How often the campaign looks at the site, the logs and Redis (seconds).
POLL = 0.1
#: Extra time the live workers get after the lease timeout (the brief's "+ 30 s").
EXIT_SLACK = 30.0
#: Settings ``--set`` may not give: the campaign sets them (and reads Redis, the logs
#: and its bounds by them); the option to use instead, if any.
OWN_SETTINGS = {
    "REDIS_URL": "", "DEMO_SITE_URL": "", "BLOOMDUPE_KEY": "", "LOG_LEVEL": "",
    "LOG_FILE": "", "DEMO_STATS_FILE": "",
    "BLOOMDUPE_LEASE_TIMEOUT": "--lease-timeout", "BLOOMDUPE_DONE_GRACE": "--done-grace",
    "CONCURRENT_REQUESTS": "--concurrency", "CONCURRENT_REQUESTS_PER_DOMAIN": "--concurrency",
    "BLOOMDUPE_REDIS_CLUSTER": "--cluster",
}


# -- settings of the campaign's workers ----------------------------------------------


def worker_settings(redis_url: str, site_url: str, *, pages: int,
                    lease_timeout: float | None = None, done_grace: float = 3.0,
                    concurrency: int | None = None,
                    extra: dict[str, str] | None = None) -> dict[str, str]:
    settings = {
        "REDIS_URL": redis_url,
        "DEMO_SITE_URL": site_url,
        "BLOOMDUPE_KEY": KEY,
        "BLOOMDUPE_DONE_GRACE": str(done_grace),
    }
    if lease_timeout is not None:
        settings["BLOOMDUPE_LEASE_TIMEOUT"] = str(lease_timeout)
    if concurrency is not None:
        settings["CONCURRENT_REQUESTS"] = str(concurrency)
        settings["CONCURRENT_REQUESTS_PER_DOMAIN"] = str(concurrency)
    if 2 * pages > SETTINGS_CAPACITY:
        settings["BLOOMDUPE_CAPACITY"] = str(2 * pages)
    settings.update(extra or {})
    return settings


# -- Redis: the queue's leases and owners ----------------------------------------------


def shard_count(client: redis.Redis) -> int:
    from scrapy_bloomdupe.bloom import meta

    return int(meta.read(client, KEY).get("shards", 1) or 1)


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def leases_by_owner(client: redis.Redis, shards: int) -> dict[str, int]:
    """Leases held, per owner (the part of a lease's field before ':')."""
    from scrapy_bloomdupe import keys

    held: dict[str, int] = {}
    for shard in range(shards):
        for name in client.hkeys(keys.leases(KEY, shard)):
            owner = name.decode().split(":", 1)[0]
            held[owner] = held.get(owner, 0) + 1
        # (the download slots' leases: a list a worker, frontier/slots.py)
        prefix = keys.slot_held(KEY, shard, "")
        for name in client.scan_iter(prefix + "*"):
            owner = name.decode()[len(prefix):]
            held[owner] = held.get(owner, 0) + int(client.llen(name))
    return held


def owner_heartbeats(client: redis.Redis, shards: int) -> dict[str, int]:
    """Each owner's latest heartbeat (server ms), over the shards."""
    from scrapy_bloomdupe import keys

    beats: dict[str, int] = {}
    for shard in range(shards):
        for name, score in client.zrange(keys.owners(KEY, shard), 0, -1, withscores=True):
            owner = name.decode()
            beats[owner] = max(beats.get(owner, 0), int(score))
    return beats


def dump_state(client: redis.Redis, path: Path) -> None:
    """The shared queue's state, for a failed run's analysis (its Redis is deleted with the
    run): per shard the queued count, the leases and the owners' heartbeats."""
    from scrapy_bloomdupe import keys

    try:
        shards = shard_count(client)
        state = {"server_ms": server_ms(client), "shards": [
            {"shard": shard, "queued": int(client.zcard(keys.queue(KEY, shard))),
             "leases": sorted(f.decode() for f in client.hkeys(keys.leases(KEY, shard))),
             "owners": {o.decode(): int(t) for o, t in client.zrange(
                 keys.owners(KEY, shard), 0, -1, withscores=True)}}
            for shard in range(shards)]}
    except redis.RedisError as e:
        state = {"error": f"{type(e).__name__}: {e}"}
    path.write_text(json.dumps(state, indent=2))


def lease_count(client: redis.Redis, shards: int) -> int:
    from scrapy_bloomdupe import keys

    return sum(int(client.hlen(keys.leases(KEY, shard))) +
               int(client.get(keys.slot_leased(KEY, shard)) or 0) for shard in range(shards))


class DeadOwners:
    """Which queue owners died at the kill, and the leases they held.

    An owner id is random, not a pid: the dead are the owners that never
    heartbeat after the kill (a live worker does every ``min(5, timeout / 3)``
    s, and at every pop) until the reap removes them. A dead worker's leases
    cannot grow after its death, so the largest count read before the reap is
    what it held when it died."""

    def __init__(self, kill_ms: int) -> None:
        self.kill_ms = kill_ms
        self.seen: set[str] = set()
        self.alive: set[str] = set()
        self.held: dict[str, int] = {}

    def observe(self, client: redis.Redis, shards: int) -> None:
        beats = owner_heartbeats(client, shards)
        leases = leases_by_owner(client, shards)
        for owner, beat in beats.items():
            self.seen.add(owner)
            if beat > self.kill_ms:
                self.alive.add(owner)
            elif owner not in self.alive:
                # The most ever read: the owners and the leases are read in two calls,
                # and a reap between them leaves the owner without its leases.
                self.held[owner] = max(self.held.get(owner, 0), leases.get(owner, 0))

    @property
    def dead(self) -> set[str]:
        return self.seen - self.alive

    @property
    def dead_leases(self) -> int:
        return sum(self.held.get(owner, 0) for owner in self.dead)


# -- one run ----------------------------------------------------------------------------


@dataclass
class RunResult:
    case: str
    run: int
    kills: int
    workers: int
    pages: int
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    never_fetched: list[int] = field(default_factory=list)
    fetched_twice: list[int] = field(default_factory=list)
    extra_fetches: int = 0
    total_fetches: int = 0
    kill_target: float | None = None
    kill_fraction: float | None = None
    kill_after_s: float | None = None
    killed: list[str] = field(default_factory=list)
    live_exit_codes: list[int | None] = field(default_factory=list)
    live_finish_reasons: list[str | None] = field(default_factory=list)
    live_pages: list[int] = field(default_factory=list)
    finish_after_kill_s: float | None = None
    wall_s: float = 0.0
    leases_before_kill: int | None = None
    dead_owners: int | None = None
    dead_leases: int | None = None
    concurrency_bound: int | None = None
    requeued_logged: int = 0
    #: Each live worker's ``bloomdupe/held_full``: asks it made wait for acks at its limit.
    live_held_full: list[int] = field(default_factory=list)
    out: str = ""

    @property
    def live_ok(self) -> bool:
        return (bool(self.live_exit_codes)
                and all(code == 0 for code in self.live_exit_codes)
                and all(r == "finished" for r in self.live_finish_reasons))

    @property
    def inflight_bound(self) -> int | None:
        """The killed workers' in-flight bound: their leases when measured, at most
        (CONCURRENT_REQUESTS + its quarter) x killed (the scheduler's promise)."""
        if self.dead_leases is not None and self.dead_owners == self.kills:
            if self.concurrency_bound is None:
                return self.dead_leases
            return min(self.dead_leases, self.concurrency_bound)
        return self.concurrency_bound

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "live_ok": self.live_ok, "inflight_bound": self.inflight_bound}


def run_once(out: Path, *, case: str = "", run: int = 1, kills: int = 1, workers: int = 4,
             pages: int = 600, delay: float = 1.0, seed: int = 2024,
             lease_timeout: float = 5.0, done_grace: float = 3.0, concurrency: int = 16,
             kill_window: tuple[float, float] = (0.2, 0.7), rng: random.Random | None = None,
             timeout: float = 300.0, log: Any = None,
             extra: dict[str, str] | None = None, cluster: bool = False,
             exit_slack: float = EXIT_SLACK) -> RunResult:
    """One run: fresh Redis, fresh site, ``workers`` workers started together; at a random
    fraction of the pages fetched (in ``kill_window``) SIGKILL ``kills`` working ones;
    wait for the live ones to exit on their own (within lease timeout + ``exit_slack`` of
    the kill, or ``timeout`` without a kill). ``extra``: more settings of the workers. ``cluster``:
    a local Redis Cluster of 3 masters (AOF on, no replicas) instead of one Redis."""
    from redis.cluster import RedisCluster

    from harness.local_cluster import LocalCluster
    from scrapy_bloomdupe.testing import RedisServer

    rng = rng or random.Random()
    out.mkdir(parents=True, exist_ok=True)
    result = RunResult(case or f"k={kills} of {workers}", run, kills, workers, pages,
                       out=str(out))
    if kills:
        result.kill_target = rng.uniform(*kill_window)
        result.concurrency_bound = (concurrency + max(1, concurrency // 4)) * kills
    server: RedisServer | LocalCluster = (
        LocalCluster(masters=3, replicas=0) if cluster
        else RedisServer(persist=True, extra=["--appendfsync", "everysec"]))
    site: Site | None = None
    crew: list[Worker] = []
    client: Any = None
    try:
        server.start()
        client = (RedisCluster.from_url(server.url) if cluster
                  else redis.Redis.from_url(server.url))
        site = start_site(out, pages=pages, seed=seed, delay=delay)
        more = {"BLOOMDUPE_REDIS_CLUSTER": "True"} if cluster else {}
        settings = worker_settings(server.url, site.url, pages=pages,
                                   lease_timeout=lease_timeout, done_grace=done_grace,
                                   concurrency=concurrency,
                                   extra={**more, **(extra or {}), "LOG_LEVEL": "DEBUG"})
        started = time.monotonic()
        crew = [start_worker(i, out, settings) for i in range(1, workers + 1)]
        _watch(result, crew, site, client, started=started, lease_timeout=lease_timeout,
               timeout=timeout, rng=rng, exit_slack=exit_slack)
        result.wall_s = time.monotonic() - started
        _tally(result, crew, site)
    except Exception as e:  # a broken run is a failed run, with the reason
        result.problems.append(f"{type(e).__name__}: {e}")
    finally:
        for w in crew:
            w.close()
        if site is not None:
            site.stop()
        if client is not None:
            if result.problems:
                dump_state(client, out / "redis-state.json")
            client.close()
        server.close()
    result.ok = not result.problems
    if log is not None and not result.ok:
        print(f"    run {run} FAILED (logs in {out}):", file=log)
        for problem in result.problems:
            print("      " + problem.replace("\n", "\n      "), file=log)
    return result


def _watch(result: RunResult, crew: list[Worker], site: Site, client: redis.Redis, *,
           started: float, lease_timeout: float, timeout: float, rng: random.Random,
           exit_slack: float) -> None:
    """Until every live worker has exited: kill at the target, follow the dead owners."""
    pages = result.pages
    killed: list[Worker] = []
    kill_time: float | None = None
    dead: DeadOwners | None = None
    shards: int | None = None
    while True:
        now = time.monotonic()
        for w in crew:
            w.read_log(now)
            if w.exited_at is None and w.process.poll() is not None:
                w.exited_at = now
        live = [w for w in crew if w not in killed]
        if all(w.exited_at is not None for w in live):
            break
        if result.kills and kill_time is None:
            early = [w for w in live if w.exited_at is not None]
            if early:
                raise RuntimeError(
                    f"{early[0].name} exited (status {early[0].process.returncode}) before "
                    f"the kill\n{early[0].tail()}")
            fetched = sum(1 for n in site.stats()["fetches"] if n)
            if fetched >= result.kill_target * pages:  # type: ignore[operator]
                victims = _pick_victims(crew, result.kills, now, rng,
                                        late=fetched > 0.7 * pages)
                if victims:
                    if shards is None:
                        shards = shard_count(client)
                    result.leases_before_kill = lease_count(client, shards)
                    for w in victims:
                        os.kill(w.pid, signal.SIGKILL)
                    for w in victims:
                        w.process.wait()
                    kill_time = time.monotonic()
                    dead = DeadOwners(server_ms(client))
                    killed = victims
                    result.killed = [w.name for w in victims]
                    result.kill_fraction = fetched / pages
                    result.kill_after_s = kill_time - started
        if dead is not None and shards is not None:
            dead.observe(client, shards)
        deadline = (kill_time + lease_timeout + exit_slack if kill_time is not None
                    else started + timeout)
        if now > deadline:
            stuck = [w for w in live if w.exited_at is None]
            since = (f"{lease_timeout + exit_slack:.0f}s after the kill"
                     if kill_time is not None else f"{timeout:.0f}s")
            result.problems.append(
                f"{', '.join(w.name for w in stuck)} still running {since}: stopped\n"
                + "\n".join(w.tail(15) for w in stuck))
            for w in stuck:
                stop(w.process)
                w.exited_at = time.monotonic()
            break
        time.sleep(POLL)
    if dead is not None:
        result.dead_owners = len(dead.dead)
        result.dead_leases = dead.dead_leases
    if result.kills and kill_time is None:
        result.problems.append("the crawl ended before the kill")
    live = [w for w in crew if w not in killed]
    if kill_time is not None:
        result.finish_after_kill_s = max(w.exited_at or 0.0 for w in live) - kill_time


def _pick_victims(crew: list[Worker], kills: int, now: float, rng: random.Random, *,
                  late: bool) -> list[Worker]:
    """``kills`` workers that crawled a page in the last RECENT seconds (past 70% of the
    pages: the ``kills`` most recent ones that crawled at all)."""
    working = [w for w in crew if w.last_crawl is not None and now - w.last_crawl <= RECENT]
    if len(working) >= kills:
        return rng.sample(working, kills)
    if late:
        some = sorted((w for w in crew if w.last_crawl is not None),
                      key=lambda w: w.last_crawl or 0.0, reverse=True)
        if len(some) >= kills:
            return some[:kills]
    return []


def _tally(result: RunResult, crew: list[Worker], site: Site) -> None:
    stats = site.stats()
    fetches: list[int] = stats["fetches"]
    result.total_fetches = sum(fetches)
    result.never_fetched = [p for p, n in enumerate(fetches) if n == 0]
    result.fetched_twice = [p for p, n in enumerate(fetches) if n > 1]
    result.extra_fetches = sum(n - 1 for n in fetches if n > 1)
    live = [w for w in crew if w.name not in result.killed]
    result.live_exit_codes = [w.process.returncode for w in live]
    result.live_finish_reasons = [w.stats().get("finish_reason") for w in live]
    result.live_pages = [int(w.stats().get("downloader/response_count", 0)) for w in live]
    result.requeued_logged = sum(int(w.stats().get("bloomdupe/requeued", 0)) for w in live)
    result.live_held_full = [int(w.stats().get("bloomdupe/held_full", 0)) for w in live]
    if result.never_fetched:
        result.problems.append(f"{len(result.never_fetched)} page(s) never fetched, e.g. "
                               f"{result.never_fetched[:10]}")
    bound = result.inflight_bound
    if result.kills and bound is not None and result.extra_fetches > bound:
        result.problems.append(
            f"{result.extra_fetches} extra fetch(es), above the killed workers' in-flight "
            f"bound of {bound} (their leases in Redis at the kill, at most "
            "CONCURRENT_REQUESTS + its quarter a killed worker): pages they did not hold, "
            "or more than the scheduler lets a worker hold, were fetched twice")
    if not result.live_ok:
        result.problems.append(
            "live workers: exit codes "
            f"{result.live_exit_codes}, finish reasons {result.live_finish_reasons}\n"
            + "\n".join(w.tail(15) for w in live
                        if w.process.returncode != 0 or w.stats().get("finish_reason")
                        != "finished"))


# -- the campaign -----------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="SIGKILL 1 or 2 of 4 working scrapy workers mid-crawl, R runs per case; "
                    "check that no page is lost and the live workers finish on their own.")
    parser.add_argument("--runs", type=int, default=10, help="runs per case (10)")
    parser.add_argument("--pages", type=int, default=None, help="pages on the site (600; "
                                                               "--quick 300)")
    parser.add_argument("--delay", type=float, default=1.0,
                        help="seconds every page takes to answer (1.0: on 2 cores a run "
                             "then takes ~20 s; at 0.05 the crawl is CPU-bound and over in "
                             "~6 s, so the kill window is short)")
    parser.add_argument("--workers", type=int, default=4, help="workers per run (4)")
    parser.add_argument("--lease-timeout", type=float, default=5.0,
                        help="BLOOMDUPE_LEASE_TIMEOUT of the workers (5)")
    parser.add_argument("--done-grace", type=float, default=3.0,
                        help="BLOOMDUPE_DONE_GRACE of the workers (3)")
    parser.add_argument("--concurrency", type=int, default=16,
                        help="CONCURRENT_REQUESTS (and per domain) of each worker (16)")
    parser.add_argument("--kills", default="0,1,2",
                        help="cases: workers killed per run, comma-separated (0,1,2; 0 is the "
                             "no-kill control)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the kill instants and victims (default: random)")
    parser.add_argument("--site-seed", type=int, default=2024, help="the site's seed")
    parser.add_argument("--quick", action="store_true", help="1 run per case, 300 pages")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every run as JSON")
    parser.add_argument("--out", type=Path, help="directory for the runs' logs")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep the logs of runs that passed too")
    parser.add_argument("--cluster", action="store_true",
                        help="a local Redis Cluster (3 masters, AOF on) instead of one Redis "
                             "(with --set BLOOMDUPE_SHARDS=24, the shards spread over them)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a Scrapy setting of every worker (repeatable), e.g. "
                             "BLOOMDUPE_SHARDS=24")
    args = parser.parse_args(argv)
    args.settings = {}
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            parser.error(f"--set {item!r}: expected NAME=VALUE")
        if name.strip() in OWN_SETTINGS:
            parser.error(f"--set {name.strip()}: the campaign sets it itself"
                         + (f" ({OWN_SETTINGS[name.strip()]})" if OWN_SETTINGS[name.strip()]
                            else ""))
        args.settings[name.strip()] = value
    if args.quick:
        args.runs = 1
    if args.pages is None:
        args.pages = 300 if args.quick else 600
    args.cases = [int(k) for k in args.kills.split(",")]
    if args.runs < 1 or args.pages < 10 or args.workers < 2:
        parser.error("--runs must be >= 1, --pages >= 10, --workers >= 2")
    if any(not 0 <= k < args.workers for k in args.cases):
        parser.error("--kills: each case must kill fewer workers than --workers")
    if args.seed is None:
        args.seed = random.randrange(2**32)
    return args


def case_name(kills: int, workers: int) -> str:
    return "no kill (control)" if kills == 0 else f"kill {kills} of {workers}"


def side_by_side(out: Path, contenders: list[tuple[str, dict[str, str]]], kills: list[int],
                 *, workers: int = 4, concurrency: int = 16) -> list[dict[str, Any]]:
    """One run a contender (its settings) and kill count, contenders in turn (600 pages
    answering in 1 s): ``benchmarks/latency_crawl.py``'s kill runs."""
    rows = []
    for k in kills:
        for name, settings in contenders:
            r = run_once(out / f"kill-{k}-{name}", case=name, kills=k, workers=workers,
                         pages=600, delay=1.0, concurrency=concurrency, lease_timeout=5.0,
                         extra=settings)
            rows.append({"contender": name, "kills": k, "never": len(r.never_fetched),
                         "extra_fetches": r.extra_fetches, "live_ok": r.live_ok,
                         "bound": (concurrency + max(1, concurrency // 4)) * k,
                         "problems": r.problems})
            print(f"  {name:12} kill {k}: never fetched {rows[-1]['never']}, fetched twice "
                  f"{r.extra_fetches}", file=sys.stderr, flush=True)
    return rows


def side_by_side_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| contender | workers SIGKILLed | pages never fetched | extra fetches | at most "
             "(CONCURRENT_REQUESTS + a quarter, a kill) | live workers exit 0 |",
             "|---|---:|---:|---:|---:|---|"]
    lines += [f"| {r['contender']} | {r['kills']} | {r['never']} | {r['extra_fetches']} | "
              f"{r['bound']} | {'yes' if r['live_ok'] else 'no'} |" for r in rows]
    return "\n".join(lines)


def summarize(name: str, runs: list[RunResult]) -> dict[str, Any]:
    never = [len(r.never_fetched) for r in runs]
    twice = [len(r.fetched_twice) for r in runs]
    finish = [r.finish_after_kill_s for r in runs if r.finish_after_kill_s is not None]
    bounds = [r.inflight_bound for r in runs if r.inflight_bound is not None]
    return {
        "case": name,
        "runs": len(runs),
        "never_fetched_total": sum(never),
        "never_fetched_max": max(never),
        "fetched_twice_total": sum(twice),
        "fetched_twice_max": max(twice),
        "extra_fetches_total": sum(r.extra_fetches for r in runs),
        "inflight_bound_max": max(bounds) if bounds else None,
        "within_bound": all(r.inflight_bound is None or r.extra_fetches <= r.inflight_bound
                            for r in runs),
        "finish_after_kill_max_s": max(finish) if finish else None,
        "wall_max_s": max(r.wall_s for r in runs),
        "live_exit_0": all(r.live_ok for r in runs),
        "failed_runs": sum(not r.ok for r in runs),
    }


def table(rows: list[dict[str, Any]]) -> str:
    header = ["case", "runs", "never fetched (total, max)", "fetched twice (total, max)",
              "extra fetches", "in-flight bound (max)", "dupes <= bound",
              "max s to finish after kill", "max run s", "live exit 0"]
    body = []
    for row in rows:
        finish = row["finish_after_kill_max_s"]
        bound = row["inflight_bound_max"]
        body.append([
            row["case"], str(row["runs"]),
            f"{row['never_fetched_total']}, {row['never_fetched_max']}",
            f"{row['fetched_twice_total']}, {row['fetched_twice_max']}",
            str(row["extra_fetches_total"]),
            "-" if bound is None else str(bound),
            "yes" if row["within_bound"] else "NO",
            "-" if finish is None else f"{finish:.1f}",
            f"{row['wall_max_s']:.1f}",
            "yes" if row["live_exit_0"] else "NO",
        ])
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(header)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
              for r in body]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def terminated(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # stop our workers, site and Redis on the way out

    signal.signal(signal.SIGTERM, terminated)
    out = args.out or Path(tempfile.mkdtemp(prefix="bloomdupe-kill-"))
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    print(f"kill_workers: {args.runs} run(s) per case, {args.workers} workers"
          f"{' on a 3-master Redis Cluster' if args.cluster else ''}, "
          f"{args.pages} pages, delay {args.delay:g}s, lease timeout {args.lease_timeout:g}s, "
          f"CONCURRENT_REQUESTS {args.concurrency}, seed {args.seed}; logs in {out}",
          flush=True)
    if args.settings:
        print("  settings: " + " ".join(f"{k}={v}" for k, v in args.settings.items()),
              flush=True)
    began = time.monotonic()
    results: dict[str, list[RunResult]] = {}
    try:
        for kills in args.cases:
            name = case_name(kills, args.workers)
            results[name] = []
            print(f"{name}:", flush=True)
            for run in range(1, args.runs + 1):
                run_dir = out / f"k{kills}" / f"run-{run:02d}"
                r = run_once(run_dir, case=name, run=run, kills=kills, workers=args.workers,
                             pages=args.pages, delay=args.delay, seed=args.site_seed,
                             lease_timeout=args.lease_timeout, done_grace=args.done_grace,
                             concurrency=args.concurrency, rng=rng, log=sys.stdout,
                             extra=args.settings, cluster=args.cluster)
                results[name].append(r)
                kill = (f"killed {','.join(r.killed)} at {r.kill_fraction:.0%} "
                        f"(target {r.kill_target:.0%}) "
                        f"({r.kill_after_s:.1f}s), leases {r.leases_before_kill}, dead "
                        f"owners {r.dead_owners} holding {r.dead_leases}, requeued "
                        f"{r.requeued_logged}; live done "
                        f"{r.finish_after_kill_s:.1f}s after; "
                        if r.kill_fraction is not None and r.finish_after_kill_s is not None
                        else "")
                print(f"  run {run:2d}: {'ok' if r.ok else 'FAILED'}  {r.wall_s:5.1f}s  "
                      f"{kill}never {len(r.never_fetched)}, twice {len(r.fetched_twice)} "
                      f"(+{r.extra_fetches}), live exit {r.live_exit_codes}", flush=True)
                if r.ok and not args.keep_logs:
                    shutil.rmtree(run_dir, ignore_errors=True)
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        return 130
    elapsed = time.monotonic() - began
    rows = [summarize(name, runs) for name, runs in results.items()]
    print()
    print(table(rows))
    print(f"\n{sum(len(r) for r in results.values())} runs in {elapsed:.0f}s "
          f"(seed {args.seed}).")
    failed = [r for runs in results.values() for r in runs if not r.ok]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "config": {k: (str(v) if isinstance(v, Path) else v)
                       for k, v in vars(args).items()},
            "elapsed_s": elapsed,
            "cases": rows,
            "runs": [r.as_dict() for runs in results.values() for r in runs],
        }, indent=2, default=str))
    if failed:
        print(f"FAILED: {len(failed)} run(s) lost a page, fetched more pages twice than the "
              "killed workers held, or a live worker did not exit 0 in time:", file=sys.stderr)
        for r in failed:
            print(f"  {r.case} run {r.run} ({r.out}): {r.problems[0].splitlines()[0]}",
                  file=sys.stderr)
        return 1
    if not args.keep_logs and not args.out:
        shutil.rmtree(out, ignore_errors=True)
    print("OK: no page lost; pages fetched twice within the killed workers' bound; every "
          "live worker exited 0 on its own.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
