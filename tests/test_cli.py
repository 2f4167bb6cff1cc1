"""The ``bloomdupe`` tool and ``scrapy bloomdupe``: real processes against a real Redis.

The standalone tool runs as ``python -m scrapy_bloomdupe.cli`` (and once as the
installed console script); the Scrapy command runs as ``python -m scrapy
bloomdupe ...`` inside ``example_project``, reading that project's settings.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import redis
from harness import zygote
from helpers import BUSY_SLOTS, DemoSpider, busy_slots
from helpers import EXAMPLE_PROJECT as PROJECT
from scrapy import Request
from scrapy.dupefilters import RFPDupeFilter
from scrapy.settings import Settings
from scrapy.utils.job import job_dir
from scrapy.utils.request import RequestFingerprinter

from scrapy_bloomdupe import cli, crawlstats, keys, sizing
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.fingerprint import ScrapyRedisFingerprinter
from scrapy_bloomdupe.frontier import failed
from scrapy_bloomdupe.frontier.queue import PriorityQueue
from scrapy_bloomdupe.migrate import JobdirSource, SetSource
from scrapy_bloomdupe.testing import RedisServer, free_port

SITE = "http://shop.example"
URLS = [f"{SITE}/item?id={i}&cat={i % 3}" for i in range(30)]


def _env(redis_url: str | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PYTHONPATH")}
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    env.update(extra or {})
    return env


def run_cli(*args: str, redis_url: str | None = None, stdin: str = "",
            env: dict[str, str] | None = None, process: bool = False
            ) -> subprocess.CompletedProcess[str]:
    """The ``bloomdupe`` tool with ``$REDIS_URL`` set to ``redis_url``.

    In this process (``cli.main``, fast), or with ``process`` as a real
    ``python -m scrapy_bloomdupe.cli`` process.
    """
    if process:
        return subprocess.run([sys.executable, "-m", "scrapy_bloomdupe.cli", *args],
                              capture_output=True, text=True, input=stdin, timeout=180,
                              env=_env(redis_url, env))
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, _env(redis_url, env), clear=True), \
            mock.patch.object(sys, "stdin", io.StringIO(stdin)), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(args))
        except SystemExit as e:  # argparse's usage errors
            code = int(e.code or 0)
    return subprocess.CompletedProcess(["bloomdupe", *args], code, out.getvalue(),
                                       err.getvalue())


def run_scrapy(*args: str, redis_url: str, stdin: str = "",
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``scrapy bloomdupe ARGS -s REDIS_URL=...`` inside the example project."""
    return zygote.run(
        [sys.executable, "-m", "scrapy", "bloomdupe", *args, "-s", f"REDIS_URL={redis_url}"],
        cwd=PROJECT, input=stdin, timeout=180, env=_env(None, env))


def clean(result: subprocess.CompletedProcess[str]) -> str:
    """All the output, after checking it holds no traceback and no Python warning."""
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    assert "Warning:" not in output, output
    return output


def make_filter(client: Any, key: str, urls: Sequence[str], *, mode: str = "scrapy",
                capacity: int = 1000, shards: int = 2, growth: bool = False) -> None:
    bloom = BloomFilter.open(client, key, sizing.plan(capacity, 0.01, shards), growth=growth,
                             fingerprint=mode)
    fingerprinter = ScrapyRedisFingerprinter() if mode == "scrapy-redis" \
        else RequestFingerprinter()
    bloom.add_many([fingerprinter.fingerprint(Request(u)) for u in urls])
    bloom.close()


def scrapy_redis_set(client: redis.Redis, key: str, urls: Sequence[str]) -> None:
    fingerprinter = ScrapyRedisFingerprinter()
    client.sadd(key, *[fingerprinter.fingerprint(Request(u)) for u in urls])


def write_requests_seen(directory: Path, urls: Sequence[str]) -> Path:
    """A JOBDIR written by Scrapy's own RFPDupeFilter, as a crawl with JOBDIR writes it,
    in Scrapy's binary format (2.18 and later: a 2-byte length, then the fingerprint).
    An older Scrapy (the floor lane's) writes one hex line each: those are rewritten
    here in the binary format, the same bytes a newer Scrapy writes."""
    path = job_dir(Settings({"JOBDIR": str(directory)}))
    df = RFPDupeFilter(path)
    for url in [*urls, *urls[:5]]:  # the duplicates are not written twice
        df.request_seen(Request(url))
    df.close("finished")
    seen = directory / "requests.seen"
    written = seen.read_bytes()
    if written and not written.startswith(b"\x00"):
        fps = [bytes.fromhex(line.decode()) for line in written.split()]
        seen.write_bytes(b"".join(len(fp).to_bytes(2, "big") + fp for fp in fps))
    return seen


def info_json(redis_url: str, key: str) -> dict[str, Any]:
    result = run_cli("info", "--key", key, "--json", redis_url=redis_url)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


# -- info -------------------------------------------------------------------------------


def test_info_table(redis_url: str, client: redis.Redis) -> None:
    make_filter(client, "shop:bloomdupe", URLS)
    result = run_cli("info", "--spider", "shop", redis_url=redis_url, process=True)
    out = clean(result)
    assert result.returncode == 0, out
    assert f"Bloom filter 'shop:bloomdupe' in Redis at {redis_url}" in result.stdout
    for text in ("created", "fingerprints", "scrapy: Scrapy's request fingerprinter",
                 "capacity                  1,000 at error rate 0.01", "shards", "hashes",
                 "growth                    off", "estimated items", "fill",
                 "est. false-positive rate", "memory", "Generations", "Shards"):
        assert text in result.stdout, text
    shard_rows = [line for line in result.stdout.splitlines() if re.match(r"  [01] +\d", line)]
    assert len(shard_rows) == 1 + 2  # the generation row and the two shard rows


def test_info_shows_the_shared_queue_per_shard(redis_url: str, client: redis.Redis) -> None:
    make_filter(client, "site:bloomdupe", ["https://a.example/"], shards=2)
    queue = PriorityQueue(client, DemoSpider(), "site:requests", tag="site:bloomdupe", shards=2)
    queue.push_many([Request(f"https://a.example/{i}") for i in range(3)])
    assert len(queue.pop_leases(1)) == 1
    result = run_cli("info", "--key", "site:bloomdupe", "--json", redis_url=redis_url)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)["queue"]
    assert (data["waiting"], data["leased"]) == (2, 1)
    assert sum(s["waiting"] for s in data["shards"]) == 2
    text = clean(run_cli("info", "--key", "site:bloomdupe", redis_url=redis_url))
    assert "2 request(s) waiting, 1 leased by workers" in text


