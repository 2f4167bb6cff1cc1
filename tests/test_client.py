"""Building the Redis client from Scrapy settings, single Redis and Redis Cluster.

The cluster cases run on the session's local cluster (3 masters, 3 replicas;
``local_cluster`` in tests/conftest.py), every master emptied before each test.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import redis
from harness.local_cluster import LocalCluster
from helpers import cluster_client, cluster_settings, crawler_for
from redis.backoff import EqualJitterBackoff
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.retry import Retry
from scrapy.settings import Settings
from scrapy.utils.misc import build_from_crawler, load_object

from scrapy_bloomdupe import connection
from scrapy_bloomdupe.addon import BloomDupeAddon
from scrapy_bloomdupe.exceptions import BloomDupeError, ConfigError
from scrapy_bloomdupe.settings import cluster_mode, wait_replicas
from scrapy_bloomdupe.testing import free_port
from scrapy_bloomdupe.transport.client import cluster_params
from scrapy_bloomdupe.transport.cluster import CLUSTER_RETRIES
from scrapy_bloomdupe.transport.diagnose import check, describe, hello, is_cluster
from scrapy_bloomdupe.transport.link import Link
from scrapy_bloomdupe.transport.onloop import AsyncNode


def test_the_cluster_setting_builds_a_cluster_client_with_a_failover_retry(
    cluster_url: str,
) -> None:
    client = cluster_client(cluster_url, REDIS_PARAMS={"socket_timeout": 5})
    try:
        check(client)
        assert is_cluster(client)
        assert client.retry.get_retries() == CLUSTER_RETRIES
        assert len(client.get_primaries()) == 3
        assert describe(client).startswith("Redis Cluster (3 masters: 127.0.0.1:")
        # health_check_interval (a package default) was dropped, socket_timeout kept.
        kwargs = client.get_connection_kwargs()
        assert "health_check_interval" not in kwargs
        assert kwargs["socket_timeout"] == 5
    finally:
        client.close()


def test_redis_cls_in_redis_params_still_makes_a_cluster_client(cluster_url: str) -> None:
    settings = Settings({"REDIS_URL": cluster_url,
                         "REDIS_PARAMS": {"redis_cls": "redis.cluster.RedisCluster"}})
    assert cluster_mode(settings)
    client = connection.from_settings(settings)
    try:
        assert isinstance(client, RedisCluster)
        check(client)
        assert client.retry.get_retries() == CLUSTER_RETRIES
    finally:
        client.close()


def test_a_users_retry_is_kept_and_retry_attempts_are_mapped() -> None:
    mine = Retry(EqualJitterBackoff(), 7)
    assert cluster_params({"retry": mine}, user_retry=True)["retry"] is mine
    mapped = cluster_params({"cluster_error_retry_attempts": 3})
    assert "cluster_error_retry_attempts" not in mapped
    assert mapped["retry"].get_retries() == 3
    dropped = cluster_params({"db": 0, "health_check_interval": 30,
                              "retry_on_timeout": True, "socket_timeout": 2})
    assert dropped == {"socket_timeout": 2, "retry": dropped["retry"]}


@pytest.mark.parametrize(("params", "setting"), [
    ({"db": 2}, "REDIS_DB"),
    ({"unix_socket_path": "/tmp/redis.sock"}, "REDIS_PARAMS"),
    ({"connection_pool": object()}, "REDIS_PARAMS"),
])
def test_what_a_cluster_cannot_take_is_a_config_error(params: dict[str, Any],
                                                       setting: str) -> None:
    with pytest.raises(ConfigError) as info:
        cluster_params(params)
    assert info.value.setting == setting


def test_conflicting_cluster_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"redis_cls must be redis\.cluster\.RedisCluster"):
        cluster_mode(Settings({"BLOOMDUPE_REDIS_CLUSTER": True,
                               "REDIS_PARAMS": {"redis_cls": "redis.Redis"}}))
    with pytest.raises(ConfigError, match="BLOOMDUPE_REDIS_CLUSTER"):
        cluster_mode(Settings({"BLOOMDUPE_REDIS_CLUSTER": False, "REDIS_PARAMS": {
            "redis_cls": "redis.cluster.RedisCluster"}}))
    with pytest.raises(ConfigError, match="must be true or false"):
        cluster_mode(Settings({"BLOOMDUPE_REDIS_CLUSTER": "maybe"}))
    assert cluster_mode(Settings({"BLOOMDUPE_REDIS_CLUSTER": "true"}))
    assert not cluster_mode(Settings({}))
    with pytest.raises(ConfigError, match="BLOOMDUPE_WAIT_REPLICAS"):
        wait_replicas(Settings({"BLOOMDUPE_WAIT_REPLICAS": -1}))


def test_cluster_mode_on_a_single_redis_is_a_config_error(redis_url: str) -> None:
    with pytest.raises(ConfigError) as info:
        connection.from_settings(cluster_settings(redis_url))
    assert info.value.setting == "BLOOMDUPE_REDIS_CLUSTER"
    assert "cluster support disabled" in str(info.value)
    assert info.value.__cause__ is None


def test_cluster_mode_with_the_cluster_down_is_one_clear_error() -> None:
    with pytest.raises(BloomDupeError, match=r"Cannot reach Redis Cluster at 127\.0\.0\.1:"):
        connection.from_settings(cluster_settings(f"redis://127.0.0.1:{free_port()}"))


def test_a_single_node_client_on_a_cluster_node_is_told_to_set_cluster_mode(
    cluster_url: str, local_cluster: LocalCluster,
) -> None:
    plain = connection.from_settings(Settings({"REDIS_URL": cluster_url}))
    try:
        assert isinstance(plain, redis.Redis)
        with pytest.raises(ConfigError, match="Set BLOOMDUPE_REDIS_CLUSTER = True") as info:
            check(plain)
        assert info.value.setting == "BLOOMDUPE_REDIS_CLUSTER"
        # And at run time: a check-and-add round trip that meets MOVED says the same.
        port = int(cluster_url.rsplit(":", 1)[1])
        elsewhere = next(f"{{k{i}}}" for i in range(1000)
                         if key_slot(f"{{k{i}}}".encode()) not in owned_slots(plain, port))
        link = Link(plain, wait_replicas=0)
        with pytest.raises(ConfigError, match="Set BLOOMDUPE_REDIS_CLUSTER = True"):
            link.execute([("GET", elsewhere)])
        link.close()
    finally:
        plain.close()


def test_a_single_redis_is_not_mistaken_for_a_cluster(redis_url: str) -> None:
    for protocol in (2, 3):
        plain = connection.from_settings(Settings({"REDIS_URL": redis_url,
                                                   "REDIS_PARAMS": {"protocol": protocol}}))
        try:
            check(plain)
            assert not is_cluster(plain)
            assert hello(plain)["mode"] == "standalone"
        finally:
            plain.close()


def owned_slots(plain: redis.Redis, port: int) -> set[int]:
    owned: set[int] = set()
    for start, end, master, *_ in plain.execute_command("CLUSTER SLOTS"):
        if int(master[1]) == port:
            owned.update(range(int(start), int(end) + 1))
    return owned


# -- a crawl that cannot start fails (scrapy crawl exits with status 1) ---------------------


@pytest.fixture(autouse=True)
def _no_start_errors_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start errors recorded by another test's crawler are not this one's."""
    monkeypatch.setattr(connection, "_START_ERRORS", [])


