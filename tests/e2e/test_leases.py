"""End to end: the leased shared queue with real ``scrapy crawl`` workers, real Redis and
the example project's local site.

* SIGKILL 1 of 4 working workers mid-crawl: no page is lost, the pages fetched
  twice are within what the dead worker held (its leases), and the live
  workers put those back and exit 0 on their own.
* 4 workers started together share the crawl: each fetches pages, every page
  exactly once.
* Pages that answer 500 are recorded (``bloomdupe failed``), and
  ``bloomdupe failed --requeue`` has the next run fetch them again.

The processes are driven by ``tests/harness/kill_workers.py`` (the fault campaign)'s
functions.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from harness import kill_workers as kw
from harness import processes

from scrapy_bloomdupe.testing import RedisServer

LEASE_TIMEOUT = 5.0
#: `--failing 5` pages on the site of the failed-requests test.
FAILING = 5
FAILING_SITE_PAGES = 300
ADDON = json.dumps({"scrapy_bloomdupe.addon.BloomDupeAddon": 100})


def redis_server() -> RedisServer:
    # AOF on, as a crawl with SCHEDULER_PERSIST wants; --maxmemory 1gb by default.
    return RedisServer(persist=True, extra=["--appendfsync", "everysec"])


def wait_for(crew: list[processes.Worker], timeout: float) -> None:
    """Until every worker has exited on its own; fails (with their log tails) after
    ``timeout`` seconds. The caller stops them (by their Popen) either way."""
    deadline = time.monotonic() + timeout
    while any(w.process.poll() is None for w in crew):
        if time.monotonic() > deadline:
            stuck = [w for w in crew if w.process.poll() is None]
            pytest.fail(f"{[w.name for w in stuck]} still running after {timeout:.0f}s\n"
                        + "\n".join(w.tail() for w in stuck))
        time.sleep(0.2)


def crawl(out: Path, redis_url: str, site: processes.Site, *, workers: int, pages: int,
          timeout: float = 120.0, **extra: str) -> list[processes.Worker]:
    """``workers`` workers started together on ``site``, until they all exit."""
    out.mkdir(parents=True, exist_ok=True)
    settings = kw.worker_settings(redis_url, site.url, pages=pages,
                                  lease_timeout=LEASE_TIMEOUT, extra=extra)
    crew: list[processes.Worker] = []
    try:
        crew = [processes.start_worker(i, out, settings) for i in range(1, workers + 1)]
        wait_for(crew, timeout)
    finally:
        for w in crew:
            w.close()  # SIGTERM then SIGKILL by Popen, if still running
    return crew


def assert_finished(crew: list[processes.Worker]) -> None:
    for w in crew:
        warned = [line for line in w.log.read_text(errors="replace").splitlines()
                  if "[py.warnings]" in line or "Traceback" in line]
        assert warned == [], f"{w.name}: {warned[:5]}"
        assert w.process.returncode == 0, f"{w.name} exit status {w.process.returncode}\n" \
                                          f"{w.tail()}"
        assert w.stats().get("finish_reason") == "finished", \
            f"{w.name} finish reason {w.stats().get('finish_reason')!r}\n{w.tail()}"


def bloomdupe(*args: str) -> dict[str, Any]:
    """``bloomdupe ARGS --json``, its JSON output."""
    script = Path(sys.executable).with_name("bloomdupe")
    command = [str(script)] if script.exists() else [sys.executable, "-m",
                                                     "scrapy_bloomdupe.cli"]
    done = subprocess.run([*command, *args, "--json"], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, f"bloomdupe {' '.join(args)}: {done.stdout}{done.stderr}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def page_id(url: str) -> int:
    parts = urlsplit(url)
    return 0 if parts.path == "/" else int(parse_qs(parts.query)["id"][0])


def short(result: kw.RunResult) -> str:
    fields = result.as_dict()
    for name in ("never_fetched", "fetched_twice"):
        fields[name] = f"{len(fields[name])} page(s): {fields[name][:20]}"
    fields["problems"] = "\n".join(result.problems)
    return "\n".join(f"  {k}: {v}" for k, v in fields.items())


# -- a worker killed mid-crawl ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("politeness", ["worker", "crawl"])
def test_sigkill_one_of_four_working_workers_mid_crawl(tmp_path: Path, politeness: str
                                                       ) -> None:
    seed = random.randrange(2**32)
    extra = {"BLOOMDUPE_POLITENESS": politeness}
    if politeness == "crawl":
        # The site is one host, one download slot: its limit crawl-wide is 4 workers'
        # worth (64), so that the 4 share the pages and the run lasts about as long as
        # with "worker" (at 16 crawl-wide, one worker took them all, and the crawl after
        # a kill took about the 30 s the harness allows, and a clean-clone CI run
        # stopped its workers).
        extra["CONCURRENT_REQUESTS_PER_DOMAIN"] = "64"
    result = kw.run_once(tmp_path, kills=1, workers=4, pages=600, delay=0.5,
                         lease_timeout=LEASE_TIMEOUT, rng=random.Random(seed), extra=extra)
    about = f"(seed {seed}; logs in {tmp_path})\n{short(result)}"
    assert result.kill_fraction is not None, f"no worker was killed {about}"
    assert len(result.killed) == 1
    # Nothing lost: every page fetched, the dead worker's requests included.
    assert result.never_fetched == [], f"pages never fetched {about}"
    # What the dead worker held: the leases of the one queue owner that stopped
    # heartbeating at the kill. Only those can be fetched twice.
    assert result.dead_owners == 1, f"expected one dead queue owner {about}"
    assert result.dead_leases is not None
    assert len(result.fetched_twice) <= result.dead_leases, \
        f"more pages fetched twice than the killed worker held in flight {about}"
    assert result.extra_fetches <= result.dead_leases, about
    # The live workers put back exactly what the dead one held.
    assert result.requeued_logged == result.dead_leases, about
    # The live workers finish on their own, in time, with status 0.
    assert result.live_exit_codes == [0, 0, 0], about
    assert result.live_finish_reasons == ["finished"] * 3, about
    assert result.finish_after_kill_s is not None
    assert result.finish_after_kill_s <= LEASE_TIMEOUT + kw.EXIT_SLACK, about
    assert result.problems == [], about


@pytest.mark.slow
def test_a_killed_worker_whose_callbacks_are_slow_costs_at_most_its_concurrency(
        tmp_path: Path) -> None:
    """Callbacks that wait 1 s (awaiting, not blocking) on pages that download in 0.05 s:
    Scrapy asks for more requests while finished downloads wait in their callbacks, so
    a worker could hold many more pages than ``CONCURRENT_REQUESTS``, each fetched
    again if it dies. The scheduler holds at most ``CONCURRENT_REQUESTS`` and a quarter
    unacked (the kill harness fails a run with more fetched twice)."""
    seed = random.randrange(2**32)
    concurrency = 8
    # The live worker's share of the site takes time after the kill: up to 160 pages, at
    # most 10 at a time, 1 s of callback each (16 s; in a loaded run its spider closed,
    # "finished", 31 s after the kill, and the campaign stopped it at 35 s). The
    # campaign's 30 s for the end to be seen come on top of that.
    result = kw.run_once(tmp_path, kills=1, workers=2, pages=200, delay=0.05,
                         concurrency=concurrency, lease_timeout=LEASE_TIMEOUT,
                         rng=random.Random(seed), extra={"DEMO_PARSE_DELAY": "1"},
                         exit_slack=kw.EXIT_SLACK + 160 / (concurrency + concurrency // 4))
    about = f"(seed {seed}; logs in {tmp_path})\n{short(result)}"
    assert result.kill_fraction is not None and len(result.killed) == 1, about
    assert result.never_fetched == [], f"pages never fetched {about}"
    assert result.extra_fetches <= concurrency + concurrency // 4, about
    assert result.live_exit_codes == [0] and result.live_finish_reasons == ["finished"], about
    assert result.problems == [], about
    # The live worker waited at its limit, and says so in its stats.
    assert result.live_held_full and result.live_held_full[0] > 0, about


# -- workers started together ----------------------------------------------------------------


@pytest.mark.slow
def test_four_workers_started_together_share_the_crawl(tmp_path: Path) -> None:
    pages = 400
    with redis_server() as server:
        site = processes.start_site(tmp_path, pages=pages, delay=0.2)
        try:
            crew = crawl(tmp_path, server.url, site, workers=4, pages=pages)
            fetches: list[int] = site.stats()["fetches"]
        finally:
            site.stop()
    assert_finished(crew)
    shares = {w.name: int(w.stats().get("downloader/response_count", 0)) for w in crew}
    assert all(n >= 1 for n in shares.values()), f"a worker fetched nothing: {shares}"
    never = [p for p, n in enumerate(fetches) if n == 0]
    twice = [p for p, n in enumerate(fetches) if n > 1]
    assert never == [] and twice == [], f"never fetched {never[:20]}, twice {twice[:20]}"
    assert sum(shares.values()) == pages, shares


# -- requests that fail for good --------------------------------------------------------------


@pytest.mark.parametrize("pages", [600, FAILING_SITE_PAGES])
def test_demo_site_fails_as_many_pages_as_asked(tmp_path: Path, pages: int) -> None:
    site = processes.start_site(tmp_path, pages=pages, failing=FAILING)
    try:
        failing = site.stats()["failing"]
    finally:
        site.stop()
    assert len(failing) == FAILING, (
        f"`python -m demo.site --pages {pages} --failing {FAILING}` makes {len(failing)} "
        f"page(s) answer 500 ({failing}), not {FAILING}: example_project/demo/site.py takes "
        f"range(step, pages, step)[:N] with step = pages // N, which holds only N - 1 pages "
        f"when N divides pages")


@pytest.mark.slow
def test_failed_pages_are_listed_and_requeued(tmp_path: Path) -> None:
    pages = FAILING_SITE_PAGES
    with redis_server() as server:
        # First run: FAILING pages answer 500 (after Scrapy's retries: failed for good).
        site = processes.start_site(tmp_path, pages=pages, failing=FAILING)
        try:
            failing: list[int] = site.stats()["failing"]
            assert len(failing) == FAILING, failing
            first = crawl(tmp_path / "run-1", server.url, site, workers=2, pages=pages,
                          ADDONS=ADDON)
            first_fetches: list[int] = site.stats()["fetches"]
        finally:
            site.stop()
        assert_finished(first)
        assert all(first_fetches[p] >= 1 for p in failing), first_fetches

        listed = bloomdupe("failed", "--key", kw.KEY, "--redis-url", server.url)
        records = listed["failed"]
        assert listed["total"] == FAILING, listed
        assert sorted(page_id(r["url"]) for r in records) == failing, listed
        for r in records:
            assert "500" in r["reason"], r
            assert r["url"].startswith(site.url), r  # the first site's URL (its port)

        moved = bloomdupe("failed", "--key", kw.KEY, "--redis-url", server.url, "--requeue")
        assert moved["requeued"] == FAILING, moved
        assert bloomdupe("failed", "--key", kw.KEY, "--redis-url", server.url)["total"] == 0

        # Second run: a new site, same seed and pages, on the same port (the requeued
        # requests carry the first site's URLs), where no page fails.
        (tmp_path / "run-2").mkdir()
        again = processes.start_site(tmp_path / "run-2", pages=pages, failing=0, port=site.port)
        assert again.url == site.url, (again.url, site.url)
        try:
            second = crawl(tmp_path / "run-2", server.url, again, workers=2, pages=pages,
                           ADDONS=ADDON)
            second_fetches: list[int] = again.stats()["fetches"]
        finally:
            again.stop()
        assert_finished(second)
        assert [second_fetches[p] for p in failing] == [1] * FAILING, \
            f"requeued pages {failing} fetched {[second_fetches[p] for p in failing]} " \
            f"times in the second run"
        assert bloomdupe("failed", "--key", kw.KEY, "--redis-url", server.url)["total"] == 0
