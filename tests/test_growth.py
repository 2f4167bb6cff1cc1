"""Growth: a full filter adds a larger generation, every worker follows, nothing is lost.

(Workers racing while the filter grows: tests/faults/test_race.py.)
"""

from __future__ import annotations

import math

import pytest
import redis
from helpers import first_plan, fps

from scrapy_bloomdupe import sizing
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.exceptions import FilterFullError


@pytest.fixture
def client(engine_client: redis.Redis) -> redis.Redis:
    """Every test here runs on both engines (``"auto"`` picks RedisBloom where it is)."""
    return engine_client


def test_generations_are_larger_and_tighter() -> None:
    first = first_plan(10_000, 0.01)
    rates = [sizing.generation(first, g).error_rate for g in range(6)]
    capacities = [sizing.generation(first, g).capacity for g in range(6)]
    assert capacities == [10_000 * 2**g for g in range(6)]
    # Every generation full at once still stays within the configured rate.
    assert 1 - math.prod(1 - r for r in rates) <= 0.01
    assert all(sizing.generation(first, g).shards == 2 for g in range(6))


def test_grows_when_full_and_keeps_every_item(client: redis.Redis) -> None:
    capacity, p = 2_000, 0.01
    bf = BloomFilter.open(client, "g", first_plan(capacity, p), growth=True, use_lock=False)
    items = fps(14_000)
    new = []
    for i in range(0, len(items), 100):
        new.extend(bf.add_many(items[i:i + 100]))
    assert len(bf.generations) >= 3, bf.counters
    assert bf.counters.generations_added == len(bf.generations) - 1
    # New items taken for seen (false positives): within the configured rate
    # (items added once older generations are full meet their rates, up to p).
    sigma_new = math.sqrt(p * (1 - p) / len(items))
    assert new.count(False) / len(items) <= p + 6 * sigma_new
    # No false negatives across generations.
    assert not any(bf.add_many(items))
    assert all(bf.contains_many(items))
    info = bf.info()
    assert len(info.generations) == len(bf.generations)
    assert info.estimated_items == pytest.approx(len(items), rel=0.1)
    assert info.capacity >= len(items)
    probes = 20_000
    positives = sum(bf.contains_many(fps(probes, "probe")))
    sigma = math.sqrt(p * (1 - p) / probes)
    assert positives / probes <= p + 6 * sigma


def test_growth_off_stays_one_generation(client: redis.Redis) -> None:
    bf = BloomFilter.open(client, "g", sizing.plan(1000, 0.01), use_lock=False)
    if bf.engine_name != "lua":
        # A NONSCALING BF refuses items past its headroom: the crawl stops with an
        # error rather than filling on at a climbing false-positive rate.
        bf.add_many(fps(1000, "b0-"))
        with pytest.raises(FilterFullError, match="BLOOMDUPE_GROWTH is off"):
            bf.add_many(fps(500, "b1-"))
        assert len(bf.generations) == 1
        return
    for i in range(0, 5000, 500):
        bf.add_many(fps(500, f"b{i}-"))
    assert len(bf.generations) == 1


@pytest.mark.parametrize("use_lock", [True, False], ids=["lock", "atomic"])
def test_a_worker_with_an_old_generation_count_is_refused_and_follows(
        client: redis.Redis, use_lock: bool) -> None:
    plan = first_plan(1_000, 0.001)
    grower = BloomFilter.open(client, "g", plan, growth=True, use_lock=use_lock)
    stale = BloomFilter.open(client, "g", plan, growth=True, use_lock=use_lock)
    early = fps(200, "early")
    stale.add_many(early)
    late = fps(3_000, "late")
    for i in range(0, len(late), 100):
        grower.add_many(late[i:i + 100])
    assert len(grower.generations) > 1 and len(stale.generations) == 1
    # Items in the new generation: the stale worker must not accept them again.
    assert not any(stale.add_many(late))
    assert stale.counters.stale_generation >= 1
    assert len(stale.generations) == len(grower.generations)
    assert not any(stale.add_many(early))


@pytest.mark.parametrize("batch", [1, 1_000], ids=["batches-of-1", "batches-of-1000"])
@pytest.mark.parametrize("use_lock", [True, False], ids=["lock", "atomic"])
def test_false_positive_rate_holds_for_any_batch_size(client: redis.Redis, batch: int,
                                                      use_lock: bool) -> None:
    """Capacity 100 at 0.001, 3,000 new items: a batch larger than the room left in the
    newest generation grows it in time (it was checked only after the whole batch:
    2,544 of 3,000 new items were reported seen)."""
    plan = sizing.plan(100, sizing.first_generation_error_rate(0.001, True))
    bf = BloomFilter.open(client, "g", plan, growth=True, use_lock=use_lock)
    items = fps(3_000, f"b{batch}-")
    answers = []
    for i in range(0, len(items), batch):
        answers.extend(bf.add_many(items[i:i + batch]))
    seen = answers.count(False)
    # Measured: 3.5 (Lua) and 4.0 (RedisBloom) on average over 20 runs of 3,000 items
    # in batches of 100, at most 7 (an early generation's share of the rate is spent
    # while later ones are young). The bound of 10 failed once in CI (11, RedisBloom):
    # at a mean of 4 that is a 0.3% chance a run. Above 15 is about 1e-5; the bug this
    # guards against answered 2,544 seen.
    assert seen <= 15, (seen, len(bf.generations))
    assert bf.counters.new == len(items) - seen
    # No generation was filled far past its capacity.
    fills = [info.estimated_items / info.sizing.capacity for info in bf.info().generations]
    assert max(fills[:-1]) < 1.3, fills
    assert not any(bf.add_many(items))


def test_a_batch_still_goes_in_one_round_trip_while_there_is_room(client: redis.Redis) -> None:
    plan = sizing.plan(100_000, sizing.first_generation_error_rate(0.001, True))
    bf = BloomFilter.open(client, "g", plan, growth=True, use_lock=False)
    bf.add_many(fps(200, "warm-"))  # the first look at the fill
    client.config_resetstat()
    assert bf.add_many(fps(1_000)) == [True] * 1_000
    calls = client.info("commandstats")["cmdstat_evalsha"]["calls"]
    assert calls == 4  # 1,000 items in calls of at most 256, one round trip
