"""Crawl-wide counters (crawlstats.py): every worker's figures added up in Redis."""

from __future__ import annotations

import redis

from scrapy_bloomdupe import crawlstats, keys


def test_workers_add_up_and_each_keeps_its_line(client: redis.Redis) -> None:
    one = crawlstats.CrawlStats(client, "k", worker_id="host:1")
    two = crawlstats.CrawlStats(client, "k", worker_id="host:2")
    one.flush({"checked": 10, "new": 4, "duplicates": 6})
    totals = two.flush({"checked": 5, "new": 5})
    assert totals["checked"] == 15 and totals["new"] == 9 and totals["duplicates"] == 6
    # A flush adds only what grew since the last one.
    totals = one.flush({"checked": 12, "new": 4, "duplicates": 8}, closed="finished")
    assert totals["checked"] == 17 and totals["duplicates"] == 8
    read = crawlstats.read(client, "k")
    assert read["totals"]["checked"] == 17
    assert read["totals"]["hit_rate"] == 8 / 17
    assert read["workers"]["host:1"]["closed"] == "finished"
    assert read["workers"]["host:2"]["checked"] == 5
    crawlstats.clear(client, "k")
    assert not client.exists(keys.stats("k"), keys.workers("k"))
