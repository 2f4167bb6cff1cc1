"""What a filter holds, per shard, per generation and in all: fill, estimated items and
false-positive rate, memory. Engine-neutral: each engine reads its shards' figures."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .. import sizing


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
    #: The generation's index; with a window, its time slice's id.
    index: int
    sizing: sizing.Sizing
    shards: list[ShardInfo]
    #: With a window: which of its slice's generations this is (0 unless it grew).
    slice_generation: int = 0

    @property
    def label(self) -> str:
        """``index``, and with a window the slice's generation after it once it grew."""
        return str(self.index) + (f"/g{self.slice_generation}" if self.slice_generation
                                  else "")

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
    #: ``"lua"`` or ``"redisbloom"`` (``BLOOMDUPE_ENGINE``, as stored with the filter).
    engine: str = "lua"

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
        """1 - prod(1 - p_g) over generations; tiny rates (a fresh filter's) kept, not 0."""
        rates = [g.estimated_false_positive_rate for g in self.generations]
        if max(rates) >= 1:
            return 1.0
        # 0.0 - x, not -x: an empty filter's rate is 0, not -0 ("est. FPR -0" in the log).
        return 0.0 - math.expm1(sum(math.log1p(-p) for p in rates))

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
            "engine": self.engine,
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
