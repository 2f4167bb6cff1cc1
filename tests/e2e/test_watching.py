"""End to end: watching a running crawl (README "Watching a crawl").

Two real ``scrapy crawl`` workers of the example project crawl its local site (slowed
down, so they are still at it while the test looks), each serving its own metrics
(``BLOOMDUPE_METRICS_PORT=0``), beside a real ``bloomdupe metrics`` exporter:

* the exporter's text, and each worker's, parse with prometheus-client's own parser
  and carry the crawl's figures; ``bloomdupe top --once`` shows the two workers;
* a real Prometheus server (Debian's ``prometheus`` package) scrapes the exporter and
  the workers every second, and every panel query of the Grafana dashboard
  (docs/grafana-dashboard.json) returns data from its query API.

The workers are stopped (SIGTERM, by PID) once the test has seen what it wants.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, demo_site, start_workers, wait_workers
from prometheus_client.parser import text_string_to_metric_families

from scrapy_bloomdupe.testing import RedisServer, free_port

pytestmark = pytest.mark.slow

KEY = "site:bloomdupe"
DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
#: Long enough a crawl that it is still running when the test is done looking.
SITE_PAGES = 3000
SITE_DELAY = 0.05
WORKER_SETTINGS = ("BLOOMDUPE_METRICS_PORT=0", "BLOOMDUPE_METRICS_HOST=127.0.0.1",
                   "BLOOMDUPE_LIVE_INTERVAL=0.5", "CONCURRENT_REQUESTS=4",
                   "BLOOMDUPE_STATS_INTERVAL=1", "BLOOMDUPE_LOG_INTERVAL=0")
SERVING = re.compile(r"Serving this worker's Prometheus metrics at (http://\S+/metrics)")


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def poll(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """``check()``'s first truthy answer; fails with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.3)
    pytest.fail(f"{what}: not seen within {timeout:.0f}s (last: {last!r})")


def samples(text: str) -> dict[str, list[Any]]:
    """Every sample of an exposition, by sample name (``..._total`` for counters)."""
    found: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def bloomdupe(redis_url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "scrapy_bloomdupe.cli", *args,
                             "--redis-url", redis_url, "--key", KEY],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@dataclass
class Crawl:
    redis_url: str
    exporter: str  # its /metrics URL
    workers: list[str]  # each worker's /metrics URL
    logs: Path


@contextmanager
def running_crawl(tmp_path: Path) -> Iterator[Crawl]:
    """Two workers crawling the slowed-down site, and the exporter; all stopped after."""
    with RedisServer(persist=True, extra=["--appendfsync", "everysec"]) as server, \
            demo_site(SITE_PAGES, delay=SITE_DELAY) as site:
        port = free_port()
        exporter = bloomdupe(server.url, "metrics", "--port", str(port), "--host", "127.0.0.1",
                             "--filter-every", "0")
        workers = start_workers(server.url, site.url, tmp_path, 2, *WORKER_SETTINGS)
        try:
            def ports() -> list[str]:
                logs = [(tmp_path / f"worker-{i}.log") for i in range(2)]
                found = [SERVING.search(log.read_text()) if log.exists() else None
                         for log in logs]
                return [m.group(1) for m in found if m] if all(found) else []

            urls = poll("each worker's metrics port in its log", ports)

            def exporter_up() -> bool:
                # (it may start after the workers: they fork from tests/harness/zygote.py)
                assert exporter.poll() is None, exporter.communicate()
                with suppress(OSError):
                    return bool(get(f"http://127.0.0.1:{port}/metrics"))
                return False

            poll("the exporter serving", exporter_up)
            yield Crawl(server.url, f"http://127.0.0.1:{port}/metrics", urls, tmp_path)
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.send_signal(signal.SIGTERM)
            codes = wait_workers(workers, timeout=120)
            exporter.terminate()
            _, err = exporter.communicate(timeout=10)
        assert codes == [0, 0], [(tmp_path / f"worker-{i}.log").read_text()[-3000:]
                                 for i in range(2)]
        assert "serving the Prometheus metrics of 'site:bloomdupe'" in err, err


