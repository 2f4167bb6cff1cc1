"""A crawl's figures read at once (crawlfigures.py) and the live lines workers write for
them (crawlstats.write_live), against a real Redis."""

from __future__ import annotations

import json
import time

import pytest
import redis
from helpers import BUSY_SLOTS, busy_slots, first_plan, fps
from redis.cluster import RedisCluster

from scrapy_bloomdupe import crawlstats, keys
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.cli import main
from scrapy_bloomdupe.crawlfigures import CrawlReader
from scrapy_bloomdupe.frontier import failed

KEY = "c"


def live(client: redis.Redis, worker: str, pages: int, ttl: float = 30.0, **more: float
         ) -> None:
    figures = {"host": "h", "pid": int(worker.split(":")[1]), "spider": "s",
               "started": time.time(), "pages": pages, "pages_per_second": pages / 10,
               "responses": {"200": pages}, **more}
    assert crawlstats.write_live(client, KEY, worker, figures, {"pages": pages}, ttl) == (
        ["pages"], None)


def test_a_live_line_expires_adds_its_counters_and_is_forgotten(client: redis.Redis) -> None:
    live(client, "h:1", 10, ttl=5)
    live(client, "h:2", 5, requeued=0)
    assert client.hget(keys.stats(KEY), "pages") == b"15"
    assert 0 < client.pttl(keys.live_worker(KEY, "h:1")) <= 5000
    assert set(crawlstats.read_live(client, KEY)) == {"h:1", "h:2"}
    # Its TTL runs out now (a 0.3 s TTL ran out before the read above on a loaded machine).
    client.pexpire(keys.live_worker(KEY, "h:1"), 1)
    deadline = time.monotonic() + 5
    while client.exists(keys.live_worker(KEY, "h:1")) and time.monotonic() < deadline:
        time.sleep(0.01)
    # Killed without a word: its line is gone, its entry stays until pruned.
    assert set(crawlstats.read_live(client, KEY)) == {"h:2"}
    assert crawlstats.live_workers(client, KEY) == ["h:1", "h:2"]
    client.zadd(keys.live(KEY), {"h:1": time.time() - 301})  # 10 TTLs of 30 s ago
    crawlstats.write_live(client, KEY, "h:2", {"pages": 5}, {}, 30, prune=True)
    assert crawlstats.live_workers(client, KEY) == ["h:2"]
    crawlstats.forget_live(client, KEY, "h:2")
    assert crawlstats.read_live(client, KEY) == {}
    assert not client.exists(keys.live(KEY))


def test_what_is_names_the_live_keys() -> None:
    assert keys.what_is(KEY, keys.live(KEY)) == (-1, "running workers, by their last write "
                                                      "(`bloomdupe top`)")
    assert keys.what_is(KEY, keys.live_worker(KEY, "h:1")) == (
        -1, "worker h:1's own figures, while it runs")
    assert keys.belongs(KEY, keys.live_worker(KEY, "h:1"))
    assert keys.belongs(KEY, keys.live(KEY))
    assert not keys.belongs(KEY, "c:lively")


def test_the_reader_gathers_every_figure_of_a_crawl(client: redis.Redis) -> None:
    bloom = BloomFilter.open(client, KEY, first_plan(10_000, 0.001), growth=True)
    try:
        bloom.add_many(fps(200))
        bloom.add_many(fps(50))  # duplicates
    finally:
        bloom.close()
    crawlstats.CrawlStats(client, KEY, "h:1").flush({"checked": 250, "new": 200,
                                                    "duplicates": 50})
    live(client, "h:1", 40, in_flight=3, requeued=2)
    client.zadd(keys.queue(KEY, 0), {b"a": 0, b"b": 0})
    client.hset(keys.leases(KEY, 1), "o:1.0", "0|c")
    failed.record(client, KEY, url="http://x/", method="GET", reason="500", score=0,
                  request=b"r", limit=10)
    client.hincrby(keys.stats(KEY), "failed", 1)
    now_ms = int(client.time()[0]) * 1000
    client.zadd(keys.owners(KEY, 0), {"alive": now_ms, "dead": now_ms - 60_000})

    figures = CrawlReader(client, KEY, lease_timeout=30).read()
    assert figures.totals["checked"] == 250 and figures.totals["duplicates"] == 50
    assert figures.totals["pages"] == 40 and figures.totals["failed"] == 1
    assert figures.totals["requeued"] == 0  # the worker's line said 2, its delta said none
    assert (figures.waiting, figures.leased, figures.failed_kept) == (2, 1, 1)
    assert figures.workers_alive == 1
    assert figures.filter is not None
    assert 0 < figures.filter.fill_ratio < 0.1
    assert 0 < figures.filter.estimated_false_positive_rate < 0.001
    assert abs(figures.filter.configured_error_rate - 0.001) < 1e-12
    assert 150 < figures.filter.estimated_items < 250
    assert figures.filter.generations == 1 and figures.filter.memory_bytes > 0
    (worker,) = figures.workers
    assert (worker.id, worker.pid, worker.pages, worker.in_flight, worker.requeued) == (
        "h:1", "1", 40, 3, 2)
    assert worker.responses == {"200": 40}
    assert figures.pages_per_second == 4.0


