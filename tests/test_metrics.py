"""Prometheus metrics: the crawl's exporter (``bloomdupe metrics``'s collector), each
worker's (the WorkerMetrics extension, ``BLOOMDUPE_METRICS_PORT``), their settings,
and one clear error without the metrics extra. Real Redis; the expositions are parsed
with prometheus-client's own parser."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from helpers import BUSY_SLOTS, EXAMPLE_PROJECT, ROOT, busy_slots, crawler_for, first_plan, fps
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from scrapy.settings import Settings
from slotqueue import SlotEntry, SlotQueue

from scrapy_bloomdupe import connection, crawlstats, keys, prometheus
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.cli import main
from scrapy_bloomdupe.cli.metrics import collect
from scrapy_bloomdupe.crawlfigures import CrawlReader
from scrapy_bloomdupe.exceptions import ConfigError
from scrapy_bloomdupe.settings import MetricsConfig, parse_metrics_port
from scrapy_bloomdupe.testing import free_port
from scrapy_bloomdupe.workermetrics import WorkerMetrics


def parse(text: bytes) -> dict[str, dict[str, Any]]:
    """Each family by name: its type and its samples' (labels, value)."""
    return {f.name: {"type": f.type, "samples": [(s.name, s.labels, s.value) for s in f.samples]}
            for f in text_string_to_metric_families(text.decode())}


def values(families: dict[str, dict[str, Any]], name: str) -> dict[str, float]:
    """The samples of family ``name`` by their ``crawl`` label."""
    return {labels["crawl"]: value for _, labels, value in families[name]["samples"]}


# -- the crawl's exporter -----------------------------------------------------------------


def test_the_exporter_serves_every_crawl_it_watches(client: redis.Redis) -> None:
    for key, n in (("a", 100), ("b", 10)):
        bloom = BloomFilter.open(client, key, first_plan(10_000, 0.001), growth=True)
        bloom.add_many(fps(n))
        bloom.close()
        crawlstats.CrawlStats(client, key, "h:1").flush({"checked": n, "new": n})
    client.zadd(keys.queue("a", 0), {b"x": 0})
    readers = [CrawlReader(client, key) for key in ("a", "b", "none")]
    families = parse(generate_latest(prometheus.registry(lambda: collect(readers))))

    assert values(families, "bloomdupe_up") == {"a": 1.0, "b": 1.0, "none": 1.0}
    assert families["bloomdupe_requests_checked"]["type"] == "counter"
    assert families["bloomdupe_requests_checked"]["samples"][0][0] == \
        "bloomdupe_requests_checked_total"
    assert values(families, "bloomdupe_requests_checked") == {"a": 100, "b": 10, "none": 0}
    for name in ("bloomdupe_requests_new", "bloomdupe_requests_duplicate", "bloomdupe_pages",
                 "bloomdupe_leases_requeued", "bloomdupe_requests_failed"):
        assert families[name]["type"] == "counter", name
        assert set(values(families, name)) == {"a", "b", "none"}, name
    fill = values(families, "bloomdupe_filter_fill_ratio")
    assert set(fill) == {"a", "b"}  # no filter, no fill
    assert fill["a"] > fill["b"] > 0
    for name in ("bloomdupe_filter_estimated_false_positive_rate",
                 "bloomdupe_filter_memory_bytes", "bloomdupe_filter_generations",
                 "bloomdupe_filter_configured_false_positive_rate"):
        assert families[name]["type"] == "gauge", name
    assert values(families, "bloomdupe_filter_generations") == {"a": 1, "b": 1}
    queue = {(labels["crawl"], labels["state"]): value
             for _, labels, value in families["bloomdupe_queue_requests"]["samples"]}
    assert queue[("a", "waiting")] == 1 and queue[("a", "leased")] == 0
    assert values(families, "bloomdupe_workers") == {"a": 0, "b": 0, "none": 0}