def test_info_shows_the_busiest_download_slots(redis_url: str, client: redis.Redis) -> None:
    make_filter(client, "site:bloomdupe", ["https://a.example/"], shards=2)
    assert info_json(redis_url, "site:bloomdupe")["slots"] is None  # politeness "worker"
    text = clean(run_cli("info", "--key", "site:bloomdupe", redis_url=redis_url))
    assert "download slots" not in text
    busy_slots(client, "site:bloomdupe")
    data = info_json(redis_url, "site:bloomdupe")["slots"]
    assert (data["in_flight_slots"], data["ready_slots"]) == (2, 2)
    assert [(s["slot"], s["in_flight"], s["concurrency"], s["waiting"])
            for s in data["slots"]] == BUSY_SLOTS
    slow, paused = data["slots"][1], data["slots"][2]
    assert slow["delay"] == 30 and 25 < slow["next_start"] <= 30 and slow["backoff"] == 0
    assert 55 < paused["backoff"] <= 60
    assert set(data["slots"][0]) == {"slot", "in_flight", "concurrency", "waiting", "delay",
                                     "next_start", "backoff"}
    assert info_json(redis_url, "site:bloomdupe")["queue"] == {
        "waiting": 12, "leased": 3, "shards": [{"index": 0, "waiting": 12, "leased": 3},
                                               {"index": 1, "waiting": 0, "leased": 0}]}
    text = clean(run_cli("info", "--key", "site:bloomdupe", redis_url=redis_url))
    block = text[text.index("Busiest download slots"):].splitlines()
    assert block[0] == ("Busiest download slots (2 with requests in flight, 2 ready to go "
                        "now or later)")
    assert block[1].split() == ["slot", "in", "flight", "limit", "waiting", "delay", "next",
                                "start", "in", "backed", "off", "for"]
    assert block[2].split() == ["one.test", "2", "2", "3", "-", "-", "-"]
    assert block[3].split()[:5] == ["slow.test", "1", "1", "2", "30"]
    assert block[4].split()[:6] == ["paused.test", "0", "1", "4", "-", "-"]
    assert block[5].split() == ["odd:80|x%", "0", "4", "3", "-", "-", "-"]


def test_info_json_options_before_or_after_the_command(redis_url: str,
                                                       client: redis.Redis) -> None:
    make_filter(client, "shop:bloomdupe", URLS, growth=True)
    for args in (["--json", "--redis-url", redis_url, "info", "--key", "shop:bloomdupe"],
                 ["info", "--spider", "shop", "--key-template", "%(spider)s:bloomdupe",
                  "--json"]):
        result = run_cli(*args, redis_url=redis_url)
        assert result.returncode == 0, clean(result)
        data = json.loads(result.stdout)
        assert data["key"] == "shop:bloomdupe"
        assert data["redis"] == redis_url
        assert data["fingerprint"] == "scrapy"
        assert data["capacity"] == 1000 and data["shards"] == 2 and data["growth"] is True
        assert data["generation_count"] == 1 and len(data["generations"]) == 1
        assert len(data["generations"][0]["shards"]) == 2
        assert 25 <= data["estimated_items"] <= 35
        assert 0 < data["fill_ratio"] < 1
        assert data["memory_bytes"] > 0
        assert data["nodes"] is None  # not a cluster


def test_info_of_an_absent_filter_names_the_filters_there(redis_url: str,
                                                         client: redis.Redis) -> None:
    make_filter(client, "shop:bloomdupe", URLS)
    result = run_cli("info", "--spider", "nope", redis_url=redis_url)
    out = clean(result)
    assert result.returncode == 1
    assert "No Bloom filter at key 'nope:bloomdupe'" in result.stderr
    assert "'shop:bloomdupe'" in result.stderr  # the hint
    assert result.stdout == ""
    assert client.exists("nope:bloomdupe:meta") == 0, out  # looking created nothing


# -- errors -----------------------------------------------------------------------------


def test_unreachable_redis_is_one_line_without_the_password() -> None:
    url = f"redis://worker:s3cret-pw@127.0.0.1:{free_port()}/0"
    # (Each waits out redis-py's retries, about 2 s: a blip is not an outage.)
    for command in (["info"], ["check", f"{SITE}/"], ["import", "--from-set", "x:dupefilter"]):
        result = run_cli(*command, "--key", "shop:bloomdupe", "--redis-url", url,
                         process=command == ["info"])
        out = clean(result)
        assert result.returncode == 1, out
        assert "Cannot reach Redis at 127.0.0.1:" in result.stderr
        assert "s3cret-pw" not in out
        assert len(result.stderr.strip().splitlines()) == 1


def test_bad_redis_url_and_bad_usage() -> None:
    result = run_cli("info", "--key", "k", "--redis-url", "http://user:s3cret-pw@host/0")
    out = clean(result)
    assert result.returncode == 1
    assert "REDIS_URL=" in result.stderr and "s3cret-pw" not in out
    for args, message in (
        ([], ""),
        (["info"], "give --key KEY, or --spider NAME"),
        (["info", "--key", "a", "--spider", "b"], "not both"),
        (["info", "--key", "{a}"], "must not contain '{' or '}'"),
        (["info", "--spider", "a", "--key-template", "%(nope)s"], "not a valid %-template"),
        (["import", "--key", "a"], "one of the arguments --from-set --from-jobdir"),
    ):
        result = run_cli(*args, redis_url="redis://127.0.0.1:1/0")
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr
        assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def auth_redis() -> Iterator[RedisServer]:
    with RedisServer(extra=["--requirepass", "s3cret-pw"]) as server:
        yield server


def test_passwords_are_never_printed(auth_redis: RedisServer) -> None:
    url = f"redis://:s3cret-pw@127.0.0.1:{auth_redis.port}/0"
    client = redis.Redis.from_url(url)
    try:
        client.flushall()
        make_filter(client, "shop:bloomdupe", URLS)
        crawlstats.CrawlStats(client, "shop:bloomdupe", "w1").flush({"checked": 3})
    finally:
        client.close()
    shown = f"redis://:***@127.0.0.1:{auth_redis.port}/0"
    for args in (["info"], ["info", "--json"], ["stats"], ["stats", "--json"],
                 ["check", f"{SITE}/"], ["check", "--json", URLS[0]]):
        result = run_cli(*args, "--key", "shop:bloomdupe", redis_url=url)
        out = clean(result)
        assert result.returncode == 0, out
        assert "s3cret-pw" not in out
        if args[0] != "check" or "--json" in args:
            assert shown in result.stdout
    wrong = f"redis://:wrong-pw@127.0.0.1:{auth_redis.port}/0"
    result = run_cli("info", "--key", "shop:bloomdupe", redis_url=wrong)
    out = clean(result)
    assert result.returncode == 1
    assert "refused the credentials" in result.stderr and "wrong-pw" not in out