def test_the_exporter_the_workers_and_top_show_a_running_crawl(tmp_path: Path) -> None:
    with running_crawl(tmp_path) as crawl:
        def crawl_figures() -> dict[str, list[Any]] | None:
            found = samples(get(crawl.exporter))
            ready = (found["bloomdupe_workers"][0].value == 2
                     and found["bloomdupe_pages_total"][0].value > 20
                     and found["bloomdupe_requests_checked_total"][0].value > 0
                     and "bloomdupe_filter_fill_ratio" in found)
            return found if ready else None

        found = poll("2 workers alive and pages crawled, at the exporter", crawl_figures)
        for name in ("bloomdupe_requests_checked_total", "bloomdupe_requests_new_total",
                     "bloomdupe_requests_duplicate_total", "bloomdupe_filter_fill_ratio",
                     "bloomdupe_filter_estimated_false_positive_rate",
                     "bloomdupe_filter_memory_bytes", "bloomdupe_filter_generations",
                     "bloomdupe_queue_requests", "bloomdupe_leases_requeued_total",
                     "bloomdupe_requests_failed_total", "bloomdupe_workers", "bloomdupe_up"):
            assert name in found, name
            assert all(s.labels["crawl"] == KEY for s in found[name]), found[name]
        one = {name: found[name][0].value for name in found}
        assert one["bloomdupe_up"] == 1
        assert one["bloomdupe_requests_checked_total"] >= one["bloomdupe_requests_new_total"] > 1
        assert one["bloomdupe_requests_duplicate_total"] > 0  # every page links back
        assert 0 < one["bloomdupe_filter_fill_ratio"] < 1
        assert 0 <= one["bloomdupe_filter_estimated_false_positive_rate"] < 0.001
        assert one["bloomdupe_filter_configured_false_positive_rate"] == pytest.approx(0.001)
        assert one["bloomdupe_filter_memory_bytes"] > 0
        assert one["bloomdupe_filter_generations"] == 1
        states = {s.labels["state"]: s.value for s in found["bloomdupe_queue_requests"]}
        assert set(states) == {"waiting", "leased"}
        assert states["waiting"] + states["leased"] > 0  # the site is far from done

        for url in crawl.workers:
            # A worker that joined late may not have a page yet: wait for its first one
            # (the site is far from done) rather than read the figure once.
            own = samples(poll(f"pages at {url}", lambda url=url: (
                text := get(url)) and "bloomdupe_worker_pages_total" in text
                and samples(text)["bloomdupe_worker_pages_total"][0].value > 0 and text))
            assert own["bloomdupe_worker_pages_total"][0].value > 0
            assert own["bloomdupe_worker_pages_total"][0].labels["crawl"] == KEY
            statuses = {s.labels["status"] for s in own["bloomdupe_worker_responses_total"]}
            assert statuses == {"200"}
            assert own["bloomdupe_worker_requests_checked_total"][0].value > 0
            assert "bloomdupe_worker_requests_in_flight" in own
            assert "bloomdupe_worker_redis_outage_seconds_total" in own

        top = bloomdupe(crawl.redis_url, "top", "--once")
        out, err = top.communicate(timeout=120)
        assert top.returncode == 0, err
        assert re.search(r"workers alive\s+2\n", out), out
        assert "Running workers (2)" in out, out
        assert re.search(r"queue\s+[\d,]+ waiting, [\d,]+ leased", out), out
        assert "est. FPR" in out, out
        rows = [line for line in out.splitlines() if re.match(r"\s+\S+:\d+\s+[\d.]+\s", line)]
        assert len(rows) == 2, out

        top = bloomdupe(crawl.redis_url, "top", "--once", "--json")
        out, err = top.communicate(timeout=120)
        assert top.returncode == 0, err
        data = json.loads(out)
        assert data["workers_alive"] == 2 and len(data["workers"]) == 2, data
        assert data["pages_per_second"] > 0, data


# -- a real Prometheus ------------------------------------------------------------------


class PrometheusServer:
    """Debian's ``prometheus`` on a free loopback port, with its own config and storage
    in a temporary directory, scraping ``targets`` every second; stopped by PID."""

    def __init__(self, targets: list[str]) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="bloomdupe-prometheus-"))
        self.targets = targets
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> PrometheusServer:
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "scrape_configs": [{"job_name": "bloomdupe", "scrape_interval": "1s",
                                      "static_configs": [{"targets": self.targets}]}]}
        (self.dir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        with (self.dir / "prometheus.log").open("wb") as log:
            self.process = subprocess.Popen(
                ["prometheus", f"--config.file={self.dir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.dir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT)
        poll("Prometheus ready", self.ready)
        return self

    def ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            pytest.fail(f"prometheus exited: {(self.dir / 'prometheus.log').read_text()[-2000:]}")
        try:
            return "Ready" in get(f"{self.url}/-/ready")
        except OSError:
            return False

    def query(self, expr: str) -> list[Any]:
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        reply = json.loads(get(url))
        assert reply["status"] == "success", reply
        return list(reply["data"]["result"])

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of every panel of the dashboard, with its
    variables given values (``$crawl``: the test's crawl)."""
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = (target["expr"].replace("$__rate_interval", "10s")
                    .replace("$crawl", re.escape(KEY)))
            found.append((panel["title"], expr))
    return found


def test_prometheus_scrapes_the_crawl_and_every_dashboard_panel_has_data(tmp_path: Path
                                                                         ) -> None:
    if shutil.which("prometheus") is None:
        pytest.skip("Debian's prometheus package is not installed: apt-get install prometheus "
                    "(scripts/bootstrap tries)")
    queries = panel_queries()
    assert len(queries) >= 9, queries
    with running_crawl(tmp_path) as crawl:
        targets = [urllib.parse.urlsplit(u).netloc for u in [crawl.exporter, *crawl.workers]]
        with PrometheusServer(targets) as prometheus:
            up = poll("every target up in Prometheus", lambda: (
                result := prometheus.query("up == 1")) and len(result) == 3 and result)
            assert len(up) == 3
            pages = poll("the crawl's pages in Prometheus", lambda: prometheus.query(
                f'bloomdupe_pages_total{{crawl="{KEY}"}} > 0'))
            assert float(pages[0]["value"][1]) > 0
            workers = prometheus.query(f'bloomdupe_workers{{crawl="{KEY}"}}')
            assert float(workers[0]["value"][1]) == 2
            for title, expr in queries:
                poll(f"data for panel {title!r}: {expr}", lambda expr=expr: prometheus.query(expr))
