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