# -- stats ------------------------------------------------------------------------------


def test_stats_table_and_json(redis_url: str, client: redis.Redis) -> None:
    key = "shop:bloomdupe"
    make_filter(client, key, URLS)
    crawlstats.CrawlStats(client, key, "host-a:101").flush(
        {"checked": 100, "new": 30, "duplicates": 70}, closed="finished")
    crawlstats.CrawlStats(client, key, "host-b:202").flush(
        {"checked": 60, "new": 20, "duplicates": 40})
    # host-b last wrote its line 12 s ago.
    line = json.loads(client.hget(keys.workers(key), "host-b:202") or "{}")
    line["last_seen"] = time.time() - 12
    client.hset(keys.workers(key), "host-b:202", json.dumps(line))

    result = run_cli("stats", "--spider", "shop", redis_url=redis_url, process=True)
    clean(result)
    assert result.returncode == 0
    out = result.stdout
    assert re.search(r"checked +160\n", out) and re.search(r"new +50\n", out)
    assert re.search(r"duplicates +110\n", out)
    assert "hit rate       68.8%" in out
    assert "Workers (2)" in out
    row_a = next(r for r in out.splitlines() if r.strip().startswith("host-a:101"))
    row_b = next(r for r in out.splitlines() if r.strip().startswith("host-b:202"))
    assert "finished" in row_a and "70.0%" in row_a
    assert re.search(r"\b(1[2-9]|[2-5]\d) s ago", row_b), row_b  # 12 s, give or take a slow start

    result = run_cli("stats", "--key", key, "--json", redis_url=redis_url)
    data = json.loads(result.stdout)
    assert data["totals"]["checked"] == 160 and data["totals"]["duplicates"] == 110
    assert data["totals"]["hit_rate"] == pytest.approx(110 / 160)
    assert data["filter_exists"] is True
    workers = {w["id"]: w for w in data["workers"]}
    assert set(workers) == {"host-a:101", "host-b:202"}
    assert workers["host-a:101"]["closed"] == "finished"
    assert 12 <= workers["host-b:202"]["last_seen_seconds_ago"] < 60


def test_stats_of_nothing_fails(redis_url: str) -> None:
    result = run_cli("stats", "--spider", "nope", redis_url=redis_url)
    clean(result)
    assert result.returncode == 1
    assert "No Bloom filter and no crawl stats at key 'nope:bloomdupe'" in result.stderr


# -- check ------------------------------------------------------------------------------


def test_check_seen_and_new_without_adding(redis_url: str, client: redis.Redis) -> None:
    make_filter(client, "shop:bloomdupe", URLS[:10])
    urls = [URLS[0], f"{SITE}/item?cat=1&id=1#reviews", URLS[20]]  # seen, seen (same page), new
    before = info_json(redis_url, "shop:bloomdupe")["set_bits"]
    result = run_cli("check", "--spider", "shop", *urls, redis_url=redis_url, process=True)
    clean(result)
    assert result.returncode == 0
    assert result.stdout.splitlines() == [f"seen  {urls[0]}", f"seen  {urls[1]}",
                                          f"new   {urls[2]}"]
    assert "2 seen, 1 new" in result.stderr

    result = run_cli("check", "--key", "shop:bloomdupe", "--json", *urls, redis_url=redis_url)
    data = json.loads(result.stdout)
    assert [r["seen"] for r in data["results"]] == [True, True, False]
    assert data["results"][0]["fingerprint"] == RequestFingerprinter().fingerprint(
        Request(urls[0])).hex()
    assert (data["seen"], data["new"]) == (2, 1)
    # POST is another request.
    result = run_cli("check", "--key", "shop:bloomdupe", "--method", "POST", URLS[0],
                     redis_url=redis_url)
    assert result.stdout.split() == ["new", URLS[0]]
    assert info_json(redis_url, "shop:bloomdupe")["set_bits"] == before  # nothing added


def test_check_in_scrapy_redis_mode(redis_url: str, client: redis.Redis) -> None:
    make_filter(client, "shop:bloomdupe", URLS[:10], mode="scrapy-redis")
    result = run_cli("check", "--key", "shop:bloomdupe", "--json", URLS[3], URLS[15],
                     redis_url=redis_url)
    clean(result)
    data = json.loads(result.stdout)
    assert data["fingerprint"] == "scrapy-redis"
    assert [r["seen"] for r in data["results"]] == [True, False]
    assert data["results"][0]["fingerprint"] == ScrapyRedisFingerprinter().fingerprint(
        Request(URLS[3])).decode()


def test_check_bad_url_and_absent_filter(redis_url: str, client: redis.Redis) -> None:
    make_filter(client, "shop:bloomdupe", URLS[:3])
    result = run_cli("check", "--spider", "shop", URLS[0], "not a url", redis_url=redis_url)
    clean(result)
    assert result.returncode == 2
    assert "bad URL 'not a url'" in result.stderr and result.stdout == ""
    result = run_cli("check", "--spider", "other", URLS[0], redis_url=redis_url)
    clean(result)
    assert result.returncode == 1 and "No Bloom filter at key 'other:bloomdupe'" in result.stderr


# -- clear ------------------------------------------------------------------------------


def test_clear_asks_to_type_the_key(redis_url: str, client: redis.Redis) -> None:
    key = "shop:bloomdupe"
    make_filter(client, key, URLS)
    crawlstats.CrawlStats(client, key, "w1").flush({"checked": 5})
    client.zadd("shop:requests", {"queued": 1})  # scrapy-redis's queue: not the filter's

    result = run_cli("clear", "--key", key, redis_url=redis_url, stdin="no\n", process=True)
    clean(result)
    assert result.returncode == 1
    assert f"Type the key ({key}) to delete it" in result.stderr
    assert "Not confirmed: nothing was deleted." in result.stderr
    assert client.exists(f"{key}:meta")

    result = run_cli("clear", "--key", key, redis_url=redis_url, stdin="")  # no answer at all
    assert result.returncode == 1 and client.exists(f"{key}:meta")

    result = run_cli("clear", "--key", key, redis_url=redis_url, stdin=f"{key}\n")
    clean(result)
    assert result.returncode == 0
    assert f"Deleted Bloom filter '{key}'" in result.stdout
    assert sorted(client.keys("*")) == [b"shop:requests"]


def test_clear_yes_and_json(redis_url: str, client: redis.Redis) -> None:
    key = "shop:bloomdupe"
    make_filter(client, key, URLS)
    result = run_cli("clear", "--spider", "shop", "--yes", "--json", redis_url=redis_url)
    clean(result)
    assert result.returncode == 0
    data = json.loads(result.stdout)
    assert data["cleared"] is True and data["key"] == key
    assert client.keys("*") == []
    result = run_cli("clear", "--spider", "shop", "--yes", redis_url=redis_url)
    assert result.returncode == 1 and "No Bloom filter" in result.stderr


