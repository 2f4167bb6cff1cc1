"""A crawl that cannot start says why in one line and exits 1: real ``scrapy crawl``.

``scrapy crawl site`` in ``example_project`` with a setting that cannot work (a
bad value of every setting of the settings table: a few in the fast lane, all
with ``slow``), a refused password, an unreachable Redis and a password that
redis-py would misread: exit status 1, the error's one line (CRITICAL) naming
the setting, no traceback, no "Engine slot not assigned", and no part of the
password anywhere.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from helpers import BAD_PASSWORD, assert_start_error_line, bad_values, example_crawl

from scrapy_bloomdupe import keys, versions
from scrapy_bloomdupe.connection import StartErrorFilter
from scrapy_bloomdupe.exceptions import ConfigError
from scrapy_bloomdupe.frontier import entry
from scrapy_bloomdupe.settingstable import SETTINGS
from scrapy_bloomdupe.testing import RedisServer, free_port

#: A password with every character that ends a URL's host part, in distinctive pieces.
PIECES = ("Alpha7x", "Bravo8y", "Charlie9z", "Delta0w")
PASSWORD = f"{PIECES[0]}#{PIECES[1]}/{PIECES[2]}?{PIECES[3]}"


@pytest.fixture(scope="module")
def auth_redis() -> Iterator[RedisServer]:
    with RedisServer(extra=["--requirepass", PASSWORD]) as server:
        yield server


@pytest.mark.parametrize(("setting", "says"), [
    ("BLOOMDUPE_CAPACITY=abc", "BLOOMDUPE_CAPACITY='abc': must be a whole number"),
    ("BLOOMDUPE_ERROR_RATE=2", "BLOOMDUPE_ERROR_RATE='2': must be in (0, 1)"),
    ("BLOOMDUPE_ON_OUTAGE=retry", "BLOOMDUPE_ON_OUTAGE='retry': must be one of close, allow"),
])
def test_a_bad_setting_is_one_line(redis_url: str, setting: str, says: str) -> None:
    assert_start_error_line(example_crawl(redis_url, setting), says)


def test_a_bad_setting_read_by_the_addon_is_one_line(redis_url: str) -> None:
    result = example_crawl(redis_url, 'ADDONS={"scrapy_bloomdupe.addon.BloomDupeAddon": 100}',
                   "BLOOMDUPE_SCHEDULER=maybe")
    assert_start_error_line(result, "BLOOMDUPE_SCHEDULER='maybe': must be true or false")


ADDON = 'ADDONS={"scrapy_bloomdupe.addon.BloomDupeAddon": 100}'


def test_a_queue_of_a_newer_format_is_one_line(redis_url: str) -> None:
    """A newer release's worker recorded a format of the queue's entries that this
    release cannot read: this worker does not start (and makes no filter there)."""
    client = redis.Redis.from_url(redis_url)
    client.set(keys.queue_format("newer:bloomdupe"), entry.STATE_FORMAT + 1)
    assert_start_error_line(example_crawl(redis_url, "BLOOMDUPE_KEY=newer:bloomdupe"),
                            f"holds state of format {entry.STATE_FORMAT + 1}, written by a "
                            "newer scrapy-bloomdupe; this worker is scrapy-bloomdupe 0.2.0 and "
                            f"reads formats up to {entry.STATE_FORMAT}: upgrade this worker to a "
                            f"release that reads format {entry.STATE_FORMAT + 1}")
    assert client.get(keys.queue_format("newer:bloomdupe")) == str(
        entry.STATE_FORMAT + 1).encode()
    assert not client.exists(keys.meta("newer:bloomdupe"))
    client.close()


def test_a_worker_does_not_join_a_crawl_of_the_other_politeness(redis_url: str) -> None:
    """Requests wait in download slots filled by workers of the other
    BLOOMDUPE_POLITENESS: this one does not start (one crawl, one set of limits)."""
    client = redis.Redis.from_url(redis_url)
    client.set(keys.slot_waiting("mixed:bloomdupe", 0), 3)
    client.hset(keys.slot_defaults("mixed:bloomdupe", 0), "mode", "crawl")
    assert_start_error_line(
        example_crawl(redis_url, "BLOOMDUPE_KEY=mixed:bloomdupe"),
        "The crawl 'mixed:bloomdupe' has 3 request(s) waiting and 0 leased, queued by "
        "workers with BLOOMDUPE_POLITENESS = 'crawl': set BLOOMDUPE_POLITENESS = 'crawl' "
        "on this worker too")
    # And the other way.
    client.hset(keys.slot_defaults("mixed:bloomdupe", 0), "mode", "worker")
    assert_start_error_line(
        example_crawl(redis_url, "BLOOMDUPE_KEY=mixed:bloomdupe", "BLOOMDUPE_POLITENESS=crawl"),
        "queued by workers with BLOOMDUPE_POLITENESS = 'worker'")
    client.close()


def test_a_scrapy_redis_queue_does_not_join_a_crawl_of_this_packages_queue(
        redis_url: str) -> None:
    """Requests wait (or are leased) in this package's queue: a worker with a scrapy-redis
    queue class would never fetch them (the filter has seen them) and would call the crawl
    done with exit code 0; it does not start. Requests in the intake (queued by the
    filter, not yet in a slot) count too."""
    client = redis.Redis.from_url(redis_url)
    client.set(keys.slot_leased("left:bloomdupe", 0), 2)
    client.zadd(keys.queue("left:bloomdupe", 0), {b"an entry": 0})
    assert_start_error_line(
        example_crawl(redis_url, "BLOOMDUPE_KEY=left:bloomdupe",
                      "SCHEDULER_QUEUE_CLASS=scrapy_redis.queue.FifoQueue"),
        "The crawl 'left:bloomdupe' has 1 request(s) waiting and 2 leased in this "
        "package's queue, which SCHEDULER_QUEUE_CLASS = 'scrapy_redis.queue.FifoQueue' "
        "would never fetch (the filter has seen them): remove that setting to go on with "
        "this package's queue, or clear the crawl (`bloomdupe clear`) to start over")
    assert not client.exists(keys.meta("left:bloomdupe"))
    client.close()


def test_crawl_wide_politeness_with_a_scrapy_redis_queue_is_one_line(redis_url: str) -> None:
    assert_start_error_line(
        example_crawl(redis_url, "BLOOMDUPE_POLITENESS=crawl",
                      "SCHEDULER_QUEUE_CLASS=scrapy_redis.queue.FifoQueue"),
        "BLOOMDUPE_POLITENESS = 'crawl' needs this package's default queue, not "
        "SCHEDULER_QUEUE_CLASS = 'scrapy_redis.queue.FifoQueue'")


def _walk() -> list[Any]:
    """A bad value of every setting of the table (``tests/test_settingstable.py`` runs a
    few of them in the fast lane)."""
    return [pytest.param(setting.name, value, id=f"{setting.name}-{i}")
            for setting in SETTINGS.values()
            for i, value in enumerate(bad_values(setting.name, setting.kind))]


@pytest.mark.parametrize(("name", "value"), _walk())
def test_a_bad_value_of_each_setting_is_one_line(redis_url: str, name: str, value: str
                                                 ) -> None:
    output = assert_start_error_line(example_crawl(redis_url, ADDON, f"{name}={value}"), name)
    assert BAD_PASSWORD not in output, output


#: The password in a setting of each kind that holds one (PORT: the Redis's port).
PASSWORD_SETTINGS = {
    "params": (f'REDIS_PARAMS={{"password": "{BAD_PASSWORD}"}}',),
    "params-user": (f'REDIS_PARAMS={{"username": "u", "password": "{BAD_PASSWORD}"}}',),
    "url": (f"BLOOMDUPE_REDIS_URL=redis://:{BAD_PASSWORD}@127.0.0.1:PORT/0",),
}


@pytest.mark.parametrize("case", list(PASSWORD_SETTINGS))
def test_a_password_refused_is_never_shown(auth_redis: RedisServer, case: str) -> None:
    settings = [s.replace("PORT", str(auth_redis.port)) for s in PASSWORD_SETTINGS[case]]
    output = assert_start_error_line(example_crawl(auth_redis.url, ADDON, *settings),
                                     "refused the credentials")
    assert BAD_PASSWORD not in output, output


@pytest.mark.parametrize("case", ["params", "url", "sentinel", "cluster"])
def test_an_unreachable_redis_never_shows_a_password(case: str) -> None:
    port = free_port()
    settings = {
        "sentinel": (f"BLOOMDUPE_SENTINELS=127.0.0.1:{port}", "BLOOMDUPE_SENTINEL_MASTER=m",
                     f"BLOOMDUPE_SENTINEL_PASSWORD={BAD_PASSWORD}",
                     f'BLOOMDUPE_SENTINEL_PARAMS={{"username": "{BAD_PASSWORD}"}}'),
        "cluster": ("BLOOMDUPE_REDIS_CLUSTER=True", *PASSWORD_SETTINGS["params"]),
    }.get(case) or tuple(s.replace("PORT", str(port)) for s in PASSWORD_SETTINGS[case])
    output = assert_start_error_line(example_crawl(f"redis://127.0.0.1:{port}/0", ADDON, *settings),
                             f"127.0.0.1:{port}")
    assert BAD_PASSWORD not in output, output


def test_a_bad_setting_under_a_non_asyncio_reactor_is_one_line(redis_url: str) -> None:
    """Twisted reports the failed start, not asyncio: one CRITICAL line too, exit 1, and
    not Twisted's raw report to stderr ("Unhandled error in Deferred" with Scrapy's
    "Engine slot not assigned"), nor the password."""
    result = example_crawl(redis_url, ADDON,
                           "TWISTED_REACTOR=twisted.internet.epollreactor.EPollReactor",
                           f'REDIS_PARAMS={{"password": "{BAD_PASSWORD}", "socket_timeout": "3s"}}')
    output = assert_start_error_line(
        result, "REDIS_PARAMS: 'socket_timeout' must be a number or None, not str")
    assert BAD_PASSWORD not in output, output
    assert "Unhandled error in Deferred" not in output, output


def test_a_refused_password_is_one_line(auth_redis: RedisServer) -> None:
    output = assert_start_error_line(example_crawl(f"redis://:Wrong-pw-1234@127.0.0.1:{auth_redis.port}/0"),
                             "refused the credentials")
    assert "Wrong-pw-1234" not in output


def test_an_unreachable_redis_is_one_line() -> None:
    port = free_port()
    assert_start_error_line(example_crawl(f"redis://:Secret-pw-1234@127.0.0.1:{port}/0"),
                    f"Cannot reach Redis at 127.0.0.1:{port}")


def test_a_password_redis_py_would_misread_is_refused_without_showing_it(
        auth_redis: RedisServer) -> None:
    url = f"redis://crawler:{PASSWORD}@127.0.0.1:{auth_redis.port}/0"
    output = assert_start_error_line(example_crawl(url), f"REDIS_URL='redis://crawler:***@127.0.0.1:"
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
    result = example_crawl(redis_url, pythonpath=tmp_path)
    floor = next(r for r in versions.runtime_requirements() if r.name == "mmh3").specifier
    assert_start_error_line(result, f"mmh3 3.1.0 installed, needs mmh3{floor}")


def test_the_same_password_percent_encoded_is_used(auth_redis: RedisServer) -> None:
    """Encoded, it gets in: the crawl starts (and then fails on the site, which is not up)."""
    url = f"redis://:{quote(PASSWORD, safe='')}@127.0.0.1:{auth_redis.port}/0"
    result = example_crawl(url, "BLOOMDUPE_DONE_GRACE=0.5", "RETRY_ENABLED=False",
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
