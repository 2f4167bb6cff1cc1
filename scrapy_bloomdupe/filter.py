"""The sharded Bloom filter in Redis: keys, metadata, check-and-add, growth, clear, info.

Layout for a filter whose key is ``K`` (``BLOOMDUPE_KEY``), shard ``i`` and
generation ``g``:

* ``K:meta``: a hash with the parameters every worker must share (format
  version, capacity, error rate, shards, bits per shard, hashes, seed, growth,
  generations, creation time). The first worker creates it atomically; the
  others read it.
* ``{K:i}:bits`` (generation 0) and ``{K:i}:bits:g`` (later generations): the
  shard's bits, each string created at full size so Redis never grows (and
  never over-allocates) it while bits arrive.
* ``{K:i}:lock``: shard ``i``'s lock (lock mode).
* ``{K:i}:gen``: how many generations shard ``i`` has seen in use (absent: 1).
* ``{K:i}:ops:<client>``: a string, the op log that makes retries safe (below).
* ``K:growlock``: held while a generation is added.

The hash tag ``{K:i}`` puts all of shard ``i`` (every generation's bits, the
lock, the generation marker, the op logs) in one Redis Cluster slot, so the
check-and-add script touches a single slot, while different shards land on
different slots and so spread over the masters.

Check-and-add is one Lua script per shard and round trip. All k bits of an item
are in one shard, so the script checks every generation and sets the item's
bits in the newest, reporting whether it was new, atomically. In lock mode the
script first checks that the shard lock still holds this worker's token: a
worker paused past the lock's TTL is rejected instead of trusted, and the
script releases the lock as it ends. Items Redis has already answered for
are answered "seen" from this worker's memory (:mod:`scrapy_bloomdupe.localcache`,
``BLOOMDUPE_LOCAL_CACHE``) and not sent.

Growth: when the newest generation reaches its capacity, a worker adds a larger
one under ``K:growlock`` (shards first, then the count in ``K:meta``). A worker
that still writes with the old count is refused by the shard's generation
marker, reloads the metadata and retries, so no item is ever added to a
generation that is no longer the newest.

Retries are idempotent. A reply lost after Redis ran the script (timeout,
reset connection) would make a blind retry answer "seen" for an item the first
attempt added, and that URL would never be crawled. So each script call
carries an id unique to this client, and the script records its reply in the
client's op log for the shard; a retried call is answered from that record,
before anything else is checked. Each call also says which calls have been
answered (``ack``: every round trip before this one), and the script forgets
those, so a log holds one round trip's replies at most (one short string,
rewritten with one ``SET ... PX``) and expires when a client goes away.

Redis-side cost, measured (``benchmarks/script_cost.py``, k = 10, load average
about 1): 8.3 us an item in calls of 50 and 19 us for a call of one, against
9.9 and 23 us with the op log as a hash (emptied and refilled by every call of
one). A first design, which kept an op id per item and set bits with one
``SETBIT`` each from offsets computed in Lua, cost 18 and 34 us under more
load. The client computes the offsets, and one ``BITFIELD`` sets an item's k
bits; every argument is a string (Redis converts a Lua number to text first).
Where the rest goes: docs/benchmarks.md.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import NoScriptError, RedisError

from . import crawlstats, hashing, sizing
from .exceptions import ConfigError, FilterMismatchError
from .localcache import LocalCache
from .lock import LockCounters, ShardLocks
from .outage import OutageGuard
from .transport import Link

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

logger = logging.getLogger(__name__)

T = TypeVar("T")

FORMAT_VERSION = 1
#: How long an op log outlives its last write; a retry must come before this.
OP_LOG_TTL_MS = 3_600_000
#: How long a worker may take to add a generation before others may try.
GROW_LOCK_TTL_MS = 60_000
#: Most items in one script call: about a millisecond of Redis time (Lua
#: scripts block every other client of the server while they run).
MAX_ITEMS_PER_SCRIPT = 256
#: Script replies besides the per-item flags.
LOCK_BUSY = -1
STALE_GENERATION = -2
#: Fields that must agree between the stored filter and a worker, by setting.
_SHARED_FIELDS = {
    "version": "format version",
    "capacity": "BLOOMDUPE_CAPACITY",
    "error_rate": "BLOOMDUPE_ERROR_RATE",
    "shards": "BLOOMDUPE_SHARDS",
    "bits_per_shard": "bits per shard",
    "hashes": "hashes",
    "growth": "BLOOMDUPE_GROWTH",
    "fingerprint": "BLOOMDUPE_FINGERPRINT",
}
_TEXT_FIELDS = ("fingerprint",)
_FLOAT_FIELDS = ("error_rate", "created")


@dataclass
class _Unit:
    """One script call of a batch: items of one shard, with the lock token it uses."""

    shard: int
    token: bytes
    call: int
    args: list[Any]
    indexes: list[int]


@dataclass
class FilterCounters:
    """What this worker's filter did; lock figures live in ``lock``."""

    checked: int = 0
    new: int = 0
    duplicates: int = 0
    #: Duplicates answered by the local cache, without Redis (in ``duplicates`` too).
    local_hits: int = 0
    script_reloads: int = 0
    stale_generation: int = 0
    generations_added: int = 0
    lock: LockCounters = field(default_factory=LockCounters)


