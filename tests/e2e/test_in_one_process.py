"""Several crawlers in one process (``AsyncCrawlerProcess``), each with the add-on and a
crawl key of its own on one Redis: two spiders, the same spider under two
``BLOOMDUPE_KEY`` s, and ``BLOOMDUPE_POLITENESS = "crawl"`` beside ``"worker"``. Each
fetches its own site's pages once, both finish, and each crawler's stats are its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import EXAMPLE_PROJECT, demo_site, run_python, take_fetches

PAGES = 60
OTHER_PAGES = 40

SCRIPT = '''
import json, sys
sys.path.insert(0, {project!r})
from scrapy.crawler import AsyncCrawlerProcess
from demo.spiders.site import SiteSpider

process = AsyncCrawlerProcess({{
    "ADDONS": {{"scrapy_bloomdupe.addon.BloomDupeAddon": 100}}, "REDIS_URL": {redis_url!r},
    "BLOOMDUPE_CAPACITY": 10_000, "BLOOMDUPE_DONE_GRACE": 1.0, "ROBOTSTXT_OBEY": False,
    "TELNETCONSOLE_ENABLED": False, "LOG_LEVEL": "INFO", "LOG_FILE": {log!r}}})
crawlers = []
for name, settings in {crawls!r}:
    spider = type("Spider" + str(len(crawlers)), (SiteSpider,),
                  {{"name": name, "custom_settings": settings}})
    crawlers.append(process.create_crawler(spider))
    process.crawl(crawlers[-1])
process.start()
print(json.dumps([{{k: c.stats.get_value(k) for k in
                   ("finish_reason", "response_received_count", "bloomdupe/new")}}
                  for c in crawlers]))
'''


@pytest.mark.parametrize("crawls", [
    [("site", {}), ("other", {})],
    [("site", {"BLOOMDUPE_KEY": "a:%(spider)s"}), ("site", {"BLOOMDUPE_KEY": "b:%(spider)s"})],
    [("site", {"BLOOMDUPE_POLITENESS": "crawl"}), ("other", {"BLOOMDUPE_POLITENESS": "worker"})],
], ids=["two-spiders", "same-spider-two-keys", "crawl-beside-worker"])
def test_two_crawls_in_one_process(redis_url: str, site: Any, tmp_path: Path,
                                   crawls: list[tuple[str, dict[str, str]]]) -> None:
    with demo_site(OTHER_PAGES) as other:
        mine = [(name, {**settings, "DEMO_SITE_URL": url})
                for (name, settings), url in zip(crawls, (site.url, other.url), strict=True)]
        output = run_python(SCRIPT.format(project=str(EXAMPLE_PROJECT), redis_url=redis_url,
                                          crawls=mine, log=str(tmp_path / "crawl.log")))
        assert take_fetches(other) == [1] * OTHER_PAGES
    assert take_fetches(site) == [1] * PAGES
    log = (tmp_path / "crawl.log").read_text()
    assert log.count("Spider closed (finished)") == 2, log
    for noise in ("Traceback", "] ERROR:", "] CRITICAL:"):
        assert noise not in output + log, log
    stats = json.loads(output.splitlines()[-1])
    assert stats == [{"finish_reason": "finished", "response_received_count": n,
                      "bloomdupe/new": n} for n in (PAGES, OTHER_PAGES)]