@pytest.mark.parametrize("damage", ["meta-deleted", "meta-damaged", "a-shard-deleted"])
def test_clear_deletes_a_filter_whatever_state_it_is_in(redis_url: str, client: redis.Redis,
                                                        damage: str) -> None:
    key = "shop:bloomdupe"
    make_filter(client, key, URLS, shards=3)
    client.zadd("{shop:bloomdupe:1}:queue", {"queued": 1})  # its request queue goes too
    client.zadd("shop:requests", {"queued": 1})  # scrapy-redis's queue: not the filter's
    client.set("{shop:bloomdupe:x:0}:bits", "another filter's")  # key "shop:bloomdupe:x"
    if damage == "meta-deleted":
        client.delete(f"{key}:meta")
    elif damage == "meta-damaged":
        client.hset(f"{key}:meta", "capacity", "abc")
    else:
        client.delete("{shop:bloomdupe:2}:bits")
    result = run_cli("clear", "--key", key, "--yes", redis_url=redis_url)
    out = clean(result)
    assert result.returncode == 0, out
    assert sorted(client.keys("*")) == [b"shop:requests", b"{shop:bloomdupe:x:0}:bits"]


# -- import -----------------------------------------------------------------------------


def test_import_from_a_scrapy_redis_set(redis_url: str, client: redis.Redis) -> None:
    scrapy_redis_set(client, "shop:dupefilter", URLS)
    make_filter(client, "shop:bloomdupe", URLS[:10], mode="scrapy-redis", capacity=5000)
    result = run_cli("import", "--spider", "shop", "--from-set", "shop:dupefilter",
                     "--batch-size", "7", "--json", redis_url=redis_url, process=True)
    clean(result)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["created"] is False and data["fingerprint"] == "scrapy-redis"
    assert (data["read"], data["added"], data["already_present"], data["skipped"]) == \
        (30, 20, 10, 0)
    assert data["source"] == {"kind": "set", "name": "shop:dupefilter",
                              "format": "scrapy-redis SET", "mode": "scrapy-redis"}
    assert "import: 30 of ~30 (100%) read, 20 new, 10 already present" in result.stderr
    assert client.scard("shop:dupefilter") == 30  # the source is left as it was

    result = run_cli("check", "--spider", "shop", *URLS, redis_url=redis_url)
    assert result.stdout.split()[::2] == ["seen"] * len(URLS)


def test_import_says_the_first_worker_moves_scrapy_redis_s_queue(redis_url: str,
                                                                client: redis.Redis) -> None:
    """The first worker moves the requests waiting in scrapy-redis's queue into the leased
    queue (scheduling/shared.py, "Took over N request(s)"): the import says so, with the
    queue's key and how many wait there, never that the queue "is used as it is"."""
    scrapy_redis_set(client, "shop:dupefilter", URLS)
    client.zadd("shop:requests", {b"request-1": 0, b"request-2": -1, b"request-3": -1})
    result = run_cli("import", "--spider", "shop", "--from-set", "shop:dupefilter",
                     "--capacity", "5000", "--no-progress", redis_url=redis_url)
    out = " ".join(clean(result).split())
    assert result.returncode == 0, out
    assert "is used as it is" not in out
    assert ("The first worker to start moves the requests waiting in scrapy-redis's request "
            "queue 'shop:requests' (3 request(s)) into the package's leased queue") in out
    assert 'logs "Took over N request(s)"' in out
    assert client.zcard("shop:requests") == 3  # the import itself moves nothing

    client.delete("shop:requests")
    result = run_cli("import", "--spider", "shop", "--from-set", "shop:dupefilter",
                     "--no-progress", redis_url=redis_url)
    out = " ".join(clean(result).split())
    assert "scrapy-redis's request queue 'shop:requests' holds nothing to take over" in out

    result = run_cli("import", "--key", "shop:bloomdupe", "--from-set", "shop:dupefilter",
                     "--no-progress", redis_url=redis_url)
    out = " ".join(clean(result).split())
    assert "request queue (SCHEDULER_QUEUE_KEY, '%(spider)s:requests' by default)" in out


def test_import_creates_the_filter_from_the_options(redis_url: str, client: redis.Redis) -> None:
    scrapy_redis_set(client, "shop:dupefilter", URLS)
    result = run_cli("import", "--spider", "shop", "--from-set", "shop:dupefilter",
                     "--capacity", "5000", "--error-rate", "0.0001", "-s", "BLOOMDUPE_SHARDS=3",
                     redis_url=redis_url)
    clean(result)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "into new Bloom filter 'shop:bloomdupe' (scrapy-redis fingerprints)" in out
    assert re.search(r"read +30\n", out) and re.search(r"added \(new\) +30\n", out)
    assert re.search(r"already present +0\n", out)
    assert "BLOOMDUPE_FINGERPRINT = 'scrapy-redis'" in out  # what to crawl with next
    data = info_json(redis_url, "shop:bloomdupe")
    assert data["fingerprint"] == "scrapy-redis"
    assert (data["capacity"], data["shards"]) == (5000, 3)
    assert data["error_rate"] == pytest.approx(0.0001 * (1 - sizing.TIGHTENING))  # growth on

    # Run again: all already there.
    result = run_cli("import", "--key", "shop:bloomdupe", "--from-set", "shop:dupefilter",
                     "--json", "--no-progress", "--capacity", "99", redis_url=redis_url)
    data = json.loads(result.stdout)
    assert (data["created"], data["added"], data["already_present"]) == (False, 0, 30)
    assert "import:" not in result.stderr  # --no-progress
    assert "note: --capacity ignored" in result.stderr
    assert info_json(redis_url, "shop:bloomdupe")["capacity"] == 5000


