"""The sharded Bloom filter in Redis: keys, metadata, check-and-add, clear, info.

Layout for a filter whose key is ``K`` (``BLOOMDUPE_KEY``):

* ``K:meta``: a hash with the parameters every worker must share (format
  version, capacity, error rate, shards, bits per shard, hashes, seed, creation
  time). The first worker creates it atomically; the others read it.
* ``{K:i}:bits``: shard ``i``, a string of ``bits_per_shard`` bits, created at
  full size so Redis never grows it (and never over-allocates) while bits
  arrive.
* ``{K:i}:lock``: shard ``i``'s lock (lock mode).
* ``{K:i}:ops:<client>``: the op log that makes retries safe (below).

The hash tag ``{K:i}`` puts a shard's bits, lock and op logs in one Redis
Cluster slot, so the check-and-add script touches a single slot, while
different shards land on different slots and so spread over the masters.

Check-and-add is one Lua script per shard and round trip. All k bits of an item
are in one shard, so the script sets them and reports whether any was 0
("new") atomically. In lock mode the script first checks that the shard lock
still holds this worker's token: a worker paused past the lock's TTL is
rejected instead of trusted, and the script releases the lock as it ends.

Retries are idempotent. A reply lost after Redis ran the script (timeout,
reset connection) would make a blind retry answer "seen" for an item the first
attempt added, and that URL would never be crawled. So each item carries an op
id unique to this client; the script logs the ids of the items it found new,
and answers a retried id from that log. Each call also says which ids have been
answered (``ack``), and the script forgets those, so a log holds one round
trip's items at most and expires when a client goes away.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError

from . import hashing, sizing
from .exceptions import ConfigError, FilterMismatchError
from .lock import LockCounters, ShardLocks
from .transport import Link

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
#: How long an op log outlives its last write; a retry must come before this.
OP_LOG_TTL_MS = 3_600_000
#: Settings that must agree between the stored filter and a worker, by field.
_SHARED_FIELDS = {
    "version": "format version",
    "capacity": "BLOOMDUPE_CAPACITY",
    "error_rate": "BLOOMDUPE_ERROR_RATE",
    "shards": "BLOOMDUPE_SHARDS",
    "bits_per_shard": "bits per shard",
    "hashes": "hashes",
}


@dataclass
class FilterCounters:
    """What this worker's filter did; lock figures live in ``lock``."""

    checked: int = 0
    new: int = 0
    duplicates: int = 0
    script_reloads: int = 0
    lock: LockCounters = field(default_factory=LockCounters)


@dataclass(frozen=True)
class ShardInfo:
    index: int
    key: str
    set_bits: int
    bits: int
    memory_bytes: int

    @property
    def fill_ratio(self) -> float:
        return self.set_bits / self.bits


@dataclass(frozen=True)
class FilterInfo:
    key: str
    sizing: sizing.Sizing
    seed: int
    created: float
    shards: list[ShardInfo]

    @property
    def set_bits(self) -> int:
        return sum(s.set_bits for s in self.shards)

    @property
    def fill_ratio(self) -> float:
        return self.set_bits / self.sizing.total_bits

    @property
    def estimated_items(self) -> float:
        k = self.sizing.hashes
        return sum(sizing.estimate_items(s.bits, k, s.set_bits) for s in self.shards)

    @property
    def estimated_false_positive_rate(self) -> float:
        # A probe lands in each shard with equal chance.
        k = self.sizing.hashes
        rates = [sizing.fill_false_positive_rate(s.fill_ratio, k) for s in self.shards]
        return sum(rates) / len(rates)

    @property
    def memory_bytes(self) -> int:
        return sum(s.memory_bytes for s in self.shards)

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "capacity": self.sizing.capacity,
            "error_rate": self.sizing.error_rate,
            "shards": self.sizing.shards,
            "bits_per_shard": self.sizing.bits_per_shard,
            "hashes": self.sizing.hashes,
            "created": self.created,
            "set_bits": self.set_bits,
            "fill_ratio": self.fill_ratio,
            "estimated_items": self.estimated_items,
            "estimated_false_positive_rate": self.estimated_false_positive_rate,
            "memory_bytes": self.memory_bytes,
            "per_shard": [
                {
                    "index": s.index,
                    "key": s.key,
                    "set_bits": s.set_bits,
                    "fill_ratio": s.fill_ratio,
                    "memory_bytes": s.memory_bytes,
                }
                for s in self.shards
            ],
        }


class BloomFilter:
    """A sharded Bloom filter in Redis, shared by every worker of a crawl.

    Build it with :meth:`open`. Not thread-safe: use one instance per thread
    (Scrapy runs every component on one thread).
    """

    # KEYS[1] meta hash. ARGV: field, value, ... to store when the hash is absent.
    # Returns the stored hash as a flat field/value list (ours or the one found).
    CREATE_META_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV))
