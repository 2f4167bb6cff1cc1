from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from scrapy_bloomdupe.testing import RedisServer


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
