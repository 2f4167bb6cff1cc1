"""Every key name (keys.py): the filter's, its shards' hash tags, the queue's."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from scrapy_bloomdupe import keys
from scrapy_bloomdupe.exceptions import ConfigError


def test_a_shards_keys_and_its_queue_share_one_slot() -> None:
    names = [keys.bits("site:bloomdupe", 3), keys.bits("site:bloomdupe", 3, 2),
             keys.lock("site:bloomdupe", 3), keys.generation_marker("site:bloomdupe", 3),
             keys.op_log("site:bloomdupe", 3, "c1"), keys.queue("site:bloomdupe", 3),
             keys.leases("site:bloomdupe", 3), keys.owners("site:bloomdupe", 3),
             keys.push_record("site:bloomdupe", 3, "c1")]
    assert len({key_slot(n.encode()) for n in names}) == 1
    assert key_slot(keys.queue("site:bloomdupe", 4).encode()) != key_slot(names[0].encode())


def test_the_failed_records_live_in_shard_zeros_slot() -> None:
    assert key_slot(keys.failed("k").encode()) == key_slot(keys.queue("k", 0).encode())


def test_names() -> None:
    assert keys.meta("k") == "k:meta" and keys.growlock("k") == "k:growlock"
    assert keys.stats("k") == "k:stats" and keys.workers("k") == "k:workers"
    assert keys.bits("k", 0) == "{k:0}:bits" and keys.bits("k", 0, 1) == "{k:0}:bits:1"


@pytest.mark.parametrize("bad", ["", "a{b", "a}b", 3])
def test_a_key_that_cannot_name_a_filter_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="BLOOMDUPE_KEY"):
        keys.validate_key(bad)  # type: ignore[arg-type]
