"""The test servers themselves: a port another process took between ``free_port`` and
the server's bind (tests run side by side) costs a retry on other ports, not a test;
and a script the tests run stops with what it started when it times out."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from harness import zygote
from harness.local_cluster import ClusterNodeProcess
from harness.local_sentinel import SentinelProcess
from helpers import run_tree

from scrapy_bloomdupe.testing import RedisServer


def taken() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_a_server_whose_port_was_taken_first_starts_on_another() -> None:
    with taken() as holder:
        server = RedisServer()
        server.port = holder.getsockname()[1]  # as if taken after free_port chose it
        with server:
            assert server.port != holder.getsockname()[1]
            assert redis.Redis.from_url(server.url).ping()
            server.restart()  # a restart keeps its port
            assert redis.Redis.from_url(server.url).ping()


def test_a_cluster_node_whose_ports_were_taken_first_starts_on_others(tmp_path: Path) -> None:
    with taken() as holder:
        node = ClusterNodeProcess(holder.getsockname()[1], 0, tmp_path, 2000)
        node.repick_ports()
        bus = node.bus_port
        node.port = holder.getsockname()[1]
        starts_elsewhere(node, holder.getsockname()[1])
        assert node.bus_port != bus or node.port != holder.getsockname()[1]


def test_a_sentinel_whose_port_was_taken_first_starts_on_another(tmp_path: Path) -> None:
    with taken() as holder, RedisServer() as master:
        sentinel = SentinelProcess(tmp_path, "m", master.port, quorum=1, down_after_ms=1000,
                                   failover_timeout_ms=10_000)
        sentinel.port = holder.getsockname()[1]
        sentinel._write_conf()  # as if its port was taken after it was chosen
        starts_elsewhere(sentinel, holder.getsockname()[1])


def starts_elsewhere(process: ClusterNodeProcess | SentinelProcess, taken_port: int) -> None:
    """``process``, told to use ``taken_port``, starts and answers on another port."""
    try:
        process.start()
        assert process.port != taken_port
        assert process.client().ping()
    finally:
        process.close()


def test_a_script_run_as_a_tree_that_times_out_leaves_no_process_behind() -> None:
    """``helpers.run_tree``: a script that times out is stopped with what it started (a
    benchmark's redis-server was left running when only the script was killed)."""
    script = ("import subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              "print(child.pid, flush=True)\n"
              "time.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        run_tree([sys.executable, "-c", script], timeout=2)
    child = int(str(raised.value.output).split()[0])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)


#: A user's own test module, as docs/development.md ("Redis for your own tests") shows
#: it: a fixture of ``scrapy_bloomdupe.testing.RedisServer`` and a dupefilter on it.
USERS_TEST = '''
import pytest
import redis
from scrapy import Request, Spider
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter
from scrapy_bloomdupe.testing import RedisServer


@pytest.fixture
def redis_url():
    with RedisServer(maxmemory="64mb") as server:
        with open("pid", "w") as f:
            f.write(str(server.process.pid))
        yield server.url


def test_my_crawl_filters_a_repeat(redis_url):
    assert redis.Redis.from_url(redis_url).config_get("maxmemory") == {"maxmemory": "67108864"}
    crawler = get_crawler(Spider, {"REDIS_URL": redis_url, "BLOOMDUPE_CAPACITY": 1000})
    crawler.spider = crawler._create_spider("mine")
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    assert not df.request_seen(Request("https://example.com/a"))
    assert df.request_seen(Request("https://example.com/a#top"))
    df.close("finished")
'''


def test_a_users_own_test_runs_on_a_throwaway_redis_server(tmp_path: Path) -> None:
    """The public test helper (docs/api.md, "Test helpers"), used as a user's test suite
    uses it: pytest in a directory of the user's, outside this repository's conftest and
    harness; the server it started is capped and gone once the test is over."""
    (tmp_path / "test_mine.py").write_text(USERS_TEST)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = run_tree([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                     "test_mine.py"], cwd=tmp_path, env=env, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
    assert not _alive(int((tmp_path / "pid").read_text()))


def _alive(pid: int) -> bool:
    """``pid`` runs (a zombie, killed and waiting for its reaper, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


#: A "spider" file whose import says what its process looks like and exits 3.
PROBE = '''
import json, os, signal, sys
print(json.dumps({"argv0": os.path.basename(sys.argv[0]), "argv": sys.argv[1:],
                  "path": sys.path[:3], "cwd": os.getcwd(),
                  "env": os.environ.get("PROBE"), "stdin": sys.stdin.read(),
                  "main": sys.modules["__main__"].__spec__.name,
                  "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
                  "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL}))
print("to stderr", file=sys.stderr)
if os.environ.get("PROBE") == "sleep":
    import time
    time.sleep(60)
raise SystemExit(3)
'''


def test_a_forked_scrapy_process_is_what_an_execd_one_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/harness/zygote.py: a ``python -m scrapy`` forked from the zygote sees the
    same argv, sys.path, working directory, environment, stdin, signal handlers and
    main module as one exec'd, and exits with the same status; a SIGKILL shows as
    ``-9``, as with ``subprocess``."""
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "extra").mkdir()
    args = [sys.executable, "-m", "scrapy", "runspider", "probe.py", "-s", "LOG_ENABLED=0"]
    env = {**os.environ, "PROBE": "here", "PYTHONPATH": str(tmp_path / "extra")}
    results = []
    for fork in (True, False):
        monkeypatch.setattr(zygote, "FORK", fork)
        assert zygote.forkable(args, env) is fork
        results.append(zygote.run(args, cwd=tmp_path, env=env, input="in", timeout=180))
    forked, execd = results
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        execd.returncode, execd.stdout, execd.stderr)
    assert forked.returncode == 3 and forked.stderr == "to stderr\n"
    assert json.loads(forked.stdout) == {
        # (runspider puts the spider's folder first, and leaves its own arguments)
        "argv0": "__main__.py", "argv": ["probe.py", "-s", "LOG_ENABLED=0"],
        "path": [str(tmp_path), str(tmp_path), str(tmp_path / "extra")], "cwd": str(tmp_path),
        "env": "here", "stdin": "in", "main": "scrapy.__main__", "sigint": True,
        "sigterm": True}
    monkeypatch.setattr(zygote, "FORK", True)
    with (tmp_path / "out").open("wb") as out:
        child = zygote.popen(args, cwd=tmp_path, env={**env, "PROBE": "sleep"},
                             stdout=out, stderr=subprocess.STDOUT)
        assert isinstance(child, zygote.Forked)
        deadline = time.monotonic() + 120
        while b"to stderr" not in (tmp_path / "out").read_bytes():
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.05)
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(0.1)
        child.kill()
        assert child.wait(10) == -9


def test_a_command_the_zygote_cannot_take_is_execd(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``sitecustomize`` on the command's PYTHONPATH, an interpreter setting of its
    own, or a command other than ``python -m scrapy``: ``subprocess`` runs it."""
    monkeypatch.setattr(zygote, "FORK", True)
    (tmp_path / "sitecustomize.py").write_text("")
    scrapy = [sys.executable, "-m", "scrapy", "version"]
    assert zygote.forkable(scrapy, dict(os.environ))
    assert not zygote.forkable(scrapy, {**os.environ, "PYTHONPATH": str(tmp_path)})
    assert not zygote.forkable(scrapy, {**os.environ, "PYTHONWARNINGS": "error"})
    assert not zygote.forkable([sys.executable, "-m", "scrapy_bloomdupe.cli"], dict(os.environ))
