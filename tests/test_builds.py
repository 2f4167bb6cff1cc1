"""Builds on one crawl fence each other (frontier/builds.py, versions.refusal, the
filter's stored format): each worker records its build in its heartbeat; a worker that
starts refuses, in one line naming both builds and what to do, a state it cannot read or
live workers of a build that cannot read the state it writes; and the builds before
0.2.0 (which record none) refuse a crawl a worker of this one has joined.

The earlier builds' states are fixtures (``tests/fixtures/builds/<hash>.json``) that
those builds wrote, each one's worker live mid-crawl: ``python scripts/build_matrix.py
--fixtures tests/fixtures/builds --pages 60 --site-delay 0.1 --concurrency 2`` writes them
again from the worktrees in ``/work/old``. With ``BLOOMDUPE_OLD_BUILDS=1`` (and those
worktrees) the slow test here runs the real earlier builds' workers against this one.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import DemoSpider, crawler_for
from scrapy.settings import Settings

from scrapy_bloomdupe import __version__, keys, sizing
from scrapy_bloomdupe.bloom import meta
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.exceptions import BuildError, FilterMismatchError
from scrapy_bloomdupe.frontier import builds, entry
from scrapy_bloomdupe.frontier.queue import PriorityQueue
from scrapy_bloomdupe.scheduler import Scheduler
from scrapy_bloomdupe.scheduling.shared import check_builds
from scrapy_bloomdupe.versions import UNRECORDED, Build, refusal

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "builds"
ROOT = Path(__file__).resolve().parent.parent
KEY = "site:bloomdupe"  # the example project's spider "site"
OURS = builds.OURS


# -- the decision -----------------------------------------------------------------------

def test_this_build_is_0_2_0_and_writes_the_state_format() -> None:
    assert __version__ == "0.2.0"
    assert Build("0.2.0", entry.STATE_FORMAT) == OURS
    assert Build.parse(str(OURS)) == OURS and Build.parse(b"junk") is None


@pytest.mark.parametrize(("state", "live", "says"), [
    (None, [], None),  # a new crawl
    (str(OURS.format), [OURS, OURS], None),  # workers of this build
    ("1", [], None),  # an earlier state, nobody on it: this build reads (or migrates) it
    (str(OURS.format), [None], rf"1 live worker\(s\) of scrapy-bloomdupe {re.escape(UNRECORDED)}"
     r", which cannot read the state this worker \(scrapy-bloomdupe 0\.2\.0, format \d+\) "
     rf"writes: stop the workers of {re.escape(UNRECORDED)} first"),
    (None, [Build("0.2.0", OURS.format - 1), None], r"2 live worker\(s\) of scrapy-bloomdupe "
     r"0\.1\.0 .*, 0\.2\.0, which cannot read"),
    (str(OURS.format + 1), [], rf"holds state of format {OURS.format + 1}, written by "
     r"scrapy-bloomdupe 0\.3\.0; this worker is scrapy-bloomdupe 0\.2\.0 and reads formats up "
     rf"to {OURS.format}: upgrade this worker to 0\.3\.0$"),
    (str(OURS.format), [Build("0.4.0", OURS.format + 2)], rf"holds state of format "
     rf"{OURS.format + 2}, written by scrapy-bloomdupe 0\.4\.0; .*upgrade this worker to 0\.4\.0"),
    ("x", [], r"holds state of format x, written by a newer scrapy-bloomdupe; .*upgrade this "
     r"worker to a release that reads format x"),
])
def test_a_worker_refuses_what_it_cannot_read_or_run_beside(
        state: str | None, live: list[Build | None], says: str | None) -> None:
    recorded = [Build("0.3.0", OURS.format + 1), Build("0.2.5", OURS.format + 1)]
    found = refusal("K", OURS, state, live, recorded if state and state.isdigit() else [])
    if says is None:
        assert found is None
    else:
        assert found is not None and re.search(says, found), found
        assert "bloomdupe clear" not in found


# -- on a real Redis ----------------------------------------------------------------------

def settings(**more: Any) -> Settings:
    return Settings({"BLOOMDUPE_KEY": KEY, "BLOOMDUPE_LEASE_TIMEOUT": 5, **more})


def test_the_heartbeat_records_the_build_and_a_look_sees_it_live(
        client: redis.Redis) -> None:
    queue = PriorityQueue(client, DemoSpider(), "x", tag=KEY)
    queue.heartbeat()
    assert client.hgetall(keys.builds(KEY)) == {queue.owner.encode(): str(OURS).encode()}
    client.set(keys.queue_format(KEY), OURS.format)
    found = builds.look(client, KEY, 5000)
    assert found.live == [(queue.owner, OURS)] and found.state == str(OURS.format)
    check_builds(client, settings(), "site")  # a worker of this build beside it: may start
    # A worker gone (left, or reaped): its record goes at the next start.
    client.zrem(keys.owners(KEY, 0), queue.owner)
    check_builds(client, settings(), "site", prune=True)
    assert client.hgetall(keys.builds(KEY)) == {}


def test_a_worker_logs_its_version_at_start_and_refuses_beside_an_older_one(
        redis_url: str, client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="scrapy_bloomdupe"):
        Scheduler.from_crawler(crawler_for(redis_url, BLOOMDUPE_KEY=KEY))
    said = [r.getMessage() for r in caplog.records if "scrapy-bloomdupe" in r.getMessage()]
    assert said == [f"scrapy-bloomdupe 0.2.0 (state format {OURS.format})"]
    client.zadd(keys.owners(KEY, 0), {"old1": int(client.time()[0]) * 1000})
    with pytest.raises(BuildError, match=r"stop the workers of 0\.1\.0"):
        Scheduler.from_crawler(crawler_for(redis_url, BLOOMDUPE_KEY=KEY))


def test_a_newer_builds_state_is_refused_naming_it(client: redis.Redis) -> None:
    """As a later build would leave it: its format record and its workers' builds."""
    client.set(keys.queue_format(KEY), OURS.format + 1)
    client.hset(keys.builds(KEY), "gone", f"0.3.0 {OURS.format + 1}")
    with pytest.raises(BuildError, match=r"written by scrapy-bloomdupe 0\.3\.0; .*upgrade this "
                       r"worker to 0\.3\.0"):
        check_builds(client, settings(), "site")
    assert client.hgetall(keys.builds(KEY)) == {b"gone": f"0.3.0 {OURS.format + 1}".encode()}