@dataclass(frozen=True)
class ShardInfo:
    index: int
    generation: int
    key: str
    set_bits: int
    bits: int
    memory_bytes: int

    @property
    def fill_ratio(self) -> float:
        return self.set_bits / self.bits


@dataclass(frozen=True)
class GenerationInfo:
    index: int
    sizing: sizing.Sizing
    shards: list[ShardInfo]

    @property
    def set_bits(self) -> int:
        return sum(s.set_bits for s in self.shards)

    @property
    def fill_ratio(self) -> float:
        return self.set_bits / sum(s.bits for s in self.shards)

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


@dataclass(frozen=True)
class FilterInfo:
    key: str
    sizing: sizing.Sizing
    seed: int
    created: float
    growth: bool
    generations: list[GenerationInfo]

    @property
    def shards(self) -> list[ShardInfo]:
        return [s for g in self.generations for s in g.shards]

    @property
    def set_bits(self) -> int:
        return sum(g.set_bits for g in self.generations)

    @property
    def total_bits(self) -> int:
        """Bits in use (each shard's prime modulus), every generation."""
        return sum(s.bits for s in self.shards)

    @property
    def fill_ratio(self) -> float:
        return self.set_bits / self.total_bits

    @property
    def capacity(self) -> int:
        return sum(g.sizing.capacity for g in self.generations)

    @property
    def estimated_items(self) -> float:
        return sum(g.estimated_items for g in self.generations)

    @property
    def estimated_false_positive_rate(self) -> float:
        missed = 1.0
        for g in self.generations:
            missed *= 1 - g.estimated_false_positive_rate
        return 1 - missed

    @property
    def memory_bytes(self) -> int:
        return sum(g.memory_bytes for g in self.generations)

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "capacity": self.sizing.capacity,
            "error_rate": self.sizing.error_rate,
            "shards": self.sizing.shards,
            "growth": self.growth,
            "created": self.created,
            "total_capacity": self.capacity,
            "set_bits": self.set_bits,
            "fill_ratio": self.fill_ratio,
            "estimated_items": self.estimated_items,
            "estimated_false_positive_rate": self.estimated_false_positive_rate,
            "memory_bytes": self.memory_bytes,
            "generations": [
                {
                    "index": g.index,
                    "capacity": g.sizing.capacity,
                    "error_rate": g.sizing.error_rate,
                    "bits_per_shard": g.sizing.bits_per_shard,
                    "hashes": g.sizing.hashes,
                    "fill_ratio": g.fill_ratio,
                    "estimated_items": g.estimated_items,
                    "memory_bytes": g.memory_bytes,
                    "shards": [
                        {"index": s.index, "key": s.key, "set_bits": s.set_bits,
                         "fill_ratio": s.fill_ratio, "memory_bytes": s.memory_bytes}
                        for s in g.shards
                    ],
                }
                for g in self.generations
            ],
        }


