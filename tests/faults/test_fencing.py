"""Fencing and bounded waits of the shard locks.

A lock holder that pauses past its TTL (GC, swap, SIGSTOP) must be rejected by
the write itself, not trusted: the check-and-add script checks the token. And
waiting for a busy lock must stay short, bounded and counted, because it runs
on Scrapy's reactor thread.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import helpers
import pytest
import redis

from scrapy_bloomdupe import sizing
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.bloom.lock import FIRST_PAUSE, MAX_PAUSE, ShardLocks
from scrapy_bloomdupe.transport.link import Link

KEY = "fence"
TTL = 0.3
STEP_TIMEOUT = 30.0


def plan() -> sizing.Sizing:
    return sizing.plan(10_000, 0.001, shards=4)


#: The URLs whose fingerprints these tests add.
FENCE = "https://example.com/fence/"


# Every test here runs on both engines (``engine_url``: the session's plain Redis, then
# the one with RedisBloom, where ``BLOOMDUPE_ENGINE = "auto"`` picks the native engine).


def counters_of(bf: BloomFilter) -> dict[str, Any]:
    c = bf.counters
    return {
        "checked": c.checked,
        "new": c.new,
        "duplicates": c.duplicates,
        "acquired": c.lock.acquired,
        "waits": c.lock.waits,
        "timeouts": c.lock.timeouts,
        "lost": c.lock.lost,
    }


def bits_set(client: redis.Redis, bf: BloomFilter) -> int:
    if bf.engine_name != "lua":  # RedisBloom counts items, not bits
        return bf.info().set_bits
    return sum(int(client.bitcount(bf.shard_key(i))) for i in range(bf.sizing.shards))


def op_logs(client: redis.Redis, client_id: str) -> list[bytes]:
    return sorted(client.scan_iter(match=f"*:ops:{client_id}", count=1000))


def logged_replies(client: redis.Redis, client_id: str) -> list[bytes]:
    """The replies a client's calls recorded (one per call that ran), all shards."""
    return sorted(reply for key in op_logs(client, client_id)
                  for reply in helpers.parse_op_log(client.get(key))[1].values())


# -- a paused holder, with real processes -------------------------------------


def holder(url: str, fingerprint: bytes, conn: Any) -> None:
    """Process H: take X's shard lock, then (after the parent's SIGSTOP) write with it."""
    client = redis.Redis.from_url(url)
    try:
        bf = BloomFilter.open(client, KEY, plan(), use_lock=True, lock_ttl=TTL)
        try:
            token = bf.locks.new_token()
            lock = helpers.lock_key_for(bf, fingerprint)
            got = helpers.take_lock(bf.locks, lock, token)
            conn.send(("locked", lock, got, token, bf.client_id))
            # The parent stops this process with SIGSTOP right now, sends "go" (it
            # waits in the pipe), lets the lock expire and another worker take it
            # and add X, then sends SIGCONT. From this process's point of view
            # nothing happened between acquire() and the write below.
            if conn.recv() != "go":
                return
            fenced = helpers.add_with_token(bf, fingerprint, token)
            retried = bf.add(fingerprint)
            conn.send(("done", fenced, retried, counters_of(bf)))
        finally:
            bf.close()
    finally:
        client.close()
        conn.close()


def worker(url: str, fingerprint: bytes, conn: Any) -> None:
    """Process W: an ordinary add of X in lock mode."""
    client = redis.Redis.from_url(url)
    try:
        bf = BloomFilter.open(client, KEY, plan(), use_lock=True, lock_ttl=TTL)
        try:
            new = bf.add(fingerprint)
            conn.send(("added", new, counters_of(bf), bf.client_id))
        finally:
            bf.close()
    finally:
        client.close()
        conn.close()


def process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        # pid (comm) state ...: comm may hold spaces, so split after the last ')'.
        return f.read().rsplit(")", 1)[1].split()[0]


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)


def receive(conn: Any, what: str) -> Any:
    if not conn.poll(STEP_TIMEOUT):
        raise AssertionError(f"no {what!r} message within {STEP_TIMEOUT}s")
    return conn.recv()


