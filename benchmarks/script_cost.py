#!/usr/bin/env python
"""Where Redis spends its time in a check-and-add: ``python benchmarks/script_cost.py``.

Redis-side microseconds per item (``INFO commandstats``: the ``usec`` of
``EVALSHA``, which includes the commands the script calls, plus the lock's
``SET`` in lock mode), for:

* scrapy-redis's ``SADD`` of one 40-character hex fingerprint;
* this package's check-and-add (``BloomFilter.add_many``), atomic and lock
  mode, one item a call and 50 a call;
* two what-if scripts, to show where the script's time goes: the same k
  ``SETBIT`` calls with the offsets computed in Lua from ``(a, b)`` (as the
  package does), and with the offsets computed by the client and passed as
  strings. Redis converts every Lua number argument of ``redis.call`` to a
  string, and that conversion is a large share of the script's time.

The what-if scripts only set bits (no lock, op log or generations): compare
them with each other, not with the package's full script.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Callable, Sequence

import redis

from scrapy_bloomdupe import sizing
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.testing import RedisServer

#: k SETBIT calls per item, offsets (a + i*b) mod m computed in Lua.
SETBIT_IN_LUA = """
local k, m = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
for j = 3, #ARGV, 2 do
  local a, b, new = tonumber(ARGV[j]), tonumber(ARGV[j + 1]), 0
  for i = 0, k - 1 do
    if redis.call('SETBIT', KEYS[1], (a + i * b) % m, 1) == 0 then new = 1 end
  end
  out[#out + 1] = new
end
return table.concat(out)
"""

#: k SETBIT calls per item, offsets computed by the client and sent as strings.
SETBIT_STRINGS = """
local k = tonumber(ARGV[1])
local out = {}
for j = 2, #ARGV, k do
  local new = 0
  for i = j, j + k - 1 do
    if redis.call('SETBIT', KEYS[1], ARGV[i], '1') == 0 then new = 1 end
  end
  out[#out + 1] = new
end
return table.concat(out)
"""


def usec(client: redis.Redis, *commands: str) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in commands)


def per_item(client: redis.Redis, run: Callable[[], None], count: int,
             commands: Sequence[str], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        client.config_resetstat()
        run()
        best = min(best, usec(client, *commands) / count)
    return best


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    n = args.items
    # Half repeats, as in run.py's stream.
    distinct = [hashlib.sha1(b"https://example.com/%d" % i).digest() for i in range(n // 2)]
    items = distinct + distinct
    plan = sizing.plan(10_000_000, 0.001)
    rows: list[tuple[str, float]] = []
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)

        def sadd() -> None:
            client.delete("sr")
            for fp in items:
                client.sadd("sr", fp.hex())

        rows.append(("scrapy-redis SADD, 1 a call",
                     per_item(client, sadd, n, ["sadd"], args.repeats)))
        for batch in (1, 50):
            for lock in (False, True):
                def package(batch: int = batch, lock: bool = lock) -> None:
                    client.flushdb()
                    bloom = BloomFilter.open(client, "cost", plan, use_lock=lock)
                    client.config_resetstat()
                    for start in range(0, n, batch):
                        bloom.add_many(items[start:start + batch])
                    bloom.close()

                best = float("inf")
                for _ in range(args.repeats):
                    package()
                    best = min(best, usec(client, "evalsha", "set") / n)
                mode = "lock" if lock else "atomic"
                rows.append((f"bloomdupe check-and-add, {mode} mode, {batch} a call", best))

        m, k = plan.bits_per_shard, plan.hashes
        pairs = [(int.from_bytes(fp[:8], "little") % m, int.from_bytes(fp[8:16], "little") % m
                  or 1) for fp in items]
        for name, script, strings in (("what-if: k SETBIT, offsets computed in Lua",
                                       SETBIT_IN_LUA, False),
                                      ("what-if: k SETBIT, offsets sent as strings",
                                       SETBIT_STRINGS, True)):
            sha = client.script_load(script)
            for batch in (1, 50):
                def what_if(sha: str = sha, strings: bool = strings, batch: int = batch) -> None:
                    client.set("bits", bytes(plan.bytes_per_shard))
                    client.config_resetstat()
                    for start in range(0, n, batch):
                        chunk = pairs[start:start + batch]
                        if strings:
                            argv: list[object] = [k] + [(a + i * b) % m for a, b in chunk
                                                        for i in range(k)]
                        else:
                            argv = [k, m] + [x for pair in chunk for x in pair]
                        client.evalsha(sha, 1, "bits", *argv)

                best = float("inf")
                for _ in range(args.repeats):
                    what_if()
                    best = min(best, usec(client, "evalsha") / n)
                rows.append((f"{name}, {batch} a call", best))
        client.close()
    print(f"Redis-side µs per item ({n:,} items, half repeats, best of {args.repeats})\n")
    print("| operation | Redis µs per item |\n|---|---:|")
    for name, value in rows:
        print(f"| {name} | {value:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