def test_import_refuses_fingerprints_of_the_other_kind(redis_url: str, tmp_path: Path,
                                                      client: redis.Redis) -> None:
    scrapy_redis_set(client, "shop:dupefilter", URLS)
    make_filter(client, "shop:bloomdupe", [], mode="scrapy")
    result = run_cli("import", "--spider", "shop", "--from-set", "shop:dupefilter",
                     redis_url=redis_url)
    clean(result)
    assert result.returncode == 1
    err = result.stderr
    assert "The Bloom filter 'shop:bloomdupe' stores 'scrapy' fingerprints" in err
    assert "BLOOMDUPE_FINGERPRINT = 'scrapy-redis'" in err
    assert info_json(redis_url, "shop:bloomdupe")["set_bits"] == 0  # nothing written

    write_requests_seen(tmp_path / "job", URLS)
    make_filter(client, "other:bloomdupe", [], mode="scrapy-redis")
    result = run_cli("import", "--spider", "other", "--from-jobdir", str(tmp_path / "job"),
                     redis_url=redis_url)
    clean(result)
    assert result.returncode == 1
    assert "stores 'scrapy-redis' fingerprints" in result.stderr
    assert "BLOOMDUPE_FINGERPRINT = 'scrapy'" in result.stderr

    # A new filter asked for with the other kind is refused before it is created.
    result = run_cli("import", "--spider", "new", "--from-set", "shop:dupefilter",
                     "-s", "BLOOMDUPE_FINGERPRINT=scrapy", redis_url=redis_url)
    assert result.returncode == 1
    assert "A new Bloom filter 'new:bloomdupe' would store 'scrapy' fingerprints" \
        in result.stderr
    assert client.exists("new:bloomdupe:meta") == 0


def test_import_refuses_a_set_that_is_not_a_dupefilter(redis_url: str,
                                                      client: redis.Redis) -> None:
    client.sadd("tags", "python", "scrapy")
    client.zadd("shop:requests", {"x": 1})
    for source, message in (("tags", "not scrapy-redis fingerprints"),
                            ("shop:requests", "is a zset, not a SET"),
                            ("missing", "There is no key 'missing'")):
        result = run_cli("import", "--spider", "shop", "--from-set", source,
                         redis_url=redis_url)
        clean(result)
        assert result.returncode == 1
        assert message in result.stderr
    assert client.exists("shop:bloomdupe:meta") == 0


def test_import_from_a_jobdir(redis_url: str, tmp_path: Path, client: redis.Redis) -> None:
    seen = write_requests_seen(tmp_path / "job", URLS[:20])
    assert seen.read_bytes()[:2] == b"\x00\x14"  # Scrapy's binary format: length, 20 bytes
    result = run_cli("import", "--spider", "shop", "--from-jobdir", str(tmp_path / "job"),
                     "--capacity", "1000", "--json", redis_url=redis_url, process=True)
    clean(result)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["created"], data["read"], data["added"], data["already_present"]) == \
        (True, 20, 20, 0)
    assert data["fingerprint"] == "scrapy"
    assert data["source"]["format"].startswith("binary")
    result = run_cli("check", "--spider", "shop", *URLS, redis_url=redis_url)
    assert result.stdout.split()[::2] == ["seen"] * 20 + ["new"] * 10


def test_import_from_an_old_text_requests_seen(redis_url: str, tmp_path: Path,
                                               client: redis.Redis) -> None:
    fingerprinter = RequestFingerprinter()
    text = "".join(fingerprinter.fingerprint(Request(u)).hex() + os.linesep
                   for u in URLS[:12])
    (tmp_path / "requests.seen").write_text(text)
    result = run_cli("import", "--spider", "shop", "--from-jobdir",
                     str(tmp_path / "requests.seen"), "--json", redis_url=redis_url)
    clean(result)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["read"], data["added"]) == (12, 12)
    assert data["source"]["format"].startswith("text")
    assert "note: A text requests.seen comes from an older Scrapy" in result.stderr
    result = run_cli("check", "--spider", "shop", URLS[0], URLS[29], redis_url=redis_url)
    assert result.stdout.split()[::2] == ["seen", "new"]


def test_import_from_a_jobdir_cut_short(redis_url: str, tmp_path: Path) -> None:
    seen = write_requests_seen(tmp_path, URLS[:5])
    with seen.open("ab") as f:
        f.write(b"\x00\x14\x01\x02\x03")  # a record an unclean shutdown cut short
    result = run_cli("import", "--key", "shop:bloomdupe", "--from-jobdir", str(tmp_path),
                     "--json", redis_url=redis_url)
    clean(result)
    data = json.loads(result.stdout)
    assert (data["read"], data["added"]) == (5, 5)
    assert "incomplete record" in " ".join(data["notes"])
    assert "note: The last 5 byte(s)" in result.stderr
    result = run_cli("import", "--key", "shop:bloomdupe", "--from-jobdir",
                     str(tmp_path / "nothing-here"), redis_url=redis_url)
    assert result.returncode == 1 and "No requests.seen file at" in result.stderr


def test_sources_read_in_batches(redis_url: str, tmp_path: Path, client: redis.Redis) -> None:
    scrapy_redis_set(client, "big:dupefilter", [f"{SITE}/{i}" for i in range(2500)])
    source = SetSource(client, "big:dupefilter")
    client.sadd("big:dupefilter", "not-a-fingerprint")  # after the sampling at start
    batches = list(source.batches(1000))
    assert sum(len(b) for b, _ in batches) == 2500 and sum(s for _, s in batches) == 1
    assert all(len(b) + s <= 1000 for b, s in batches)

    path = write_requests_seen(tmp_path, [f"{SITE}/{i}" for i in range(2500)])
    jobdir = JobdirSource(path)
    assert jobdir.total == 2500
    batches = list(jobdir.batches(1000))
    assert [len(b) for b, _ in batches] == [1000, 1000, 500]
    assert all(len(fp) == 20 for b, _ in batches for fp in b)


# -- the console script ---------------------------------------------------------------------


def test_console_script(redis_url: str, client: redis.Redis) -> None:
    script = Path(sys.executable).parent / "bloomdupe"
    if not script.exists():
        pytest.skip("the bloomdupe console script is not installed next to this Python")
    make_filter(client, "shop:bloomdupe", URLS)
    result = subprocess.run([str(script), "info", "--spider", "shop"], capture_output=True,
                            text=True, timeout=180, env=_env(redis_url))
    assert result.returncode == 0, result.stderr
    assert "Bloom filter 'shop:bloomdupe'" in result.stdout


# -- scrapy bloomdupe, in the example project ---------------------------------------------------


def test_scrapy_command_info_and_stats(redis_url: str, client: redis.Redis) -> None:
    make_filter(client, "site:bloomdupe", URLS)
    crawlstats.CrawlStats(client, "site:bloomdupe", "w1").flush(
        {"checked": 10, "new": 4, "duplicates": 6})
    result = run_scrapy("info", "site", redis_url=redis_url)
    clean(result)
    assert result.returncode == 0, result.stderr
    assert f"Bloom filter 'site:bloomdupe' in Redis at {redis_url}" in result.stdout
    assert "Generations" in result.stdout and "Shards" in result.stdout

    result = run_scrapy("info", "site", "--json", redis_url=redis_url)
    data = json.loads(result.stdout)
    assert data["key"] == "site:bloomdupe" and data["capacity"] == 1000

    result = run_scrapy("stats", "site", redis_url=redis_url)
    clean(result)
    assert result.returncode == 0
    assert "hit rate       60.0%" in result.stdout and "Workers (1)" in result.stdout
    result = run_scrapy("stats", "site", "--json", redis_url=redis_url)
    assert json.loads(result.stdout)["totals"]["checked"] == 10

    # The key is the project's BLOOMDUPE_KEY with the spider's name.
    make_filter(client, "crawls:site:seen", URLS[:3])
    result = run_scrapy("info", "site", "--json", "-s", "BLOOMDUPE_KEY=crawls:%(spider)s:seen",
                        redis_url=redis_url)
    assert json.loads(result.stdout)["key"] == "crawls:site:seen"
    result = run_scrapy("info", "--key", "crawls:site:seen", "--json", redis_url=redis_url)
    assert json.loads(result.stdout)["key"] == "crawls:site:seen"