def test_a_newer_filter_format_says_upgrade_not_clear(client: redis.Redis) -> None:
    BloomFilter.open(client, KEY, sizing.plan(1000, 0.01))
    client.hset(keys.meta(KEY), "version", meta.FORMAT_VERSION + 1)
    with pytest.raises(Exception, match="upgrade this worker") as refused:
        BloomFilter.open(client, KEY, sizing.plan(1000, 0.01))
    assert "bloomdupe clear" not in str(refused.value)
    assert not isinstance(refused.value, FilterMismatchError)


def test_info_shows_the_state_format_and_each_live_workers_version(
        redis_url: str, client: redis.Redis) -> None:
    BloomFilter.open(client, KEY, sizing.plan(1000, 0.01)).close()
    ours = PriorityQueue(client, DemoSpider(), "x", tag=KEY)
    ours.heartbeat()
    client.set(keys.queue_format(KEY), OURS.format)
    client.zadd(keys.owners(KEY, 0), {"old1": int(client.time()[0]) * 1000})  # no record
    out = subprocess.run([sys.executable, "-m", "scrapy_bloomdupe.cli", "info", "--key", KEY],
                         capture_output=True, text=True, timeout=180,
                         env={**os.environ, "REDIS_URL": redis_url})
    assert out.returncode == 0, out.stderr
    assert re.search(rf"state format +{OURS.format}; this scrapy-bloomdupe writes "
                     rf"{OURS.format}\n", out.stdout), out.stdout
    assert re.search(r"live workers +2 \(heard from in the last 30 s\)", out.stdout)
    assert re.search(rf"{ours.owner} +0\.2\.0 +{OURS.format}\n", out.stdout), out.stdout
    assert re.search(rf"old1 +{re.escape(UNRECORDED)} +\?", out.stdout), out.stdout
    # Heard from again: under a loaded CI the first command alone can outlast the 30 s.
    ours.heartbeat()
    client.zadd(keys.owners(KEY, 0), {"old1": int(client.time()[0]) * 1000})
    data = json.loads(subprocess.run(
        [sys.executable, "-m", "scrapy_bloomdupe.cli", "info", "--key", KEY, "--json"],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "REDIS_URL": redis_url}).stdout)
    assert data["state_format"] == str(OURS.format)
    assert sorted(data["workers"], key=lambda w: w["owner"] != ours.owner) == [
        {"owner": ours.owner, "version": "0.2.0", "format": OURS.format},
        {"owner": "old1", "version": None, "format": None}]


