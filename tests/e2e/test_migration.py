"""Migrating a live scrapy-redis crawl to scrapy_bloomdupe, with real crawls.

1. ``scrapy crawl site`` with scrapy-redis's own scheduler and dupefilter, stopped
   part-way (``CLOSESPIDER_PAGECOUNT``), ``SCHEDULER_PERSIST`` on: its SET of
   fingerprints (``site:dupefilter``) and its queue (``site:requests``) stay in
   Redis, as when a crawl is stopped to be migrated.
2. ``bloomdupe import --from-set site:dupefilter`` into a filter with
   scrapy-redis fingerprints, sized as the project's settings size it.
3. ``scrapy crawl site`` again, now with scrapy_bloomdupe's scheduler and
   dupefilter and ``BLOOMDUPE_FINGERPRINT = "scrapy-redis"``: it takes over the
   queue's requests and checks new links against the imported fingerprints.

The demo site (``example_project/demo/site.py``) counts the fetches of each
page: across both crawls every page is fetched exactly once.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import EXAMPLE_PROJECT as PROJECT

PAGES = 400
STOP_AFTER = 80  # pages the old crawl fetches before it is stopped (a few more are in flight)
#: example_project/demo/settings.py's BLOOMDUPE_CAPACITY: the new crawl's workers
#: join the imported filter only if it was made with their parameters.
CAPACITY = 10_000


def fetches(site: Any) -> list[int]:
    with urllib.request.urlopen(site.url + "__stats", timeout=10) as reply:
        counts: list[int] = json.load(reply)["fetches"]
    return counts


def crawl(redis_url: str, site: Any, log: Path, *settings: str
          ) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "scrapy", "crawl", "site", "-s", f"REDIS_URL={redis_url}",
               "-s", f"DEMO_SITE_URL={site.url}", "-s", f"LOG_FILE={log}"]
    for setting in settings:
        command += ["-s", setting]
    env = {**os.environ, "REDIS_URL": redis_url}
    return subprocess.run(command, cwd=PROJECT, capture_output=True, text=True, timeout=120,
                          env=env)


def bloomdupe(*args: str, redis_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scrapy_bloomdupe.cli", *args,
                           "--redis-url", redis_url],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_a_stopped_scrapy_redis_crawl_goes_on_with_bloomdupe(durable_redis: str, site: Any,
                                                             tmp_path: Path) -> None:
    client = redis.Redis.from_url(durable_redis)
    try:
        # 1. The old crawl: scrapy-redis's scheduler and SET dupefilter, stopped part-way.
        old = crawl(durable_redis, site, tmp_path / "old.log",
                    "SCHEDULER=scrapy_redis.scheduler.Scheduler",
                    "DUPEFILTER_CLASS=scrapy_redis.dupefilter.RFPDupeFilter",
                    "SCHEDULER_PERSIST=True", f"CLOSESPIDER_PAGECOUNT={STOP_AFTER}",
                    # A scrapy-redis project has none of scrapy_bloomdupe's components.
                    "SPIDER_MIDDLEWARES={}", "EXTENSIONS={}")
        old_log = (tmp_path / "old.log").read_text()
        assert old.returncode == 0, old.stderr + old_log[-3000:]
        assert "Spider closed (closespider_pagecount)" in old_log
        assert "Traceback" not in old_log
        after_old = fetches(site)
        fetched_by_old = [p for p, n in enumerate(after_old) if n]
        assert max(after_old) == 1  # scrapy-redis alone fetches nothing twice
        assert STOP_AFTER <= len(fetched_by_old) < PAGES  # stopped part-way
        assert client.type("site:dupefilter") == b"set"
        seen_by_old = client.scard("site:dupefilter")
        assert seen_by_old > len(fetched_by_old)  # fetched ones, and found ones still queued
        assert client.zcard("site:requests") > 0

        # 2. Import its SET into a filter with scrapy-redis fingerprints.
        result = bloomdupe("import", "--spider", "site", "--from-set", "site:dupefilter",
                           "--capacity", str(CAPACITY), "--json", redis_url=durable_redis)
        assert result.returncode == 0, result.stderr
        imported = json.loads(result.stdout)
        assert imported["created"] is True
        assert imported["fingerprint"] == "scrapy-redis"
        assert imported["read"] == seen_by_old
        assert imported["added"] + imported["already_present"] == seen_by_old
        assert imported["skipped"] == 0
        # The pages the old crawl fetched are now "seen" for the new one.
        urls = [site.base + site_path(p) for p in fetched_by_old]
        result = bloomdupe("check", "--spider", "site", "--json", *urls, redis_url=durable_redis)
        assert result.returncode == 0, result.stderr
        assert all(r["seen"] for r in json.loads(result.stdout)["results"])

        # 3. The new crawl: scrapy_bloomdupe (the example project's settings), same queue.
        new = crawl(durable_redis, site, tmp_path / "new.log",
                    "BLOOMDUPE_FINGERPRINT=scrapy-redis", "BLOOMDUPE_DONE_GRACE=1")
        new_log = (tmp_path / "new.log").read_text()
        assert new.returncode == 0, new.stderr + new_log[-3000:]
        assert "Spider closed (finished)" in new_log
        bad = [line for line in new_log.splitlines()
               if re.search(r"\] (WARNING|ERROR|CRITICAL):|Traceback", line)]
        assert bad == [], bad
        assert "scrapy-redis fingerprints" in new_log  # the filter it joined

        # Every page fetched exactly once across both crawls: none twice, none never.
        after_new = fetches(site)
        assert [p for p, n in enumerate(after_new) if n > 1] == []
        assert [p for p, n in enumerate(after_new) if n == 0] == []
        assert after_new == [1] * PAGES
        assert client.zcard("site:requests") == 0

        # The new crawl's figures: what it found new is what the old one had not seen.
        result = bloomdupe("stats", "--spider", "site", "--json", redis_url=durable_redis)
        stats = json.loads(result.stdout)
        assert stats["totals"]["new"] == PAGES - seen_by_old
        assert len(stats["workers"]) == 1 and stats["workers"][0]["closed"] == "finished"
    finally:
        client.close()


def site_path(page: int) -> str:
    sys.path.insert(0, str(PROJECT))
    try:
        path: str = importlib.import_module("demo.site").page_path(page)
    finally:
        sys.path.remove(str(PROJECT))
    return path