def test_scrapy_command_check_uses_the_projects_fingerprinter(redis_url: str, tmp_path: Path,
                                                              client: redis.Redis) -> None:
    (tmp_path / "pathonly.py").write_text(
        "from scrapy.utils.request import fingerprint\n\n\n"
        "class PathOnly:\n"
        "    '''Fingerprints without the query string.'''\n\n"
        "    def fingerprint(self, request):\n"
        "        return fingerprint(request.replace(url=request.url.split('?')[0]))\n"
    )
    bloom = BloomFilter.open(client, "site:bloomdupe", sizing.plan(1000, 0.01))
    bloom.add(RequestFingerprinter().fingerprint(Request(f"{SITE}/page")))
    bloom.close()
    url = f"{SITE}/page?utm_source=x"
    env = {"PYTHONPATH": str(tmp_path)}
    result = run_scrapy("check", "site", url, "-s", "REQUEST_FINGERPRINTER_CLASS=pathonly.PathOnly",
                        redis_url=redis_url, env=env)
    clean(result)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["seen", url]
    result = run_scrapy("check", "site", url, redis_url=redis_url, env=env)
    assert result.stdout.split() == ["new", url]  # Scrapy's default fingerprinter
    result = run_cli("check", "--spider", "site", url, redis_url=redis_url)
    assert result.stdout.split() == ["new", url]  # standalone: Scrapy's default too


def test_scrapy_command_import_uses_the_projects_settings(redis_url: str,
                                                          client: redis.Redis) -> None:
    scrapy_redis_set(client, "site:dupefilter", URLS)
    result = run_scrapy("import", "site", "--from-set", "site:dupefilter", redis_url=redis_url)
    clean(result)
    assert result.returncode == 1  # the project fingerprints with Scrapy's fingerprinter
    assert "BLOOMDUPE_FINGERPRINT in the project's settings" in result.stderr
    assert "BLOOMDUPE_FINGERPRINT = 'scrapy-redis'" in result.stderr
    assert client.exists("site:bloomdupe:meta") == 0

    result = run_scrapy("import", "site", "--from-set", "site:dupefilter", "--json",
                        "-s", "BLOOMDUPE_FINGERPRINT=scrapy-redis", redis_url=redis_url)
    clean(result)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["created"], data["read"], data["added"]) == (True, 30, 30)
    info = info_json(redis_url, "site:bloomdupe")
    assert info["capacity"] == 10_000  # example_project/demo/settings.py: BLOOMDUPE_CAPACITY
    assert info["fingerprint"] == "scrapy-redis"


def test_scrapy_command_clear(redis_url: str, client: redis.Redis) -> None:
    make_filter(client, "site:bloomdupe", URLS)
    result = run_scrapy("clear", "site", redis_url=redis_url, stdin="no\n")
    clean(result)
    assert result.returncode == 1 and client.exists("site:bloomdupe:meta")
    result = run_scrapy("clear", "site", redis_url=redis_url, stdin="site:bloomdupe\n")
    assert result.returncode == 0 and not client.exists("site:bloomdupe:meta")
    make_filter(client, "site:bloomdupe", URLS)
    result = run_scrapy("clear", "site", "--yes", "--json", redis_url=redis_url)
    clean(result)
    assert result.returncode == 0 and json.loads(result.stdout)["cleared"] is True
    assert client.keys("*") == []


def test_scrapy_command_errors(redis_url: str) -> None:
    for args, message in (
        (["info"], "which spider's filter?"),
        (["nope", "site"], "unknown command 'nope'"),
        (["info", "nospider"], "this project has no spider 'nospider' (it has: site)"),
        (["info", "site", "--yes"], "--yes applies to clear only"),
        (["check", "site"], "check which URLs?"),
        (["check", "site", "not a url"], "bad URL 'not a url'"),
    ):
        result = run_scrapy(*args, redis_url=redis_url)
        clean(result)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert message in result.stderr, (args, result.stderr)
    result = run_scrapy("info", "site", redis_url=redis_url)
    assert result.returncode == 1 and "No Bloom filter at key 'site:bloomdupe'" in result.stderr
    result = run_scrapy("info", "site", redis_url=f"redis://:pw-s3cret@127.0.0.1:{free_port()}")
    clean(result)
    assert result.returncode == 1 and "Cannot reach Redis" in result.stderr
    assert "pw-s3cret" not in result.stdout + result.stderr


# -- a Redis Cluster ------------------------------------------------------------------------


@pytest.mark.slow
def test_info_shows_the_spread_of_shards_over_a_cluster() -> None:
    from harness import local_cluster
    from redis.cluster import RedisCluster

    with local_cluster.LocalCluster(masters=3, replicas=0) as local:
        client = RedisCluster.from_url(local.url)
        try:
            make_filter(client, "shop:bloomdupe", URLS, shards=6)
        finally:
            client.close()
        result = run_cli("info", "--cluster", "--key", "shop:bloomdupe", "--json",
                         redis_url=local.url)
        assert result.returncode == 0, result.stderr
        nodes = json.loads(result.stdout)["nodes"]
        assert len(nodes) == 3
        assert sorted(i for shards in nodes.values() for i in shards) == list(range(6))
        result = run_cli("info", "--cluster", "--key", "shop:bloomdupe", redis_url=local.url)
        clean(result)
        assert "Shards over 3 master(s)" in result.stdout
        rows = [line for line in result.stdout.splitlines() if re.match(r"  [0-5] ", line)]
        assert len(rows) == 1 + 6 and all("127.0.0.1:" in r for r in rows[1:])
        result = run_cli("check", "--cluster", "--key", "shop:bloomdupe", URLS[0],
                         f"{SITE}/other", redis_url=local.url)
        assert result.stdout.split()[::2] == ["seen", "new"]


# -- read-only: info, stats and check never write ----------------------------------------


