"""A reply lost after Redis ran the check-and-add must not turn a retry into "seen".

Between the client and a real redis-server sits a small TCP proxy. Armed, it
forwards the next command that contains a marker (``EVALSHA``, ``BITFIELD``)
to Redis, swallows Redis's reply, and once Redis has gone quiet resets the
client's connection: the command ran, the client never heard. redis-py's retry
then reconnects (through the proxy, disarmed by then) and sends the command
again.

A plain ``BITFIELD ... SET u1`` check-and-add answers "seen" on that retry (its
first copy set the bits): the URL would never be crawled. The control test
shows that, which also proves the proxy loses the reply only after Redis has
executed the command. The filter's check-and-add logs each item's op id and
must answer the retry "new".
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import helpers
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from scrapy_bloomdupe import sizing
from scrapy_bloomdupe.bloom.filter import BloomFilter

KEY = "lost"
#: How long Redis must stay silent after a swallowed reply before the reset.
QUIET = 0.05


@dataclass(eq=False)
class _Pair:
    client: socket.socket
    server: socket.socket
    swallowing: bool = False
    dropped: int = 0
    last: float = 0.0


class ReplyLosingProxy:
    """127.0.0.1:``port`` -> Redis; :meth:`arm` makes it lose one reply after execution.

    One thread with a selector; :meth:`close` stops it and closes every socket.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        self.port: int = self.listener.getsockname()[1]
        self.accepted = 0
        self.lost_replies = 0
        self.dropped_bytes = 0
        self._marker: bytes | None = None
        self._times = 0
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._stop = threading.Event()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.listener, selectors.EVENT_READ, None)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="reply-losing-proxy", daemon=True)
        self._thread.start()

    def arm(self, marker: bytes, times: int = 1) -> None:
        """Lose the reply to the next ``times`` client writes that contain ``marker``.

        Each on its own connection: with ``times`` 2 the retry's reply is lost too.
        """
        with self._lock:
            self._marker = marker
            self._times = times

    @property
    def armed(self) -> bool:
        with self._lock:
            return self._marker is not None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        assert not self._thread.is_alive(), "proxy thread did not stop"
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for key, _ in self._sel.select(0.005):
                    if key.data is None:
                        self._accept()
                    else:
                        pair, side = key.data
                        if pair in self._pairs:
                            self._pump(pair, side)
                now = time.monotonic()
                for pair in list(self._pairs):
                    if pair.swallowing and pair.dropped and now - pair.last >= QUIET:
                        self._drop(pair, reset=True)
                        self.lost_replies += 1
        except BaseException as e:  # reported by close()
            self._error = e
        finally:
            for pair in list(self._pairs):
                self._drop(pair)
            self._sel.unregister(self.listener)
            self.listener.close()
            self._sel.close()

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except BlockingIOError:
            return
        client.setblocking(True)
        server = socket.create_connection(self.upstream, timeout=5)
        server.settimeout(None)
        pair = _Pair(client, server)
        self._pairs.append(pair)
        self.accepted += 1
        self._sel.register(client, selectors.EVENT_READ, (pair, "client"))
        self._sel.register(server, selectors.EVENT_READ, (pair, "server"))

    def _pump(self, pair: _Pair, side: str) -> None:
        src = pair.client if side == "client" else pair.server
        try:
            data = src.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._drop(pair)
            return
        if side == "client":
            with self._lock:
                if not pair.swallowing and self._marker is not None and self._marker in data:
                    self._times -= 1
                    if self._times == 0:
                        self._marker = None
                    pair.swallowing = True
                    pair.last = time.monotonic()
            pair.server.sendall(data)
        elif pair.swallowing:
            pair.dropped += len(data)
            self.dropped_bytes += len(data)
            pair.last = time.monotonic()
        else:
            pair.client.sendall(data)

    def _drop(self, pair: _Pair, reset: bool = False) -> None:
        self._pairs.remove(pair)
        for s in (pair.client, pair.server):
            self._sel.unregister(s)
        if reset:
            # SO_LINGER 0: close sends RST, as a crashed peer or a dead NAT entry would.
            pair.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        pair.client.close()
        pair.server.close()


# Every test here runs on both engines (``engine_url``: the session's plain Redis, then
# the one with RedisBloom, where ``BLOOMDUPE_ENGINE = "auto"`` picks the native engine).