def test_the_exporter_serves_the_busiest_download_slots(client: redis.Redis) -> None:
    BloomFilter.open(client, "a", first_plan(1000, 0.01)).close()
    BloomFilter.open(client, "b", first_plan(1000, 0.01)).close()
    busy_slots(client, "a")
    readers = [CrawlReader(client, "a"), CrawlReader(client, "b")]
    families = parse(generate_latest(prometheus.registry(lambda: collect(readers))))

    def by_slot(name: str) -> dict[tuple[str, str], float]:
        assert families[name]["type"] == "gauge", name
        return {(labels["crawl"], labels["slot"]): value
                for _, labels, value in families[name]["samples"]}

    assert by_slot("bloomdupe_slot_requests_in_flight") == {
        ("a", slot): flight for slot, flight, _, _ in BUSY_SLOTS}  # b: politeness "worker"
    assert by_slot("bloomdupe_slot_requests_waiting") == {
        ("a", slot): waiting for slot, _, _, waiting in BUSY_SLOTS}
    backoff = by_slot("bloomdupe_slot_backoff_seconds")
    assert 55 < backoff.pop(("a", "paused.test")) <= 60 and set(backoff.values()) == {0}
    start = by_slot("bloomdupe_slot_next_start_seconds")
    assert 25 < start.pop(("a", "slow.test")) <= 30 and set(start.values()) == {0}
    # At most BUSIEST slots a crawl (the series' cardinality).
    families = parse(generate_latest(prometheus.registry(
        lambda: collect([CrawlReader(client, "a", slots=2)]))))
    assert by_slot("bloomdupe_slot_requests_in_flight") == {("a", "one.test"): 2,
                                                           ("a", "slow.test"): 1}


def test_top_shows_the_busiest_download_slots(redis_url: str, client: redis.Redis,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    BloomFilter.open(client, "site:bloomdupe", first_plan(1000, 0.01)).close()
    assert main(["top", "--once", "--redis-url", redis_url, "--key", "site:bloomdupe"]) == 0
    assert "download slots" not in capsys.readouterr().out  # politeness "worker"
    busy_slots(client, "site:bloomdupe")
    SlotQueue(client, "site:bloomdupe").push(  # more slots than top shows
        [SlotEntry(f"h{j:02}.test", 0, b"\x01u") for j in range(12)])
    assert main(["top", "--once", "--redis-url", redis_url, "--key", "site:bloomdupe"]) == 0
    frame = capsys.readouterr().out
    block = frame[frame.index("Busiest download slots"):].splitlines()
    assert block[0] == ("Busiest download slots (2 with requests in flight, 14 ready to go "
                        "now or later)")
    rows = [line.split() for line in block[2:]]
    assert len(rows) == 10
    assert [row[:4] for row in rows[:4]] == [[s, str(f), str(c), str(w)]
                                             for s, f, c, w in BUSY_SLOTS]
    # delay, next start in, backed off for
    assert re.fullmatch(r" +slow\.test +1 +1 +2 +30 s +(2\d|30) s +-", block[3]), block[3]
    assert re.fullmatch(r" +paused\.test +0 +1 +4 +- +- +(5\d|60) s", block[4]), block[4]
    assert [row[:4] for row in rows[4:]] == [[f"h{j:02}.test", "0", "none", "1"]
                                             for j in range(6)]
    assert main(["top", "--once", "--json", "--redis-url", redis_url, "--key",
                 "site:bloomdupe"]) == 0
    data = json.loads(capsys.readouterr().out)["slots"]
    assert (data["in_flight_slots"], data["ready_slots"], len(data["slots"])) == (2, 14, 10)
    assert data["slots"][0] == {"slot": "one.test", "in_flight": 2, "concurrency": 2,
                                "waiting": 3, "delay": 0, "next_start": 0, "backoff": 0}


def test_an_unreachable_redis_is_up_0_not_an_error() -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    families = parse(generate_latest(prometheus.registry(
        lambda: collect([CrawlReader(client, "a")]))))
    client.close()
    assert values(families, "bloomdupe_up") == {"a": 0.0}
    assert families["bloomdupe_requests_checked"]["samples"] == []


def test_bloomdupe_metrics_serves_until_stopped(redis_url: str) -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "scrapy_bloomdupe.cli", "metrics", "--redis-url", redis_url,
         "--spider", "one", "--spider", "two", "--port", str(port), "--host", "127.0.0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        process.terminate()
        _, err = process.communicate(timeout=10)
    assert values(parse(text), "bloomdupe_up") == {"one:bloomdupe": 1, "two:bloomdupe": 1}
    assert "no crawl at key 'one:bloomdupe'" in err
    assert f"'one:bloomdupe', 'two:bloomdupe' (Redis at {redis_url}) at " \
           f"http://127.0.0.1:{port}/metrics" in err


BLOCK_PROMETHEUS = "import sys; sys.modules['prometheus_client'] = None; "


def test_without_the_extra_bloomdupe_metrics_names_it(redis_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_PROMETHEUS + "from scrapy_bloomdupe.cli import main; "
         f"sys.exit(main(['metrics', '--redis-url', '{redis_url}', '--key', 'k', "
         "'--port', '0']))"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == ("bloomdupe: error: bloomdupe metrics needs the "
                                   "prometheus-client package: pip install "
                                   "scrapy-bloomdupe[metrics]"), done.stderr


def test_without_the_extra_a_metrics_port_names_it(redis_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_PROMETHEUS + "from helpers import crawler_for; "
         "from scrapy_bloomdupe.workermetrics import WorkerMetrics; "
         f"WorkerMetrics.from_crawler(crawler_for('{redis_url}', "
         "BLOOMDUPE_METRICS_PORT=9410))"],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "PYTHONPATH": os.path.dirname(__file__)})
    assert done.returncode == 1
    assert ("ConfigError: BLOOMDUPE_METRICS_PORT=9410: serving a worker's metrics needs the "
            "prometheus-client package: pip install scrapy-bloomdupe[metrics]") in done.stderr