@pytest.mark.parametrize(("component", "setting"), [
    ("scrapy_bloomdupe.dupefilter.RedisBloomDupeFilter", "BLOOMDUPE_CAPACITY"),
    ("scrapy_bloomdupe.scheduler.Scheduler", "BLOOMDUPE_LEASE_TIMEOUT"),
    ("scrapy_bloomdupe.middleware.BloomDupeBatchMiddleware", "BLOOMDUPE_BATCH_SIZE"),
    ("scrapy_bloomdupe.extension.BloomDupeStats", "BLOOMDUPE_LOG_INTERVAL"),
    ("scrapy_bloomdupe.workermetrics.WorkerMetrics", "BLOOMDUPE_LIVE_INTERVAL"),
])
@pytest.mark.parametrize("crawling", [True, False])
def test_a_start_error_fails_the_crawl_it_starts(redis_url: str, component: str, setting: str,
                                                 crawling: bool) -> None:
    """Scrapy before 2.19 fails a crawl (exit status 1) only when its crawler has no
    spider: a component's start error drops it, in a crawl only (not a tool's crawler)."""
    crawler = crawler_for(redis_url, **{setting: "abc"})
    crawler.crawling = crawling
    with pytest.raises(ConfigError, match=setting):
        build_from_crawler(load_object(component), crawler)
    assert (crawler.spider is None) is crawling