@pytest.fixture
def proxy(engine_url: str) -> Iterator[ReplyLosingProxy]:
    p = ReplyLosingProxy(urlsplit(engine_url).port or 6379)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def proxied(proxy: ReplyLosingProxy) -> Iterator[redis.Redis]:
    """A client through the proxy, with redis-py's retry: 3 retries, no backoff."""
    c = redis.Redis(host="127.0.0.1", port=proxy.port, retry=Retry(NoBackoff(), 3))
    try:
        yield c
    finally:
        c.close()


#: The URLs whose fingerprints these tests add.
LOST = "https://example.com/lost/"


def open_filter(client: redis.Redis, use_lock: bool) -> BloomFilter:
    return BloomFilter.open(client, KEY, sizing.plan(100_000, 0.001, shards=4), use_lock=use_lock)


def assert_one_reply_lost(proxy: ReplyLosingProxy, accepted_before: int) -> None:
    assert not proxy.armed, "the armed command never went through the proxy"
    assert proxy.lost_replies == 1, f"{proxy.lost_replies} replies lost"
    assert proxy.dropped_bytes > 0, "Redis never answered the swallowed command"
    assert proxy.accepted == accepted_before + 1, (
        f"{proxy.accepted - accepted_before} new connections: expected one reconnect"
    )


# -- control: a blind check-and-add loses the URL ----------------------------


def bitfield_check_and_add(client: redis.Redis, key: str, offsets: list[int]) -> bool:
    """One command: set the bits, "new" when any was 0 (the classic check-and-add)."""
    args: list[Any] = []
    for o in offsets:
        args.extend(("SET", "u1", o, 1))
    old = client.execute_command("BITFIELD", key, *args)
    return not all(old)


def test_control_plain_bitfield_retry_answers_seen(
    proxy: ReplyLosingProxy, proxied: redis.Redis, engine_client: redis.Redis
) -> None:
    offsets = [7, 1_001, 55_555, 123_456]
    # Without a lost reply the proxy is transparent.
    assert bitfield_check_and_add(proxied, "control:a", offsets) is True
    assert bitfield_check_and_add(proxied, "control:a", offsets) is False

    accepted = proxy.accepted
    proxy.arm(b"BITFIELD")
    new = bitfield_check_and_add(proxied, "control:b", offsets)
    assert_one_reply_lost(proxy, accepted)
    # The first copy ran (the bits are set), the retry saw them: a new URL
    # reported as seen. This is the failure the filter's op log prevents.
    assert engine_client.bitcount("control:b") == len(offsets)
    assert new is False, "the proxy did not make the retry see its own first write"


# -- the filter: a retried check-and-add still answers "new" -------------------

MODES = [pytest.param(True, id="lock"), pytest.param(False, id="atomic")]


@pytest.mark.parametrize("use_lock", MODES)
def test_add_survives_lost_reply(
    proxy: ReplyLosingProxy, proxied: redis.Redis, use_lock: bool
) -> None:
    bf = open_filter(proxied, use_lock)
    try:
        assert bf.add(helpers.fp(LOST, 0)) is True  # warm up the held connection
        accepted = proxy.accepted
        proxy.arm(b"EVALSHA")
        x = helpers.fp(LOST, 1)
        new = bf.add(x)
        assert_one_reply_lost(proxy, accepted)
        assert new is True, "a lost reply made the retry answer 'seen' for a new URL"
        assert bf.contains(x)
        assert bf.add(x) is False
        assert bf.add(helpers.fp(LOST, 2)) is True
        c = bf.counters
        assert (c.checked, c.new, c.duplicates) == (4, 3, 1)
        if use_lock:
            assert c.lock.timeouts == 0
            assert c.lock.lost == 0
    finally:
        bf.close()


