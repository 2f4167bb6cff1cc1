"""The recrawl example: the demo spider run over the demo site with a short window
(``BLOOMDUPE_WINDOW``). Run again within the window it fetches nothing (every page was
fetched within it); run again past the window and one slice it fetches every page
again, once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from helpers import EXAMPLE_PROJECT, ROOT, demo_site, take_fetches, wait_workers

PAGES = 40
#: Seconds (8 slices of 7.5 s): two crawls of the demo site must end within it (20 s
#: was too short once, on a CI machine busy with the floor lane beside the suite, and
#: 30 s once: the two took 31.9 s). The wait past it is a sleep, not CPU.
WINDOW = 60.0


def crawl(redis_url: str, site_url: str, log: Path) -> int:
    """One ``scrapy crawl site`` of the example project with the window (the package of
    this checkout: PYTHONPATH, also when it is a git worktree)."""
    env = {**os.environ, "REDIS_URL": redis_url, "DEMO_SITE_URL": site_url,
           "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "scrapy", "crawl", "site", "-s", f"LOG_FILE={log}",
               "-s", f"BLOOMDUPE_WINDOW={WINDOW}", "-s", "BLOOMDUPE_KEY=recrawl:bloomdupe"]
    process = subprocess.Popen(command, cwd=EXAMPLE_PROJECT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    (code,) = wait_workers([process], timeout=120)
    return code


def redis_time(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6


@pytest.mark.slow
def test_pages_are_refetched_after_the_window_and_not_before(redis_url: str,
                                                             tmp_path: Path) -> None:
    client = redis.Redis.from_url(redis_url)
    with demo_site(PAGES) as site:
        started = redis_time(client)
        assert crawl(redis_url, site.url, tmp_path / "first.log") == 0
        first_done = redis_time(client)
        assert take_fetches(site) == [1] * PAGES
        # Within the window: every page was fetched less than WINDOW seconds ago.
        assert crawl(redis_url, site.url, tmp_path / "second.log") == 0
        assert redis_time(client) - started < WINDOW, "the second run came too late to tell"
        assert take_fetches(site) == [0] * PAGES
        # Past the window and one slice since the last page was added: all new again.
        time.sleep(max(0.0, first_done + WINDOW * 9 / 8 + 0.5 - redis_time(client)))
        assert crawl(redis_url, site.url, tmp_path / "third.log") == 0
        assert take_fetches(site) == [1] * PAGES
    log = (tmp_path / "third.log").read_text()
    assert "'bloomdupe/window/slices'" in log
    client.close()