end
return redis.call('HGETALL', KEYS[1])
"""

    # KEYS[1] shard bits, KEYS[2] this client's op log for the shard,
    # KEYS[3] shard lock (lock mode only).
    # ARGV[1] hashes k, ARGV[2] bits per shard m, ARGV[3] lock token ('' in atomic mode),
    # ARGV[4] ack: this client's op ids below it were answered and are forgotten,
    # ARGV[5] op log TTL in ms, ARGV[6..] triples (op id, a, b): the item's bits are
    # (a + i*b) mod m for i < k.
    # Returns -1, having written nothing, when KEYS[3] does not hold the token;
    # otherwise one character an item: '1' new (now added), '0' seen before.
    CHECK_ADD_SCRIPT = """
local token = ARGV[3]
if token ~= '' and redis.call('GET', KEYS[3]) ~= token then
  return -1
end
local k, m = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[4])
local out, logged = {}, false
for j = 6, #ARGV, 3 do
  local op, new = ARGV[j], 0
  if redis.call('ZSCORE', KEYS[2], op) then
    new = 1
  else
    local a, b = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
    for i = 0, k - 1 do
      if redis.call('SETBIT', KEYS[1], (a + i * b) % m, 1) == 0 then new = 1 end
    end
    if new == 1 then
      redis.call('ZADD', KEYS[2], op, op)
      logged = true
    end
  end
  out[#out + 1] = new
end
if logged then redis.call('PEXPIRE', KEYS[2], ARGV[5]) end
if token ~= '' then redis.call('DEL', KEYS[3]) end
return table.concat(out)
"""

    def __init__(
        self,
        client: Redis | RedisCluster,
        key: str,
        plan: sizing.Sizing,
        seed: int,
        created: float,
        *,
        use_lock: bool = True,
        lock_ttl: float = 1.0,
        lock_wait: float = 1.5,
    ) -> None:
        self.client = client
        self.key = key
        self.sizing = plan
        self.seed = seed
        self.created = created
        self.use_lock = use_lock
        self.counters = FilterCounters()
        self.locks = ShardLocks(client, lock_ttl, lock_wait, counters=self.counters.lock)
        self.client_id = secrets.token_hex(6)
        self._next_op = 1
        self._script = client.register_script(self.CHECK_ADD_SCRIPT)
        self._sha = self._script.sha
        self._link = Link(client)
        m = plan.bits_per_shard
        self._fixed_args = (plan.hashes, m)
        self._bits_keys = [self.shard_key(i) for i in range(plan.shards)]
        self._lock_keys = [self.lock_key(i) for i in range(plan.shards)]
        self._op_keys = [f"{{{key}:{i}}}:ops:{self.client_id}" for i in range(plan.shards)]

    # -- keys ---------------------------------------------------------------

    @staticmethod
    def meta_key(key: str) -> str:
        return f"{key}:meta"

    def shard_key(self, index: int) -> str:
        return f"{{{self.key}:{index}}}:bits"

    def lock_key(self, index: int) -> str:
        return f"{{{self.key}:{index}}}:lock"

    # -- creation -----------------------------------------------------------

    @classmethod
    def open(
        cls,
        client: Redis | RedisCluster,
        key: str,
        plan: sizing.Sizing | None,
        *,
        use_lock: bool = True,
        lock_ttl: float = 1.0,
        lock_wait: float = 1.5,
    ) -> BloomFilter:
        """Create the filter at ``key``, or join the one there.

        With ``plan`` None the stored filter is joined whatever its parameters
        (for tools); otherwise a stored filter with other parameters raises
        :class:`FilterMismatchError`.
        """
        validate_key(key)
        meta_key = cls.meta_key(key)
        if plan is None:
            stored = _decode_meta(client.hgetall(meta_key))
            if not stored:
                raise FilterMismatchError(key, {"filter": ("absent", "an existing filter")})
        else:
            proposal = {
                "version": FORMAT_VERSION,
                "capacity": plan.capacity,
                "error_rate": repr(plan.error_rate),
                "shards": plan.shards,
                "bits_per_shard": plan.bits_per_shard,
                "hashes": plan.hashes,
                "seed": secrets.randbits(32),
                "created": repr(time.time()),
            }
            flat: list[Any] = [x for kv in proposal.items() for x in kv]
            reply = client.register_script(cls.CREATE_META_SCRIPT)(keys=[meta_key], args=flat)
            stored = _decode_meta(dict(zip(reply[::2], reply[1::2], strict=True)))
            ours = {
                "version": FORMAT_VERSION,
                "capacity": plan.capacity,
                "error_rate": plan.error_rate,
                "shards": plan.shards,
                "bits_per_shard": plan.bits_per_shard,
                "hashes": plan.hashes,
            }
            differences = {
                _SHARED_FIELDS[name]: (stored.get(name), value)
                for name, value in ours.items()
                if stored.get(name) != value
            }
            if differences:
                raise FilterMismatchError(key, differences)
        stored_plan = sizing.Sizing(
            capacity=int(stored["capacity"]),
            error_rate=float(stored["error_rate"]),
            shards=int(stored["shards"]),
            bits_per_shard=int(stored["bits_per_shard"]),
            hashes=int(stored["hashes"]),
        )
        bloom = cls(
            client,
            key,
            stored_plan,
            int(stored["seed"]),
            float(stored["created"]),
            use_lock=use_lock,
            lock_ttl=lock_ttl,
            lock_wait=lock_wait,
        )
        bloom._ensure_shards()
        client.script_load(cls.CHECK_ADD_SCRIPT)
        return bloom

    def _ensure_shards(self) -> None:
        """Create missing shards at full size (``SET NX``: never overwrites bits)."""
        size = self.sizing.bytes_per_shard
        pipe = self.client.pipeline(transaction=False)
        for name in self._bits_keys:
            pipe.strlen(name)
        lengths = pipe.execute()
        missing = [n for n, length in zip(self._bits_keys, lengths, strict=True) if not length]
        if missing:
            zeros = bytes(size)
            for name in missing:
                self.client.set(name, zeros, nx=True)
            logger.info("Created %d Bloom filter shard(s) of %d bytes at %s", len(missing),
                        size, self.key)
            lengths = [self.client.strlen(n) for n in self._bits_keys]
        wrong = [(n, got) for n, got in zip(self._bits_keys, lengths, strict=True) if got != size]
        if wrong:
            name, got = wrong[0]
            raise FilterMismatchError(self.key, {f"length of {name}": (got, size)})

    # -- check-and-add ------------------------------------------------------

    def add(self, fingerprint: bytes) -> bool:
        """Add one item; True when it was new, False when it was seen before."""
        return self.add_many([fingerprint])[0]

    def add_many(self, fingerprints: Sequence[bytes]) -> list[bool]:
        """Check-and-add many items in one pipelined round trip (per lock wait).

        Returns, in order, True for each item that was new. An item twice in
        the batch is new at most once.
        """
        if not fingerprints:
            return []
        plan = self.sizing
        by_shard: dict[int, list[Any]] = {}
        where: dict[int, list[int]] = {}
        op = ack = self._next_op
        for index, fp in enumerate(fingerprints):
            pos = hashing.position(fp, self.seed, plan.shards, plan.bits_per_shard)
            by_shard.setdefault(pos.shard, []).extend((op, pos.a, pos.b))
            where.setdefault(pos.shard, []).append(index)
            op += 1
        self._next_op = op
        results: list[bool] = [False] * len(fingerprints)
        pending = list(by_shard)
        use_lock = self.use_lock
        tokens = {shard: self.locks.new_token() for shard in pending} if use_lock else {}
        pauses = self.locks.pauses() if use_lock else None
        while pending:
            replies = self._round_trip(pending, by_shard, ack, tokens if use_lock else None)
            busy = []
            for shard, reply in zip(pending, replies, strict=True):
                if reply == -1:
                    busy.append(shard)
                    continue
                for index, flag in zip(where[shard], reply, strict=True):
                    results[index] = flag == 49  # ord("1")
            pending = busy
            if pending and pauses is not None and next(pauses, None) is None:
                logger.warning(
                    "Shard lock(s) %s stayed busy for BLOOMDUPE_LOCK_WAIT=%ss; checking "
                    "without the lock (the check-and-add script is atomic on its own)",
                    [self._lock_keys[s] for s in pending], self.locks.wait,
                )
                use_lock = False
        new = sum(results)
        self.counters.checked += len(results)
        self.counters.new += new
        self.counters.duplicates += len(results) - new
        return results

    def _round_trip(
        self,
        shards: list[int],
        by_shard: dict[int, list[Any]],
        ack: int,
        tokens: dict[int, bytes] | None,
    ) -> list[Any]:
        """One round trip: per shard (the lock's SET NX PX and) the script.

        Returns one reply per shard, -1 where the shard's lock was busy.
        Scripts flushed from Redis (a restart) are loaded again and the round
        trip repeated with the same tokens and op ids: it is idempotent.
        """
        ttl_ms = self.locks.ttl_ms
        commands: list[tuple[Any, ...]] = []
        for shard in shards:
            if tokens is not None:
                token = tokens[shard]
                lock = self._lock_keys[shard]
                commands.append(("SET", lock, token, "NX", "PX", ttl_ms))
                commands.append(("EVALSHA", self._sha, 3, self._bits_keys[shard],
                                 self._op_keys[shard], lock, *self._fixed_args, token, ack,
                                 OP_LOG_TTL_MS, *by_shard[shard]))
            else:
                commands.append(("EVALSHA", self._sha, 2, self._bits_keys[shard],
                                 self._op_keys[shard], *self._fixed_args, "", ack,
                                 OP_LOG_TTL_MS, *by_shard[shard]))
        raw = self._link.execute(commands)
        if any(isinstance(r, NoScriptError) for r in raw):
            self.counters.script_reloads += 1
            self.client.script_load(self.CHECK_ADD_SCRIPT)
            return self._round_trip(shards, by_shard, ack, tokens)
        for r in raw:
            if isinstance(r, Exception):
                raise r
        if tokens is None:
            return raw
        counters = self.locks.counters
        replies = []
        for got_lock, reply in zip(raw[::2], raw[1::2], strict=True):
            if got_lock:
                counters.acquired += 1
                if reply == -1:
                    # Taken by us, then gone before our script ran: it expired.
                    counters.lost += 1
            replies.append(reply)
        return replies

    def add_with_token(self, fingerprint: bytes, token: bytes) -> bool | None:
        """Fenced check-and-add under a lock already taken with ``token``.

        Returns None, having written nothing, when the lock no longer holds the
        token (it expired; another worker may hold it now). For tools and tests
        that take the lock in a separate step; :meth:`add` does both in one.
        """
        plan = self.sizing
        pos = hashing.position(fingerprint, self.seed, plan.shards, plan.bits_per_shard)
        op = self._next_op
        self._next_op += 1
        keys = [self._bits_keys[pos.shard], self._op_keys[pos.shard], self._lock_keys[pos.shard]]
        reply = self._script(keys=keys, args=[*self._fixed_args, token, op, OP_LOG_TTL_MS,
                                              op, pos.a, pos.b])
        if reply == -1:
            self.counters.lock.lost += 1
            return None
        new = bool(reply == b"1")
        self.counters.checked += 1
        self.counters.new += new
        self.counters.duplicates += not new
        return new

    def lock_key_for(self, fingerprint: bytes) -> str:
        plan = self.sizing
        return self._lock_keys[
            hashing.position(fingerprint, self.seed, plan.shards, plan.bits_per_shard).shard
        ]

    # -- reading ------------------------------------------------------------

    def contains(self, fingerprint: bytes) -> bool:
        """True when every bit of the item is set (it was probably added). Writes nothing."""
        return self.contains_many([fingerprint])[0]

    def contains_many(self, fingerprints: Sequence[bytes]) -> list[bool]:
        plan = self.sizing
        pipe = self.client.pipeline(transaction=False)
        for fp in fingerprints:
            pos = hashing.position(fp, self.seed, plan.shards, plan.bits_per_shard)
            args: list[Any] = []
            for offset in hashing.offsets(pos, plan.hashes, plan.bits_per_shard):
                args.extend(("GET", "u1", offset))
            pipe.execute_command("BITFIELD_RO", self._bits_keys[pos.shard], *args)
        return [all(bits) for bits in pipe.execute()]

    def info(self) -> FilterInfo:
        """Parameters, and per shard the set bits and memory (BITCOUNT is O(shard size))."""
        pipe = self.client.pipeline(transaction=False)
        for name in self._bits_keys:
            pipe.bitcount(name)
            pipe.memory_usage(name, samples=0)
        raw = pipe.execute()
        shards = [
            ShardInfo(i, name, int(raw[2 * i] or 0), self.sizing.bits_per_shard,
                      int(raw[2 * i + 1] or 0))
            for i, name in enumerate(self._bits_keys)
        ]
        return FilterInfo(self.key, self.sizing, self.seed, self.created, shards)

    def clear(self) -> None:
        """Delete the filter: metadata, shards, locks and op logs."""
        names = [self.meta_key(self.key), *self._bits_keys, *self._lock_keys]
        for i in range(self.sizing.shards):
            names.extend(self.client.scan_iter(match=f"{{{self.key}:{i}}}:ops:*", count=1000))
        for name in names:
            self.client.delete(name)

    def close(self) -> None:
        """Give the held connection back to the client's pool."""
        self._link.close()


def validate_key(key: str) -> None:
    if not isinstance(key, str) or not key:
        raise ConfigError("BLOOMDUPE_KEY", key, "must be a non-empty string")
    if "{" in key or "}" in key:
        raise ConfigError(
            "BLOOMDUPE_KEY", key, "must not contain '{' or '}': the filter adds its own hash tags"
        )


def _decode_meta(raw: dict[Any, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in raw.items():
        name = name.decode() if isinstance(name, bytes) else str(name)
        text = value.decode() if isinstance(value, bytes) else str(value)
        out[name] = float(text) if name in ("error_rate", "created") else int(text)
    return out