@pytest.mark.parametrize("use_lock", MODES)
def test_add_many_survives_lost_reply(
    proxy: ReplyLosingProxy, proxied: redis.Redis, use_lock: bool
) -> None:
    bf = open_filter(proxied, use_lock)
    try:
        seen = [helpers.fp(LOST, 100 + i) for i in range(40)]
        fresh = [helpers.fp(LOST, 200 + i) for i in range(40)]
        assert all(bf.add_many(seen))
        # Seen and new items interleaved, over every shard, one of them twice.
        batch = [x for pair in zip(seen, fresh, strict=True) for x in pair] + [fresh[0]]
        expected = [False, True] * 40 + [False]
        assert len({helpers.lock_key_for(bf, x) for x in batch}) == bf.sizing.shards

        accepted = proxy.accepted
        proxy.arm(b"EVALSHA")
        flags = bf.add_many(batch)
        assert_one_reply_lost(proxy, accepted)
        wrong = [i for i, (got, want) in enumerate(zip(flags, expected, strict=True))
                 if got != want]
        assert wrong == [], f"{len(wrong)} of {len(batch)} answers wrong after a lost reply"
        assert all(bf.contains_many(fresh))
        assert not any(bf.add_many(fresh + seen))
    finally:
        bf.close()


@pytest.mark.parametrize("use_lock", MODES)
def test_lost_reply_to_several_calls_on_one_shard(
    proxy: ReplyLosingProxy, proxied: redis.Redis, use_lock: bool
) -> None:
    # More than MAX_ITEMS_PER_SCRIPT items of one shard: several calls to it in
    # one round trip, each of which must be answered from the op log on the retry.
    bf = BloomFilter.open(proxied, KEY, sizing.plan(100_000, 0.001, shards=1),
                          use_lock=use_lock)
    try:
        seen = [helpers.fp(LOST, 1000 + i) for i in range(300)]
        fresh = [helpers.fp(LOST, 2000 + i) for i in range(300)]
        assert all(bf.add_many(seen))
        accepted = proxy.accepted
        proxy.arm(b"EVALSHA")
        flags = bf.add_many(seen + fresh)
        assert_one_reply_lost(proxy, accepted)
        assert flags == [False] * 300 + [True] * 300
    finally:
        bf.close()


@pytest.mark.parametrize("use_lock", MODES)
def test_two_lost_replies_in_a_row(
    proxy: ReplyLosingProxy, proxied: redis.Redis, use_lock: bool
) -> None:
    # The retry's reply is lost too: the third attempt must still answer "new".
    bf = open_filter(proxied, use_lock)
    try:
        assert bf.add(helpers.fp(LOST, 0)) is True
        accepted = proxy.accepted
        proxy.arm(b"EVALSHA", times=2)
        new = bf.add(helpers.fp(LOST, 1))
        assert not proxy.armed
        assert (proxy.lost_replies, proxy.accepted - accepted) == (2, 2)
        assert new is True
        assert bf.add(helpers.fp(LOST, 1)) is False
    finally:
        bf.close()


def test_add_with_token_survives_lost_reply(
    proxy: ReplyLosingProxy, proxied: redis.Redis
) -> None:
    bf = open_filter(proxied, True)
    try:
        x = helpers.fp(LOST, 1)
        lock = helpers.lock_key_for(bf, x)
        token = bf.locks.new_token()
        assert helpers.take_lock(bf.locks, lock, token)
        accepted = proxy.accepted
        proxy.arm(b"EVALSHA")
        result = helpers.add_with_token(bf, x, token)
        assert_one_reply_lost(proxy, accepted)
        written = bf.contains(x)
        assert result is True, (
            f"add_with_token returned {result!r} after a lost reply; item written: {written}; "
            f"an add now answers new={bf.add(x)} (the URL is lost)"
        )
    finally:
        bf.close()


# -- the scheduler's queue: a retried push must not queue a request again -------


@pytest.fixture
def unretried(proxy: ReplyLosingProxy) -> Iterator[redis.Redis]:
    """A client through the proxy without redis-py's retry: a lost reply raises, and
    the retry is the caller's (as the scheduler's outage guard retries a push)."""
    c = redis.Redis(host="127.0.0.1", port=proxy.port, retry=Retry(NoBackoff(), 0))
    try:
        yield c
    finally:
        c.close()


def pushed_popped_pushed_again(queue: Any, other: Any, proxy: ReplyLosingProxy) -> list[str]:
    """Push X with its reply lost; another worker pops X; the push is retried.
    Returns the URLs left in the queue."""
    from scrapy import Request

    x = Request("https://example.com/lost-push-x")
    queue.push(Request("https://example.com/warm-up"))  # connect before arming
    assert other.pop().url == "https://example.com/warm-up"
    proxy.arm(b"lost-push-x")
    with pytest.raises(redis.ConnectionError):
        queue.push(x)
    # The proxy counts the lost reply just after the reset the client saw.
    deadline = time.monotonic() + 5
    while proxy.lost_replies < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not proxy.armed and proxy.lost_replies == 1
    assert other.pop().url == x.url  # the first push ran; X is crawled once
    queue.push(x)  # the retry
    left = []
    while (request := other.pop()) is not None:
        left.append(request.url)
    return left


