"""A crawl that cannot start says why in one line and exits non-zero: real ``scrapy crawl``.

``scrapy crawl site`` in ``example_project`` with a setting that cannot work, a
refused password, an unreachable Redis and a password that redis-py would
misread: exit status 1, the error's one line (CRITICAL), no traceback, no
"Engine slot not assigned", and no part of the password anywhere.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from helpers import EXAMPLE_PROJECT

from scrapy_bloomdupe import versions
from scrapy_bloomdupe.connection import StartErrorFilter
from scrapy_bloomdupe.exceptions import ConfigError
from scrapy_bloomdupe.testing import RedisServer, free_port

#: A password with every character that ends a URL's host part, in distinctive pieces.
PIECES = ("Alpha7x", "Bravo8y", "Charlie9z", "Delta0w")
PASSWORD = f"{PIECES[0]}#{PIECES[1]}/{PIECES[2]}?{PIECES[3]}"


@pytest.fixture(scope="module")
def auth_redis() -> Iterator[RedisServer]:
    with RedisServer(extra=["--requirepass", PASSWORD]) as server:
        yield server


def crawl(redis_url: str, *settings: str,
          pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``scrapy crawl site -s ...`` in the example project (its site is not running: a
    crawl that starts would fail on the first page, not at start)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(REDIS_URL=redis_url, DEMO_SITE_URL=f"http://127.0.0.1:{free_port()}/")
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    args = [a for s in settings for a in ("-s", s)]
    return subprocess.run([sys.executable, "-m", "scrapy", "crawl", "site", *args],
                          cwd=EXAMPLE_PROJECT, capture_output=True, text=True, timeout=120,
                          env=env)


def assert_one_line(result: subprocess.CompletedProcess[str], says: str) -> str:
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    lines = [line for line in output.splitlines() if "CRITICAL" in line or "ERROR" in line]
    assert len(lines) == 1, output
    assert "[scrapy_bloomdupe] CRITICAL: Cannot start the crawl: " in lines[0], output
    assert says in lines[0], output
    for noise in ("Traceback", "Engine slot not assigned", "Task exception was never retrieved",
                  "During handling"):
        assert noise not in output, output
    return output


@pytest.mark.parametrize(("setting", "says"), [
    ("BLOOMDUPE_CAPACITY=abc", "BLOOMDUPE_CAPACITY='abc': must be a whole number"),
    ("BLOOMDUPE_ERROR_RATE=2", "BLOOMDUPE_ERROR_RATE='2': must be in (0, 1)"),
    ("BLOOMDUPE_ON_OUTAGE=retry", "BLOOMDUPE_ON_OUTAGE='retry': must be one of close, allow"),
])
def test_a_bad_setting_is_one_line(redis_url: str, setting: str, says: str) -> None:
    assert_one_line(crawl(redis_url, setting), says)


def test_a_bad_setting_read_by_the_addon_is_one_line(redis_url: str) -> None:
    result = crawl(redis_url, 'ADDONS={"scrapy_bloomdupe.addon.BloomDupeAddon": 100}',
                   "BLOOMDUPE_SCHEDULER=maybe")
    assert_one_line(result, "BLOOMDUPE_SCHEDULER='maybe': must be true or false")


def test_a_refused_password_is_one_line(auth_redis: RedisServer) -> None:
    output = assert_one_line(crawl(f"redis://:Wrong-pw-1234@127.0.0.1:{auth_redis.port}/0"),
                             "refused the credentials")
    assert "Wrong-pw-1234" not in output


def test_an_unreachable_redis_is_one_line() -> None:
    port = free_port()
    assert_one_line(crawl(f"redis://:Secret-pw-1234@127.0.0.1:{port}/0"),
                    f"Cannot reach Redis at 127.0.0.1:{port}")


def test_a_password_redis_py_would_misread_is_refused_without_showing_it(
        auth_redis: RedisServer) -> None:
    url = f"redis://crawler:{PASSWORD}@127.0.0.1:{auth_redis.port}/0"
    output = assert_one_line(crawl(url), f"REDIS_URL='redis://crawler:***@127.0.0.1:"
                                         f"{auth_redis.port}/0': the user name or password "
                                         "holds '/', '?' or '#' unencoded")
    assert "Percent-encode" in output
    for piece in PIECES:
        assert piece not in output, output


#: Loaded at the worker's start (PYTHONPATH): mmh3 reads as 3.1.0, below every floor it
#: had, as after ``pip install --no-deps mmh3==3.1.0``, without a venv to build.
OLD_MMH3 = """\
import importlib.metadata as metadata

_real = metadata.version


def version(name):
    return "3.1.0" if name == "mmh3" else _real(name)


metadata.version = version
"""


def test_a_dependency_below_its_floor_is_one_line(redis_url: str, tmp_path: Path) -> None:
    """Not a crawl that fetches nothing and exits 0: exit status 1, one line naming the
    package, the version installed and the floor (read from the installed metadata)."""
    (tmp_path / "sitecustomize.py").write_text(OLD_MMH3)
    result = crawl(redis_url, pythonpath=tmp_path)
    floor = next(r for r in versions.runtime_requirements() if r.name == "mmh3").specifier
    output = assert_one_line(result, f"mmh3 3.1.0 installed, needs mmh3{floor}")
    assert result.returncode == 1, output


def test_the_same_password_percent_encoded_is_used(auth_redis: RedisServer) -> None:
    """Encoded, it gets in: the crawl starts (and then fails on the site, which is not up)."""
    url = f"redis://:{quote(PASSWORD, safe='')}@127.0.0.1:{auth_redis.port}/0"
    result = crawl(url, "BLOOMDUPE_DONE_GRACE=0.5", "RETRY_ENABLED=False",
                   "SCHEDULER_PERSIST=False")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Bloom filter site:bloomdupe: capacity" in output
    for piece in PIECES:
        assert piece not in output, output


# -- the filter on its own ------------------------------------------------------------------


def _unretrieved(error: BaseException, caplog: pytest.LogCaptureFixture) -> logging.LogRecord:
    """The record asyncio logs for a task whose ``error`` nobody retrieved."""
    async def fail() -> None:
        raise error

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(fail())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        del task

    caplog.set_level(logging.ERROR, logger="asyncio")
    asyncio.run(main())
    gc.collect()
    records = [r for r in caplog.records if r.name in ("asyncio", "scrapy_bloomdupe")]
    assert len(records) == 1, records
    return records[0]


def test_the_filter_shows_a_chained_error_of_ours_as_one_line(
        caplog: pytest.LogCaptureFixture) -> None:
    def chained() -> RuntimeError:
        try:
            raise ConfigError("BLOOMDUPE_CAPACITY", "abc", "must be a whole number")
        except ConfigError:
            try:
                raise RuntimeError("Engine slot not assigned")  # what Scrapy adds
            except RuntimeError as e:
                return e

    record = _unretrieved(chained(), caplog)
    assert record.name == "scrapy_bloomdupe" and record.levelname == "CRITICAL"
    assert record.getMessage() == ("Cannot start the crawl: BLOOMDUPE_CAPACITY='abc': must "
                                   "be a whole number")
    assert record.exc_info is None


def test_the_filter_leaves_other_errors_alone(caplog: pytest.LogCaptureFixture) -> None:
    record = _unretrieved(KeyError("not ours"), caplog)
    assert record.name == "asyncio" and record.exc_info is not None
    assert any(isinstance(f, StartErrorFilter) for f in logging.getLogger("asyncio").filters)
