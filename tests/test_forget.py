"""``bloomdupe forget``: the next request for each forgotten URL counts as new exactly
once, whichever worker asks (local caches included), with or without a window, on both
engines; fingerprinted as ``bloomdupe check`` fingerprints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from harness.local_cluster import LocalCluster
from helpers import ROOT, cluster_client, fps
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter
from test_cli import SITE, clean, run_cli, run_scrapy

from scrapy_bloomdupe import keys, sizing
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.bloom.forgetting import FORGET_CHECK_EVERY, FORGET_SETTLE
from scrapy_bloomdupe.localcache import LocalCache, TimedCache
from scrapy_bloomdupe.testing import RedisServer

WINDOW = sizing.Window(60_000)
#: Slices of days: a cache entry of an item answered "seen" (kept until its slice ends,
#: less a margin) does not lapse during a test that counts the cache's answers.
LONG_WINDOW = sizing.Window(30 * 86_400_000)


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
    started = time.monotonic()
    assert tool.forget_many([items[3], items[150], items[3]]) == 2
    assert time.monotonic() - started >= FORGET_SETTLE  # no cache answers for them now
    assert tool.forget_many([items[3]]) == 0  # already waiting
    assert tool.forgotten() == 2
    answers = two.add_many(items)
    assert [i for i, new in enumerate(answers) if new] == [3, 150]
    assert not any(one.add_many(items)) and not any(two.add_many(items))
    assert tool.forgotten() == 0
    assert two.contains_many([items[3]]) == [True]  # added again


def forget_during_the_next_lookup(bloom: BloomFilter, forget: Callable[[], object]) -> None:
    """Make ``bloom``'s next local-cache lookup run ``forget`` whole before it looks: a
    worker paused between its read of the forget counter and its lookup."""
    cache = bloom.cache
    base = type(cache)

    class Paused(base):  # type: ignore[valid-type,misc]
        def __contains__(self, item: bytes) -> bool:
            cache.__class__ = base
            forget()
            return base.__contains__(self, item)

    cache.__class__ = Paused


@pytest.mark.parametrize("window", [None, LONG_WINDOW], ids=["no-window", "window"])
def test_right_after_forget_returns_no_cache_answers_for_the_item(
        engine_client: redis.Redis, engine_url: str, window: sizing.Window | None) -> None:
    worker = open_filter(engine_client, window)
    items = fps(20)
    assert all(worker.add_many(items))
    time.sleep(FORGET_CHECK_EVERY)
    assert not any(worker.add_many(items))  # the counter read afresh, then the cache
    assert worker.counters.local_hits == 20
    other = redis.Redis.from_url(engine_url)  # another client, as bloomdupe forget is
    tool = BloomFilter.open(other, "t", None, read_only=True)
    tool.forget_many([items[5]])
    # The very next check, however soon: the worker's last read is older than
    # FORGET_CHECK_EVERY by now, so it reads the counter again and drops its cache.
    assert [i for i, new in enumerate(worker.add_many(items)) if new] == [5]
    assert worker.counters.local_hits == 20
    assert not any(worker.add_many(items))  # once
    assert worker.counters.local_hits == 40
    # A forget that runs whole while the worker is between its (fresh) read of the
    # counter and its lookup: the lookup is not answered from the cache.
    forget_during_the_next_lookup(worker, lambda: tool.forget_many([items[9]]))
    assert [i for i, new in enumerate(worker.add_many(items)) if new] == [9]
    assert worker.counters.local_hits == 40
    assert not any(worker.add_many(items)) and not any(worker.add_many(items))
    assert worker.counters.local_hits == 60
    other.close()


@pytest.mark.parametrize("window", [None, LONG_WINDOW], ids=["no-window", "window"])
def test_a_failed_read_of_the_forget_counter_keeps_the_cache_from_answering(
        engine_client: redis.Redis, window: sizing.Window | None) -> None:
    worker = open_filter(engine_client, window)
    items = fps(20)
    assert all(worker.add_many(items))
    tool = BloomFilter.open(engine_client, "t", None, read_only=True)
    tool.forget_many([items[5]])
    counter = keys.forgets("t")
    assert engine_client.get(counter) == b"1"
    engine_client.delete(counter)
    engine_client.rpush(counter, "not a counter")  # its GET fails now (WRONGTYPE)
    # Redis answers, as it must for the forgotten item; the cache does not.
    assert [i for i, new in enumerate(worker.add_many(items)) if new] == [5]
    assert not any(worker.add_many(items))
    assert worker.counters.local_hits == 0
    engine_client.delete(counter)
    engine_client.set(counter, 1)  # readable again, as the forget left it
    assert not any(worker.add_many(items)) and not any(worker.add_many(items))
    assert worker.counters.local_hits == 20


@pytest.mark.parametrize("cache", [LocalCache, TimedCache])
def test_the_cache_does_not_answer_while_redis_is_away(cache: type) -> None:
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        worker = open_filter(client, None if cache is LocalCache else LONG_WINDOW)
        assert isinstance(worker.cache, cache)
        items = fps(20)
        assert all(worker.add_many(items))
        assert not any(worker.add_many(items)) and worker.counters.local_hits == 20
        time.sleep(FORGET_CHECK_EVERY)  # the last read of the forget counter is stale
        server.stop()
        with pytest.raises(redis.ConnectionError):
            worker.add_many(items)  # sent to Redis, not answered from the cache
        assert worker.counters.local_hits == 20
        client.close()


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


def test_check_answers_new_for_a_forgotten_url(redis_url: str, client: redis.Redis) -> None:
    """``check`` right after ``forget`` says what the next crawl's check says: new (it
    said "seen", from the bits, though the URL waits to be re-admitted); once a
    worker has re-admitted it, seen again. It reads only."""
    urls = [f"{SITE}/page/{i}" for i in range(3)]
    fingerprinter = RequestFingerprinter()
    bloom = open_filter(client, None, key="shop:bloomdupe")
    bloom.add_many([fingerprinter.fingerprint(Request(u)) for u in urls])
    forgot = run_cli("forget", "--spider", "shop", urls[1], redis_url=redis_url)
    assert forgot.returncode == 0, forgot.stderr
    result = run_cli("check", "--spider", "shop", *urls, "--json", redis_url=redis_url)
    clean(result)
    assert result.returncode == 0, result.stderr
    assert [r["seen"] for r in json.loads(result.stdout)["results"]] == [True, False, True]
    assert bloom.add_many([fingerprinter.fingerprint(Request(urls[1]))]) == [True]  # new
    result = run_cli("check", "--spider", "shop", urls[1], redis_url=redis_url)
    assert result.returncode == 0 and result.stdout.startswith("seen"), result.stdout


def test_keys_lists_and_clear_deletes_the_forget_counter(redis_url: str, client: redis.Redis
                                                         ) -> None:
    """After a forget, ``keys`` lists the forget counter (``K:forgets``) and ``clear``
    deletes it with the rest: it was left behind, alone, listed by nothing."""
    bloom = open_filter(client, None, key="shop:bloomdupe")
    bloom.add_many([RequestFingerprinter().fingerprint(Request(f"{SITE}/page/0"))])
    bloom.close()
    assert run_cli("forget", "--spider", "shop", f"{SITE}/page/0",
                   redis_url=redis_url).returncode == 0
    result = run_cli("keys", "--spider", "shop", "--json", redis_url=redis_url)
    clean(result)
    listed = {row["key"] for row in json.loads(result.stdout)["keys"]}
    assert listed == {k.decode() for k in client.scan_iter()}
    assert keys.forgets("shop:bloomdupe") in listed
    result = run_cli("clear", "--spider", "shop", "--yes", redis_url=redis_url)
    clean(result)
    assert result.returncode == 0, result.stderr
    assert list(client.scan_iter()) == []


def test_ctrl_c_during_a_forget_says_what_holds(redis_url: str, client: redis.Redis) -> None:
    """Interrupted while it waits for workers' caches (after the counter was raised),
    ``bloomdupe forget`` says to run it again and exits 130, with no traceback."""
    bloom = open_filter(client, None, key="shop:bloomdupe")
    process = subprocess.Popen(
        [sys.executable, "-m", "scrapy_bloomdupe.cli", "forget", "--key", "shop:bloomdupe",
         f"{SITE}/page/1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "REDIS_URL": redis_url},
        # Python answers SIGINT only if it was not ignored when it started: a test run
        # started in the background by a shell without job control ignores it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while client.get(keys.forgets("shop:bloomdupe")) is None:  # it waits from here
            assert process.poll() is None and time.monotonic() < deadline, process.stderr
            time.sleep(0.01)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, (out, err)
    assert "forget interrupted" in err and "run the same forget again" in err, err
    assert "Traceback" not in err
    assert bloom.forgotten() == 1


def test_a_forget_on_redis_cluster_waits_for_each_masters_replica(
        local_cluster: LocalCluster, cluster_url: str) -> None:
    """On a cluster each master's share of the forget (its shards' forgotten sets, and the
    counter on its master) ends with ``WAIT 1`` on that master: every master here has a
    replica. Then each forgotten item is new once."""
    rc = cluster_client(cluster_url)
    masters = [local_cluster.node(port).client() for port in local_cluster.master_ports()]
    try:
        bf = BloomFilter.open(rc, "cf", sizing.plan(10_000, 0.001, shards=6), local_cache=0)
        items = fps(60, "cluster-forget/")
        assert bf.add_many(items) == [True] * 60
        written = {rc.get_node_from_key(keys.forgotten("cf", shard)).name
                   for shard in range(6)} | {rc.get_node_from_key(keys.forgets("cf")).name}
        for master in masters:
            master.config_resetstat()
        assert bf.forget_many(items) == 60
        waits = sum(int(m.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))
                    for m in masters)
        assert waits == len(written) > 1
        assert bf.add_many(items) == [True] * 60
        assert not any(bf.add_many(items))
        bf.clear()
        bf.close()
    finally:
        for master in masters:
            master.close()
        rc.close()