def snapshot(client: redis.Redis) -> dict[bytes, bytes | None]:
    """Every key with its DUMP (type, value, and nothing else), to compare before/after."""
    return {name: client.dump(name) for name in client.scan_iter(count=1000)}


READ_COMMANDS = (["info"], ["info", "--json"], ["stats"], ["stats", "--json"],
                 ["check", URLS[0], URLS[1], URLS[2]], ["check", "--json", URLS[0]])


def test_reading_a_filter_with_a_missing_shard_writes_nothing(redis_url: str,
                                                              client: redis.Redis) -> None:
    key = "shop:bloomdupe"
    make_filter(client, key, URLS, shards=3)
    crawlstats.CrawlStats(client, key, "w1").flush({"checked": 3})
    missing = keys.bits(key, 1)
    client.delete(missing)
    before, size = snapshot(client), client.dbsize()
    for args in READ_COMMANDS:
        result = run_cli(*args, "--key", key, redis_url=redis_url)
        out = clean(result)
        assert result.returncode == 1, out  # the filter is damaged: failed, yet shown
        assert f"lacks 1 shard(s): '{missing}'" in result.stderr, out
        assert "Nothing was written" in result.stderr
        assert client.dbsize() == size and snapshot(client) == before, args
        assert not client.exists(missing)
    data = json.loads(run_cli("info", "--json", "--key", key, redis_url=redis_url).stdout)
    assert data["missing_shards"] == [missing]
    table = run_cli("info", "--key", key, redis_url=redis_url).stdout
    assert re.search(r"^\s+1\s+missing\s", table, re.M), table
    # The Scrapy command (the project's settings, its fingerprinter) writes nothing either.
    project_key = "site:bloomdupe"
    make_filter(client, project_key, URLS, shards=2)
    client.delete(keys.bits(project_key, 0))
    before, size = snapshot(client), client.dbsize()
    for args in (["info", "site"], ["stats", "site"], ["check", "site", URLS[0]]):
        result = run_scrapy(*args, redis_url=redis_url)
        out = clean(result)
        assert result.returncode == 1 and "lacks 1 shard(s)" in result.stderr, out
        assert result.stderr.startswith("scrapy bloomdupe: error: "), out
        assert client.dbsize() == size and snapshot(client) == before, args


def test_check_marks_a_url_of_a_missing_shard(redis_url: str, client: redis.Redis) -> None:
    key = "shop:bloomdupe"
    make_filter(client, key, URLS[:10], shards=2)
    client.delete(keys.bits(key, 0))
    result = run_cli("check", "--json", "--key", key, *URLS, redis_url=redis_url)
    assert result.returncode == 1
    data = json.loads(result.stdout)
    unsure = [r for r in data["results"] if r.get("shard_missing")]
    assert unsure and all(not r["seen"] for r in unsure)
    assert all(r["seen"] for r in data["results"][:10] if not r.get("shard_missing"))
    table = run_cli("check", "--key", key, *URLS, redis_url=redis_url)
    assert table.stdout.count("new?") == len(unsure)


def test_an_intact_filter_is_read_without_writing(redis_url: str, client: redis.Redis) -> None:
    key = "shop:bloomdupe"
    make_filter(client, key, URLS)
    before = snapshot(client)
    for args in READ_COMMANDS:
        result = run_cli(*args, "--key", key, redis_url=redis_url)
        assert result.returncode == 0, clean(result)
    assert snapshot(client) == before


@pytest.mark.parametrize(("field", "value", "says"), [
    ("capacity", "abc", "capacity 'abc' is not a number"),
    ("shards", "0", "shards 0 is not at least 1"),
    ("seed", None, "no seed"),
    ("error_rate", "1.5", "error_rate 1.5 is not between 0 and 1"),
    ("generations", "x", "generations 'x' is not a number"),
])
def test_damaged_metadata_is_one_line_and_status_1(redis_url: str, client: redis.Redis,
                                                   field: str, value: str | None,
                                                   says: str) -> None:
    key = "shop:bloomdupe"
    make_filter(client, key, URLS)
    if value is None:
        client.hdel(keys.meta(key), field)
    else:
        client.hset(keys.meta(key), field, value)
    before = snapshot(client)
    for args in (["info"], ["info", "--json"], ["stats"], ["check", URLS[0]]):
        result = run_cli(*args, "--key", key, redis_url=redis_url)
        out = clean(result)
        assert result.returncode == 1, out
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, out
        assert "metadata 'shop:bloomdupe:meta'" in lines[0] and says in lines[0], out
    assert snapshot(client) == before


def test_check_takes_only_http_urls(redis_url: str, client: redis.Redis) -> None:
    make_filter(client, "shop:bloomdupe", URLS[:3])
    for url in ("ftp://x/y", "file:///etc/passwd", "data:,x", "mailto:a@b.example", "http://",
                "shop.example/a"):
        result = run_cli("check", "--key", "shop:bloomdupe", url, redis_url=redis_url)
        out = clean(result)
        assert result.returncode == 2, (url, out)
        assert f"bad URL {url!r}" in result.stderr and result.stdout == ""
    result = run_cli("check", "--key", "shop:bloomdupe", "ftp://x/y", redis_url=redis_url)
    assert "only http:// and https:// URLs can be checked" in result.stderr
    result = run_scrapy("check", "site", "ftp://x/y", redis_url=redis_url)
    assert result.returncode == 2 and "only http:// and https://" in result.stderr


def test_keys_lists_every_key_of_a_crawl_and_writes_nothing(client: redis.Redis,
                                                           redis_url: str) -> None:
    """A user's cleanup by prefix (``SCAN MATCH demo:*``) misses the shards, whose names
    start with a hash tag; ``bloomdupe keys --spider demo`` lists every key of the crawl:
    filter, op logs, queue shards, leases, owners, push records, failed requests, stats,
    and scrapy-redis's keys of the spider, but no key of another filter."""
    key = "demo:bloomdupe"
    bf = BloomFilter.open(client, key, sizing.plan(1000, 0.01, shards=2))
    q = PriorityQueue(client, DemoSpider(), "demo:requests", tag=key, shards=2)
    requests = [Request(f"{SITE}/page/{i}") for i in range(20)]
    bf.add_many([RequestFingerprinter().fingerprint(r) for r in requests], q,
                lambda i: q.entry(requests[i]))
    q.push_many([Request(f"{SITE}/again", dont_filter=True)])
    lease = q.pop_leases(1)[0]
    failed.record(client, key, url=lease.request.url, method="GET", reason="HTTP 500",
                  score=0, request=b"x", limit=10)
    crawlstats.CrawlStats(client, key, "w1").flush({"checked": 20})
    client.zadd("demo:requests", {b"old": 0})
    client.sadd("demo:dupefilter", "ab" * 20)
    other = BloomFilter.open(client, "demo:bloomdupe:sub", sizing.plan(1000, 0.01, shards=1))
    before = {k: client.dump(k) for k in client.scan_iter()}

    result = run_cli("keys", "--spider", "demo", "--json", redis_url=redis_url)
    assert result.returncode == 0, result.stdout + result.stderr
    listed = {row["key"]: row for row in json.loads(result.stdout)["keys"]}
    ours = {k.decode() for k in before if b"demo:bloomdupe:sub" not in k}
    assert set(listed) == ours
    assert [n for n in ours if n.startswith("{")]  # what a cleanup by prefix misses
    assert listed["{demo:bloomdupe:1}:bits"]["type"] == "string"
    assert listed["{demo:bloomdupe:0}:failed"]["type"] == "stream"
    assert "request queue" in listed["{demo:bloomdupe:0}:queue"]["what"]
    assert any(":ops:" in n for n in listed) and any(":push:" in n for n in listed)
    assert "scrapy-redis's request queue" in listed["demo:requests"]["what"]
    assert {k: client.dump(k) for k in client.scan_iter()} == before  # nothing written

    table = run_cli("keys", "--key", key, redis_url=redis_url)
    assert table.returncode == 0 and "}:leases" in table.stdout and "}:owners" in table.stdout
    assert "demo:requests" not in table.stdout  # --key: no spider, no scrapy-redis keys
    bf.close()
    other.close()


