"""End to end, ``BLOOMDUPE_POLITENESS = "crawl"`` (docs/politeness.md): real ``scrapy
crawl`` workers against the demo site, what the site saw. The in-flight limit, the
delay and a 429's ``Retry-After`` are checked by the politeness benchmark's smoke test
(tests/e2e/test_benchmarks_smoke.py); here, robots.txt's ``Crawl-delay``."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

import pytest
from helpers import demo_site, run_workers, take_fetches

PAGES = 30
CRAWL_DELAY = 0.2


@pytest.mark.slow
def test_a_robots_crawl_delay_holds_for_every_worker(redis_url: str, tmp_path: Path) -> None:
    """The site's robots.txt asks for 0.2 s between requests; with ``ROBOTSTXT_OBEY``
    and no ``DOWNLOAD_DELAY`` two workers space their requests crawl-wide (the first
    ones, queued before robots.txt was read, excepted)."""
    with demo_site(PAGES, crawl_delay=CRAWL_DELAY) as site:
        results = run_workers(redis_url, site.url, tmp_path, 2, "BLOOMDUPE_POLITENESS=crawl",
                              "ROBOTSTXT_OBEY=True", "DOWNLOAD_DELAY=0",
                              "CONCURRENT_REQUESTS_PER_DOMAIN=8", "BLOOMDUPE_DONE_GRACE=1")
        assert [code for code, _ in results] == [0, 0], results[0][1][-3000:]
        assert take_fetches(site) == [1] * PAGES
        with site.lock:
            starts = sorted(site.starts[site.hosts[0]])
    gaps = [b - a for a, b in itertools.pairwise(starts[3:])]
    assert statistics.median(gaps) >= 0.9 * CRAWL_DELAY, gaps
    assert any("Crawl-delay" in log for _, log in results)
