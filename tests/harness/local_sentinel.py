"""A throwaway local Redis Sentinel set-up: a master, its replicas and three sentinels.

For this package's tests (and users' own): real ``redis-server`` processes on
free loopback ports, the sentinels started with ``redis-server FILE
--sentinel``, never a mock. Needs ``redis-server`` on ``PATH``.

Every server (sentinels too) runs with a ``--maxmemory`` cap, and is stopped by
its own process id, never by name. The data servers keep an append-only file,
so one killed with :meth:`LocalSentinel.kill` comes back with
:meth:`LocalSentinel.restart` holding what it had; the sentinels then make it a
replica of whoever is master by then.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from scrapy_bloomdupe.testing import RedisServer, free_port

__all__ = ["LocalSentinel", "SentinelProcess"]

#: Memory cap of every server started here.
MAXMEMORY = "256mb"


class SentinelProcess(RedisServer):
    """One ``redis-server sentinel.conf --sentinel`` watching ``master_name``."""

    def __init__(self, dir: Path, master_name: str, master_port: int, *, quorum: int,
                 down_after_ms: int, failover_timeout_ms: int) -> None:
        super().__init__(dir=dir, maxmemory=MAXMEMORY)
        self.master_name = master_name
        self._watch = (f"sentinel monitor {master_name} 127.0.0.1 {master_port} {quorum}\n"
                       f"sentinel down-after-milliseconds {master_name} {down_after_ms}\n"
                       f"sentinel failover-timeout {master_name} {failover_timeout_ms}\n"
                       f"sentinel parallel-syncs {master_name} 1\n")
        self._write_conf()

    def _write_conf(self) -> None:
        # Sentinel rewrites its configuration file (what it learns): one of its own,
        # written before its first start only.
        (self.dir / "sentinel.conf").write_text(
            f"port {self.port}\nbind 127.0.0.1\nprotected-mode no\ndir {self.dir}\n"
            + self._watch)

    def repick_ports(self) -> None:
        super().repick_ports()
        self._write_conf()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def args(self) -> list[str]:
        return ["redis-server", str(self.dir / "sentinel.conf"), "--sentinel",
                "--maxmemory", self.maxmemory]

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2, socket_connect_timeout=2,
                           decode_responses=True)


class LocalSentinel:
    """A master with ``replicas`` replicas and ``sentinels`` sentinels on 127.0.0.1.

    ``down_after_ms`` is the sentinels' ``down-after-milliseconds``: how long the
    master must be unreachable before they fail it over. ``master_name`` is the
    name they know it by (``BLOOMDUPE_SENTINEL_MASTER``), :attr:`sentinel_addresses`
    their ``host:port`` (``BLOOMDUPE_SENTINELS``). A context manager.
    """

    def __init__(self, *, replicas: int = 1, sentinels: int = 3,
                 master_name: str = "mymaster", down_after_ms: int = 1000,
                 failover_timeout_ms: int = 10_000) -> None:
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not on PATH (Debian: apt-get install redis-server)")
        self.master_name = master_name
        self.root = Path(tempfile.mkdtemp(prefix="bloomdupe-sentinel-"))
        self.servers: dict[int, RedisServer] = {}
        master = self._server("master", [])
        self.first_master = master.port
        for i in range(replicas):
            self._server(f"replica-{i}", ["--replicaof", "127.0.0.1", str(master.port)])
        self.sentinels: list[SentinelProcess] = []
        for i in range(sentinels):
            path = self.root / f"sentinel-{i}"
            path.mkdir()
            self.sentinels.append(SentinelProcess(
                path, master_name, master.port, quorum=sentinels // 2 + 1,
                down_after_ms=down_after_ms, failover_timeout_ms=failover_timeout_ms))

    def _server(self, name: str, extra: list[str]) -> RedisServer:
        path = self.root / name
        path.mkdir()
        server = RedisServer(persist=True, dir=path, maxmemory=MAXMEMORY, port=free_port(),
                             extra=["--repl-diskless-sync-delay", "0", *extra])
        self.servers[server.port] = server
        return server

    # -- addresses ----------------------------------------------------------------------

    @property
    def sentinel_addresses(self) -> list[str]:
        return [s.address for s in self.sentinels]

    def settings(self, **extra: Any) -> dict[str, Any]:
        """Scrapy settings of a crawl on this set-up."""
        return {"BLOOMDUPE_SENTINELS": self.sentinel_addresses,
                "BLOOMDUPE_SENTINEL_MASTER": self.master_name, **extra}

    def named(self) -> Iterator[int | None]:
        """The master's port as each running sentinel names it (None: it names none, or
        does not answer)."""
        for sentinel in self.sentinels:
            if not sentinel.process or sentinel.process.poll() is not None:
                continue
            client = sentinel.client()
            try:
                address: Any = client.sentinel_get_master_addr_by_name(self.master_name)
                yield int(address[1]) if address else None
            except redis.RedisError:
                yield None
            finally:
                client.close()

    def master_port(self) -> int:
        """The master's port, as the first sentinel that answers says."""
        port = next((port for port in self.named() if port is not None), None)
        if port is None:
            raise RuntimeError("no sentinel names a master")
        return port

    def node(self, port: int) -> RedisServer:
        return self.servers[port]

    def client(self, port: int) -> redis.Redis:
        """A plain client of the data server on ``port``."""
        return redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2)

    def role(self, port: int) -> str | None:
        client = self.client(port)
        try:
            return str(client.info("replication").get("role"))
        except redis.RedisError:
            return None
        finally:
            client.close()

    # -- life -----------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> LocalSentinel:
        try:
            for server in self.servers.values():
                server.start()
            for sentinel in self.sentinels:
                sentinel.start()
            self.wait_ready(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until every sentinel knows the master, its replicas (linked) and the other
        sentinels: a failover can then be agreed on."""
        deadline = time.monotonic() + timeout
        replicas = len(self.servers) - 1
        while True:
            if all(self._knows_all(s, replicas) for s in self.sentinels):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the sentinels did not see each other within {timeout}s; "
                                   f"see {self.root}")
            time.sleep(0.1)

    def _knows_all(self, sentinel: SentinelProcess, replicas: int) -> bool:
        client = sentinel.client()
        try:
            state: Any = client.sentinel_master(self.master_name)
            return (int(state.get("num-other-sentinels", 0)) == len(self.sentinels) - 1
                    and int(state.get("num-slaves", 0)) >= replicas
                    and not state.get("is_sdown") and not state.get("is_odown")
                    and self._replicas_linked(int(state["port"]), replicas))
        except (redis.RedisError, KeyError, ValueError):
            return False
        finally:
            client.close()

    def _replicas_linked(self, master_port: int, replicas: int) -> bool:
        client = self.client(master_port)
        try:
            info = client.info("replication")
        except redis.RedisError:
            return False
        finally:
            client.close()
        online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                  and v.get("state") == "online"]
        return info.get("role") == "master" and len(online) >= replicas

    def failover(self) -> None:
        """``SENTINEL FAILOVER``: a replica is made master, the master a replica."""
        client = self.sentinels[0].client()
        try:
            run: Any = client.execute_command  # redis-py leaves it unannotated
            run("SENTINEL", "FAILOVER", self.master_name)
        finally:
            client.close()

    def kill(self, port: int) -> None:
        """SIGKILL the data server on ``port`` (by its process id), as in a crash."""
        self.servers[port].kill()

    def restart(self, port: int) -> None:
        """Start the killed server on ``port`` again (the sentinels make it a replica)."""
        self.servers[port].start()

    def wait_new_master(self, old_port: int, timeout: float = 30.0) -> tuple[int, float]:
        """The port of the master that replaced ``old_port``, and when (monotonic) the
        sentinels first named it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                port = self.master_port()
            except RuntimeError:
                port = old_port
            if port != old_port and self.role(port) == "master":
                return port, time.monotonic()
            time.sleep(0.02)
        raise RuntimeError(f"no new master replaced 127.0.0.1:{old_port} within {timeout}s")

    def wait_agreed(self, port: int, timeout: float = 30.0) -> float:
        """Until every running sentinel names the server on ``port`` as the master; when
        (monotonic). A sentinel that has not yet heard of a failover still names the
        old master, and sends clients there if it comes back."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if set(self.named()) == {port}:
                return time.monotonic()
            time.sleep(0.02)
        raise RuntimeError(f"the sentinels did not agree on 127.0.0.1:{port} within {timeout}s")

    def close(self) -> None:
        for process in [*self.sentinels, *self.servers.values()]:
            process.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalSentinel:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