class Processes:
    """Spawned processes and pipes; every process started is reaped by :meth:`reap`."""

    def __init__(self) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        self.started: list[Any] = []

    def pipe(self) -> tuple[Any, Any]:
        return self.ctx.Pipe()

    def start(self, target: Callable[..., None], *args: Any) -> Any:
        p = self.ctx.Process(target=target, args=args)
        p.start()
        self.started.append(p)
        return p

    def reap(self) -> None:
        for p in self.started:
            if p.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)
                p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
            p.close()


@pytest.fixture
def spawn() -> Iterator[Processes]:
    procs = Processes()
    try:
        yield procs
    finally:
        procs.reap()


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc to see a stopped process")
def test_holder_stopped_past_ttl_is_rejected(spawn: Processes, engine_url: str) -> None:
    x = helpers.fp(FENCE, 1)
    client = redis.Redis.from_url(engine_url)
    h_parent, h_child = spawn.pipe()
    w_parent, w_child = spawn.pipe()
    try:
        h = spawn.start(holder, engine_url, x, h_child)
        h_child.close()
        tag, lock, got, token, h_id = receive(h_parent, "locked")
        assert (tag, got) == ("locked", True)
        assert client.get(lock) == token

        os.kill(h.pid, signal.SIGSTOP)
        wait_for(lambda: process_state(h.pid) == "T", 10, "H to stop")
        h_parent.send("go")  # sits in the pipe until H runs again
        stopped_at = time.monotonic()
        wait_for(lambda: not client.exists(lock), 10, "H's lock to expire")
        assert time.monotonic() - stopped_at < TTL + 2

        w = spawn.start(worker, engine_url, x, w_child)
        w_child.close()
        tag, w_new, w_counts, w_id = receive(w_parent, "added")
        w.join(STEP_TIMEOUT)
        assert w.exitcode == 0
        assert process_state(h.pid) == "T", "H ran before SIGCONT"
        paused_for = time.monotonic() - stopped_at
        assert paused_for > TTL

        os.kill(h.pid, signal.SIGCONT)
        tag, fenced, retried, h_counts = receive(h_parent, "done")
        h.join(STEP_TIMEOUT)
        assert h.exitcode == 0

        figures = f"paused {paused_for:.3f}s with TTL {TTL}s; W {w_counts}; H {h_counts}"
        # W took the expired lock without waiting and added X.
        assert w_new is True, figures
        assert (w_counts["acquired"], w_counts["waits"], w_counts["lost"]) == (1, 0, 0), figures
        # H's fenced write with its stale token was rejected, and wrote nothing:
        # the only call of H's on record is its retry's, which found X seen;
        # W's call is on record as new.
        assert fenced is None, figures
        assert h_counts["lost"] == 1, figures
        assert logged_replies(client, h_id) == [b"0"], figures
        assert logged_replies(client, w_id) == [b"1"], figures
        # H's proper retry is told X was seen.
        assert retried is False, figures
        accepted = [w_new, fenced, retried].count(True)
        assert accepted == 1, f"X accepted {accepted} times; {figures}"
        assert not client.exists(lock), "the lock outlived the last write"
    finally:
        h_parent.close()
        w_parent.close()
        client.close()


# -- fencing, in one process --------------------------------------------------


def test_stale_token_writes_nothing(engine_client: redis.Redis) -> None:
    bf = BloomFilter.open(engine_client, KEY, plan(), use_lock=True, lock_ttl=0.05)
    try:
        x = helpers.fp(FENCE, 2)
        lock = helpers.lock_key_for(bf, x)
        token = bf.locks.new_token()
        assert helpers.take_lock(bf.locks, lock, token)
        wait_for(lambda: not engine_client.exists(lock), 5, "the lock to expire")

        assert helpers.add_with_token(bf, x, token) is None
        assert bits_set(engine_client, bf) == 0
        assert op_logs(engine_client, bf.client_id) == []
        assert not bf.contains(x)
        assert counters_of(bf) == {
            "checked": 0, "new": 0, "duplicates": 0, "acquired": 1, "waits": 0,
            "timeouts": 0, "lost": 1,
        }
        # The item was not lost: an ordinary add still finds it new.
        assert bf.add(x) is True
        assert bf.add(x) is False
    finally:
        bf.close()


