"""The filter's shards over a Redis Cluster's masters: every operation, the spread, growth.

On the session's local cluster (3 masters, 3 replicas; ``local_cluster`` in
tests/conftest.py), every master emptied and every script cache flushed before
each test.
"""

from __future__ import annotations

import pytest
import redis
from harness.local_cluster import LocalCluster
from helpers import CLUSTER_SHARDS, fps, node_clients, plan, shard_of
from redis.cluster import RedisCluster
from redis.crc import key_slot

from scrapy_bloomdupe import keys, sizing
from scrapy_bloomdupe.bloom.filter import BloomFilter
from scrapy_bloomdupe.bloom.placement import shard_nodes, shard_slots

KEY = "cl"


@pytest.mark.parametrize("use_lock", [True, False], ids=["lock", "atomic"])
def test_every_operation_works_on_a_cluster(rc: RedisCluster, local_cluster: LocalCluster,
                                            use_lock: bool) -> None:
    bf = BloomFilter.open(rc, KEY, plan(), use_lock=use_lock)
    try:
        spread = shard_nodes(rc, bf)
        items = fps(3000, "op-")
        # One add_many whose shards live on all three masters.
        batch = items[:60]
        shards = {shard_of(bf, fp) for fp in batch}
        assert {n for n, idx in spread.items() if set(idx) & shards} == set(spread), spread
        assert bf.add_many(batch) == [True] * len(batch)
        assert bf.add_many(batch) == [False] * len(batch)
        assert bf.add(items[60]) is True
        assert bf.add(items[60]) is False
        assert sum(bf.add_many(items)) == len(items) - 61
        assert all(bf.contains_many(items))
        others = fps(1000, "other-")
        assert sum(bf.contains_many(others)) <= 5
        link = bf.link.counters
        assert link is not None and link.retries == 0 and link.round_trips > 0
        info = bf.info()
        assert len(info.shards) == CLUSTER_SHARDS
        assert abs(info.estimated_items - len(items)) < 0.02 * len(items), info.estimated_items
        assert info.memory_bytes >= CLUSTER_SHARDS * bf.sizing.bytes_per_shard
        # Every master holds bits: the shards' keys really are spread.
        masters = node_clients(local_cluster)
        held = {name: c.dbsize() for name, c in masters.items()}
        assert all(held[name] > 0 for name in spread if spread[name]), (held, spread)
        bf.clear()
        left = {name: c.dbsize() for name, c in masters.items()}
        assert left == dict.fromkeys(masters, 0), left
        for c in masters.values():
            c.close()
    finally:
        bf.close()


def test_shards_spread_over_every_master_and_each_shard_is_one_slot(
    rc: RedisCluster, local_cluster: LocalCluster,
) -> None:
    bf = BloomFilter.open(rc, KEY, plan(12))
    try:
        spread = shard_nodes(rc, bf)
        masters = {f"127.0.0.1:{p}" for p in local_cluster.master_ports()}
        assert set(spread) == masters
        assert all(spread[m] for m in masters), f"a master holds no shard: {spread}"
        assert sorted(i for idx in spread.values() for i in idx) == list(range(12))
        slots = shard_slots(bf)
        for i in range(12):
            fixed = [*(bf.shard_key(i, g) for g in range(len(bf.generations))),
                     keys.lock(bf.key, i), keys.generation_marker(bf.key, i),
                     keys.op_log(bf.key, i, bf.client_id)]
            assert {key_slot(k.encode()) for k in fixed} == {slots[i]}
        assert len(set(slots)) == 12
        # The shard's node as the client sees it is the node that holds its keys.
        for name, indexes in spread.items():
            node = redis.Redis(host="127.0.0.1", port=int(name.rsplit(":", 1)[1]))
            assert all(node.exists(bf.shard_key(i)) for i in indexes), name
            node.close()
    finally:
        bf.close()


def test_growth_works_on_a_cluster(rc: RedisCluster) -> None:
    small = sizing.plan(2000, 0.0001, shards=6)
    bf = BloomFilter.open(rc, KEY, small, growth=True)
    try:
        items = fps(6000, "grow-")
        new = 0
        for start in range(0, len(items), 100):
            new += sum(bf.add_many(items[start:start + 100]))
        assert len(bf.generations) >= 2
        assert new >= len(items) - 10, new
        assert all(bf.contains_many(items))
        for i in range(6):
            keys = [bf.shard_key(i, g) for g in range(len(bf.generations))]
            assert len({key_slot(k.encode()) for k in keys}) == 1
    finally:
        bf.clear()
        bf.close()