def test_the_addon_fails_the_crawl_on_a_bad_setting(redis_url: str) -> None:
    crawler = crawler_for(redis_url)
    crawler.crawling = True
    addon = build_from_crawler(BloomDupeAddon, crawler)
    with pytest.raises(ConfigError, match="BLOOMDUPE_SCHEDULER"):
        addon.update_settings(Settings({"BLOOMDUPE_SCHEDULER": "maybe"}))
    assert crawler.spider is None


def test_twisted_s_two_reports_of_a_failed_start_are_one_line(
        caplog: pytest.LogCaptureFixture) -> None:
    """Under a non-asyncio reactor Twisted logs "Unhandled error in Deferred" (Scrapy's
    "Engine slot not assigned", as text), then the chain with ours in it."""
    crawler = crawler_for("redis://127.0.0.1:1/0")
    crawler.crawling = True
    error = ConfigError("BLOOMDUPE_CAPACITY", "abc", "must be a whole number")
    connection.mark_failed(crawler, error)
    twisted = logging.getLogger("twisted")
    with caplog.at_level(logging.DEBUG):
        twisted.critical("Unhandled error in Deferred:")
        twisted.critical("\nTraceback (most recent call last):\n  File \"x\"\nscrapy_bloomdupe."
                         "exceptions.ConfigError: %s\n\nDuring handling of the above exception, "
                         "another exception occurred:\n\nRuntimeError: Engine slot not assigned",
                         error)
        twisted.critical("Unhandled error in Deferred:")  # another, not ours: left alone
    records = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert records == [
        ("scrapy_bloomdupe", "CRITICAL", "Cannot start the crawl: BLOOMDUPE_CAPACITY='abc': "
                                         "must be a whole number"),
        ("twisted", "CRITICAL", "Unhandled error in Deferred:"),
    ]


#: What redis-py 8 logs for each connection that asks a server without the command.
MAINT_LINE = "Failed to enable maintenance notifications"


def maint_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if MAINT_LINE in r.getMessage()]


@pytest.mark.parametrize("where", ["url", "host"])
def test_no_connection_asks_for_maintenance_notifications(
        redis_url: str, where: str, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 49: redis-py 8 (RESP3, maintenance notifications "auto") sent CLIENT
    MAINT_NOTIFICATIONS on every new connection, which Redis 7 refuses: a DEBUG line
    each, 4 a worker. The blocking client and the link's redis.asyncio twin never ask."""
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    settings = {"REDIS_URL": redis_url} if where == "url" else {
        "REDIS_HOST": "127.0.0.1", "REDIS_PORT": port}
    with caplog.at_level(logging.DEBUG, logger="redis"):
        client = connection.from_settings(Settings(settings))
        try:
            assert client.ping()
            node = AsyncNode.of(client.connection_pool)
            assert node is not None

            async def ping() -> list[object]:
                try:
                    return await node.round_trip([("PING",)])
                finally:
                    node.close()  # on the loop, which then waits for the close
                    await asyncio.sleep(0)

            assert asyncio.run(ping()) == [b"PONG"]
        finally:
            client.close()
    assert maint_lines(caplog) == []


def test_no_cluster_connection_asks_for_maintenance_notifications(
        cluster_url: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="redis"):
        client = cluster_client(cluster_url)
        try:
            check(client)
            for primary in client.get_primaries():
                assert client.ping(target_nodes=primary)
        finally:
            client.close()
    assert maint_lines(caplog) == []
