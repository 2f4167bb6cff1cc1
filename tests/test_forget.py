"""``bloomdupe forget``: the next request for each forgotten URL counts as new exactly
once, whichever worker asks (local caches included), with or without a window, on both
engines; fingerprinted as ``bloomdupe check`` fingerprints."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis
from helpers import ROOT, fps
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter
from test_cli import SITE, clean, run_cli, run_scrapy

from scrapy_bloomdupe import keys, sizing
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.bloom.forgetting import FORGET_CHECK_EVERY

WINDOW = sizing.Window(60_000)


def open_filter(client: redis.Redis, window: sizing.Window | None, key: str = "t"
                ) -> BloomFilter:
    plan = (sizing.plan(10_000, 0.001, shards=3) if window is None
            else sizing.window_plan(10_000, 0.001, window, shards=3))
    return BloomFilter.open(client, key, plan, window=window, local_cache=1000)


@pytest.mark.parametrize("window", [None, WINDOW], ids=["no-window", "window"])
def test_a_forgotten_item_is_new_once_on_every_worker(engine_client: redis.Redis,
                                                      window: sizing.Window | None) -> None:
    one, two = open_filter(engine_client, window), open_filter(engine_client, window)
    items = fps(200)
    assert one.add_many(items) == [True] * 200
    assert not any(two.add_many(items)) and not any(one.add_many(items))
    assert one.counters.local_hits == 200 and two.counters.local_hits == 0
    assert not any(two.add_many(items))  # now from two's cache as well
    tool = BloomFilter.open(engine_client, "t", None, read_only=True)
    assert tool.forget_many([items[3], items[150], items[3]]) == 2
    assert tool.forget_many([items[3]]) == 0  # already waiting
    assert tool.forgotten() == 2
    time.sleep(FORGET_CHECK_EVERY + 0.1)  # the workers look at the forget counter
    answers = two.add_many(items)
    assert [i for i, new in enumerate(answers) if new] == [3, 150]
    assert not any(one.add_many(items)) and not any(two.add_many(items))
    assert tool.forgotten() == 0
    assert two.contains_many([items[3]]) == [True]  # added again


def test_forget_from_the_command_line(redis_url: str, client: redis.Redis, tmp_path: Path
                                      ) -> None:
    urls = [f"{SITE}/page/{i}" for i in range(5)]
    fingerprinter = RequestFingerprinter()
    bloom = open_filter(client, None, key="shop:bloomdupe")
    bloom.add_many([fingerprinter.fingerprint(Request(u)) for u in urls])
    listed = tmp_path / "urls.txt"
    listed.write_text(f"# re-fetch these\n{urls[1]}\n\n{urls[2]}\n{SITE}/never-seen\n")
    result = run_cli("forget", "--spider", "shop", urls[0], "--file", str(listed), "--json",
                     redis_url=redis_url)
    clean(result)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["forgotten"], data["were_seen"], data["waiting"]) == (4, 3, 4)
    time.sleep(FORGET_CHECK_EVERY + 0.1)
    answers = bloom.add_many([fingerprinter.fingerprint(Request(u)) for u in urls])
    assert answers == [True, True, True, False, False]
    result = run_cli("forget", "--key", "shop:bloomdupe", redis_url=redis_url)
    assert result.returncode == 2 and "forget which URLs" in result.stderr
    result = run_cli("forget", "--key", "shop:bloomdupe", "not a url", redis_url=redis_url)
    assert result.returncode == 2 and "bad URL" in result.stderr
    # (PYTHONPATH: the package of this checkout, also when it is a git worktree.)
    result = run_scrapy("forget", "--key", "shop:bloomdupe", urls[4], redis_url=redis_url,
                        env={"PYTHONPATH": str(ROOT)})
    clean(result)
    assert result.returncode == 0, result.stderr
    assert "Forgot 1 URL(s)" in result.stdout and "1 of them were in the filter" in result.stdout
    assert client.scard(keys.forgotten("shop:bloomdupe", 0)) + client.scard(
        keys.forgotten("shop:bloomdupe", 1)) + client.scard(
        keys.forgotten("shop:bloomdupe", 2)) == 2  # SITE/never-seen and page/4
