"""Bloom-filter arithmetic: sizes from capacity and error rate, and estimates.

Pure functions. With n items, m bits, k hashes, p error rate: m = -n ln p / (ln 2)^2,
k = (m / n) ln 2, p(n) = (1 - e^(-k n / m))^k; from X set bits, n* = -(m / k) ln(1 - X / m).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from .exceptions import ConfigError

#: Most hashes an item may have (the script's arithmetic must stay exact; see hashing.py).
MAX_HASHES = 200
#: Redis strings hold at most 512 MiB, that is 2**32 bits.
REDIS_MAX_STRING_BITS = 2**32
#: Default ceiling for one shard: small enough to spread over a cluster's masters.
DEFAULT_MAX_SHARD_BYTES = 64 * 1024 * 1024
#: Default ceiling for the whole filter, every generation together.
DEFAULT_MAX_BYTES = 4 * 1024**3
#: Default ceiling for the shard count (each shard is a few keys and work at start).
DEFAULT_MAX_SHARDS = 4096


def human_bytes(n: float) -> str:
    """``n`` bytes for people: ``512 B``, ``1.5 KiB``, ``64 MiB``, ``18.2 TiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Sizing:
    """The shape of one filter: how many bits, hashes and shards."""

    capacity: int
    error_rate: float
    shards: int
    bits_per_shard: int
    hashes: int
    #: ``BLOOMDUPE_MAX_BYTES`` (None: no limit): this worker's limit, not stored, not compared.
    max_bytes: int | None = field(default=None, compare=False)

    @property
    def total_bits(self) -> int:
        return self.shards * self.bits_per_shard

    @property
    def bytes_per_shard(self) -> int:
        return self.bits_per_shard // 8

    @property
    def total_bytes(self) -> int:
        """Bytes of all shards (what this generation takes in Redis, allocator aside)."""
        return self.shards * self.bytes_per_shard

    @cached_property
    def modulus(self) -> int:
        """Bits of a shard used: the largest prime <= ``bits_per_shard``, so double hashing's
        ``a + i*b mod m`` gives every item k distinct offsets (false positives stay low)."""
        return largest_prime_at_most(self.bits_per_shard)


def _is_prime(n: int) -> bool:
    """Miller-Rabin with the first 12 primes as bases: exact for every n < 3.3e24."""
    if n < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    for p in small:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d //= 2
        r += 1
    for a in small:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def largest_prime_at_most(n: int) -> int:
    if n < 2:
        raise ValueError(f"no prime at most {n}")
    while not _is_prime(n):
        n -= 1
    return n


def optimal_bits(capacity: int, error_rate: float) -> int:
    """Bits needed for ``capacity`` items at false-positive rate ``error_rate``."""
    return math.ceil(-capacity * math.log(error_rate) / (math.log(2) ** 2))


def optimal_hashes(bits: int, capacity: int) -> int:
    """Number of hash functions that minimises the false-positive rate."""
    return max(1, round(bits / capacity * math.log(2)))