# -- states that the earlier builds wrote -------------------------------------------------

def fixture_names() -> list[str]:
    return sorted(p.stem for p in FIXTURES.glob("*.json"))


def load(client: redis.Redis, name: str) -> dict[str, Any]:
    """The fixture's keys into Redis, as the earlier build wrote them."""
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    for raw, found in data["keys"].items():
        key, kind, value = base64.b64decode(raw), found["type"], found["value"]
        if kind == "string":
            client.set(key, base64.b64decode(value))
        elif kind == "hash":
            client.hset(key, mapping={base64.b64decode(k): base64.b64decode(v)
                                      for k, v in value.items()})
        elif kind == "zset":
            client.zadd(key, {base64.b64decode(m): s for m, s in value})
        elif kind == "list":
            client.rpush(key, *(base64.b64decode(v) for v in value))
        elif kind == "set":
            client.sadd(key, *(base64.b64decode(v) for v in value))
    return data


def age_owners(client: redis.Redis, *, live: bool) -> int:
    """Move the fixture's heartbeats to now (its workers live) or long ago (gone); how
    many owners it has."""
    now_ms = int(client.time()[0]) * 1000
    owners = client.zrange(keys.owners(KEY, 0), 0, -1, withscores=True)
    for owner, score in owners:
        client.zadd(keys.owners(KEY, 0), {owner: now_ms if live else score - 10**9})
    return len(owners)


def reads(name: str) -> tuple[int, int | None]:
    """What the earlier build reads: the filter's format versions up to, and the state's
    format records up to (None: it reads no record), from its source as committed."""
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    return data["meta_reads"], data["format_reads"]


@pytest.mark.parametrize("name", fixture_names())
def test_a_live_worker_of_an_earlier_build_keeps_this_one_out(
        client: redis.Redis, name: str) -> None:
    load(client, name)
    assert age_owners(client, live=True) >= 1
    assert client.hlen(keys.builds(KEY)) == 0  # the earlier builds record none
    with pytest.raises(BuildError, match=rf"1 live worker\(s\) of scrapy-bloomdupe "
                       rf"{re.escape(UNRECORDED)}, .*stop the workers of "
                       rf"{re.escape(UNRECORDED)} first"):
        check_builds(client, settings(), "site")


@pytest.mark.parametrize("name", fixture_names())
def test_this_build_joins_an_earlier_builds_state_and_fences_it(
        client: redis.Redis, name: str) -> None:
    """Its workers gone, this build may start; the filter and the format record it then
    writes are past what the earlier build reads, so that build refuses the crawl."""
    load(client, name)
    age_owners(client, live=False)
    check_builds(client, settings(), "site")
    stored = meta.read(client, KEY)
    bf = BloomFilter.open(client, KEY, meta.stored_plan(stored),
                          growth=bool(stored.get("growth")),
                          fingerprint=stored.get("fingerprint", "scrapy"))
    bf.close()
    client.set(keys.queue_format(KEY), OURS.format)  # as the scheduler's start claims it
    meta_reads, _ = reads(name)
    assert meta.read(client, KEY)["version"] == meta.FORMAT_VERSION > meta_reads


# -- the real earlier builds (slow, opt-in) -------------------------------------------------

OLD = Path(os.environ.get("BLOOMDUPE_OLD_DIR", "/work/old"))


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("BLOOMDUPE_OLD_BUILDS") != "1",
                    reason="runs every earlier build's workers (minutes): BLOOMDUPE_OLD_BUILDS=1")
@pytest.mark.skipif(not OLD.is_dir(), reason=f"no earlier builds' worktrees at {OLD}")
def test_every_earlier_build_against_this_one_with_real_workers(tmp_path: Path) -> None:
    names = sorted(p.name for p in OLD.iterdir() if (p / ".venv" / "bin" / "scrapy").exists())
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_matrix.py"), "--old", str(OLD),
         "--builds", *names, "--out", str(tmp_path), "--pages", "150"],
        capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