def test_every_command_on_both_engines(engine: str, engine_url: str) -> None:
    """import, info, stats, check, keys and clear on a filter of each engine (``"auto"`` picks
    the native one where the server has RedisBloom), a missing shard found by every
    read, and nothing written by one."""
    client = redis.Redis.from_url(engine_url)
    try:
        key = "shop:bloomdupe"
        scrapy_redis_set(client, "shop:dupefilter", URLS)
        result = run_cli("import", "--key", key, "--from-set", "shop:dupefilter",
                         "--no-progress", "--capacity", "1000", "-s", "BLOOMDUPE_SHARDS=3",
                         redis_url=engine_url)
        out = clean(result)
        assert result.returncode == 0, out
        assert f"{engine} engine" in out, out
        assert client.hget(f"{key}:meta", "engine") == engine.encode()
        again = clean(run_cli("import", "--key", key, "--from-set", "shop:dupefilter",
                              "--no-progress", redis_url=engine_url))
        assert re.search(r"added \(new\)\s+0\n", again), again

        data = json.loads(run_cli("info", "--key", key, "--json", redis_url=engine_url).stdout)
        assert data["engine"] == engine
        assert data["estimated_items"] == pytest.approx(len(URLS), rel=0.1)
        assert 0 < data["estimated_false_positive_rate"] < 0.01
        assert engine in clean(run_cli("info", "--key", key, redis_url=engine_url))
        assert run_cli("stats", "--key", key, "--json", redis_url=engine_url).returncode == 0

        checked = json.loads(run_cli("check", "--key", key, "--json", URLS[0],
                                     f"{SITE}/never", redis_url=engine_url).stdout)
        assert [r["seen"] for r in checked["results"]] == [True, False]

        bloom = BloomFilter.open(client, key, None, read_only=True)
        listed = json.loads(run_cli("keys", "--key", key, "--json",
                                    redis_url=engine_url).stdout)["keys"]
        what = {row["key"]: row["what"] for row in listed}
        assert all(f"filter shard {i}, generation 0" in what[bloom.shard_key(i)]
                   for i in range(3)), what
        missing = bloom.shard_key(1)
        client.delete(missing)
        before = snapshot(client)
        for args in READ_COMMANDS:
            result = run_cli(*args, "--key", key, redis_url=engine_url)
            assert result.returncode == 1, clean(result)
            assert f"lacks 1 shard(s): '{missing}'" in result.stderr
            assert snapshot(client) == before, args

        result = run_cli("clear", "--key", key, redis_url=engine_url, stdin=f"{key}\n")
        assert result.returncode == 0, clean(result)
        assert client.keys(f"*{key}*") == []
    finally:
        client.close()


class ItemSpider(DemoSpider):
    """The spider whose ``parse_item`` a deploy renamed, once it is restored."""

    def parse_item(self, response: Any) -> None:
        pass


def test_failed_lists_undecodable_entries_and_requeue_queues_them_again(
        client: redis.Redis, redis_url: str) -> None:
    """An entry naming a callback the spider lost is retired by the pop that meets it;
    ``bloomdupe failed`` lists it with its reason, and ``--requeue`` (the callback
    restored) queues it again, past the filter."""
    key = "demo:bloomdupe"
    url = f"{SITE}/item?id=7"
    entry = pickle.dumps({**Request(url).to_dict(), "callback": "parse_item"}, protocol=-1)
    client.zadd(keys.queue(key, 0), {entry: -3})
    assert PriorityQueue(client, DemoSpider(), "demo:requests", tag=key).pop_leases(5) == []

    listed = run_cli("failed", "--key", key, "--json", redis_url=redis_url)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    (record,) = json.loads(listed.stdout)["failed"]
    assert record["url"] == url and record["method"] == "GET"
    assert "cannot be decoded" in record["reason"] and "parse_item" in record["reason"]
    table = run_cli("failed", "--key", key, redis_url=redis_url)
    assert url in table.stdout and "cannot be decoded" in table.stdout

    moved = run_cli("failed", "--key", key, "--requeue", "--json", redis_url=redis_url)
    assert json.loads(moved.stdout)["requeued"] == 1
    assert failed.count(client, key) == 0
    assert client.zscore(keys.queue(key, 0), entry) == -3  # as it was, its priority kept
    (lease,) = PriorityQueue(client, ItemSpider(), "demo:requests", tag=key).pop_leases(5)
    assert lease.request.url == url and lease.request.callback.__name__ == "parse_item"


def test_failed_of_a_crawl_that_does_not_exist_is_one_error(client: redis.Redis,
                                                            redis_url: str) -> None:
    """``failed`` (and ``--requeue``) at a key with nothing of a crawl (a typo) exits 1
    with one line, not "recorded 0"; a crawl with no failed request lists none."""
    for args in (["--spider", "nosuch"], ["--spider", "nosuch", "--requeue"]):
        result = run_cli("failed", *args, redis_url=redis_url)
        assert result.returncode == 1, result.stdout + result.stderr
        assert result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stderr
        assert "No crawl at key 'nosuch:bloomdupe'" in clean(result)
    BloomFilter.open(client, "shop:bloomdupe", sizing.plan(1000, 0.01, shards=1)).close()
    result = run_cli("failed", "--spider", "shop", redis_url=redis_url)
    assert result.returncode == 0 and "recorded  0" in clean(result), result.stderr