def plan(
    capacity: int,
    error_rate: float,
    shards: int | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    max_shards: int | None = DEFAULT_MAX_SHARDS,
) -> Sizing:
    """Size a filter, validating every input (raises :class:`ConfigError`). Shards:
    ``shards``, or the fewest within ``max_shard_bytes``. Over ``max_bytes`` or ``max_shards``
    (None: no limit) is refused."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        raise ConfigError("BLOOMDUPE_CAPACITY", capacity, "must be a whole number above 0")
    if (
        isinstance(error_rate, bool)
        or not isinstance(error_rate, (int, float))
        or not 0 < error_rate < 1
    ):
        raise ConfigError(
            "BLOOMDUPE_ERROR_RATE", error_rate, "must be a number between 0 and 1, exclusive"
        )
    if (
        isinstance(max_shard_bytes, bool)
        or not isinstance(max_shard_bytes, int)
        or max_shard_bytes <= 0
    ):
        raise ConfigError(
            "BLOOMDUPE_MAX_SHARD_BYTES", max_shard_bytes, "must be a whole number above 0"
        )
    if max_shard_bytes * 8 > REDIS_MAX_STRING_BITS:
        raise ConfigError(
            "BLOOMDUPE_MAX_SHARD_BYTES",
            max_shard_bytes,
            "is over Redis's 512 MiB (536870912 bytes) string limit",
        )
    for name, limit in (("BLOOMDUPE_MAX_BYTES", max_bytes), ("BLOOMDUPE_MAX_SHARDS", max_shards)):
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit <= 0):
            raise ConfigError(name, limit, "must be a whole number above 0")
    bits = optimal_bits(capacity, error_rate)
    hashes = optimal_hashes(bits, capacity)
    if shards is not None and (isinstance(shards, bool) or not isinstance(shards, int)
                               or shards <= 0):
        raise ConfigError("BLOOMDUPE_SHARDS", shards, "must be a whole number above 0")
    if max_shards is not None and shards is not None and shards > max_shards:
        raise ConfigError(
            "BLOOMDUPE_SHARDS", shards,
            f"is over BLOOMDUPE_MAX_SHARDS={max_shards}: every shard is a few Redis keys and "
            "work at every start; a few shards per Redis (Cluster) master are enough. Use "
            "fewer shards, or raise BLOOMDUPE_MAX_SHARDS if you really mean it",
        )
    if hashes > MAX_HASHES:
        raise ConfigError("BLOOMDUPE_ERROR_RATE", error_rate,
                          f"needs more than {MAX_HASHES} hashes; use a rate of at least 1e-60")
    if max_bytes is not None and math.ceil(bits / 8) > max_bytes:
        raise ConfigError(
            "BLOOMDUPE_CAPACITY", capacity,
            f"needs a filter of {human_bytes(math.ceil(bits / 8))} "
            f"({bits / 8 / capacity:.2f} bytes an item), over BLOOMDUPE_MAX_BYTES={max_bytes} "
            f"({human_bytes(max_bytes)}). Lower BLOOMDUPE_CAPACITY to what the crawl needs "
            "(with BLOOMDUPE_GROWTH on, the filter grows if a crawl needs more) or raise "
            "BLOOMDUPE_ERROR_RATE; raise BLOOMDUPE_MAX_BYTES only if your Redis has the memory",
        )
    if shards is None:
        shards = max(1, math.ceil(bits / (max_shard_bytes * 8)))
        if max_shards is not None and shards > max_shards:
            raise ConfigError(
                "BLOOMDUPE_MAX_SHARD_BYTES", max_shard_bytes,
                f"gives {shards} shards, over BLOOMDUPE_MAX_SHARDS={max_shards}; raise "
                "BLOOMDUPE_MAX_SHARD_BYTES (at most 536870912) or set BLOOMDUPE_SHARDS",
            )
    bits_per_shard = math.ceil(bits / shards / 8) * 8
    if bits_per_shard > REDIS_MAX_STRING_BITS:
        raise ConfigError(
            "BLOOMDUPE_SHARDS",
            shards,
            f"gives {bits_per_shard} bits a shard, over Redis's limit of 2**32 bits; "
            f"use at least {math.ceil(bits / REDIS_MAX_STRING_BITS)} shards",
        )
    return Sizing(capacity, float(error_rate), shards, bits_per_shard, hashes, max_bytes)


#: Scalable Bloom filters: generation g holds GROWTH_FACTOR**g times the first's capacity
#: at TIGHTENING**g its rate; with the first at p * (1 - TIGHTENING) all sum to at most p.
GROWTH_FACTOR = 2
TIGHTENING = 0.1


def first_generation_error_rate(error_rate: float, growth: bool) -> float:
    """The error rate of generation 0, leaving room for later ones when growing."""
    return error_rate * (1 - TIGHTENING) if growth else error_rate


def configured_error_rate(first_error_rate: float, growth: bool) -> float:
    """The configured rate from generation 0's (:func:`first_generation_error_rate`'s inverse)."""
    return first_error_rate / (1 - TIGHTENING) if growth else first_error_rate


def generation(first: Sizing, index: int) -> Sizing:
    """Sizing of generation ``index`` (0 is ``first``): same shard count, larger shards."""
    if index == 0:
        return first
    return _sized(first, index, first.capacity * GROWTH_FACTOR**index,
                  first.error_rate * TIGHTENING**index)


def _sized(first: Sizing, index: int, capacity: int, error_rate: float) -> Sizing:
    """Generation ``index`` of ``first``'s filter, of ``capacity`` at ``error_rate``."""
    bits = optimal_bits(capacity, error_rate)
    bits_per_shard = math.ceil(bits / first.shards / 8) * 8
    if optimal_hashes(bits, capacity) > MAX_HASHES:
        raise ConfigError("BLOOMDUPE_ERROR_RATE", first.error_rate,
                          f"leaves generation {index} more than {MAX_HASHES} hashes")
    if bits_per_shard > REDIS_MAX_STRING_BITS:
        raise ConfigError(
            "BLOOMDUPE_SHARDS", first.shards,
            f"is too few for generation {index} ({bits_per_shard} bits a shard, over Redis's "
            "2**32); start a new filter with more shards or a larger BLOOMDUPE_CAPACITY",
        )
    return Sizing(capacity, error_rate, first.shards, bits_per_shard,
                  optimal_hashes(bits, capacity), first.max_bytes)


