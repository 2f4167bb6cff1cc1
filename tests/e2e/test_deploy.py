"""A deploy mid-crawl: real ``scrapy runspider`` workers, the add-on, a real Redis and the
demo site.

The crawl is stopped (Ctrl-C, ``SCHEDULER_PERSIST`` on) with requests in the shared
queue that name the callback ``parse_item``; the new version of the spider renamed it
``parse_page``, and an entry written with another serializer (JSON) waits in the queue
too. The new workers retire the entries they cannot decode (counted, one ERROR naming
them, listed by ``bloomdupe failed``), fetch everything else exactly once, and end the
crawl by themselves with exit 0. Once the callback is restored, ``bloomdupe failed
--requeue`` and one more run fetch the rest: every page of the site exactly once over
the three runs. (Measured before: each worker that popped such an entry logged
"Leasing requests failed", a reclaim put it back blaming a failover, and the crawl
never ended.)
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis
from helpers import demo_site, start_runspider, take_fetches, wait_workers, waiting_entries
from scrapy_redis import picklecompat

from scrapy_bloomdupe import keys
from scrapy_bloomdupe.frontier import entry
from scrapy_bloomdupe.frontier import queue as frontier_queue

ADDON = json.dumps({"scrapy_bloomdupe.addon.BloomDupeAddon": 100})
KEY = "deploy:bloomdupe"
PAGES = 180
CONCURRENCY = 4
#: An entry another serializer wrote (JSON, not the crawl's pickle).
JSON_PATH = "written-as-json"

#: The spider: pages whose id is a multiple of 3 are parsed by ITEM_CALLBACK, the others
#: by ``parse``; ``{methods}`` are its methods of that name (each does what parse does).
SPIDER = '''
from urllib.parse import parse_qs, urlsplit

import scrapy


def page(url):
    found = parse_qs(urlsplit(url).query).get("id")
    return int(found[0]) if found else 0


class DeploySpider(scrapy.Spider):
    name = "deploy"

    async def start(self):
        yield scrapy.Request(self.settings.get("DEMO_SITE_URL"))

    def parse(self, response):
        yield {{"url": response.url}}
        for href in response.css("a::attr(href)").getall():
            url = response.urljoin(href)
            callback = self.{item_callback} if page(url) % 3 == 0 else self.parse
            yield scrapy.Request(url, callback=callback)
{methods}
'''


def spider(tmp_path: Path, version: str, item_callback: str, methods: list[str]) -> Path:
    defined = "".join(f"\n    def {name}(self, response):\n"
                      "        yield from self.parse(response)\n" for name in methods)
    path = tmp_path / version / "deploy_spider.py"
    path.parent.mkdir()
    path.write_text(SPIDER.format(item_callback=item_callback, methods=defined))
    return path


def page_id(url: str) -> int:
    found = parse_qs(urlsplit(url).query).get("id")
    return int(found[0]) if found else 0


def settings(redis_url: str, site: Any) -> dict[str, str]:
    return {"ADDONS": ADDON, "REDIS_URL": redis_url, "DEMO_SITE_URL": site.url,
            "BLOOMDUPE_KEY": KEY, "BLOOMDUPE_CAPACITY": "10000", "SCHEDULER_PERSIST": "True",
            "BLOOMDUPE_DONE_GRACE": "1", "LOG_LEVEL": "INFO",
            "CONCURRENT_REQUESTS": str(CONCURRENCY)}


def logs(tmp_path: Path, workers: range) -> list[str]:
    return [(tmp_path / f"worker-{i}.log").read_text(errors="replace") for i in workers]


def stat(log: str, name: str) -> int:
    found = re.search(rf"'{re.escape(name)}': (\d+)", log)
    return int(found.group(1)) if found else 0


def bloomdupe(redis_url: str, *args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "scrapy_bloomdupe.cli", "failed", "--key",
                           KEY, "--redis-url", redis_url, *args, "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def queued_dict(member: bytes) -> dict[str, Any]:
    """A queued member's fields, as the crawl wrote it (a compact entry, its fields by
    the crawl's serializer, pickle): the URL, the callback when it has one, ..."""
    return entry.Codec(picklecompat, None).fields(entry.split_requeues(member)[1])


