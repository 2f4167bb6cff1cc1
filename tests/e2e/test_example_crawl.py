"""End to end: the example project's demo, real ``scrapy crawl`` workers, real Redis.

Runs ``example_project/run_demo.py`` (the one demo command) against the
session's Redis with 3 workers on a 500-page site, then checks from the site's
own fetch counts that every page was fetched exactly once, and from each
worker's stats that the Bloom filter did the filtering.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from helpers import RUN_DEMO, run_tree

PAGES = 500
WORKERS = 3
STAT_KEYS = (
    "dupefilter/filtered",
    "bloomdupe/checked",
    "bloomdupe/new",
    "bloomdupe/duplicates",
    "bloomdupe/hit_rate",
    "bloomdupe/redis_errors",
    "bloomdupe/lock/acquired",
    "bloomdupe/fill_ratio",
    "bloomdupe/estimated_items",
    "bloomdupe/estimated_false_positive_rate",
    "bloomdupe/memory_bytes",
)


def demo_command(redis_url: str, out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(RUN_DEMO), "--workers", str(WORKERS), "--pages", str(PAGES),
            "--redis-url", redis_url, "--out", str(out), "--timeout", "240", *extra]



@pytest.fixture
def durable_server(server_url: str) -> Iterator[str]:
    """An emptied server of each kind in turn (Redis, Valkey) with an RDB save point, as
    ``durable_redis``."""
    client = redis.Redis.from_url(server_url)
    before = client.config_get("save")["save"]
    client.config_set("save", "3600 1")
    try:
        yield server_url
    finally:
        client.config_set("save", before)
        client.close()


@pytest.mark.slow
def test_demo_crawl_fetches_every_page_exactly_once(durable_server: str, tmp_path: Path) -> None:
    """On Redis, and on Valkey (``server``)."""
    result = run_tree(demo_command(durable_server, tmp_path), timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "pages fetched twice" in result.stdout and "Bloom filter in Redis" in result.stdout

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ok"], summary["problems"]
    assert summary["pages"] == PAGES
    assert summary["fetch_counts"] == [1] * PAGES  # each page once: none twice, none missed
    assert summary["fetched_twice"] == [] and summary["never_fetched"] == []

    workers = summary["workers"]
    assert len(workers) == WORKERS
    for w in workers:
        assert w["returncode"] == 0, w["name"]
        assert w["bad_log_lines"] == [], w["name"]
        stats = w["stats"]
        assert stats["finish_reason"] == "finished"
        missing = [key for key in STAT_KEYS if key not in stats]
        assert not missing, f"{w['name']} lacks {missing}"
        assert stats["bloomdupe/checked"] == stats["bloomdupe/new"] + stats["bloomdupe/duplicates"]
        assert stats["dupefilter/filtered"] == stats["bloomdupe/duplicates"]
        assert stats["bloomdupe/redis_errors"] == 0
        # The filter all workers share: every worker reads the same one at close.
        assert stats["bloomdupe/memory_bytes"] == summary["filter"]["memory_bytes"]

    def total(key: str) -> int:
        return sum(w["stats"].get(key, 0) for w in workers)

    # One admitted URL per page, across the workers; every other check was a duplicate.
    assert total("bloomdupe/new") == PAGES
    assert total("downloader/response_count") == PAGES
    assert total("dupefilter/filtered") == summary["duplicates_filtered"] > PAGES
    # The crawl was shared: more than one worker fetched pages.
    assert sum(1 for w in workers if w["stats"].get("downloader/response_count")) >= 2
    assert summary["set_memory_bytes"] > summary["filter"]["memory_bytes"] > 0

    # A Redis that is not the demo's own: its keys are gone afterwards.
    client = redis.Redis.from_url(durable_server)
    try:
        assert client.keys("*bloomdupe-demo-*") == []
    finally:
        client.close()


@pytest.mark.slow
def test_demo_fails_loudly_when_a_worker_dies(durable_redis: str, tmp_path: Path) -> None:
    process = subprocess.Popen(demo_command(durable_redis, tmp_path), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        pids: list[int] = []
        deadline = time.monotonic() + 180
        for line in process.stdout:
            if match := re.search(r"pids ([\d, ]+)\)", line):
                pids = [int(p) for p in match.group(1).split(", ")]
            elif pids and re.search(r"pages fetched +[1-9]", line):
                os.kill(pids[-1], signal.SIGKILL)  # mid-crawl, as in a crash
                break
            assert time.monotonic() < deadline, "the crawl never got going"
        stdout, stderr = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 1, stdout + stderr
    assert f"DEMO FAILED: worker-{WORKERS} crashed (killed by SIGKILL)" in stderr
    assert f"lines of {tmp_path / f'worker-{WORKERS}.log'}" in stderr  # the worker's log tail