#: A window (``BLOOMDUPE_WINDOW``) is cut into this many slices, up to the max
#: (:func:`fit_window`): an item is forgotten a window to a window plus a slice after.
WINDOW_SLICES = 8
WINDOW_SLICES_MAX = 12


@dataclass(frozen=True)
class Window:
    """A recrawl window: its length (ms, Redis's clock) and slices (see :attr:`live`)."""

    window_ms: int
    slices: int = WINDOW_SLICES

    @property
    def slice_ms(self) -> int:
        """Window / slices, rounded up (never forget an item before the window is over)."""
        return -(-self.window_ms // self.slices)

    @property
    def live(self) -> int:
        """Slices checked by a call: the current one and the ``slices`` before it."""
        return self.slices + 1

    def slice_of(self, now_ms: float) -> int:
        return int(now_ms // self.slice_ms)

    def expires_at(self, slice_id: int) -> int:
        """When slice ``slice_id`` stops being live (ms of Redis's clock): it expires then."""
        return (slice_id + self.slices + 1) * self.slice_ms


def window_plan(capacity: int, error_rate: float, window: Window, shards: int | None = None,
                max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                max_bytes: int | None = DEFAULT_MAX_BYTES,
                max_shards: int | None = DEFAULT_MAX_SHARDS) -> Sizing:
    """One slice's sizing: ``capacity / slices`` items at ``error_rate / live`` (a lookup
    checks every live slice: false positives add up), the first generation at ``1 -
    TIGHTENING`` of that. ``max_bytes`` bounds every live slice together."""
    per_slice = max_bytes // window.live if max_bytes is not None else None
    if per_slice is not None and per_slice < 1:
        per_slice = 1
    return plan(-(-capacity // window.slices),
                first_generation_error_rate(error_rate / window.live, True), shards,
                max_shard_bytes, per_slice, max_shards)


def allocated_bytes(length: int) -> int:
    """What Redis allocates for a string of ``length`` bytes made at once: header and final
    zero, rounded up to jemalloc's size class (four between two powers of two)."""
    size = length + (3 if length < 2**8 else 5 if length < 2**16 else 9) + 1
    if size <= 16:
        return 16
    lg = size.bit_length() - 1
    step = 1 << max(lg - 2, 3)
    return -(-size // step) * step


def window_bits_per_item(slice_plan: Sizing, window: Window, capacity: int) -> float:
    """Bits Redis allocates for every live slice's first generation, per item a window."""
    return (window.live * slice_plan.shards * allocated_bytes(slice_plan.bytes_per_shard)
            * 8 / capacity)


def fit_window(window_ms: int, capacity: int, error_rate: float, shards: int | None = None,
               max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
               max_bytes: int | None = DEFAULT_MAX_BYTES,
               max_shards: int | None = DEFAULT_MAX_SHARDS) -> tuple[Window, Sizing]:
    """The window cut into the slice count (8 to 12) using least memory after allocator
    rounding, and one slice's sizing. Counts whose rounding exceeds the rate lose; ties go
    to fewer slices."""
    best: tuple[bool, float, int, Window, Sizing] | None = None
    for slices in range(WINDOW_SLICES, WINDOW_SLICES_MAX + 1):
        window = Window(window_ms, slices)
        slice_plan = window_plan(capacity, error_rate, window, shards, max_shard_bytes,
                                 max_bytes, max_shards)
        over = false_positive_rate(slice_plan.modulus, slice_plan.hashes,
                                   slice_plan.capacity / slice_plan.shards) * window.live
        candidate = (over > error_rate, window_bits_per_item(slice_plan, window, capacity),
                     slices, window, slice_plan)
        if best is None or candidate[:3] < best[:3]:
            best = candidate
    assert best is not None
    return best[3], best[4]


#: How a window's slice grows (stored with the filter so workers agree): 1 as
#: :func:`generation`, 2 by the items it holds (:func:`slice_generation`).
SLICE_GROWTH_DOUBLING = 1
SLICE_GROWTH_BY_ITEMS = 2
#: Share of a later slice generation's rate kept back for the rounding of its shards.
SLICE_ROUNDING_MARGIN = 0.9


def slice_generation(first: Sizing, index: int, schedule: int = SLICE_GROWTH_BY_ITEMS
                     ) -> Sizing:
    """Sizing of a window's slice generation ``index`` (0 is ``first``, its share).
    Schedule 2: generation 1 holds one share, generation g past it ``2**g`` shares. The
    rate the first generation leaves is split by halves (g takes ``rest / 2**g`` less
    :data:`SLICE_ROUNDING_MARGIN`), so all stay within it. Schedule 1 is :func:`generation`'s."""
    if index == 0 or schedule == SLICE_GROWTH_DOUBLING:
        return generation(first, index)
    share = first.error_rate / (1 - TIGHTENING)
    rest = share - false_positive_rate(first.modulus, first.hashes,
                                       -(-first.capacity // first.shards))
    rest = max(rest, share * TIGHTENING * TIGHTENING)  # a first generation over its rate
    return _sized(first, index, first.capacity * (1 if index == 1 else GROWTH_FACTOR**index),
                  rest * SLICE_ROUNDING_MARGIN / 2**index)


def total_bytes(first: Sizing, generations: int, schedule: int = 0) -> int:
    """Bytes of the first ``generations`` generations (a slice's with a ``schedule``)."""
    return sum((slice_generation(first, g, schedule) if schedule else generation(first, g))
               .total_bytes for g in range(generations))


def false_positive_rate(bits: int, hashes: int, items: float) -> float:
    """Expected false-positive rate of a filter of ``bits`` holding ``items``."""
    if items <= 0:
        return 0.0
    return float((1.0 - math.exp(-hashes * items / bits)) ** hashes)


def estimate_items(bits: int, hashes: int, set_bits: int) -> float:
    """Estimated number of items in a filter from its count of set bits."""
    if set_bits >= bits:
        return math.inf
    return -bits / hashes * math.log1p(-set_bits / bits)


def fill_false_positive_rate(fill_ratio: float, hashes: int) -> float:
    """False-positive rate now, from the share of bits set (a probe hits k set bits)."""
    return float(fill_ratio**hashes)