def test_top_needs_a_crawl(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "--once", "--redis-url", redis_url, "--key", "nothing"]) == 1
    assert "No crawl at key 'nothing'" in capsys.readouterr().err


# -- settings ---------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "ports"), [
    (None, None), ("", None), ("None", None), (9410, (9410, 9410)), ("9410", (9410, 9410)),
    ("9410-9420", (9410, 9420)), (" 9410 - 9411 ", (9410, 9411)), (0, (0, 0)), ("0", (0, 0)),
    ((9410, 9412), (9410, 9412)),
])
def test_metrics_port_parses(value: object, ports: tuple[int, int] | None) -> None:
    assert parse_metrics_port(value) == ports


@pytest.mark.parametrize("value", ["94x0", "9410-", "-1", "1-2-3", True, 1.5, "9420-9410",
                                   70000, "0-5"])
def test_a_bad_metrics_port_names_the_setting_and_the_value(value: object) -> None:
    with pytest.raises(ConfigError) as e:
        parse_metrics_port(value)
    assert str(e.value).startswith(f"BLOOMDUPE_METRICS_PORT={value!r}: ")
    if value == "94x0":
        assert str(e.value) == ("BLOOMDUPE_METRICS_PORT='94x0': is not a port, a range "
                                "'A-B' or 0")


def test_metrics_config_defaults_and_errors() -> None:
    config = MetricsConfig.from_settings(Settings())
    assert config == MetricsConfig(None, "0.0.0.0", 5.0)
    with pytest.raises(ConfigError, match="BLOOMDUPE_LIVE_INTERVAL"):
        MetricsConfig.from_settings(Settings({"BLOOMDUPE_LIVE_INTERVAL": 0}))
    with pytest.raises(ConfigError, match="BLOOMDUPE_METRICS_HOST"):
        MetricsConfig.from_settings(Settings({"BLOOMDUPE_METRICS_HOST": " "}))


# -- each worker's ----------------------------------------------------------------------


_opened: list[WorkerMetrics] = []


def opened(redis_url: str, **settings: Any) -> WorkerMetrics:
    """The extension of a crawler on ``redis_url``, as after spider_opened (no reactor);
    its client is closed after the test."""
    crawler = crawler_for(redis_url, **settings)
    ext = WorkerMetrics.from_crawler(crawler)
    ext.key = ext.key_template.key_for(crawler.spider.name)
    ext.client = connection.get_client(crawler)
    _opened.append(ext)
    return ext


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _opened:
        client = _opened.pop().client
        if client is not None:
            client.close()


def test_a_worker_writes_its_line_and_adds_what_grew(redis_url: str, client: redis.Redis
                                                     ) -> None:
    ext = opened(redis_url, BLOOMDUPE_LIVE_INTERVAL=2)
    stats = ext.crawler.stats
    stats.set_value("response_received_count", 7)
    stats.set_value("downloader/response_status_count/200", 6)
    stats.set_value("downloader/response_status_count/404", 1)
    stats.set_value("bloomdupe/requeued", 2)
    ext.write()
    stats.set_value("response_received_count", 10)
    ext.write()
    key = "demo:bloomdupe"
    line = json.loads(client.get(keys.live_worker(key, ext.worker)) or "{}")
    assert line["pages"] == 10 and line["responses"] == {"200": 6, "404": 1}
    assert line["requeued"] == 2 and line["spider"] == "demo"
    assert line["pages_per_second"] > 0
    assert 0 < client.pttl(keys.live_worker(key, ext.worker)) <= 15_000  # MIN_TTL
    assert client.hget(keys.stats(key), "pages") == b"10"
    assert client.hget(keys.stats(key), "requeued") == b"2"
    # At close: the last of its counters added (the crawl's filter is still there), its
    # line gone.
    client.hset(keys.meta(key), "capacity", 1)
    stats.set_value("response_received_count", 12)
    ext.spider_closed(ext.crawler.spider, "finished")
    assert client.hget(keys.stats(key), "pages") == b"12"
    assert not client.exists(keys.live_worker(key, ext.worker))
    assert crawlstats.live_workers(client, key) == []