def test_the_fill_is_read_at_most_every_filter_every_seconds(client: redis.Redis) -> None:
    bloom = BloomFilter.open(client, KEY, first_plan(10_000, 0.001), growth=True)
    now = [0.0]
    reader = CrawlReader(client, KEY, filter_every=10, clock=lambda: now[0])
    try:
        before = reader.read().filter
        bloom.add_many(fps(500))
        assert reader.read().filter == before  # not read again yet
        now[0] = 10.0
        after = reader.read().filter
    finally:
        bloom.close()
    assert before is not None and after is not None
    assert after.fill_ratio > before.fill_ratio


def test_no_crawl_reads_as_zeros(client: redis.Redis) -> None:
    figures = CrawlReader(client, "nothing").read()
    assert figures.filter is None and figures.problem is None
    assert not any(figures.totals.values())
    assert (figures.waiting, figures.leased, figures.workers_alive, figures.workers) == (
        0, 0, 0, [])


def test_a_damaged_filter_is_a_problem_not_a_crash(client: redis.Redis) -> None:
    client.hset(keys.meta(KEY), mapping={"capacity": "x", "shards": "2"})
    figures = CrawlReader(client, KEY).read()
    assert figures.filter is None
    assert figures.problem is not None and "ValueError" in figures.problem


def test_bloomdupe_keys_lists_the_live_keys_and_clear_deletes_them(
        client: redis.Redis, redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    BloomFilter.open(client, KEY, first_plan(1000, 0.01), growth=True).close()
    live(client, "h:1", 3)
    assert main(["keys", "--json", "--redis-url", redis_url, "--key", KEY]) == 0
    listed = {row["key"]: row for row in json.loads(capsys.readouterr().out)["keys"]}
    assert listed[keys.live(KEY)]["type"] == "zset"
    assert listed[keys.live_worker(KEY, "h:1")]["what"] == "worker h:1's own figures, " \
                                                           "while it runs"
    assert main(["clear", "--yes", "--redis-url", redis_url, "--key", KEY]) == 0
    assert client.keys("*") == []


def test_the_reader_works_on_a_redis_cluster(rc: RedisCluster) -> None:
    bloom = BloomFilter.open(rc, KEY, first_plan(10_000, 0.001, shards=4), growth=True)
    try:
        bloom.add_many(fps(100))
    finally:
        bloom.close()
    crawlstats.write_live(rc, KEY, "h:1", {"pages": 5, "started": 1.0}, {"pages": 5}, 30)
    rc.zadd(keys.owners(KEY, 0), {"alive": time.time() * 1000})  # one machine, one clock
    figures = CrawlReader(rc, KEY).read()
    assert figures.filter is not None and figures.filter.fill_ratio > 0
    assert figures.totals["pages"] == 5
    assert [w.id for w in figures.workers] == ["h:1"]
    assert figures.workers_alive == 1
    assert figures.slots is None
    busy_slots(rc, KEY, shards=4)  # download slots on a cluster, each on its home shard
    slots = CrawlReader(rc, KEY).read().slots
    assert slots is not None
    assert [(s.slot, s.in_flight, s.concurrency, s.waiting) for s in slots.slots] == BUSY_SLOTS
    assert 55 < slots.slots[2].backoff <= 60
