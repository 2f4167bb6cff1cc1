from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from scrapy_bloomdupe import hashing, sizing

fingerprints = st.binary(min_size=0, max_size=64)
seeds = st.integers(min_value=0, max_value=2**32 - 1)
shard_counts = st.integers(min_value=1, max_value=4096)
shard_bits = st.integers(min_value=8, max_value=2**32).map(lambda b: b - b % 8 or 8)


def position(fingerprint: bytes, seed: int, shards: int, modulus: int) -> hashing.Position:
    """Shard and offset coefficients of ``fingerprint`` under the filter's ``seed``, as the
    Lua engine computes them for a shard whose used bits number ``modulus``."""
    h1, h2 = hashing.halves(fingerprint, seed)
    return hashing.Position(hashing.shard_of(h1, shards), *hashing.coefficients(h1, h2, modulus))


@given(fingerprints, seeds, shard_counts, shard_bits, st.integers(min_value=1, max_value=40))
def test_offsets_stay_inside_one_shard(fp: bytes, seed: int, shards: int, bits: int,
                                       k: int) -> None:
    pos = position(fp, seed, shards, bits)
    assert 0 <= pos.shard < shards
    assert 0 <= pos.a < bits and 0 < pos.b < bits and 0 < pos.c < bits
    offsets = hashing.offsets(pos, k, bits)
    assert len(offsets) == k
    assert all(0 <= o < bits for o in offsets)


def test_offsets_rarely_repeat() -> None:
    # Two offsets i < j coincide for one stride b in m: about k^2/2 / m of items.
    modulus, k, n = sizing.largest_prime_at_most(19_320), 20, 20_000
    repeats = sum(
        len(set(hashing.offsets(position(b"u%d" % i, 1, 1, modulus), k, modulus))) < k
        for i in range(n)
    )
    assert repeats <= 2 * n * (k * k / 2) / modulus


def test_equal_first_two_coefficients_do_not_make_equal_offsets() -> None:
    # Double hashing's floor: an item whose (a, b) equals an inserted item's is
    # always a false positive. The third coefficient separates such items.
    modulus, k = 57_731, 40
    first = hashing.Position(0, 15092, 18946, 7)
    second = hashing.Position(0, 15092, 18946, 4242)
    shared = set(hashing.offsets(first, k, modulus)) & set(hashing.offsets(second, k, modulus))
    assert len(shared) <= 3


def test_lua_and_python_expand_offsets_alike() -> None:
    # The script's (i*i*i - i) / 6 is exact in doubles: i^3 - i is divisible by 6.
    assert all((i * i * i - i) % 6 == 0 for i in range(1000))


@given(fingerprints, seeds, shard_counts, shard_bits)
def test_lua_arithmetic_is_exact(fp: bytes, seed: int, shards: int, bits: int) -> None:
    # The script computes (a + i*b) % m with doubles: every value must stay < 2**53.
    pos = position(fp, seed, shards, bits)
    k = sizing.MAX_HASHES
    assert pos.a + k * pos.b + pos.c * ((k**3 - k) // 6) < 2**53
    assert 0 < pos.c < bits


@given(fingerprints, seeds)
def test_same_answer_for_same_input(fp: bytes, seed: int) -> None:
    assert position(fp, seed, 7, 1 << 20) == position(fp, seed, 7, 1 << 20)


def test_seed_changes_positions() -> None:
    fp = b"https://example.com/"
    assert len({position(fp, seed, 16, 1 << 24) for seed in range(50)}) == 50


def test_identical_in_another_process() -> None:
    # Same answer in a fresh interpreter (no per-process hash randomisation).
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from test_hashing import position;"
        "print(tuple(position(b'fp-%d' % i, 12345, 13, 8 * 10**6) for i in range(20)))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)],
                         capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": "random"}).stdout.strip()
    here = tuple(position(b"fp-%d" % i, 12345, 13, 8 * 10**6) for i in range(20))
    assert out == str(here)


def test_pinned_values() -> None:
    # Changing these breaks every stored filter: bump FORMAT_VERSION if you must.
    assert position(bytes(20), 42, 4, 7_999_993) == (0, 3636750, 6256131, 5939703)


def test_shards_are_used_evenly() -> None:
    counts = [0] * 8
    for i in range(8000):
        counts[position(b"u%d" % i, 7, 8, 1 << 20).shard] += 1
    assert min(counts) > 850 and max(counts) < 1150