def test_a_worker_closing_after_the_crawl_was_cleared_writes_nothing(
        redis_url: str, client: redis.Redis) -> None:
    ext = opened(redis_url)
    ext.crawler.stats.set_value("response_received_count", 3)
    ext.spider_closed(ext.crawler.spider, "finished")
    assert client.keys("*") == []


def test_a_crawl_cleared_between_the_check_and_the_last_write_keeps_no_counters(
        redis_url: str, client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last worker of a crawl without SCHEDULER_PERSIST clears it while another
    closes: after that one's check that the crawl is there, before its last write
    (seen in a CI run: ``K:stats`` made again and left behind)."""
    ext = opened(redis_url)
    key = "demo:bloomdupe"
    client.hset(keys.meta(key), "capacity", 1)
    send = ext._send

    def cleared_first(*args: Any, **kwargs: Any) -> Any:
        client.delete(keys.meta(key))  # the last worker's clear
        return send(*args, **kwargs)

    monkeypatch.setattr(ext, "_send", cleared_first)
    ext.crawler.stats.set_value("response_received_count", 3)
    ext.spider_closed(ext.crawler.spider, "finished")
    assert client.keys("*") == []


def two_free_ports() -> int:
    """A port whose next one is free too (``free_port`` alone answered one whose next
    was taken, by another socket on the machine: failed twice on 2026-11-24)."""
    for _ in range(100):
        first = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", first + 1))
            except OSError:
                continue
        return first
    raise RuntimeError("no two adjacent free ports on 127.0.0.1")


def test_workers_on_one_host_take_the_next_free_port_of_the_range(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    first = two_free_ports()
    one = opened(redis_url, BLOOMDUPE_METRICS_PORT=f"{first}-{first + 1}",
                 BLOOMDUPE_METRICS_HOST="127.0.0.1")
    two = opened(redis_url, BLOOMDUPE_METRICS_PORT=f"{first}-{first + 1}",
                 BLOOMDUPE_METRICS_HOST="127.0.0.1")
    three = opened(redis_url, BLOOMDUPE_METRICS_PORT=f"{first}-{first + 1}",
                   BLOOMDUPE_METRICS_HOST="127.0.0.1")
    try:
        with caplog.at_level("INFO", logger="scrapy_bloomdupe.workermetrics"):
            for ext in (one, two, three):
                assert ext.config.ports is not None
                ext.listen(*ext.config.ports)
        assert one.server is not None and one.server.server_port == first
        assert two.server is not None and two.server.server_port == first + 1
        assert three.server is None
        messages = [r.getMessage() for r in caplog.records]
        assert messages[0] == (f"Serving this worker's Prometheus metrics at "
                               f"http://127.0.0.1:{first}/metrics (BLOOMDUPE_METRICS_PORT)")
        assert messages[2].startswith(f"BLOOMDUPE_METRICS_PORT: no free port in "
                                      f"{first}-{first + 1} on 127.0.0.1")
        one.crawler.stats.set_value("response_received_count", 4)
        one.crawler.stats.set_value("downloader/response_status_count/200", 4)
        with urllib.request.urlopen(f"http://127.0.0.1:{first}/metrics", timeout=5) as r:
            families = parse(r.read())
    finally:
        for ext in (one, two, three):
            ext.spider_closed(ext.crawler.spider, "finished")
    labels = {"crawl": "demo:bloomdupe", "worker": one.worker}
    assert families["bloomdupe_worker_pages"]["samples"] == [
        ("bloomdupe_worker_pages_total", labels, 4.0)]
    assert families["bloomdupe_worker_responses"]["samples"] == [
        ("bloomdupe_worker_responses_total", {**labels, "status": "200"}, 4.0)]
    assert families["bloomdupe_worker_requests_in_flight"]["type"] == "gauge"
    for name in ("bloomdupe_worker_requests_checked", "bloomdupe_worker_lock_waits",
                 "bloomdupe_worker_redis_outage_seconds", "bloomdupe_worker_leases_requeued",
                 "bloomdupe_worker_requests_failed", "bloomdupe_worker_items",
                 "bloomdupe_worker_held_full"):
        assert families[name]["type"] == "counter", name
    assert one.server is None  # stopped at close


def test_scrapy_bloomdupe_top_and_metrics_in_a_project(redis_url: str,
                                                       client: redis.Redis) -> None:
    BloomFilter.open(client, "site:bloomdupe", first_plan(1000, 0.01), growth=True).close()
    crawlstats.write_live(client, "site:bloomdupe", "h:7", {"pages": 3, "pid": 7,
                                                           "pages_per_second": 1.5}, {}, 30)

    def scrapy(*args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        return subprocess.run([sys.executable, "-m", "scrapy", "bloomdupe", *args, "-s",
                               f"REDIS_URL={redis_url}"], cwd=EXAMPLE_PROJECT,
                              capture_output=True, text=True, timeout=180, env=env)

    done = scrapy("top", "site", "--once")
    assert done.returncode == 0, done.stderr
    assert "crawl 'site:bloomdupe'" in done.stdout and "Running workers (1)" in done.stdout
    assert " h:7 " in done.stdout and " 1.5 " in done.stdout, done.stdout
    done = scrapy("metrics", "site")
    assert done.returncode == 2
    assert "metrics needs --port PORT" in done.stderr
    done = scrapy("info", "site", "--once")
    assert done.returncode == 2
    assert "--once applies to top only" in done.stderr


def test_a_worker_writes_its_figures_with_the_least_privilege_acl(
        redis_url: str, client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """The ACL user of docs/security.md (the Lua engine's line, for the demo spider's key)
    is enough: nothing denied, no warning."""
    doc = (ROOT / "docs" / "security.md").read_text()
    line = next(t for t in doc.splitlines() if t.startswith("ACL SETUSER crawler "))
    rules = line.split()[3:]
    rules = [r.replace("myspider", "demo").replace(">the-password", ">pw") for r in rules]
    client.execute_command("ACL", "SETUSER", "metrics-test", *rules)
    client.execute_command("ACL", "LOG", "RESET")
    try:
        ext = opened(redis_url.replace("redis://", "redis://metrics-test:pw@"))
        ext.crawler.stats.set_value("response_received_count", 2)
        with caplog.at_level("DEBUG", logger="scrapy_bloomdupe.workermetrics"):
            ext.write()
            ext._writes = 0  # the next write prunes the index
            ext.write()
            client.hset(keys.meta("demo:bloomdupe"), "capacity", 1)
            ext.spider_closed(ext.crawler.spider, "finished")
        assert client.execute_command("ACL", "LOG") == []
        assert not caplog.records, [r.getMessage() for r in caplog.records]
        assert client.hget(keys.stats("demo:bloomdupe"), "pages") == b"2"
    finally:
        client.execute_command("ACL", "DELUSER", "metrics-test")


def test_the_least_privilege_acl_reads_a_crawl_and_says_what_the_slots_need(
        redis_url: str, client: redis.Redis, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    """With the ACL user of docs/security.md (and +xlen, which the tools need), a crawl
    without download slots is read with nothing denied; one with slots is read but for
    them, and a line says what they need."""
    doc = (ROOT / "docs" / "security.md").read_text()
    line = next(t for t in doc.splitlines() if t.startswith("ACL SETUSER crawler "))
    rules = [r.replace("myspider", "demo").replace(">the-password", ">pw")
             for r in line.split()[3:]]
    # The tools also read the failed requests' count (docs/metrics.md, "What top reads").
    client.execute_command("ACL", "SETUSER", "slots-test", *rules, "+xlen")
    client.execute_command("ACL", "LOG", "RESET")
    url = redis_url.replace("redis://", "redis://slots-test:pw@")
    BloomFilter.open(client, "demo:bloomdupe", first_plan(1000, 0.01)).close()
    try:
        assert main(["top", "--once", "--json", "--redis-url", url, "--spider", "demo"]) == 0
        assert json.loads(capsys.readouterr().out)["slots"] is None
        assert main(["info", "--json", "--redis-url", url, "--spider", "demo"]) == 0
        assert json.loads(capsys.readouterr().out)["slots"] is None
        assert client.execute_command("ACL", "LOG") == []
        busy_slots(client, "demo:bloomdupe")
        with caplog.at_level("WARNING", logger="scrapy_bloomdupe.crawlfigures"):
            assert main(["top", "--once", "--redis-url", url, "--spider", "demo"]) == 0
        out = capsys.readouterr().out
        assert "queue            12 waiting, 3 leased" in out and "download slots" not in out
        assert "they need +hmget +llen" in caplog.text
        assert main(["info", "--redis-url", url, "--spider", "demo"]) == 0
        done = capsys.readouterr()
        assert "12 request(s) waiting, 3 leased by workers" in done.out
        assert "busiest download slots cannot be read" in done.err and "+hmget +llen" in done.err
    finally:
        client.execute_command("ACL", "DELUSER", "slots-test")
