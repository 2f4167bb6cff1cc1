"""Issue 49, items 2 and 3, as a user meets them: a ``scrapy startproject`` project with the
add-on, a ``CrawlSpider`` with ``allowed_domains`` and ``start_urls``, over a site with no
robots.txt whose pages link off-site (tests/harness/offsite_site.py), fetches counted
on the server.

* Off-site links never reach Redis: the filter holds the site's pages only, every
  request handed out is a page fetched (none ends in an ``IgnoreRequest``), and
  Scrapy's ``offsite/*`` stats count each off-site link, as in one Scrapy process.
* The start page is fetched once a crawl: by one of two workers started together, not
  by a worker that joins later, not as a link back to it, not again when a crawl kept
  with ``SCHEDULER_PERSIST`` is resumed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from harness.offsite_site import final_stats, link_site, start_project
from helpers import wait_workers

PAGES = 40
SEEN_LINE = "is in the crawl's filter already"


def wait_for(condition: Callable[[], bool], timeout: float = 90.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def logs_of(tmp_path: Path, names: list[str]) -> list[str]:
    return [(tmp_path / f"{name}.log").read_text(errors="replace") for name in names]


def test_two_workers_and_a_late_one_fetch_every_page_once_and_nothing_off_site(
        redis_url: str, tmp_path: Path) -> None:
    project = start_project(tmp_path, redis_url)
    late = tmp_path / "w2.log"
    # The pages past the 8th wait until the third worker has joined: the crawl is
    # under way (two pages leased) when it starts.
    with link_site(PAGES, gate_after=8) as site:
        workers = [project.start(tmp_path / f"w{i}.log", site.url) for i in range(2)]
        assert wait_for(lambda: site.page_fetches() > 8)
        home = site.fetches["/"]
        workers.append(project.start(late, site.url))  # joins late
        # Until it has dealt with its start request (or the site was asked for it again).
        joined = wait_for(lambda: (late.exists() and SEEN_LINE in late.read_text())
                          or site.fetches["/"] > home)
        site.gate.set()
        codes = wait_workers(workers, timeout=120)
        fetches = dict(site.fetches)
    logs = logs_of(tmp_path, ["w0", "w1", "w2"])
    assert codes == [0, 0, 0], [log[-3000:] for log in logs]
    assert joined, "the third worker did not deal with its start request in time"
    # Every page once, the start page included; robots.txt asked by each worker (404).
    assert {p: n for p, n in fetches.items() if p != "/robots.txt"} == \
        dict.fromkeys(site.paths, 1)
    stats = [final_stats(log) for log in logs]
    # The filter: the site's pages, nothing off-site.
    assert sum(s.get("bloomdupe/new", 0) for s in stats) == PAGES
    # Every request handed out was fetched: no off-site one reached the queue, to end in
    # an IgnoreRequest.
    assert sum(s.get("scheduler/dequeued/redis", 0) for s in stats) == PAGES
    assert not any("IgnoreRequest" in name for s in stats for name in s)
    # Scrapy's own off-site figures: each off-site link of each page, each worker its
    # domains (logged once each).
    assert sum(s.get("offsite/filtered", 0) for s in stats) == \
        sum(len(site.offsite_links(p)) for p in site.paths)
    for s, log in zip(stats, logs, strict=True):
        domains = log.count("Filtered offsite request to ")
        assert s.get("offsite/domains", 0) == domains <= 4
    # The two that did not queue the start page found it in the crawl, and said so.
    assert sum(SEEN_LINE in log for log in logs) == 2
    assert SEEN_LINE in logs[2]


def test_a_resumed_crawl_does_not_fetch_its_start_page_again(redis_url: str,
                                                            tmp_path: Path) -> None:
    project = start_project(tmp_path, redis_url)
    project.settings["SCHEDULER_PERSIST"] = "True"
    with link_site(PAGES) as site:
        first = project.start(tmp_path / "first.log", site.url, CLOSESPIDER_PAGECOUNT="5")
        assert wait_workers([first], timeout=120) == [0]
        assert "closespider_pagecount" in (tmp_path / "first.log").read_text()
        assert site.fetches["/"] == 1
        resumed = project.start(tmp_path / "resumed.log", site.url)
        assert wait_workers([resumed], timeout=120) == [0], \
            (tmp_path / "resumed.log").read_text()[-3000:]
        fetches = dict(site.fetches)
    # The rest of the crawl, from the queue it kept; the start page not again. (A page
    # whose download was under way when the first run stopped may be fetched again: it
    # was not done.)
    assert fetches["/"] == 1
    assert all(fetches.get(path, 0) >= 1 for path in site.paths)
    assert SEEN_LINE in (tmp_path / "resumed.log").read_text()


@pytest.mark.parametrize("start_once", ["False"])
def test_start_once_off_fetches_the_start_page_in_every_worker(
        redis_url: str, tmp_path: Path, start_once: str) -> None:
    """``BLOOMDUPE_START_ONCE = False``: Scrapy's per-process behaviour, as documented."""
    project = start_project(tmp_path, redis_url)
    with link_site(8) as site:
        workers = [project.start(tmp_path / f"w{i}.log", site.url,
                                 BLOOMDUPE_START_ONCE=start_once) for i in range(2)]
        assert wait_workers(workers, timeout=120) == [0, 0]
        # Each worker's own start request, then once as a link back to it.
        assert site.fetches["/"] == 3
