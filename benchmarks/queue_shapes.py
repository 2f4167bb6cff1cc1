#!/usr/bin/env python
"""Two Redis shapes for a leased shared request queue: ``python benchmarks/queue_shapes.py``.

A leased queue is at-least-once: a request a worker takes stays recorded as
that worker's lease until the worker acks it, and a dead worker's leases go
back to the queue. This script measures, against one throwaway local
``redis-server`` (``--maxmemory 512mb``) and one redis-py client, with
payloads of pickled Scrapy requests (``Request.to_dict()``, ~320 bytes) of
four priority levels:

* **A, sorted set + lease hash**: queue ``{q}:queue`` (ZSET, score =
  -priority), leases ``{q}:leases`` (HASH, ``owner:pop.j`` -> ``score|payload``),
  owners ``{q}:owners`` (ZSET, owner -> last heartbeat in ms, Redis TIME). Push
  is ``ZADD``; pop+lease is one Lua script (ZRANGE WITHSCORES,
  ZREMRANGEBYRANK, HSET into the leases, heartbeat); ack is ``HDEL``; reap is
  a Lua script that moves the leases of owners with an old heartbeat back
  into the queue. As the one lease hash holds every worker's leases, that
  script reads them all; **A'** keeps one lease hash per owner
  (``{q}:leases:<owner>``, same pop script) and reaps only the dead owner's.
* **B, a Stream with a consumer group**: push ``XADD``; pop ``XREADGROUP ...
  >``; ack ``XACK`` + ``XDEL``; reap ``XAUTOCLAIM``. Streams have no
  priorities, so also **B-prio**: one stream per priority level, popped from
  the highest non-empty level, either by the client (one round trip per level
  tried) or by one Lua script that walks the levels.
* The **scrapy-redis baseline**: its PriorityQueue pop (MULTI, ZRANGE 0 0,
  ZREMRANGEBYRANK 0 0, EXEC), no lease and no ack.

For each: items/s (push one a call and 100 a round trip; pop+ack with m = 1
and m = 16 items a pop, the ack of one batch pipelined with the next pop),
Redis microseconds per item (``INFO commandstats``, the ``usec`` of the
top-level commands; ``EVALSHA``'s and ``EXEC``'s include the commands they
run, which are not counted again), the redis-server process's CPU per item
(``INFO cpu``: includes reading and writing the sockets), round trips per
item, bytes per queued and per leased item (``MEMORY USAGE`` of the keys, and
the ``used_memory`` delta) and the time to reap 1,000 leases of a dead worker.
Each timed measurement runs ``--repeats`` times (3), in rounds over all of
them so that a busy moment on the machine does not hit one measurement's runs
together, and each column keeps its best (highest items/s, lowest µs and
bytes). By default this client and the redis-server share one CPU
(``--pin one``), so items/s is one over the client's and the server's time
per item together; ``--pin split`` puts them on two CPUs, where on a small VM
every round trip also pays two cross-CPU wakeups. The ``usec`` column
depends on that much less, and is the steadiest under load.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import random
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

import redis
from scrapy import Request

from scrapy_bloomdupe.testing import RedisServer

QUEUE, LEASES, OWNERS = "{q}:queue", "{q}:leases", "{q}:owners"
STREAM, GROUP = "{q}:stream", "g"
LEVELS = 4  # priority levels: priority 3 (highest) .. 0
LEVEL_STREAMS = [f"{{q}}:stream:p{p}" for p in range(LEVELS - 1, -1, -1)]  # highest first

#: ZADD the (score, payload) pairs of ARGV: a stand-in for a check-and-push.
A_PUSH = "return redis.call('ZADD', KEYS[1], unpack(ARGV))"

#: KEYS queue, leases, owners. ARGV owner, pop number, m. Takes the m requests
#: of highest priority, records each as a lease of ``owner:pop.j`` ->
#: ``score|payload``, stamps the owner's heartbeat (Redis TIME, ms) and returns
#: {field, payload, ...}.
A_POP = """
local t = redis.call('TIME')
redis.call('ZADD', KEYS[3], t[1] .. string.format('%03d', math.floor(t[2] / 1000)), ARGV[1])
local items = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[3]) - 1, 'WITHSCORES')
if #items == 0 then return {} end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #items / 2 - 1)
local prefix = ARGV[1] .. ':' .. ARGV[2] .. '.'
local lease, out = {}, {}
for i = 1, #items, 2 do
  local f = prefix .. ((i + 1) / 2)
  lease[#lease + 1] = f
  lease[#lease + 1] = items[i + 1] .. '|' .. items[i]
  out[#out + 1] = f
  out[#out + 1] = items[i]
end
redis.call('HSET', KEYS[2], unpack(lease))
return out
"""

#: KEYS queue, leases, owners. ARGV timeout in ms. Owners whose heartbeat is
#: older than the timeout are dead: their leases go back to the queue at
#: their score, and they leave the owners set. Returns the number requeued.
#: The lease hash holds every owner's leases, so this reads all of them.
A_REAP = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cutoff = string.format('(%.0f', now - tonumber(ARGV[1]))
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', cutoff)
if #dead == 0 then return 0 end
local is_dead = {}
for _, owner in ipairs(dead) do is_dead[owner] = true end
local all = redis.call('HGETALL', KEYS[2])
local fields, pairs_ = {}, {}
for i = 1, #all, 2 do
  if is_dead[string.match(all[i], '^(.*):')] then
    local v = all[i + 1]
    local bar = string.find(v, '|', 1, true)
    fields[#fields + 1] = all[i]
    pairs_[#pairs_ + 1] = string.sub(v, 1, bar - 1)
    pairs_[#pairs_ + 1] = string.sub(v, bar + 1)
  end
end
for i = 1, #fields, 500 do
  redis.call('HDEL', KEYS[2], unpack(fields, i, math.min(i + 499, #fields)))
  redis.call('ZADD', KEYS[1], unpack(pairs_, 2 * i - 1, math.min(2 * i + 998, #pairs_)))
end
redis.call('ZREM', KEYS[3], unpack(dead))
return #fields
"""

#: KEYS queue, owners. ARGV timeout in ms, lease key prefix. As A_REAP, with
#: one lease hash per owner (prefix .. owner), so it reads only the dead
#: owners' leases. Those keys are not in KEYS: they share the queue's hash tag,
#: so the script stays on one slot of a Redis Cluster.
A_REAP_PER_OWNER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cutoff = string.format('(%.0f', now - tonumber(ARGV[1]))
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', cutoff)
local moved = 0
for _, owner in ipairs(dead) do
  local key = ARGV[2] .. owner
  local all = redis.call('HGETALL', key)
  local pairs_ = {}
  for i = 1, #all, 2 do
    local bar = string.find(all[i + 1], '|', 1, true)
    pairs_[#pairs_ + 1] = string.sub(all[i + 1], 1, bar - 1)
    pairs_[#pairs_ + 1] = string.sub(all[i + 1], bar + 1)
  end
  for i = 1, #pairs_, 1000 do
    redis.call('ZADD', KEYS[1], unpack(pairs_, i, math.min(i + 999, #pairs_)))
  end
  redis.call('DEL', key)
  redis.call('ZREM', KEYS[2], owner)
  moved = moved + #all / 2
end
return moved
"""

#: XADD each payload of ARGV to KEYS[1]: a stand-in for a check-and-push.
B_PUSH = """
for i = 1, #ARGV do redis.call('XADD', KEYS[1], '*', 'd', ARGV[i]) end
return #ARGV
"""

#: KEYS the level streams, highest priority first. ARGV group, consumer, m.
#: Reads up to m new entries, from the highest levels first; returns
#: {level, id, payload, ...} (level = index into KEYS, 1-based).
B_PRIO_POP = """
local want, out = tonumber(ARGV[3]), {}
for level = 1, #KEYS do
  local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', want,
                       'STREAMS', KEYS[level], '>')
  if r then
    for _, e in ipairs(r[1][2]) do
      out[#out + 1] = level
      out[#out + 1] = e[1]
      out[#out + 1] = e[2][2]
      want = want - 1
    end
  end
  if want == 0 then break end
end
return out
"""


@dataclass
class Row:
    shape: str
    operation: str
    items_per_s: float | None = None
    redis_us: float | None = None  # INFO commandstats usec per item
    cpu_us: float | None = None  # redis-server user+sys CPU per item
    round_trips: float | None = None
    bytes_usage: float | None = None  # MEMORY USAGE of the keys, per item
    bytes_delta: float | None = None  # used_memory delta, per item
    note: str = ""
    runs: list[dict[str, float]] = field(default_factory=list)


@dataclass
class Outcome:
    items: int
    round_trips: int
    note: str = ""


@dataclass
class Spec:
    """One timed measurement: ``run`` after ``setup`` on an empty database."""

    row: Row
    setup: Callable[[], None]
    run: Callable[[], Outcome]
    commands: Sequence[str]  # top-level commands whose usec count
    note_ms_for: int = 0  # when > 0, note how many ms that many items took


class Bench:
    def __init__(self, client: redis.Redis, payloads: list[bytes], scores: list[int],
                 repeats: int) -> None:
        self.r = client
        self.payloads = payloads
        self.scores = scores
        self.repeats = repeats
        self.sha = {name: client.script_load(text) for name, text in (
            ("a_push", A_PUSH), ("a_pop", A_POP), ("a_reap", A_REAP),
            ("a_reap_per_owner", A_REAP_PER_OWNER), ("b_push", B_PUSH),
            ("b_prio_pop", B_PRIO_POP))}

    # -- measuring ---------------------------------------------------------

    def usec(self, commands: Sequence[str]) -> int:
        stats = self.r.info("commandstats")
        return sum(int(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in commands)

    def cpu(self) -> float:
        info = self.r.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def timed(self, shape: str, operation: str, setup: Callable[[], None],
              run: Callable[[], Outcome], commands: Sequence[str], note_ms_for: int = 0) -> Spec:
        return Spec(Row(shape, operation), setup, run, commands, note_ms_for)

    def run_all(self, specs: Sequence[Spec]) -> list[Row]:
        """``repeats`` rounds over all the specs (so that each spec's runs are spread over
        the whole run, not bunched in one busy moment); each column keeps its best."""
        for _ in range(self.repeats):
            for spec in specs:
                self.once(spec)
        for spec in specs:
            row = spec.row
            row.items_per_s = max(run["items_per_s"] for run in row.runs)
            row.redis_us = min(run["redis_us"] for run in row.runs)
            row.cpu_us = min(run["cpu_us"] for run in row.runs)
            row.round_trips = min(run["round_trips"] for run in row.runs)
            if spec.note_ms_for:
                ms = spec.note_ms_for / row.items_per_s * 1e3
                row.note = f"{ms:.1f} ms" + (f"; {row.note}" if row.note else "")
        return [spec.row for spec in specs]

    def once(self, spec: Spec) -> None:
        self.r.flushall()
        spec.setup()
        self.r.config_resetstat()
        cpu0 = self.cpu()
        start = time.perf_counter()
        out = spec.run()
        elapsed = time.perf_counter() - start
        cpu = self.cpu() - cpu0
        us = self.usec(spec.commands)
        spec.row.runs.append({"items_per_s": out.items / elapsed, "redis_us": us / out.items,
                              "cpu_us": cpu * 1e6 / out.items,
                              "round_trips": out.round_trips / out.items, "seconds": elapsed,
                              "load_average": os.getloadavg()[0]})
        spec.row.note = out.note

    def memory(self, shape: str, operation: str, build: Callable[[], int],
               keys: Sequence[str]) -> Row:
        """Bytes per item of what ``build`` leaves (it returns the item count)."""
        row = Row(shape, operation)
        for _ in range(self.repeats):
            self.r.flushall()
            before = int(self.r.info("memory")["used_memory"])
            count = build()
            after = int(self.r.info("memory")["used_memory"])
            usage = sum(self.r.memory_usage(k, samples=0) or 0 for k in keys)
            row.runs.append({"bytes_usage": usage / count, "bytes_delta": (after - before) / count})
        row.bytes_usage = min(run["bytes_usage"] for run in row.runs)
        row.bytes_delta = min(run["bytes_delta"] for run in row.runs)
        return row

    # -- filling -----------------------------------------------------------

    def fill_zset(self, n: int) -> None:
        for start in range(0, n, 500):
            flat: list[Any] = []
            for i in range(start, min(n, start + 500)):
                flat += [self.scores[i], self.payloads[i]]
            self.r.execute_command("ZADD", QUEUE, *flat)

    def make_group(self, streams: Sequence[str]) -> None:
        for s in streams:
            self.r.xgroup_create(s, GROUP, id="$", mkstream=True)

    def fill_stream(self, n: int) -> None:
        self.make_group([STREAM])
        pipe = self.r.pipeline(transaction=False)
        for i in range(n):
            pipe.execute_command("XADD", STREAM, "*", "d", self.payloads[i])
            if i % 500 == 499:
                pipe.execute()
        pipe.execute()

    def fill_levels(self, n: int) -> None:
        self.make_group(LEVEL_STREAMS)
        pipe = self.r.pipeline(transaction=False)
        for i in range(n):
            # score = -priority; LEVEL_STREAMS[0] is priority LEVELS - 1.
            pipe.execute_command("XADD", LEVEL_STREAMS[LEVELS - 1 + self.scores[i]], "*", "d",
                                 self.payloads[i])
            if i % 500 == 499:
                pipe.execute()
        pipe.execute()

    # -- push ----------------------------------------------------------------

    def push_specs(self, n: int) -> list[Spec]:
        p, s, r = self.payloads, self.scores, self.r

        def zadd_1() -> Outcome:
            for i in range(n):
                r.execute_command("ZADD", QUEUE, s[i], p[i])
            return Outcome(n, n)

        def zadd_100() -> Outcome:
            trips = 0
            for start in range(0, n, 100):
                flat: list[Any] = []
                for i in range(start, min(n, start + 100)):
                    flat += [s[i], p[i]]
                r.execute_command("ZADD", QUEUE, *flat)
                trips += 1
            return Outcome(n, trips)

        def zadd_script(batch: int) -> Callable[[], Outcome]:
            def run() -> Outcome:
                trips = 0
                for start in range(0, n, batch):
                    flat: list[Any] = []
                    for i in range(start, min(n, start + batch)):
                        flat += [s[i], p[i]]
                    r.evalsha(self.sha["a_push"], 1, QUEUE, *flat)
                    trips += 1
                return Outcome(n, trips)
            return run

        def xadd_1() -> Outcome:
            for i in range(n):
                r.execute_command("XADD", STREAM, "*", "d", p[i])
            return Outcome(n, n)

        def xadd_100() -> Outcome:
            trips = 0
            pipe = r.pipeline(transaction=False)
            for start in range(0, n, 100):
                for i in range(start, min(n, start + 100)):
                    pipe.execute_command("XADD", STREAM, "*", "d", p[i])
                pipe.execute()
                trips += 1
            return Outcome(n, trips)

        def xadd_script(batch: int) -> Callable[[], Outcome]:
            def run() -> Outcome:
                trips = 0
                for start in range(0, n, batch):
                    r.evalsha(self.sha["b_push"], 1, STREAM, *p[start:start + batch])
                    trips += 1
                return Outcome(n, trips)
            return run

        def none() -> None:
            pass

        def group() -> None:
            self.make_group([STREAM])

        return [
            self.timed("A zset (= scrapy-redis push)", "push: ZADD, 1 a call", none, zadd_1,
                       ["zadd"]),
            self.timed("A zset", "push: one ZADD of 100", none, zadd_100, ["zadd"]),
            self.timed("A zset", "push: EVALSHA (ZADD), 1 a call", none, zadd_script(1),
                       ["evalsha"]),
            self.timed("A zset", "push: EVALSHA (one ZADD), 100 a call", none, zadd_script(100),
                       ["evalsha"]),
            self.timed("B stream", "push: XADD, 1 a call", group, xadd_1, ["xadd"]),
            self.timed("B stream", "push: 100 XADD pipelined", group, xadd_100, ["xadd"]),
            self.timed("B stream", "push: EVALSHA (XADD), 1 a call", group, xadd_script(1),
                       ["evalsha"]),
            self.timed("B stream", "push: EVALSHA (100 XADD), 100 a call", group,
                       xadd_script(100), ["evalsha"]),
        ]

    # -- pop + ack -------------------------------------------------------------

    def check(self, got: int, n: int, what: str, streams: Sequence[str] = ()) -> None:
        if got == n:
            return
        message = f"{what}: popped {got} of {n} items"
        if streams:  # entries added to each stream since it was made
            added = [self.r.xinfo_stream(s)["entries-added"] for s in streams]
            message += f" (entries added: {added})"
        raise RuntimeError(message)

    def baseline_pop(self, n: int, m: int) -> Callable[[], Outcome]:
        def run() -> Outcome:
            got = trips = 0
            pipe = self.r.pipeline(transaction=True)
            while True:
                pipe.zrange(QUEUE, 0, m - 1).zremrangebyrank(QUEUE, 0, m - 1)
                items, _ = pipe.execute()
                trips += 1
                if not items:
                    break
                got += len(items)
            self.check(got, n, "scrapy-redis pop")
            return Outcome(got, trips)
        return run

    def a_pop(self, n: int, m: int, owner: str = "w1") -> Callable[[], Outcome]:
        def run() -> Outcome:
            got = trips = 0
            number = 1
            ack: list[bytes] = []
            pipe = self.r.pipeline(transaction=False)
            while True:
                if ack:
                    pipe.hdel(LEASES, *ack)
                pipe.evalsha(self.sha["a_pop"], 3, QUEUE, LEASES, OWNERS, owner, number, m)
                out = pipe.execute()[-1]
                trips += 1
                number += 1
                if not out:
                    break
                ack = out[0::2]  # the fields; out[1::2] are the requests
                got += len(ack)
            self.check(got, n, "A pop")
            if self.r.hlen(LEASES):
                raise RuntimeError("A pop: leases left after acking all")
            return Outcome(got, trips)
        return run

    def b_pop(self, n: int, m: int, xdel: bool = True) -> Callable[[], Outcome]:
        def run() -> Outcome:
            got = trips = 0
            ack: list[bytes] = []
            pipe = self.r.pipeline(transaction=False)
            while True:
                if ack:
                    pipe.xack(STREAM, GROUP, *ack)
                    if xdel:
                        pipe.xdel(STREAM, *ack)
                pipe.execute_command("XREADGROUP", "GROUP", GROUP, "w1", "COUNT", m,
                                     "STREAMS", STREAM, ">")
                reply = pipe.execute()[-1]
                trips += 1
                if not reply:
                    break
                ack = [entry_id for entry_id, _ in reply[0][1]]
                got += len(ack)
            self.check(got, n, "B pop", [STREAM])
            return Outcome(got, trips)
        return run

    def b_prio_walk(self, n: int, m: int) -> Callable[[], Outcome]:
        """One XREADGROUP per level tried, highest first; the ack rides on the first."""
        def run() -> Outcome:
            got = trips = 0
            ack: dict[str, list[bytes]] = {}
            pipe = self.r.pipeline(transaction=False)
            while True:
                taken: dict[str, list[bytes]] = {}
                want = m
                for stream in LEVEL_STREAMS:
                    for s, ids in ack.items():
                        pipe.xack(s, GROUP, *ids).xdel(s, *ids)
                    ack = {}
                    pipe.execute_command("XREADGROUP", "GROUP", GROUP, "w1", "COUNT", want,
                                         "STREAMS", stream, ">")
                    reply = pipe.execute()[-1]
                    trips += 1
                    if reply:
                        ids = [entry_id for entry_id, _ in reply[0][1]]
                        taken[stream] = ids
                        want -= len(ids)
                    if want == 0:
                        break
                if want == m:
                    break
                got += m - want
                ack = taken
            self.check(got, n, "B-prio walk", LEVEL_STREAMS)
            return Outcome(got, trips, "a pop tries each level until it has m")
        return run

    def b_prio_lua(self, n: int, m: int) -> Callable[[], Outcome]:
        """One script walks the levels; the ack (XACK + XDEL per stream) is pipelined."""
        def run() -> Outcome:
            got = trips = 0
            ack: dict[int, list[bytes]] = {}
            pipe = self.r.pipeline(transaction=False)
            while True:
                for level, ids in ack.items():
                    s = LEVEL_STREAMS[level - 1]
                    pipe.xack(s, GROUP, *ids).xdel(s, *ids)
                pipe.evalsha(self.sha["b_prio_pop"], LEVELS, *LEVEL_STREAMS, GROUP, "w1", m)
                out = pipe.execute()[-1]
                trips += 1
                if not out:
                    break
                ack = {}
                for j in range(0, len(out), 3):
                    ack.setdefault(int(out[j]), []).append(out[j + 1])
                got += len(out) // 3
            self.check(got, n, "B-prio Lua", LEVEL_STREAMS)
            return Outcome(got, trips)
        return run

    def pop_specs(self, n: int) -> list[Spec]:
        def zset() -> None:
            self.fill_zset(n)

        def stream() -> None:
            self.fill_stream(n)

        def levels() -> None:
            self.fill_levels(n)

        specs = [
            self.timed("scrapy-redis baseline", "pop m=1: MULTI ZRANGE 0 0 + ZREMRANGEBYRANK, "
                       "no lease", zset, self.baseline_pop(n, 1), ["multi", "exec"]),
            self.timed("scrapy-redis baseline", "pop m=16: same with 0 15, no lease", zset,
                       self.baseline_pop(n, 16), ["multi", "exec"])]
        for m in (1, 16):
            specs.append(self.timed("A zset", f"pop+lease m={m} (EVALSHA) + HDEL ack", zset,
                                    self.a_pop(n, m), ["evalsha", "hdel"]))
        for m in (1, 16):
            specs.append(self.timed("B stream", f"pop m={m} XREADGROUP + XACK + XDEL", stream,
                                    self.b_pop(n, m), ["xreadgroup", "xack", "xdel"]))
        specs.append(self.timed("B stream", "pop m=16 XREADGROUP + XACK, no XDEL", stream,
                                self.b_pop(n, 16, xdel=False), ["xreadgroup", "xack"]))
        for m in (1, 16):
            specs.append(self.timed(f"B-prio ({LEVELS} streams)",
                                    f"pop m={m}, client walks levels + XACK + XDEL", levels,
                                    self.b_prio_walk(n, m), ["xreadgroup", "xack", "xdel"]))
        for m in (1, 16):
            specs.append(self.timed(f"B-prio ({LEVELS} streams)",
                                    f"pop m={m}, EVALSHA walks levels + XACK + XDEL", levels,
                                    self.b_prio_lua(n, m), ["evalsha", "xack", "xdel"]))
        return specs

    # -- reap ------------------------------------------------------------------

    def reap_specs(self, dead: int, live: int) -> list[Spec]:
        """Requeue the ``dead`` leases of a dead worker, beside ``live`` leases of a live one."""
        specs = []
        for others in (0, live):
            total = dead + others

            def a_setup(others: int = others, total: int = total) -> None:
                self.fill_zset(total)
                self.interleave(dead, others, lambda owner, number, m: self.r.evalsha(
                    self.sha["a_pop"], 3, QUEUE, LEASES, OWNERS, owner, number, m))
                self.r.zadd(OWNERS, {"dead": 0})  # its heartbeat stopped long ago

            def a_reap() -> Outcome:
                moved = self.r.evalsha(self.sha["a_reap"], 3, QUEUE, LEASES, OWNERS, 60_000)
                self.check(int(moved), dead, "A reap")
                return Outcome(int(moved), 1)

            def a1_setup(others: int = others, total: int = total) -> None:
                self.fill_zset(total)
                self.interleave(dead, others, lambda owner, number, m: self.r.evalsha(
                    self.sha["a_pop"], 3, QUEUE, f"{LEASES}:{owner}", OWNERS, owner, number, m))
                self.r.zadd(OWNERS, {"dead": 0})

            def a1_reap() -> Outcome:
                moved = self.r.evalsha(self.sha["a_reap_per_owner"], 2, QUEUE, OWNERS, 60_000,
                                       f"{LEASES}:")
                self.check(int(moved), dead, "A' reap")
                return Outcome(int(moved), 1)

            def b_setup(others: int = others, total: int = total) -> None:
                self.fill_stream(total)
                self.interleave(dead, others, lambda owner, number, m: self.r.execute_command(
                    "XREADGROUP", "GROUP", GROUP, owner, "COUNT", m, "STREAMS", STREAM, ">"))
                # Make the dead consumer's entries idle for 10 minutes.
                ids = [e["message_id"] for e in self.r.xpending_range(
                    STREAM, GROUP, "-", "+", dead + 1, consumername="dead")]
                for start in range(0, len(ids), 500):
                    self.r.xclaim(STREAM, GROUP, "dead", 0, ids[start:start + 500],
                                  idle=600_000, justid=True)

            def b_reap() -> Outcome:
                cursor: Any = "0-0"
                moved = trips = 0
                while True:
                    cursor, entries, _ = self.r.xautoclaim(STREAM, GROUP, "live", 60_000,
                                                           cursor, count=1000)
                    trips += 1
                    moved += len(entries)
                    if cursor in (b"0-0", "0-0"):
                        break
                self.r.xgroup_delconsumer(STREAM, GROUP, "dead")
                self.check(moved, dead, "B reap")
                return Outcome(moved, trips + 1, "to consumer 'live', not back to the stream")

            label = f"reap {dead:,} dead leases, {others:,} live"
            specs += [
                self.timed("A zset", f"{label} (EVALSHA)", a_setup, a_reap, ["evalsha"], dead),
                self.timed("A' zset, lease hash per owner", f"{label} (EVALSHA)", a1_setup,
                           a1_reap, ["evalsha"], dead),
                self.timed("B stream", f"{label} (XAUTOCLAIM COUNT 1000 + DELCONSUMER)",
                           b_setup, b_reap, ["xautoclaim", "xgroup|delconsumer"], dead)]
        return specs

    def interleave(self, dead: int, live: int, pop: Callable[[str, int, int], Any]) -> None:
        """Pops of up to 16 by 'dead' and 'live' in turn, until they hold dead and live leases."""
        held = {"dead": 0, "live": 0}
        want = {"dead": dead, "live": live}
        number = 1
        while held["dead"] < dead or held["live"] < live:
            for owner in ("dead", "live"):
                m = min(16, want[owner] - held[owner])
                if m:
                    pop(owner, number, m)
                    number += 1
                    held[owner] += m

    # -- memory ----------------------------------------------------------------

    def memory_rows(self, n: int) -> list[Row]:
        def a_queued() -> int:
            self.fill_zset(n)
            return n

        def a_leased() -> int:
            self.fill_zset(n)
            number = 1
            while self.r.evalsha(self.sha["a_pop"], 3, QUEUE, LEASES, OWNERS, "w1", number, 16):
                number += 1
            return n

        def b_queued() -> int:
            self.fill_stream(n)
            return n

        def b_read() -> list[bytes]:
            ids: list[bytes] = []
            while True:
                reply = self.r.xreadgroup(GROUP, "w1", {STREAM: ">"}, count=100)
                if not reply:
                    return ids
                ids += [entry_id for entry_id, _ in reply[0][1]]

        def b_leased() -> int:
            self.fill_stream(n)
            b_read()
            return n

        def b_acked(xdel: bool) -> Callable[[], int]:
            def build() -> int:
                self.fill_stream(n)
                ids = b_read()
                for start in range(0, len(ids), 100):
                    self.r.xack(STREAM, GROUP, *ids[start:start + 100])
                    if xdel:
                        self.r.xdel(STREAM, *ids[start:start + 100])
                return n
            return build

        def levels_queued() -> int:
            self.fill_levels(n)
            return n

        return [
            self.memory("A zset (= scrapy-redis)", f"{n:,} queued", a_queued, [QUEUE]),
            self.memory("A zset", f"{n:,} leased (not acked)", a_leased, [QUEUE, LEASES, OWNERS]),
            self.memory("B stream", f"{n:,} queued", b_queued, [STREAM]),
            self.memory("B stream", f"{n:,} leased (pending, not acked)", b_leased, [STREAM]),
            self.memory("B stream", f"{n:,} acked without XDEL: what stays", b_acked(False),
                        [STREAM]),
            self.memory("B stream", f"{n:,} acked with XDEL: what stays", b_acked(True),
                        [STREAM]),
            self.memory(f"B-prio ({LEVELS} streams)", f"{n:,} queued", levels_queued,
                        LEVEL_STREAMS),
        ]


def make_payloads(n: int, seed: int = 1) -> tuple[list[bytes], list[int]]:
    """Pickled ``Request.to_dict()`` of n distinct requests, and their scores (-priority)."""
    rng = random.Random(seed)
    payloads, scores = [], []
    for i in range(n):
        priority = rng.randrange(LEVELS)
        request = Request(f"https://www.example.com/catalogue/category/books/item-{i}/index.html",
                          priority=priority, meta={"depth": 3},
                          headers={"Referer": f"https://www.example.com/catalogue/page-{i // 20}"
                                              ".html"})
        payloads.append(pickle.dumps(request.to_dict(), protocol=pickle.HIGHEST_PROTOCOL))
        scores.append(-priority)
    return payloads, scores


def fmt(value: float | None, digits: int) -> str:
    if value is None:
        return ""
    return f"{value:,.{digits}f}"


def table(rows: Sequence[Row]) -> str:
    lines = ["| shape | operation | items/s | Redis µs/item | server CPU µs/item "
             "| round trips/item | bytes/item (MEMORY USAGE) | bytes/item (used_memory Δ) "
             "| note |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r.shape} | {r.operation} | {fmt(r.items_per_s, 0)} "
                     f"| {fmt(r.redis_us, 2)} | {fmt(r.cpu_us, 2)} | {fmt(r.round_trips, 3)} "
                     f"| {fmt(r.bytes_usage, 0)} | {fmt(r.bytes_delta, 0)} | {r.note} |")
    return "\n".join(lines)


def pin(mode: str, server: RedisServer) -> str:
    """Pin this process and the redis-server (which this script started) to CPUs.

    On a 2-vCPU VM a round trip between two processes on different CPUs costs
    a cross-CPU wakeup each way, which swamps the queue's own cost (and the
    kernel moves the processes between the two cases during a run); on one
    CPU the one-a-round-trip rows are steady and compare the shapes' work.
    """
    if mode == "none" or not hasattr(os, "sched_setaffinity") or server.process is None:
        return "not pinned"
    allowed = sorted(os.sched_getaffinity(0))
    client_cpu, server_cpu = allowed[-1], allowed[-1]
    if mode == "split" and len(allowed) > 1:
        client_cpu = allowed[-2]
    os.sched_setaffinity(0, {client_cpu})
    os.sched_setaffinity(server.process.pid, {server_cpu})
    return f"client on CPU {client_cpu}, redis-server on CPU {server_cpu}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--items", type=int, default=20_000,
                        help="items per push and pop+ack measurement (default 20000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement (best kept)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run, about 10 s: 5,000 items, 1 run, smaller memory/reap")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    parser.add_argument("--pin", choices=["one", "split", "none"], default="one",
                        help="one (default): this client and redis-server on the same CPU; "
                             "split: on two CPUs; none: where the kernel puts them")
    args = parser.parse_args(argv)
    n, repeats, mem_items, dead, live = args.items, args.repeats, 10_000, 1_000, 9_000
    if args.quick:
        n, repeats, mem_items, dead, live = min(n, 5_000), 1, 5_000, 1_000, 1_000
    payloads, scores = make_payloads(max(n, mem_items, dead + live))
    mean_size = sum(map(len, payloads)) / len(payloads)
    load_before = os.getloadavg()
    started = datetime.now(timezone.utc)
    # A password, so that no other process's client that picks the same port
    # by chance writes to this server.
    password = secrets.token_hex(16)
    with RedisServer(extra=["--maxmemory", "512mb", "--requirepass", password]) as server:
        client = redis.Redis(port=server.port, password=password)
        if server.process is None or client.info("server")["process_id"] != server.process.pid:
            raise RuntimeError(f"port {server.port} is another redis-server's")
        cpus = pin(args.pin, server)
        version = client.info("server")["redis_version"]
        bench = Bench(client, payloads, scores, repeats)
        rows = bench.run_all(bench.push_specs(n) + bench.pop_specs(n)
                             + bench.reap_specs(dead, live))
        rows += bench.memory_rows(mem_items)
        client.close()
    load_after = os.getloadavg()
    header = (f"Redis {version}, redis-py {redis.__version__}, Python "
              f"{platform.python_version()}, {os.cpu_count()} CPUs, "
              f"{started:%Y-%m-%d %H:%M} UTC; {n:,} items a measurement, payload "
              f"{mean_size:.0f} bytes on average, {LEVELS} priority levels; best of {repeats} "
              f"run(s) per column; {cpus}; load average {load_before[0]:.2f} before, "
              f"{load_after[0]:.2f} after")
    print(header + "\n")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"header": header, "redis": version, "items": n, "repeats": repeats,
                       "pin": args.pin,
                       "payload_bytes": mean_size, "rows": [asdict(r) for r in rows]},
                      out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
