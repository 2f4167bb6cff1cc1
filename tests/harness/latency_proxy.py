"""A TCP proxy that adds a fixed delay to every round trip (no ``tc netem`` needed).

``python tests/harness/latency_proxy.py --target-port 6379 --delay-ms 2`` listens
on a free loopback port, prints ``listening on <port>`` and forwards each
connection to the target. Every chunk read from the client is held until
``delay`` after it arrived, then written to the server, in order; replies go
back at once. A one-way delay on the request path adds ``delay`` to every round
trip, which is all a request/reply protocol like Redis's can feel (pipelining
included: a pipeline is one chunk, delayed once).

Threads, not asyncio: asyncio's epoll timeout is rounded up to whole
milliseconds, too coarse for a 0.5 ms delay; ``time.sleep`` is not. The proxy
runs in its own process (:class:`LatencyProxy` starts it) so its work never
competes with the measured process for the GIL. The added delay is never
exactly ``delay`` (thread hand-offs and timer slack add to it): measure it with
:func:`measure_rtt` and report what was measured.
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType

if __package__ in (None, ""):  # run as a script: make ``harness`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.processes import stop

_CHUNK = 65536


def _pipe_delayed(src: socket.socket, dst: socket.socket, delay: float) -> None:
    """Client to server: hold each chunk ``delay`` seconds after it arrived."""
    pending: queue.SimpleQueue[tuple[float, bytes] | None] = queue.SimpleQueue()

    def writer() -> None:
        try:
            while True:
                item = pending.get()
                if item is None:
                    break
                due, data = item
                left = due - time.monotonic()
                if left > 0:
                    time.sleep(left)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _shutdown(dst)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        while True:
            data = src.recv(_CHUNK)
            if not data:
                break
            pending.put((time.monotonic() + delay, data))
    except OSError:
        pass
    finally:
        pending.put(None)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    """Server to client: no delay."""
    try:
        while True:
            data = src.recv(_CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        _shutdown(dst)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def serve(listener: socket.socket, target: tuple[str, int], delay: float) -> None:
    while True:
        client, _ = listener.accept()
        server = socket.create_connection(target)
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_pipe_delayed, args=(client, server, delay), daemon=True).start()
        threading.Thread(target=_pipe, args=(server, client), daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target-host", default="127.0.0.1")
    parser.add_argument("--target-port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--port", type=int, default=0, help="listen port (0: a free one)")
    args = parser.parse_args(argv)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.port))
    listener.listen(128)
    print(f"listening on {listener.getsockname()[1]}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        serve(listener, (args.target_host, args.target_port), args.delay_ms / 1000)


class LatencyProxy:
    """The proxy in a child process; a context manager. ``.port``, ``.url``."""

    def __init__(self, target_port: int, delay_ms: float) -> None:
        self.target_port = target_port
        self.delay_ms = delay_ms
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> LatencyProxy:
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--target-port",
             str(self.target_port), "--delay-ms", str(self.delay_ms)],
            stdout=subprocess.PIPE,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode()
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"latency proxy did not start: {line!r}")
        self.port = int(line.split()[-1])
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)
            if self.process.stdout is not None:
                self.process.stdout.close()

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def measure_rtt(url: str, pings: int = 200) -> float:
    """Median seconds of one PING round trip through ``url`` (redis-py, one connection)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.ping()
        times = []
        for _ in range(pings):
            started = time.perf_counter()
            client.ping()
            times.append(time.perf_counter() - started)
        return statistics.median(times)
    finally:
        client.close()


def proxy_overhead(target_port: int, base_rtt: float) -> float:
    """Seconds the proxy's own thread hand-offs add to a round trip (measured with no
    delay over ``base_rtt``, the direct one): what to take off the delay asked of it, so
    that the round trip grows by the intended amount."""
    with LatencyProxy(target_port, 0.0) as proxy:
        return max(0.0, measure_rtt(proxy.url) - base_rtt)


if __name__ == "__main__":
    main()