def test_stale_holder_cannot_write_or_free_the_new_holders_lock(engine_url: str) -> None:
    c1 = redis.Redis.from_url(engine_url)
    c2 = redis.Redis.from_url(engine_url)
    stale = BloomFilter.open(c1, KEY, plan(), use_lock=True, lock_ttl=0.05)
    fresh = BloomFilter.open(c2, KEY, plan(), use_lock=True, lock_ttl=30)
    try:
        x = helpers.fp(FENCE, 3)
        lock = helpers.lock_key_for(stale, x)
        assert helpers.lock_key_for(fresh, x) == lock
        old, new = stale.locks.new_token(), fresh.locks.new_token()
        assert old != new
        assert helpers.take_lock(stale.locks, lock, old)
        wait_for(lambda: not c1.exists(lock), 5, "the stale lock to expire")
        assert helpers.take_lock(fresh.locks, lock, new)
        assert not helpers.take_lock(stale.locks, lock, old), "SET NX took a held lock"

        assert helpers.add_with_token(stale, x, old) is None
        assert c1.get(lock) == new, "the rejected write touched the new holder's lock"
        assert c1.pttl(lock) > 1000
        assert bits_set(c1, stale) == 0
        assert not stale.locks.release(lock, old), "released someone else's lock"
        assert c1.get(lock) == new

        assert helpers.add_with_token(fresh, x, new) is True
        assert not c1.exists(lock), "the fenced write did not release its lock"
        assert stale.add(x) is False
        assert fresh.add(x) is False
    finally:
        stale.close()
        fresh.close()
        c1.close()
        c2.close()


def test_release_only_own_token(engine_client: redis.Redis) -> None:
    locks = ShardLocks(Link(engine_client), 10.0, 0.1)
    assert helpers.take_lock(locks, "some:lock", b"mine")
    assert not locks.release("some:lock", b"theirs")
    assert engine_client.get("some:lock") == b"mine"
    assert locks.release("some:lock", b"mine")
    assert not engine_client.exists("some:lock")
    assert not locks.release("some:lock", b"mine")


# -- bounded waits, fake clock ------------------------------------------------


class FakeTime:
    """A clock that only moves when slept on; ``drag`` makes each sleep last longer."""

    def __init__(self, drag: float = 1.0) -> None:
        self.now = 1_000.0
        self.drag = drag
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds * self.drag


def test_pauses_double_up_to_the_cap_and_stop_at_the_budget(engine_client: redis.Redis) -> None:
    t = FakeTime()
    locks = ShardLocks(Link(engine_client), 1.0, 0.2, clock=t.clock, sleep=t.sleep)
    start = t.now
    steps = list(locks.pauses())
    expected = [0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, *[0.02] * 8, 0.0085]
    assert (FIRST_PAUSE, MAX_PAUSE) == (0.0005, 0.02)
    assert steps == pytest.approx(expected)
    assert t.slept == steps
    assert t.now - start == pytest.approx(0.2)
    c = locks.counters
    assert (c.waits, c.timeouts, c.acquired, c.lost) == (len(expected), 1, 0, 0)
    assert c.wait_time == pytest.approx(0.2)


def test_pauses_stay_bounded_when_sleeps_overrun(engine_client: redis.Redis) -> None:
    # Each sleep takes three times as long as asked (a loaded machine): the wait
    # still ends at the first check past the budget, one pause late at most.
    t = FakeTime(drag=3.0)
    locks = ShardLocks(Link(engine_client), 1.0, 0.2, clock=t.clock, sleep=t.sleep)
    start = t.now
    steps = list(locks.pauses())
    waited = t.now - start
    assert 0.2 <= waited <= 0.2 + 3 * MAX_PAUSE
    assert all(s <= MAX_PAUSE for s in steps)
    assert locks.counters.timeouts == 1
    assert locks.counters.waits == len(steps)
    assert locks.counters.wait_time == pytest.approx(waited)


def test_no_budget_means_no_wait(engine_client: redis.Redis) -> None:
    t = FakeTime()
    locks = ShardLocks(Link(engine_client), 1.0, 0.0, clock=t.clock, sleep=t.sleep)
    assert list(locks.pauses()) == []
    assert t.slept == []
    assert (locks.counters.waits, locks.counters.timeouts) == (0, 1)


def test_pauses_counted_only_when_taken(engine_client: redis.Redis) -> None:
    t = FakeTime()
    locks = ShardLocks(Link(engine_client), 1.0, 0.2, clock=t.clock, sleep=t.sleep)
    pauses = locks.pauses()
    assert next(pauses) == pytest.approx(FIRST_PAUSE)
    assert next(pauses) == pytest.approx(2 * FIRST_PAUSE)
    pauses.close()  # the lock came free: no timeout
    c = locks.counters
    assert (c.waits, c.timeouts) == (2, 0)
    assert c.wait_time == pytest.approx(3 * FIRST_PAUSE)


