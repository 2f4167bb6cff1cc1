"""Where a filter's shards live: their keys, their Redis Cluster slots, their masters.

Shard ``i``'s keys carry the hash tag ``{K:i}`` (:mod:`scrapy_bloomdupe.keys`): one slot
on one master a shard, the shards spread over the masters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from redis.crc import key_slot

from .. import keys
from ..transport.cluster import is_cluster
from ..transport.diagnose import describe

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

    from .filter import BloomFilter


def shard_slots(bloom: BloomFilter) -> list[int]:
    """The Redis Cluster slot of each shard, in shard order."""
    return [key_slot(keys.bits(bloom.key, i).encode()) for i in range(bloom.sizing.shards)]


def shard_nodes(client: Redis | RedisCluster, bloom: BloomFilter) -> dict[str, list[int]]:
    """Which master holds which shards: ``{"host:port": [shard index, ...]}``, empty
    masters included (an uneven spread shows); one entry on a single node."""
    shards = range(bloom.sizing.shards)
    if not is_cluster(client):
        return {describe(client): list(shards)}
    cluster: Any = client
    spread: dict[str, list[int]] = {n.name: [] for n in cluster.get_primaries()}
    for index, slot in zip(shards, shard_slots(bloom), strict=True):
        node = cluster.nodes_manager.get_node_from_slot(slot)
        spread.setdefault(node.name, []).append(index)
    return {name: spread[name] for name in sorted(spread)}