class BloomFilter:
    """A sharded, optionally growing Bloom filter in Redis, shared by every worker.

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

    # KEYS[1] this client's op log for the shard (a string), KEYS[2] the shard's
    # generation marker, KEYS[3] the shard's lock, KEYS[4..3+G] the shard's
    # bits, oldest generation first.
    # ARGV[1] lock token ('' in atomic mode), ARGV[2] this call's id (the op id
    # of its first item), ARGV[3] ack: this client's calls with lower ids were
    # answered and are forgotten, ARGV[4] op log TTL in ms, ARGV[5] G, the
    # generation count, ARGV[6..5+G] k of each generation, then per item its k
    # bit offsets in each generation, oldest first (computed by the client, see
    # hashing.py: Redis converts Lua numbers to strings, which costs more).
    # The op log holds "<ack>|<call>:<reply>|<call>:<reply>|...": the replies of
    # the round trip under way (several calls when a round trip sends more than
    # one to the shard). A call with a new ack starts it afresh.
    # Returns the recorded reply when this call already ran (a retry after a
    # lost reply); -1 (LOCK_BUSY) when KEYS[3] does not hold the token, -2
    # (STALE_GENERATION) when the shard already has more than G generations,
    # both having written nothing; otherwise one character an item: '1' new
    # (now added to the newest generation), '0' seen before.
    CHECK_ADD_SCRIPT = """