# -- bounded waits against a real busy lock -----------------------------------

WAIT = 0.2
#: Scheduling slack on a loaded two-core machine; the wait itself is WAIT.
SLACK = 0.5


def hold(client: redis.Redis, lock: str, ttl_ms: int) -> None:
    assert client.set(lock, b"someone-else", nx=True, px=ttl_ms)


@contextlib.contextmanager
def waiting_filter(engine_url: str, lock_wait: float
                   ) -> Iterator[tuple[BloomFilter, redis.Redis]]:
    """A filter in lock mode (1 s locks) that waits up to ``lock_wait`` for a busy one,
    and another client of the same Redis, to hold its locks."""
    c = redis.Redis.from_url(engine_url)
    other = redis.Redis.from_url(engine_url)
    bf = BloomFilter.open(c, KEY, plan(), use_lock=True, lock_ttl=1.0, lock_wait=lock_wait)
    try:
        yield bf, other
    finally:
        bf.close()
        c.close()
        other.close()


def test_add_waits_at_most_lock_wait_then_checks_atomically(engine_url: str) -> None:
    with waiting_filter(engine_url, WAIT) as (bf, other):
        x = helpers.fp(FENCE, 4)
        lock = helpers.lock_key_for(bf, x)
        hold(other, lock, 60_000)

        started = time.monotonic()
        first = bf.add(x)
        took = time.monotonic() - started
        counts = counters_of(bf)
        figures = f"add took {took:.3f}s with lock_wait {WAIT}s; {counts}"
        assert WAIT <= took < WAIT + SLACK, figures
        assert first is True, figures
        assert counts["timeouts"] == 1, figures
        assert counts["waits"] >= 1, figures
        assert bf.counters.lock.wait_time <= took, figures
        assert (counts["acquired"], counts["lost"]) == (0, 0), figures
        # The fallback did not steal or free the other holder's lock...
        assert other.get(lock) == b"someone-else"
        assert other.pttl(lock) > 50_000
        # ...and it really added the item.
        assert bf.contains(x)

        started = time.monotonic()
        second = bf.add(x)
        took = time.monotonic() - started
        assert second is False
        assert WAIT <= took < WAIT + SLACK, f"second add took {took:.3f}s"
        assert bf.counters.lock.timeouts == 2


def test_add_many_waits_only_for_the_busy_shard(engine_url: str) -> None:
    with waiting_filter(engine_url, WAIT) as (bf, other):
        items = [helpers.fp(FENCE, 100 + i) for i in range(60)]
        shards = {helpers.lock_key_for(bf, f) for f in items}
        assert len(shards) == bf.sizing.shards
        busy = helpers.lock_key_for(bf, items[0])
        hold(other, busy, 60_000)

        started = time.monotonic()
        flags = bf.add_many(items)
        took = time.monotonic() - started
        counts = counters_of(bf)
        figures = f"add_many took {took:.3f}s; {counts}"
        assert flags == [True] * len(items), figures
        assert WAIT <= took < WAIT + SLACK, figures
        assert counts["timeouts"] == 1, figures
        # Every free shard's lock was taken once; the busy one never.
        assert counts["acquired"] == bf.sizing.shards - 1, figures
        assert other.get(busy) == b"someone-else"
        assert all(bf.contains_many(items))
        assert not any(bf.add_many(items))


def test_add_takes_the_lock_once_it_expires(engine_url: str) -> None:
    with waiting_filter(engine_url, 2.0) as (bf, other):
        x = helpers.fp(FENCE, 5)
        lock = helpers.lock_key_for(bf, x)
        hold(other, lock, 100)

        started = time.monotonic()
        assert bf.add(x) is True
        took = time.monotonic() - started
        counts = counters_of(bf)
        figures = f"add took {took:.3f}s behind a 0.1s lock; {counts}"
        assert 0.05 <= took < 0.1 + SLACK, figures
        assert counts["timeouts"] == 0, figures
        assert counts["acquired"] == 1, figures
        assert counts["waits"] >= 1, figures
        assert not other.exists(lock), figures
