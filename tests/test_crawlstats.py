"""Crawl-wide counters (crawlstats.py): every worker's figures added up in Redis."""

from __future__ import annotations

import time

import pytest
import redis

from scrapy_bloomdupe import crawlstats, keys
from scrapy_bloomdupe.testing import RedisServer


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


def test_a_flush_a_failover_lost_is_added_again_on_the_new_master(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With asynchronous replication a flush can reach the old master after the replica was
    promoted, and be lost (in a Sentinel failover test, 90% of the crawl's ``new``). After
    the master changed (its epoch), the next flush reads the worker's line on the new
    master, written after the counters, and adds again what is missing. Two real servers:
    the new master a replica detached after the first flush."""
    with RedisServer() as old, RedisServer() as new:
        old_client, new_client = redis.Redis.from_url(old.url), redis.Redis.from_url(new.url)
        new_client.replicaof("127.0.0.1", old.port)
        epoch = 0
        monkeypatch.setattr(crawlstats, "master_epoch", lambda client: epoch)
        worker = crawlstats.CrawlStats(old_client, "k", worker_id="host:1")
        worker.flush({"checked": 10, "new": 5})
        while new_client.hget(keys.workers("k"), "host:1") is None:  # replicated
            time.sleep(0.01)
        new_client.replicaof("NO", "ONE")  # promoted, as of now
        assert worker.flush({"checked": 30, "new": 12})["new"] == 12  # lost: the old one's
        epoch, worker.client = 1, new_client  # the failover, as the worker sees it
        totals = worker.flush({"checked": 40, "new": 15})
        assert (totals["checked"], totals["new"]) == (40, 15)  # not 20 and 8
        assert worker.flush({"checked": 41, "new": 15})["checked"] == 41  # then as before
        old_client.close()
        new_client.close()
