"""Issue 49, a user's first hour: a project made by ``scrapy startproject`` (the
installed Scrapy's template: ``ROBOTSTXT_OBEY = True``), the add-on in the template's
``ADDONS`` line, two workers of a ``CrawlSpider`` over a static site that has no
robots.txt (a 404) and one broken link, ``SCHEDULER_PERSIST`` off (the default).

One crawl for the module (:func:`first_crawl`), looked at by each test; the template's
``DOWNLOAD_DELAY = 1`` is set to 0 on the command line, for time's sake only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from harness.startproject import Project, Run, StaticSite, docs_pages, start_project, static_site

from scrapy_bloomdupe.testing import RedisServer

PAGES = 8
#: The template's DOWNLOAD_DELAY = 1 at 0 (time), and a misspelt setting (item 5).
SETTINGS = {"DOWNLOAD_DELAY": 0, "BLOOMDUPE_CAPACTIY": 1000}


@dataclass
class FirstCrawl:
    project: Project
    site: StaticSite
    runs: list[Run]
    redis_url: str
    #: The site's fetches by path when the first crawl ended.
    fetched: dict[str, int]


@pytest.fixture(scope="module")
def first_crawl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FirstCrawl]:
    tmp = tmp_path_factory.mktemp("first-day")
    with RedisServer() as server, static_site(tmp / "site", docs_pages(PAGES)) as site:
        project = start_project(tmp, server.url)
        runs = project.crawl(site.url + "index.html", workers=2, settings=SETTINGS)
        yield FirstCrawl(project, site, runs, server.url, site.fetched())


def test_the_crawl_fetched_every_page_and_exited_0(first_crawl: FirstCrawl) -> None:
    assert [run.code for run in first_crawl.runs] == [0, 0], first_crawl.runs[0].text()[-3000:]
    fetched = first_crawl.fetched
    for i in range(PAGES):
        assert fetched.get(f"/page-{i}.html") == 1, fetched
    assert fetched.get("/changelog.html") == 1, fetched


def test_no_robots_txt_is_no_error(first_crawl: FirstCrawl) -> None:
    """Item 1: robots.txt answers 404 (each worker asks): no ERROR, no traceback, no
    ``robotstxt/exception_count``; the request did not come from the scheduler, so it is
    not recorded as failed, and the broken link, which did, is."""
    assert first_crawl.fetched.get("/robots.txt", 0) >= 1
    for run in first_crawl.runs:
        text = run.text()
        assert "ERROR" not in text, "\n".join(run.lines("ERROR"))
        assert "Traceback" not in text
        assert "robotstxt/exception_count" not in text
    # (a worker that fetched nothing, the other having taken every page, asked for none)
    assert any("robotstxt/response_status_count/404" in run.text() for run in first_crawl.runs)
    recorded = [line for run in first_crawl.runs for line in run.lines("Failed for good")]
    assert len(recorded) == 1 and "/changelog.html> (HTTP 404)" in recorded[0], recorded


def test_a_misspelt_setting_is_named_once_at_start(first_crawl: FirstCrawl) -> None:
    """Item 5: ``-s BLOOMDUPE_CAPACTIY=1000`` ran with the default, silently."""
    for run in first_crawl.runs:
        warned = run.lines("Unknown setting")
        assert len(warned) == 1, warned
        assert "WARNING" in warned[0] and "BLOOMDUPE_CAPACTIY (did you mean " \
            "BLOOMDUPE_CAPACITY?)" in warned[0]


def test_the_log_has_no_noise_and_no_untruth(first_crawl: FirstCrawl) -> None:
    """Item 6: redis-py 8's "Failed to enable maintenance notifications" (4 a worker on
    Redis 7), "est. FPR -0", and "Resuming crawl" from a worker of a brand-new crawl."""
    for run in first_crawl.runs:
        text = run.text()
        assert "maintenance notifications" not in text
        assert "FPR -0" not in text
        assert "Resuming" not in text
        assert len(run.lines("Bloom filter closed:")) == 1


def test_the_crawls_report_outlives_it_until_cleared(first_crawl: FirstCrawl) -> None:
    """Item 4: a worker said "recorded in Redis; `bloomdupe failed` lists such requests",
    and once the crawl (SCHEDULER_PERSIST off) ended `bloomdupe failed` answered "No
    crawl at key": the report was deleted with the rest. It is kept
    (BLOOMDUPE_REPORT_TTL), the last worker sums the crawl up in one line, `bloomdupe
    keys` lists the end mark, a new crawl at the key starts afresh, and `bloomdupe clear`
    removes what a finished crawl left (it exited 1, "No Bloom filter")."""
    project = first_crawl.project
    assert [run.code for run in first_crawl.runs] == [0, 0]
    listed = project.scrapy("bloomdupe", "failed", "docs")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "/changelog.html" in listed.stdout and "HTTP 404" in listed.stdout
    stats = project.scrapy("bloomdupe", "stats", "docs")
    assert stats.returncode == 0, stats.stdout + stats.stderr
    summaries = [line for run in first_crawl.runs for line in run.lines(" is over, over all")]
    assert len(summaries) == 1, summaries  # the last worker's
    pages = sum(int(n) for run in first_crawl.runs
                for n in re.findall(r"'response_received_count': (\d+)", run.text()))
    assert f"docs:bloomdupe is over, over all its workers: {pages} pages, " in summaries[0]
    assert ", 1 failed. SCHEDULER_PERSIST is off" in summaries[0]
    assert "kept for 7 days (BLOOMDUPE_REPORT_TTL)" in summaries[0]
    listed_keys = project.scrapy("bloomdupe", "keys", "docs")
    assert "docs:bloomdupe:finished" in listed_keys.stdout, listed_keys.stdout
    requeue = project.scrapy("bloomdupe", "failed", "docs", "--requeue")
    assert requeue.returncode == 1 and "Traceback" not in requeue.stderr
    assert "is over" in requeue.stderr and "no queue to put them back in" in requeue.stderr

    # The next run at the same key starts afresh: every page again, its own report only.
    (again,) = project.crawl(first_crawl.site.url + "index.html", settings=SETTINGS)
    assert again.code == 0, again.text()[-3000:]
    fetched = first_crawl.site.fetched()
    assert all(fetched[path] == 2 * n for path, n in first_crawl.fetched.items()
               if path.startswith("/page-")), fetched
    listed = project.scrapy("bloomdupe", "failed", "docs", "--json")
    assert json.loads(listed.stdout)["total"] == 1

    cleared = project.scrapy("bloomdupe", "clear", "docs", "--yes")
    assert cleared.returncode == 0, cleared.stdout + cleared.stderr
    assert "report of the finished crawl" in cleared.stdout + cleared.stderr
    left = project.scrapy("bloomdupe", "keys", "docs")
    assert "No key of the crawl 'docs:bloomdupe'" in left.stdout, left.stdout
