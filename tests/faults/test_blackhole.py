"""A blackholed Redis (the network stops forwarding, nothing is refused): a bounded
stall, one clear error, no request dropped."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import crawler_for
from scrapy import Request
from scrapy.utils.misc import build_from_crawler

from scrapy_bloomdupe.dupefilter import RedisBloomDupeFilter
from scrapy_bloomdupe.testing import RedisServer


class Blackhole:
    """A TCP proxy to Redis that can stop forwarding, as a dead network link does:
    connections stay open, bytes go nowhere, nothing answers."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.forwarding = True
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        self.closed = False
        self._start(self._accept)

    def _start(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.sockets += [client, upstream]
            self._start(self._pipe, client, upstream)
            self._start(self._pipe, upstream, client)

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        while not self.closed:
            try:
                data = source.recv(65536)
            except OSError:
                return
            if not data:
                return
            if self.forwarding:
                try:
                    sink.sendall(data)
                except OSError:
                    return

    def close(self) -> None:
        self.closed = True
        for s in [self.listener, *self.sockets]:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        for thread in self.threads:
            thread.join(5)


@pytest.fixture
def blackhole() -> Iterator[Blackhole]:
    with RedisServer() as server:
        proxy = Blackhole(server.port)
        try:
            yield proxy
        finally:
            proxy.close()


@pytest.mark.parametrize("on_outage", ["allow", "close"])
def test_blackholed_redis_stalls_a_bounded_time_with_one_clear_error(
        blackhole: Blackhole, on_outage: str, caplog: pytest.LogCaptureFixture) -> None:
    crawler = crawler_for(
        f"redis://127.0.0.1:{blackhole.port}/0",
        REDIS_PARAMS={"socket_timeout": 0.5, "socket_connect_timeout": 0.5},
        BLOOMDUPE_OUTAGE_TIMEOUT=2,
        BLOOMDUPE_ON_OUTAGE=on_outage,
    )
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    assert not df.request_seen(Request("http://a.example/before"))
    blackhole.forwarding = False
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="scrapy_bloomdupe"):
        seen = df.request_seen(Request("http://a.example/during"))
    stalled = time.monotonic() - started
    # Not dropped as a duplicate: passed on unchecked.
    assert seen is False
    assert df.unchecked == 1
    # Bounded: redis-py's retries (5, each up to the 0.5 s socket timeout, with
    # backoff), then BLOOMDUPE_OUTAGE_TIMEOUT (2 s, its retries too).
    assert 2 <= stalled < 20, stalled
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors[0].startswith(f"Redis at 127.0.0.1:{blackhole.port} db 0 is unavailable")
    assert "stayed unavailable for 2.0s (BLOOMDUPE_OUTAGE_TIMEOUT)" in errors[1]
    assert len(errors) == 2, errors