local token, call, ack = ARGV[1], ARGV[2], ARGV[3]
local log = redis.call('GET', KEYS[1])
local head = ack .. '|'
if log and string.sub(log, 1, #head) == head then
  local tag = '|' .. call .. ':'
  local at = string.find(log, tag, #head, true)
  if at then
    if token ~= '' and redis.call('GET', KEYS[3]) == token then redis.call('DEL', KEYS[3]) end
    local from = at + #tag
    return string.sub(log, from, string.find(log, '|', from, true) - 1)
  end
else
  log = head
end
if token ~= '' and redis.call('GET', KEYS[3]) ~= token then return -1 end
local G = tonumber(ARGV[5])
local stored = tonumber(redis.call('GET', KEYS[2]) or '1')
if stored > G then
  if token ~= '' then redis.call('DEL', KEYS[3]) end
  return -2
elseif stored < G then
  redis.call('SET', KEYS[2], G)
end
local ks, width, args = {}, 0, {}
for g = 1, G do
  ks[g] = tonumber(ARGV[5 + g])
  width = width + ks[g]
end
local out = {}
for j = 6 + G, #ARGV, width do
  local at, found = j, false
  for g = 1, G - 1 do
    for i = 0, ks[g] - 1 do
      args[3 * i + 1], args[3 * i + 2], args[3 * i + 3] = 'GET', 'u1', ARGV[at + i]
    end
    at = at + ks[g]
    found = true
    for _, bit in ipairs(redis.call('BITFIELD_RO', KEYS[3 + g], unpack(args, 1, 3 * ks[g]))) do
      if bit == 0 then
        found = false
        break
      end
    end
    if found then break end
  end
  local new = '0'
  if not found then
    at = j + width - ks[G]
    for i = 0, ks[G] - 1 do
      args[4 * i + 1], args[4 * i + 2], args[4 * i + 3], args[4 * i + 4] =
        'SET', 'u1', ARGV[at + i], '1'
    end
    for _, bit in ipairs(redis.call('BITFIELD', KEYS[3 + G], unpack(args, 1, 4 * ks[G]))) do
      if bit == 0 then
        new = '1'
        break
      end
    end
  end
  out[#out + 1] = new
end
local reply = table.concat(out)
redis.call('SET', KEYS[1], log .. call .. ':' .. reply .. '|', 'PX', ARGV[4])
if token ~= '' then redis.call('DEL', KEYS[3]) end
return reply
"""

    def __init__(
        self,
        client: Redis | RedisCluster,
        key: str,
        plan: sizing.Sizing,
        seed: int,
        created: float,
        *,
        growth: bool = False,
        generations: int = 1,
        fingerprint: str = "scrapy",
        use_lock: bool = True,
        lock_ttl: float = 1.0,
        lock_wait: float = 1.5,
        outage: OutageGuard | None = None,
        local_cache: int = 0,
    ) -> None:
        self.client = client
        #: Waits out Redis outages around each round trip (retrying the very same
        #: commands, so a reply lost in the outage is answered from the op log).
        self.outage = outage
        self.key = key
        self.sizing = plan
        self.seed = seed
        self.created = created
        self.growth = growth
        self.fingerprint = fingerprint
        self.use_lock = use_lock
        self.counters = FilterCounters()
        #: Items Redis has answered for (they are in the filter for good); see localcache.
        self.cache = LocalCache(local_cache)
        self.locks = ShardLocks(client, lock_ttl, lock_wait, counters=self.counters.lock)
        self.client_id = secrets.token_hex(6)
        self._next_op = 1
        self._script = client.register_script(self.CHECK_ADD_SCRIPT)
        self._sha = self._script.sha
        self._link = Link(client)
        shards = range(plan.shards)
        self._lock_keys = [self.lock_key(i) for i in shards]
        self._gen_keys = [f"{{{key}:{i}}}:gen" for i in shards]
        self._op_keys = [f"{{{key}:{i}}}:ops:{self.client_id}" for i in shards]
        self._new_since_grow_check = 0
        self._set_generations(generations)

    def _set_generations(self, count: int) -> None:
        self.generations = [sizing.generation(self.sizing, g) for g in range(count)]
        self._gen_args: list[Any] = [count, *(plan.hashes for plan in self.generations)]
        self._bits_keys = [
            [self.shard_key(i, g) for g in range(count)] for i in range(self.sizing.shards)
        ]
        newest = self.generations[-1]
        # Each worker looks at the fill every 0.1% of the capacity it adds, so
        # N workers overfill a generation by about N * 0.1% before it grows.
        # BITCOUNT scans 1.8 bytes an item, so this costs ~2 KB of scan per item.
        self._grow_check_every = max(16, newest.capacity // 1000)

    # -- keys ---------------------------------------------------------------

    @staticmethod
    def meta_key(key: str) -> str:
        return f"{key}:meta"

    def shard_key(self, index: int, generation: int = 0) -> str:
        suffix = f":{generation}" if generation else ""
        return f"{{{self.key}:{index}}}:bits{suffix}"

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
        growth: bool = False,
        fingerprint: str = "scrapy",
        use_lock: bool = True,
        lock_ttl: float = 1.0,
        lock_wait: float = 1.5,
        local_cache: int = 0,
    ) -> BloomFilter:
        """Create the filter at ``key``, or join the one there.

        ``plan`` is the first generation's sizing; with ``growth`` larger
        generations are added as it fills. With ``plan`` None the stored filter
        is joined whatever its parameters (for tools); otherwise a stored
        filter with other parameters raises :class:`FilterMismatchError`.
        """
        validate_key(key)
        meta_key = cls.meta_key(key)
        if plan is None:
            stored = _decode_meta(client.hgetall(meta_key))
            if not stored:
                raise FilterMismatchError(key, {"filter": ("absent", "an existing filter")})
        else:
            ours: dict[str, Any] = {
                "version": FORMAT_VERSION,
                "capacity": plan.capacity,
                "error_rate": plan.error_rate,
                "shards": plan.shards,
                "bits_per_shard": plan.bits_per_shard,
                "hashes": plan.hashes,
                "growth": int(growth),
                "fingerprint": fingerprint,
            }
            proposal = {**ours, "error_rate": repr(plan.error_rate), "generations": 1,
                        "seed": secrets.randbits(32), "created": repr(time.time())}
            flat: list[Any] = [x for kv in proposal.items() for x in kv]
            reply = client.register_script(cls.CREATE_META_SCRIPT)(keys=[meta_key], args=flat)
            stored = _decode_meta(dict(zip(reply[::2], reply[1::2], strict=True)))
            differences = {
                _SHARED_FIELDS[name]: (_configured(name, stored.get(name), stored),
                                       _configured(name, value, ours))
                for name, value in ours.items()
                if stored.get(name) != value
            }
            if differences:
                raise FilterMismatchError(key, differences)
        stored_plan = sizing.Sizing(
            capacity=stored["capacity"],
            error_rate=stored["error_rate"],
            shards=stored["shards"],
            bits_per_shard=stored["bits_per_shard"],
            hashes=stored["hashes"],
        )
        bloom = cls(
            client, key, stored_plan, stored["seed"], stored["created"],
            growth=bool(stored.get("growth", 0)), generations=stored.get("generations", 1),
            fingerprint=stored.get("fingerprint", "scrapy"),
            use_lock=use_lock, lock_ttl=lock_ttl, lock_wait=lock_wait, local_cache=local_cache,
        )
        bloom._ensure_shards(range(len(bloom.generations)))
        client.script_load(cls.CHECK_ADD_SCRIPT)
        return bloom

    def _ensure_shards(self, generations: range) -> None:
        for g in generations:
            names = [keys[g] for keys in self._bits_keys]
            self._create_shards(names, self.generations[g].bytes_per_shard, g)

    def _create_shards(self, names: list[str], size: int, generation: int) -> None:
        """Create missing shards at full size (``SET NX``: never overwrites bits)."""
        lengths = [self.client.strlen(n) for n in names]
        missing = [n for n, length in zip(names, lengths, strict=True) if not length]
        if missing:
            zeros = bytes(size)
            for name in missing:
                self.client.set(name, zeros, nx=True)
            logger.info("Created %d Bloom filter shard(s) of %d bytes for %s generation %d",
                        len(missing), size, self.key, generation)
            lengths = [self.client.strlen(n) for n in names]
        for name, got in zip(names, lengths, strict=True):
            if got != size:
                raise FilterMismatchError(self.key, {f"length of {name}": (got, size)})

    def _reload(self) -> None:
        """Adopt the generation count stored in Redis (another worker grew the filter)."""
        stored = _decode_meta(self.client.hgetall(self.meta_key(self.key)))
        count = stored.get("generations", 1)
        if count != len(self.generations):
            logger.info("Bloom filter %s now has %d generations", self.key, count)
            self._set_generations(count)

    # -- check-and-add ------------------------------------------------------

    def add(self, fingerprint: bytes) -> bool:
        """Add one item; True when it was new, False when it was seen before."""
        return self.add_many([fingerprint])[0]

    def add_many(self, fingerprints: Sequence[bytes]) -> list[bool]:
        """Check-and-add many items in one pipelined round trip (per lock wait).

        Returns, in order, True for each item that was new. An item twice in
        the batch is new at most once. Each script call carries at most
        ``MAX_ITEMS_PER_SCRIPT`` items, so no call blocks Redis for long.
        """
        if not fingerprints:
            return []
        count = len(fingerprints)
        cache = self.cache
        remaining: Sequence[int] = range(count)
        if cache.size:
            remaining = [i for i, fp in enumerate(fingerprints) if fp not in cache]
            self.counters.local_hits += count - len(remaining)
        seed = self.seed
        halves = {i: hashing.halves(fingerprints[i], seed) for i in remaining}
        asked = remaining
        op = ack = self._next_op
        self._next_op += count
        results: list[bool] = [False] * count
        use_lock = self.use_lock
        pauses = self.locks.pauses() if use_lock else None
        while remaining:
            pending = self._group(halves, remaining, op)
            refused: list[int] = []
            while pending:
                replies = self._round_trip(pending, ack, use_lock)
                busy = []
                for unit, reply in zip(pending, replies, strict=True):
                    if reply == LOCK_BUSY:
                        busy.append(unit)
                    elif reply == STALE_GENERATION:
                        refused.extend(unit.indexes)
                    else:
                        for index, flag in zip(unit.indexes, reply, strict=True):
                            results[index] = flag == 49  # ord("1")
                pending = busy
                if pending and pauses is not None and next(pauses, None) is None:
                    logger.warning(
                        "Shard lock(s) %s stayed busy for BLOOMDUPE_LOCK_WAIT=%ss; checking "
                        "without the lock (the check-and-add script is atomic on its own)",
                        sorted({self._lock_keys[u.shard] for u in pending}), self.locks.wait,
                    )
                    use_lock = False
            if refused:
                # Another worker added a generation: redo those items with it.
                self.counters.stale_generation += 1
                self._guarded(self._reload)
            remaining = refused
        cache.update(fingerprints[i] for i in asked)
        new = sum(results)
        self.counters.checked += len(results)
        self.counters.new += new
        self.counters.duplicates += len(results) - new
        if self.growth and new:
            self._new_since_grow_check += new
            if self._new_since_grow_check >= self._grow_check_every:
                self._new_since_grow_check = 0
                try:
                    self._maybe_grow()
                except RedisError as e:  # the answers stand; the next check tries again
                    logger.warning("Could not check whether Bloom filter %s must grow: %s",
                                   self.key, e)
        return results

    def _guarded(self, call: Callable[[], T]) -> T:
        """``call``, waiting out Redis outages when the filter has an outage guard."""
        return call() if self.outage is None else self.outage.call(call)

    def _group(self, halves: Mapping[int, tuple[int, int]], indexes: Sequence[int],
               first_op: int) -> list[_Unit]:
        """Script calls for these items under the current generations: per shard,
        in chunks of at most ``MAX_ITEMS_PER_SCRIPT``.

        An item's op id is ``first_op`` plus its index, and a call's id is its
        first item's: the same on every retry.
        """
        shards = self.sizing.shards
        plans = [(g.hashes, g.modulus) for g in self.generations]
        open_units: dict[int, _Unit] = {}
        units: list[_Unit] = []
        for index in indexes:
            h1, h2 = halves[index]
            shard = hashing.shard_of(h1, shards)
            unit = open_units.get(shard)
            if unit is None or len(unit.indexes) >= MAX_ITEMS_PER_SCRIPT:
                token = self.locks.new_token() if self.use_lock else b""
                unit = open_units[shard] = _Unit(shard, token, first_op + index, [], [])
                units.append(unit)
            for k, m in plans:
                unit.args.extend(hashing.offsets(
                    hashing.Position(shard, *hashing.coefficients(h1, h2, m)), k, m))
            unit.indexes.append(index)
        return units

    def _round_trip(self, units: list[_Unit], ack: int, use_lock: bool) -> list[Any]:
        """One round trip: per unit (the shard lock's SET NX PX and) the script.

        Returns one reply per unit (see CHECK_ADD_SCRIPT). Scripts flushed
        from Redis (a restart) are loaded again and the round trip repeated
        with the same tokens and op ids: it is idempotent.
        """
        ttl_ms = self.locks.ttl_ms
        generations = len(self.generations)
        commands: list[tuple[Any, ...]] = []
        for unit in units:
            shard = unit.shard
            token = unit.token if use_lock else b""
            lock = self._lock_keys[shard]
            if use_lock:
                commands.append(("SET", lock, token, "NX", "PX", ttl_ms))
            commands.append(("EVALSHA", self._sha, 3 + generations, self._op_keys[shard],
                             self._gen_keys[shard], lock, *self._bits_keys[shard], token,
                             unit.call, ack, OP_LOG_TTL_MS, *self._gen_args, *unit.args))
        raw = self._guarded(lambda: self._link.execute(commands))
        if any(isinstance(r, NoScriptError) for r in raw):
            self.counters.script_reloads += 1
            self._guarded(lambda: self.client.script_load(self.CHECK_ADD_SCRIPT))
            return self._round_trip(units, ack, use_lock)
        for r in raw:
            if isinstance(r, Exception):
                raise r
        if not use_lock:
            return raw
        counters = self.locks.counters
        replies = []
        for got_lock, reply in zip(raw[::2], raw[1::2], strict=True):
            if got_lock:
                counters.acquired += 1
                if reply == LOCK_BUSY:
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
        op = self._next_op
        self._next_op += 1
        (unit,) = self._group({0: hashing.halves(fingerprint, self.seed)}, [0], op)
        shard = unit.shard
        keys = [self._op_keys[shard], self._gen_keys[shard], self._lock_keys[shard],
                *self._bits_keys[shard]]
        reply = self._script(keys=keys, args=[token, unit.call, op, OP_LOG_TTL_MS,
                                              *self._gen_args, *unit.args])
        if reply in (LOCK_BUSY, STALE_GENERATION):
            self.counters.lock.lost += reply == LOCK_BUSY
            return None
        new = bool(reply == b"1")
        self.counters.checked += 1
        self.counters.new += new
        self.counters.duplicates += not new
        return new

    def lock_key_for(self, fingerprint: bytes) -> str:
        h1, _ = hashing.halves(fingerprint, self.seed)
        return self._lock_keys[hashing.shard_of(h1, self.sizing.shards)]

    # -- growth -------------------------------------------------------------

    def _maybe_grow(self) -> None:
        """Add a generation when the newest one has reached its capacity."""
        self._reload()
        newest = len(self.generations) - 1
        if self._newest_items() < self.generations[newest].capacity:
            return
        lock = f"{self.key}:growlock"
        token = self.locks.new_token()
        if not self.client.set(lock, token, nx=True, px=GROW_LOCK_TTL_MS):
            return  # another worker is adding it; the generation marker tells us when
        try:
            self._reload()
            if len(self.generations) - 1 != newest:
                return
            try:
                following = sizing.generation(self.sizing, newest + 1)
            except ConfigError as e:
                logger.warning("Bloom filter %s is full and cannot grow: %s", self.key, e)
                return
            # Shards first, then the count: no worker may use a generation
            # before all of its shards exist.
            self._create_shards(
                [self.shard_key(i, newest + 1) for i in range(self.sizing.shards)],
                following.bytes_per_shard, newest + 1,
            )
            self.client.hset(self.meta_key(self.key), "generations", newest + 2)
            self._set_generations(newest + 2)
            self.counters.generations_added += 1
            logger.warning(
                "Bloom filter %s reached the capacity of generation %d (%d items); added "
                "generation %d for %d more at error rate %.2g, %d bytes",
                self.key, newest, self.generations[newest].capacity, newest + 1,
                following.capacity, following.error_rate,
                following.bytes_per_shard * following.shards,
            )
        finally:
            self.locks.release(lock, token)

    def _newest_items(self) -> float:
        g = len(self.generations) - 1
        plan = self.generations[g]
        pipe = self.client.pipeline(transaction=False)
        for keys in self._bits_keys:
            pipe.bitcount(keys[g])
        return sum(sizing.estimate_items(plan.modulus, plan.hashes, int(n or 0))
                   for n in pipe.execute())

    # -- reading ------------------------------------------------------------

    def contains(self, fingerprint: bytes) -> bool:
        """True when every bit of the item is set (it was probably added). Writes nothing."""
        return self.contains_many([fingerprint])[0]

    def contains_many(self, fingerprints: Sequence[bytes]) -> list[bool]:
        shards = self.sizing.shards
        pipe = self.client.pipeline(transaction=False)
        for fp in fingerprints:
            h1, h2 = hashing.halves(fp, self.seed)
            shard = hashing.shard_of(h1, shards)
            for g, plan in enumerate(self.generations):
                m = plan.modulus
                pos = hashing.Position(shard, *hashing.coefficients(h1, h2, m))
                args: list[Any] = []
                for offset in hashing.offsets(pos, plan.hashes, m):
                    args.extend(("GET", "u1", offset))
                pipe.execute_command("BITFIELD_RO", self._bits_keys[shard][g], *args)
        replies = pipe.execute()
        count = len(self.generations)
        return [
            any(all(bits) for bits in replies[i * count:(i + 1) * count])
            for i in range(len(fingerprints))
        ]

    def info(self) -> FilterInfo:
        """Parameters, and per generation and shard the set bits and memory.

        BITCOUNT is O(shard size): a few milliseconds for 64 MiB.
        """
        self._reload()
        pipe = self.client.pipeline(transaction=False)
        for g in range(len(self.generations)):
            for keys in self._bits_keys:
                pipe.bitcount(keys[g])
                pipe.memory_usage(keys[g], samples=0)
        raw = iter(pipe.execute())
        generations = []
        for g, plan in enumerate(self.generations):
            shards = [
                ShardInfo(i, g, keys[g], int(next(raw) or 0), plan.modulus,
                          int(next(raw) or 0))
                for i, keys in enumerate(self._bits_keys)
            ]
            generations.append(GenerationInfo(g, plan, shards))
        return FilterInfo(self.key, self.sizing, self.seed, self.created, self.growth,
                          generations)

    def clear(self) -> None:
        """Delete the filter: metadata, every generation's shards, locks, markers, op logs,
        and the crawl-wide stats (``crawlstats``)."""
        names = [self.meta_key(self.key), f"{self.key}:growlock", crawlstats.stats_key(self.key),
                 crawlstats.workers_key(self.key), *self._lock_keys, *self._gen_keys]
        for i, keys in enumerate(self._bits_keys):
            names.extend(keys)
            names.extend(self.client.scan_iter(match=f"{{{self.key}:{i}}}:ops:*", count=1000))
            names.extend(self.client.scan_iter(match=f"{{{self.key}:{i}}}:bits:*", count=1000))
        for name in dict.fromkeys(names):
            self.client.delete(name)
        self.cache.clear()

    def close(self) -> None:
        """Give the held connection back to the client's pool."""
        self._link.close()


def parse_op_log(raw: bytes) -> tuple[int, dict[int, bytes]]:
    """An op log's ack and its recorded replies by call id (for tools and tests)."""
    ack, *entries, _ = raw.split(b"|")
    calls = (entry.split(b":") for entry in entries)
    return int(ack), {int(call): reply for call, reply in calls}


def validate_key(key: str) -> None:
    if not isinstance(key, str) or not key:
        raise ConfigError("BLOOMDUPE_KEY", key, "must be a non-empty string")
    if "{" in key or "}" in key:
        raise ConfigError(
            "BLOOMDUPE_KEY", key, "must not contain '{' or '}': the filter adds its own hash tags"
        )


def _configured(name: str, value: Any, fields: dict[str, Any]) -> Any:
    """A stored field as the user configured it: growth keeps part of the error rate back."""
    if name == "error_rate" and fields.get("growth") and isinstance(value, float):
        return float(f"{value / (1 - sizing.TIGHTENING):.12g}")
    return value


def _decode_meta(raw: dict[Any, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in raw.items():
        name = name.decode() if isinstance(name, bytes) else str(name)
        text = value.decode() if isinstance(value, bytes) else str(value)
        if name in _TEXT_FIELDS:
            out[name] = text
        else:
            out[name] = float(text) if name in _FLOAT_FIELDS else int(text)
    return out
