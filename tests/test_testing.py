"""The test servers themselves: a port another process took between ``free_port`` and
the server's bind (tests run side by side) costs a retry on other ports, not a test;
and a script the tests run stops with what it started when it times out."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from helpers import run_tree

from scrapy_bloomdupe.testing import RedisServer
from scrapy_bloomdupe.testing_cluster import ClusterNodeProcess
from scrapy_bloomdupe.testing_sentinel import SentinelProcess


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


def _alive(pid: int) -> bool:
    """``pid`` runs (a zombie, killed and waiting for its reaper, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
