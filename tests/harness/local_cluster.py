"""A throwaway local Redis Cluster: masters and replicas on free loopback ports.

For this package's tests (and users' own): real ``redis-server`` processes in
cluster mode, joined by ``redis-cli --cluster create``, never a mock. Needs
``redis-server`` and ``redis-cli`` (Redis 7+, for ``cluster-port``) on ``PATH``.

Each node has its own temporary directory (``nodes.conf``, the append-only
file), a client port and a cluster-bus port, both chosen free at start. A node
killed with :meth:`LocalCluster.kill` can be brought back with
:meth:`LocalCluster.restart`: it rejoins from its ``nodes.conf`` (as a replica
of whoever took its slots).
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
from redis.crc import key_slot

from scrapy_bloomdupe.testing import RedisServer

__all__ = ["ClusterNodeProcess", "LocalCluster"]


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (all held open while choosing)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
        return ports


def _command(c: redis.Redis, *args: Any) -> Any:
    run: Any = c.execute_command  # redis-py leaves it unannotated
    return run(*args)


def _key_on(c: redis.Redis, port: int) -> str:
    """A key whose slot the master on ``port`` (``c``) serves."""
    ranges = []
    for start, end, master, *_ in _command(c, "CLUSTER", "SLOTS"):
        if int(master[1]) == port:
            ranges.append((int(start), int(end)))
    for i in itertools.count():
        key = f"bloomdupe-warm-{i}"
        if any(start <= key_slot(key.encode()) <= end for start, end in ranges):
            return key
    raise AssertionError("unreachable")


def _cluster_info(c: redis.Redis) -> dict[str, str]:
    raw = _command(c, "CLUSTER", "INFO")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return dict(line.split(":", 1) for line in text.split() if ":" in line)


class ClusterNodeProcess(RedisServer):
    """One ``redis-server --cluster-enabled yes`` of a :class:`LocalCluster`."""

    def __init__(self, port: int, bus_port: int, dir: Path, node_timeout_ms: int,
                 extra: list[str] | None = None) -> None:
        super().__init__(port=port, dir=dir, extra=extra)
        self.bus_port = bus_port
        self.node_timeout_ms = node_timeout_ms
        self._started = False  # its ports may change until it first runs (see start)

    def repick_ports(self) -> None:
        self.port, self.bus_port = _free_ports(2)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def args(self) -> list[str]:
        return [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
            "--protected-mode", "no", "--dir", str(self.dir),
            "--cluster-enabled", "yes", "--cluster-port", str(self.bus_port),
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            # A new replica's first sync starts at once, not after 5 s.
            "--repl-diskless-sync-delay", "0",
            *([] if "--maxmemory" in self.extra else ["--maxmemory", self.maxmemory]),
            *self.extra,
        ]

    def client(self, **kwargs: Any) -> redis.Redis:
        """A plain (non-cluster) client to this one node."""
        kwargs.setdefault("socket_timeout", 5)
        kwargs.setdefault("socket_connect_timeout", 5)
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def info(self, section: str) -> dict[str, Any]:
        c = self.client(socket_timeout=1, socket_connect_timeout=1)
        try:
            return dict(c.info(section))
        finally:
            c.close()


class LocalCluster:
    """``masters`` masters with ``replicas`` replicas each, on 127.0.0.1; a context manager.

    ``node_timeout_ms`` is ``cluster-node-timeout``: how long a master must be
    unreachable before the others fail it over to a replica. Every node runs
    with ``appendonly yes``. ``url`` points at the first node (any node works
    as a cluster client's start node).
    """

    def __init__(self, masters: int = 3, replicas: int = 1, *, node_timeout_ms: int = 2000,
                 extra: list[str] | None = None) -> None:
        for tool in ("redis-server", "redis-cli"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} is not on PATH (Debian: apt-get install redis-server)")
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        self.masters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.root = Path(tempfile.mkdtemp(prefix="bloomdupe-cluster-"))
        count = masters * (1 + replicas)
        ports = _free_ports(2 * count)
        self.nodes: list[ClusterNodeProcess] = []
        for i in range(count):
            node_dir = self.root / f"node{i}"
            node_dir.mkdir()
            self.nodes.append(ClusterNodeProcess(
                ports[2 * i], ports[2 * i + 1], node_dir, node_timeout_ms, list(extra or [])
            ))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    def urls(self) -> list[str]:
        return [f"redis://{n.address}" for n in self.nodes]

    def node(self, port: int) -> ClusterNodeProcess:
        for n in self.nodes:
            if n.port == port:
                return n
        raise KeyError(port)

    # -- life cycle ---------------------------------------------------------

    def start(self, timeout: float = 30.0) -> LocalCluster:
        try:
            for n in self.nodes:
                n.start()
            command = ["redis-cli", "--cluster", "create", *(n.address for n in self.nodes),
                       "--cluster-replicas", str(self.replicas), "--cluster-yes"]
            done = subprocess.run(command, capture_output=True, timeout=timeout, check=False)
            if done.returncode != 0:
                raise RuntimeError(
                    f"redis-cli --cluster create failed ({done.returncode}): "
                    f"{done.stdout.decode(errors='replace')[-2000:]}"
                    f"{done.stderr.decode(errors='replace')[-2000:]}"
                )
            self.wait_ok(timeout)
            if self.replicas:
                self.wait_replicated(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def wait_replicated(self, timeout: float = 30.0) -> None:
        """Until each master's replicas answer a write's ``WAIT`` within 100 ms. Online is
        not enough: measured, a fresh replica answered a master's first ``WAIT`` s late
        (0.3-0.6 s, or not within 500 ms), which a test of ``WAIT`` takes for a
        missing replica, and a crawl (``WAIT 1`` by default on a cluster with
        replicas) logs as one."""
        deadline = time.monotonic() + timeout
        for port in self.master_ports():
            c = self.node(port).client(socket_timeout=2, socket_connect_timeout=2)
            try:
                key = _key_on(c, port)
                while True:
                    c.set(key, 1)
                    if int(_command(c, "WAIT", self.replicas, 100)) >= self.replicas:
                        c.delete(key)
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the replicas of 127.0.0.1:{port} did not answer "
                                           f"WAIT within {timeout}s")
            finally:
                c.close()

    def _live(self) -> Iterator[ClusterNodeProcess]:
        return (n for n in self.nodes if n.alive)

    def state(self) -> dict[int, str]:
        """``cluster_state`` of every live node, by port ('down' when it does not answer)."""
        out = {}
        for n in self._live():
            c = n.client(socket_timeout=1, socket_connect_timeout=1)
            try:
                out[n.port] = _cluster_info(c).get("cluster_state", "?")
            except redis.RedisError:
                out[n.port] = "down"
            finally:
                c.close()
        return out

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node says ``cluster_state:ok``, agrees on who the masters
        are, covers all slots, and every live replica's link to its master is up."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            try:
                last = self._settled()
                if last is True:
                    return
            except redis.RedisError as e:
                last = e
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster did not settle in {timeout}s: {last}")
            time.sleep(0.05)

    def _settled(self) -> bool | str:
        views = set()
        live = list(self._live())
        for n in live:
            c = n.client(socket_timeout=1, socket_connect_timeout=1)
            try:
                fields = _cluster_info(c)
                if fields.get("cluster_state") != "ok":
                    return f"{n.address} cluster_state {fields.get('cluster_state')}"
                if fields.get("cluster_slots_ok") != "16384":
                    return f"{n.address} slots ok {fields.get('cluster_slots_ok')}"
                if int(fields.get("cluster_known_nodes", 0)) != len(self.nodes):
                    return f"{n.address} knows {fields.get('cluster_known_nodes')} nodes"
                views.add(tuple(sorted(self._masters_seen_by(c))))
                replication = c.info("replication")
                if (replication.get("role") == "slave"
                        and replication.get("master_link_status") != "up"):
                    return f"{n.address} replica link {replication.get('master_link_status')}"
                if replication.get("role") == "master" and len(live) == len(self.nodes):
                    # Every replica online (its full sync done), so that the first WAIT
                    # is answered by it rather than timing out (a fresh cluster's).
                    online = [v for k, v in replication.items() if k.startswith("slave")
                              and isinstance(v, dict) and v.get("state") == "online"]
                    if len(online) < self.replicas:
                        return f"{n.address} has {len(online)} replica(s) online"
            finally:
                c.close()
        if len(views) != 1:
            return f"nodes disagree on the masters: {views}"
        (masters,) = views
        if len(masters) != self.masters:
            return f"{len(masters)} masters with slots, want {self.masters}"
        return True

    @staticmethod
    def _masters_seen_by(c: redis.Redis) -> list[str]:
        raw = _command(c, "CLUSTER", "NODES")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        masters = []
        for line in text.splitlines():
            parts = line.split()
            if len(parts) < 8:
                continue
            flags = parts[2].split(",")
            if "master" in flags and "fail" not in flags and len(parts) > 8:
                masters.append(parts[1].split("@")[0])
        return masters

    def master_ports(self) -> list[int]:
        """Ports of the live masters that hold slots, as the cluster sees them now."""
        for n in self._live():
            c = n.client(socket_timeout=1, socket_connect_timeout=1)
            try:
                return sorted(int(a.rsplit(":", 1)[1]) for a in self._masters_seen_by(c))
            except redis.RedisError:
                continue
            finally:
                c.close()
        raise RuntimeError("no cluster node answers")

    def replica_ports(self, master_port: int) -> list[int]:
        """Ports of the live replicas of the master on ``master_port``."""
        out = []
        for n in self._live():
            replication = n.info("replication")
            if (replication.get("role") == "slave"
                    and int(replication.get("master_port", 0)) == master_port):
                out.append(n.port)
        return out

    def flushall(self) -> None:
        """Empty every master (replicas follow) and drop every node's script cache."""
        for port in self.master_ports():
            c = self.node(port).client()
            try:
                c.flushall()
            finally:
                c.close()
        for n in self._live():
            c = n.client()
            try:
                c.script_flush()
            finally:
                c.close()

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port``."""
        self.node(port).kill()

    def restart(self, port: int, timeout: float = 30.0) -> None:
        """Start a killed node again and wait until the cluster has settled with it."""
        self.node(port).start()
        self.wait_ok(timeout)

    def close(self) -> None:
        for n in self.nodes:
            n.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
