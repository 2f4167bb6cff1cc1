"""A waiting request's bytes in Redis, today's entries against compact ones (docs/capacity.md).

    .venv/bin/python scripts/entry_bytes.py [--requests 100000]

For each kind of request, the same requests are kept in a fresh redis-server
(``scrapy_bloomdupe.testing.RedisServer``): in the queue's sorted set
(``{K:0}:queue``, score -priority) as today's entries (Scrapy's
``Request.to_dict(spider=...)`` pickled, as scrapy-redis writes them) and as
compact ones (``frontier/entry.py``); then each of them leased (the lease hash,
``{K:0}:leases``, once the queue's pops took every one); and, for the list
layout planned in docs/design-notes.md (not built), compact in lists of 100.
A figure is ``MEMORY USAGE`` (exact: ``SAMPLES 0``) of the keys over the
requests; an entry's length is the mean.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import redis
from scrapy import Request, Spider
from scrapy_redis import picklecompat

from scrapy_bloomdupe import keys
from scrapy_bloomdupe.frontier.entry import Codec
from scrapy_bloomdupe.frontier.queue import PriorityQueue
from scrapy_bloomdupe.testing import RedisServer

TAG = "bytes:bloomdupe"
BATCH = 1000
LIST_LENGTH = 100


class DocsSpider(Spider):
    name = "docs"

    def parse_item(self, response: Any) -> None:
        pass

    def _callback(self, response: Any) -> None:  # CrawlSpider's callback of every rule
        pass


SPIDER = DocsSpider()


def docs_url(i: int, hosts: int = 1) -> str:
    """A documentation-like URL of 64 bytes (docs/design-notes.md's measurements) on one of
    ``hosts`` hosts: ``docs.example.org``, or one as long (``benchmarks/frontier_memory.py``)."""
    host = "docs.example.org" if i % hosts == 0 else f"docs{i % hosts:04d}.example"
    return f"https://{host}/django-doc/html/ref/page-{i:09d}.html"


#: The kinds of request: what a spider of each kind queues.
KINDS: dict[str, Callable[[int], Request]] = {
    "a URL alone (the test spider's)": lambda i: Request(docs_url(i)),
    "a callback (parse_item)": lambda i: Request(docs_url(i), callback=SPIDER.parse_item),
    "a CrawlSpider's (rule, link text, depth, DEPTH_PRIORITY)": lambda i: Request(
        docs_url(i), callback=SPIDER._callback, priority=-2,
        meta={"rule": 0, "link_text": "Model field reference", "depth": 2}),
}


def legacy(request: Request) -> bytes:
    return picklecompat.dumps(request.to_dict(spider=SPIDER))  # type: ignore[no-any-return]


def memory(client: redis.Redis, names: list[str] | None = None) -> int:
    """``MEMORY USAGE ... SAMPLES 0`` of ``names`` (None: every key), summed."""
    if names is None:
        names = list(client.scan_iter(count=1000))
    return sum(int(client.memory_usage(name, samples=0) or 0) for name in names)


def measure(client: redis.Redis, requests: list[Request]) -> dict[str, float]:
    codec = Codec(picklecompat, SPIDER)
    out: dict[str, float] = {}
    queue = keys.queue(TAG, 0)
    for label, encode in (("today", legacy), ("compact", codec.encode)):
        client.flushall()
        entries = [encode(r) for r in requests]
        for start in range(0, len(entries), BATCH):
            client.zadd(queue, {e: -r.priority for e, r in zip(
                entries[start:start + BATCH], requests[start:start + BATCH], strict=True)})
        out[f"{label}_entry"] = sum(map(len, entries)) / len(entries)
        out[f"{label}_zset"] = memory(client, [queue]) / len(requests)
        # Every one leased by the queue (its pops read both kinds of entry).
        leasing = PriorityQueue(client, SPIDER, "docs:requests", tag=TAG)
        while leasing.pop_leases(BATCH):
            pass
        out[f"{label}_leased"] = memory(client, [keys.leases(TAG, 0)]) / len(requests)
        if label == "compact":
            client.flushall()
            names = []
            for n, start in enumerate(range(0, len(entries), LIST_LENGTH)):
                names.append(f"{{{TAG}:0}}:slot:docs.example.org:{n}")
                client.rpush(names[-1], *entries[start:start + LIST_LENGTH])
            out["compact_lists"] = memory(client, names) / len(requests)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    count = parser.parse_args().requests
    rows = []
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        info = client.info("server")
        for kind, make in KINDS.items():
            figures = measure(client, [make(i) for i in range(count)])
            rows.append((kind, figures))
        client.close()
    lines = [f"Redis {info['redis_version']}, {count:,} requests of each kind, bytes a request",
             "",
             "| request | entry: today | compact | waiting (zset): today | compact "
             "| leased (hash): today | compact | waiting in lists of 100, compact |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for kind, f in rows:
        lines.append(f"| {kind} | {f['today_entry']:.0f} | {f['compact_entry']:.0f} "
                     f"| {f['today_zset']:.0f} | {f['compact_zset']:.0f} "
                     f"| {f['today_leased']:.0f} | {f['compact_leased']:.0f} "
                     f"| {f['compact_lists']:.0f} |")
    print("\n".join(lines))  # noqa: T201 (a script's output)


if __name__ == "__main__":
    main()