def assert_clean_exit(codes: list[int], texts: list[str]) -> None:
    for code, text in zip(codes, texts, strict=True):
        assert code == 0, text[-3000:]
        assert "Traceback" not in text and "Leasing requests failed" not in text, text[-3000:]
        # No reclaim, and none blaming a failover that never happened.
        assert "not held by it" not in text and "failover" not in text, text[-3000:]
        assert "'finish_reason': 'finished'" in text, text[-3000:]


def test_entries_a_deploy_made_undecodable_are_retired_and_the_crawl_ends(
        durable_redis: str, tmp_path: Path) -> None:
    client = redis.Redis.from_url(durable_redis)
    with demo_site(PAGES, delay=0.05) as site:
        values = settings(durable_redis, site)
        # Run 1: the old spider, stopped mid-crawl (Ctrl-C: graceful, the queue kept).
        before = spider(tmp_path, "before", "parse_item", ["parse_item"])
        workers = start_runspider(before, tmp_path, 2, values)
        try:
            deadline = time.monotonic() + 180
            while sum(site.fetches) < PAGES // 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            for worker in workers:
                worker.send_signal(signal.SIGINT)
            codes = wait_workers(workers, 60)
        finally:
            wait_workers(workers, 0)
        first = take_fetches(site)
        assert codes == [0, 0], logs(tmp_path, range(2))[0][-3000:]
        waiting, leased = frontier_queue.status(client, KEY, 1)
        assert waiting > 0 and leased == 0, (waiting, leased)
        # The queued requests that name parse_item: the new spider cannot decode them.
        lost = {page_id(d["url"]) for d in map(queued_dict, waiting_entries(client, KEY))
                if d.get("callback") == "parse_item"}
        assert lost, "no request naming parse_item was queued when the crawl stopped"
        json_url = site.url + JSON_PATH
        client.zadd(keys.queue(KEY, 0), {json.dumps({"url": json_url}): 0})

        # Run 2: the new spider (parse_item renamed parse_page).
        after = spider(tmp_path, "after", "parse_page", ["parse_page"])
        codes = wait_workers(start_runspider(after, tmp_path, 2, values, first=2), 60)
        second = take_fetches(site)
        texts = logs(tmp_path, range(2, 4))
        assert_clean_exit(codes, texts)
        both = "\n".join(texts)
        # Counted, and named in ERRORs that say what to do.
        assert sum(stat(text, "bloomdupe/undecodable") for text in texts) == len(lost) + 1
        errors = [line for line in both.splitlines() if " ERROR: " in line]
        assert all("bloomdupe failed --requeue" in line for line in errors), errors
        named = {page_id(url) for url in re.findall(r"(http://\S+) \(", "\n".join(errors))}
        assert named >= lost, (named, lost)
        assert json_url in "\n".join(errors)
        # Listed by `bloomdupe failed`, with their reasons.
        records = bloomdupe(durable_redis)["failed"]
        assert sorted(r["url"] for r in records if r["url"] != json_url) == sorted(
            r["url"] for r in records if page_id(r["url"]) in lost)
        assert {page_id(r["url"]) for r in records if r["url"] != json_url} == lost
        assert all("cannot be decoded" in r["reason"] for r in records), records
        assert sum("parse_item" in r["reason"] for r in records) == len(lost)
        assert len(records) == len(lost) + 1
        # Everything else fetched once over both runs; the retired pages not at all.
        fetched = [a + b for a, b in zip(first, second, strict=True)]
        assert [p for p, n in enumerate(fetched) if n > 1] == [], fetched
        assert all(fetched[p] == 0 for p in lost), [fetched[p] for p in lost]
        assert frontier_queue.status(client, KEY, 1) == (0, 0)

        # The callback restored: requeued, the next run fetches what was left.
        restored = spider(tmp_path, "restored", "parse_page", ["parse_page", "parse_item"])
        assert bloomdupe(durable_redis, "--requeue")["requeued"] == len(lost) + 1
        codes = wait_workers(start_runspider(restored, tmp_path, 1, values, first=4), 60)
        third = take_fetches(site)
        assert_clean_exit(codes, logs(tmp_path, range(4, 5)))
    # The JSON entry is still undecodable: retired again, alone.
    assert [r["url"] for r in bloomdupe(durable_redis)["failed"]] == [json_url]
    total = [a + b for a, b in zip(fetched, third, strict=True)]
    assert [p for p, n in enumerate(total) if n != 1] == [], total
    client.close()
