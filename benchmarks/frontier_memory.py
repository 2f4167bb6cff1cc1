#!/usr/bin/env python
"""The frontier's memory: bytes a waiting or leased request, each queue layout against
scrapy-redis's, measured in one run.

``python benchmarks/frontier_memory.py [--requests 1000000] [--hosts 1000]``; the kinds
of request and the contenders: ``kinds`` and ``contenders`` below; what a figure is, and
the figures: docs/capacity.md (A frontier of a million requests).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from scrapy import Request
from scrapy.settings import Settings
from scrapy_redis import picklecompat
from scrapy_redis.queue import PriorityQueue as RedisPriorityQueue

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scrapy_bloomdupe.frontier.leased import LeasedQueue
from scrapy_bloomdupe.frontier.politeness import OneSlot, SlotPolicy
from scrapy_bloomdupe.frontier.queue import PriorityQueue, status
from scrapy_bloomdupe.testing import RedisServer
from scripts.entry_bytes import SPIDER, docs_url, memory

TAG = "mem:bloomdupe"
BATCH = 1000


def kinds(hosts: int) -> dict[str, Callable[[int], Request]]:
    """A 64-byte URL over ``hosts`` hosts and a callback; a CrawlSpider's request."""
    return {
        "a callback (parse_item)": lambda i: Request(docs_url(i, hosts),
                                                     callback=SPIDER.parse_item),
        "a CrawlSpider's (rule, link text, depth, priority -2)": lambda i: Request(
            docs_url(i, hosts), callback=SPIDER._callback, priority=-2,
            meta={"rule": 0, "link_text": "Model field reference", "depth": 2}),
    }


def contenders(client: redis.Redis) -> dict[str, Callable[[], Any]]:
    """scrapy-redis's ``PriorityQueue`` (pickled ``Request.to_dict`` in a sorted set; its
    pops remove, nothing is leased); this package's sorted set (``frontier/queue.py``, the
    intake, a cluster's layout until 2026-11-27); the download slots' lists
    (``frontier/leased.py``), one slot (``"worker"``) and a slot a host (``"crawl"``)."""
    unlimited = Settings({"CONCURRENT_REQUESTS_PER_DOMAIN": 0, "DOWNLOAD_DELAY": 0})
    return {
        "scrapy-redis PriorityQueue": lambda: RedisPriorityQueue(
            client, SPIDER, "mem:requests", picklecompat),
        "sorted set (the intake)": lambda: PriorityQueue(
            client, SPIDER, "mem:requests", tag=TAG),
        'slots, "worker" (one slot)': lambda: LeasedQueue(
            client, SPIDER, "mem:requests", tag=TAG, policy=OneSlot()),
        'slots, "crawl" (a slot a host)': lambda: LeasedQueue(
            client, SPIDER, "mem:requests", tag=TAG, policy=SlotPolicy(unlimited, SPIDER)),
    }


def measure(client: redis.Redis, make: Callable[[], Any], requests: list[Request],
            leased: int) -> tuple[float, int, int, float]:
    """(bytes a request, waiting, leased, seconds) for one contender."""
    client.flushall()
    started = time.monotonic()
    queue = make()
    if isinstance(queue, PriorityQueue):
        for start in range(0, len(requests), BATCH):
            queue.push_many(requests[start:start + BATCH])
        taken = 0
        while taken < leased:
            got = queue.pop_leases(min(BATCH, leased - taken))
            if not got:
                break
            taken += len(got)
        waiting, held = status(client, TAG, 1)
    else:
        for request in requests:
            queue.push(request)
        waiting, held = int(client.zcard("mem:requests")), 0
    seconds = time.monotonic() - started
    return memory(client) / max(1, waiting + held), waiting, held, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--leased", type=float, default=0.01,
                        help="share of the requests leased after queueing (0.01)")
    args = parser.parse_args(argv)
    leased = int(args.requests * args.leased)
    lines = [f"`python benchmarks/frontier_memory.py --requests {args.requests} --hosts "
             f"{args.hosts}`: bytes a waiting or leased request ({leased:,} leased)", "",
             "| request | layout | waiting | leased | bytes a request | x scrapy-redis | s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    with RedisServer(maxmemory="4gb") as server:
        client = redis.Redis.from_url(server.url)
        for kind, build in kinds(args.hosts).items():
            requests = [build(i) for i in range(args.requests)]
            base = None
            for name, make in contenders(client).items():
                per, waiting, held, seconds = measure(client, make, requests, leased)
                base = base or per
                lines.append(f"| {kind} | {name} | {waiting:,} | {held:,} | {per:.0f} | "
                             f"{per / base:.2f} | {seconds:.0f} |")
        version = client.info("server")["redis_version"]
        client.close()
    print("\n".join(lines) + f"\n\n(Redis {version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