def test_control_scrapy_redis_push_retry_queues_a_crawled_request_again(
    proxy: ReplyLosingProxy, unretried: redis.Redis, engine_client: redis.Redis
) -> None:
    from scrapy import Spider
    from scrapy_redis.queue import PriorityQueue

    spider = Spider("lost")
    left = pushed_popped_pushed_again(PriorityQueue(unretried, spider, "lost:requests"),
                                      PriorityQueue(engine_client, spider, "lost:requests"), proxy)
    assert left == ["https://example.com/lost-push-x"]  # X would be fetched twice


def test_queue_push_retried_after_a_lost_reply_queues_once(
    proxy: ReplyLosingProxy, unretried: redis.Redis, engine_client: redis.Redis
) -> None:
    from scrapy import Request, Spider

    from scrapy_bloomdupe.frontier.queue import PriorityQueue

    spider = Spider("lost")
    queue = PriorityQueue(unretried, spider, "lost:requests")
    other = PriorityQueue(engine_client, spider, "lost:requests")
    assert pushed_popped_pushed_again(queue, other, proxy) == []
    # A failed push followed by another request (no retry): that one is queued.
    proxy.arm(b"lost-push-y")
    with pytest.raises(redis.ConnectionError):
        queue.push(Request("https://example.com/lost-push-y"))
    queue.push(Request("https://example.com/z"))
    assert sorted(r.url for r in iter(other.pop, None)) == [
        "https://example.com/lost-push-y", "https://example.com/z"]
    # The same request pushed again later (not a retry) is queued again, as before.
    queue.push(Request("https://example.com/z"))
    assert other.pop().url == "https://example.com/z"
    assert engine_client.exists(*queue._push_records)
    queue.close()  # forgets its push records (its pops are leases, acked or given back)
    assert not engine_client.exists(*queue._push_records)


def test_a_retire_whose_reply_is_lost_records_once_and_its_pop_is_reclaimed(
    proxy: ReplyLosingProxy, unretried: redis.Redis, engine_client: redis.Redis
) -> None:
    """A pop met an entry it cannot decode (a callback the spider lost); the retire ran
    but its reply was lost. The entry is recorded once, even retired again by a retry;
    the request popped with it, never handed out, goes back to the queue with the next
    reclaim, said to be a lost pop's (not a failover's)."""
    import pickle

    from scrapy import Request, Spider

    from scrapy_bloomdupe import keys
    from scrapy_bloomdupe.frontier import failed
    from scrapy_bloomdupe.frontier.queue import PriorityQueue, Reclaimed

    spider = Spider("lost")
    queue = PriorityQueue(unretried, spider, "lost:requests")
    gone = pickle.dumps({**Request("https://example.com/lost-callback").to_dict(),
                         "callback": "parse_item"}, protocol=-1)
    queue.push(Request("https://example.com/kept"))
    engine_client.zadd(keys.queue(queue.tag, 0), {gone: -1})
    engine_client.script_load(PriorityQueue.RETIRE_SCRIPT)  # no NOSCRIPT to lose instead
    proxy.arm(b"lost-callback")  # the retire's command names the entry's URL
    with pytest.raises(redis.ConnectionError):
        queue.pop_leases(5)
    deadline = time.monotonic() + 5
    while proxy.lost_replies < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.lost_replies == 1
    # The retire ran: the entry is out of the lease hash, recorded once.
    assert [r.url for r in failed.read(engine_client, queue.tag)] == [
        "https://example.com/lost-callback"]
    assert queue._retire(0, "lease", [(f"{queue.owner}:1.0", -1, gone, ValueError("x"))]) \
        is None  # retried: nothing recorded again
    assert failed.count(engine_client, queue.tag) == 1
    assert queue.reclaim() == Reclaimed(lost_pops=1)
    assert [lease.request.url for lease in queue.pop_leases(5)] == ["https://example.com/kept"]
    queue.close()
