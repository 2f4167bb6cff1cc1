"""scrapy-redis's ``RedisSpider`` (start URLs read from a Redis list) with this package's
add-on: two real ``scrapy runspider`` workers share the crawl of the demo site, each
page fetched once, and both close on their own (``MAX_IDLE_TIME_BEFORE_CLOSE``)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import FEED_SPIDER, start_runspider, wait_workers

from scrapy_bloomdupe import keys

PAGES = 300

SPIDER = FEED_SPIDER


@pytest.mark.slow
def test_redis_spider_workers_share_a_crawl_fed_from_a_redis_list(
        durable_redis: str, site: Any, tmp_path: Path) -> None:
    spider = tmp_path / "feed.py"
    spider.write_text(SPIDER)
    client = redis.Redis.from_url(durable_redis)
    client.lpush("feed:start_urls", site.url)
    settings = {
        "ADDONS": json.dumps({"scrapy_bloomdupe.addon.BloomDupeAddon": 100}),
        "REDIS_URL": durable_redis, "SCHEDULER_PERSIST": "True",
        "MAX_IDLE_TIME_BEFORE_CLOSE": "3", "BLOOMDUPE_DONE_GRACE": "1",
        "LOG_LEVEL": "INFO",
    }
    processes = start_runspider(spider, tmp_path, 2, settings)
    codes = wait_workers(processes, 120)
    logs = [(tmp_path / f"worker-{i}.log").read_text() for i in range(2)]
    for code, log in zip(codes, logs, strict=True):
        assert code == 0, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        assert "Spider closed (finished)" in log
    with urllib.request.urlopen(site.url + "__stats", timeout=10) as reply:
        fetches = json.load(reply)["fetches"]
    # RedisSpider makes its start requests with dont_filter=True (as in scrapy-redis),
    # so the start page is not in the filter and is fetched once more when a page
    # links to it; every other page exactly once.
    assert fetches[0] == 2
    assert [p for p, n in enumerate(fetches[1:], start=1) if n != 1] == []
    assert client.llen("feed:start_urls") == 0
    # The crawl-wide figures (`bloomdupe stats`, `top`) count every page: each worker
    # adds its last ones at close (they were left out, 106 of 200 in a demo crawl).
    assert client.hget(keys.stats("feed:bloomdupe"), "pages") == str(sum(fetches)).encode()
    client.close()
