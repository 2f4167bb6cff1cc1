from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from helpers import cluster_client
from redis.cluster import RedisCluster

from scrapy_bloomdupe.testing import RedisServer
from scrapy_bloomdupe.testing_cluster import LocalCluster

# -- a single Redis -----------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One real redis-server on a free loopback port for the whole session."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The session server's URL, with the database emptied before each test."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.fixture
def durable_redis(redis_url: str) -> Iterator[str]:
    """The session's Redis with an RDB save point, so a crawl with SCHEDULER_PERSIST does
    not (rightly) warn that a restart would forget the filter; restored afterwards."""
    client = redis.Redis.from_url(redis_url)
    before = client.config_get("save")["save"]
    client.config_set("save", "3600 1")
    try:
        yield redis_url
    finally:
        client.config_set("save", before)
        client.close()


# -- a Redis Cluster ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    """3 masters + 3 replicas on free loopback ports (``cluster-node-timeout`` 2000 ms, AOF
    on), for the whole session. Tests that kill a master start a cluster of their own."""
    with LocalCluster(masters=3, replicas=1, node_timeout_ms=2000) as servers:
        yield servers


@pytest.fixture
def cluster_url(local_cluster: LocalCluster) -> str:
    """The session cluster's URL, every master emptied and every script cache flushed."""
    local_cluster.wait_ok()
    local_cluster.flushall()
    return local_cluster.url


@pytest.fixture
def rc(cluster_url: str) -> Iterator[RedisCluster]:
    """A cluster client on the session cluster, built from Scrapy settings."""
    client = cluster_client(cluster_url)
    yield client
    client.close()
