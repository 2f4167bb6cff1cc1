"""The dupefilter alone (the add-on with ``BLOOMDUPE_SCHEDULER = False``: Scrapy's own
scheduler): its filter outlives the crawl as a ``JOBDIR``'s ``requests.seen`` does.

Real consecutive ``scrapy runspider`` crawls of the demo site, no project settings
(so no ``SCHEDULER_PERSIST`` but the test's): the second fetches nothing the
first fetched; ``SCHEDULER_PERSIST = False`` deletes the filter at close, and the
crawl after that fetches every page again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from helpers import crawl_through_a_freeze, demo_site, start_runspider, take_fetches, wait_workers

PAGES = 60

SPIDER = '''
import scrapy


class OneMachineSpider(scrapy.Spider):
    name = "onemachine"
    custom_settings = {
        "ADDONS": {"scrapy_bloomdupe.addon.BloomDupeAddon": 100},
        "BLOOMDUPE_SCHEDULER": False,
        "BLOOMDUPE_CAPACITY": 10_000,
    }

    async def start(self):
        yield scrapy.Request(self.settings["DEMO_SITE_URL"])

    def parse(self, response):
        yield from response.follow_all(css="a")
'''


def test_the_filter_outlives_the_crawl_as_a_jobdir(durable_redis: str, site: Any,
                                                   tmp_path: Path) -> None:
    spider = tmp_path / "onemachine.py"
    spider.write_text(SPIDER)
    client = redis.Redis.from_url(durable_redis)

    def crawl(run: int, **settings: str) -> str:
        logs = tmp_path / f"run-{run}"
        logs.mkdir()
        processes = start_runspider(spider, logs, 1, {
            "REDIS_URL": durable_redis, "DEMO_SITE_URL": site.url, **settings})
        [code] = wait_workers(processes, timeout=90)
        log = (logs / "worker-0.log").read_text()
        assert code == 0, log[-3000:]
        for bad in ("Traceback", "] ERROR:", "] CRITICAL:"):
            assert bad not in log, log[-3000:]
        return log

    crawl(1)
    assert take_fetches(site) == [1] * PAGES
    assert client.exists("onemachine:bloomdupe:meta") == 1  # kept, as a JOBDIR would
    log = crawl(2)
    assert take_fetches(site) == [0] * PAGES, "the second crawl fetched pages again"
    assert "'dupefilter/filtered': 1" in log  # the home page, seen in the first crawl
    # Asked to clear: this crawl still finds everything seen, then deletes the filter.
    crawl(3, SCHEDULER_PERSIST="False")
    assert take_fetches(site) == [0] * PAGES
    assert client.exists("onemachine:bloomdupe:meta") == 0
    crawl(4)
    assert take_fetches(site) == [1] * PAGES
    client.delete(*client.keys("onemachine:bloomdupe*"), *client.keys("{onemachine:*"))
    client.close()


FROZEN_PAGES = 300


def test_a_frozen_redis_stops_no_download_and_loses_no_request(tmp_path: Path) -> None:
    """The dupefilter alone under Scrapy's own scheduler (no batch middleware: Scrapy
    asks ``request_seen`` for every request), Redis frozen (SIGSTOP) for 5 s in
    mid-crawl: the reactor keeps turning (pages queued before the freeze are fetched
    during it; each round trip waited on the reactor's thread: 0 were), the requests
    found meanwhile wait for Redis in memory, and once it is back every page is
    fetched, once."""
    with demo_site(FROZEN_PAGES, delay=0.05) as site:
        seen = crawl_through_a_freeze(
            site, tmp_path, "CONCURRENT_REQUESTS=2", "SCHEDULER=scrapy.core.scheduler.Scheduler",
            "SPIDER_MIDDLEWARES={}")
    assert seen.longest_gap < 2.5, f"a reactor stood still {seen.longest_gap:.1f} s of 5"
    assert seen.during > 0, "no page fetched while Redis was frozen"
    assert seen.total == [1] * FROZEN_PAGES
