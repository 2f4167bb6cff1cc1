"""Each Lua script called directly against a real redis-server, with the KEYS and ARGV its
file's header lists: a change to a script's layout fails here, next to its cause.

The check-and-add script runs on both engines (``engine`` fixture): replay after a
lost reply, fencing, a missing shard, a stale generation, a refused write. Every test
on one node runs on Redis and on Valkey (``server`` fixture).
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest
import redis
from harness.local_cluster import LocalCluster
from redis.crc import key_slot
from redis.exceptions import NoPermissionError, ResponseError

from scrapy_bloomdupe import luascript
from scrapy_bloomdupe.bloom.lua import CROSS_SLOT

BLOOM = "scrapy_bloomdupe.bloom"
FRONTIER = "scrapy_bloomdupe.frontier"
OP_LOG, MARKER, LOCK, QUEUE = "{t}:op", "{t}:gen", "{t}:lock", "{t}:queue"
FORGOT = "{t}:forgot"
BITS = ["{t}:bits:0", "{t}:bits:1"]
K = 4  # bits an item (Lua engine)


@pytest.fixture
def redis_url(server_url: str) -> str:
    """This module's tests on one node run on each server (Redis, Valkey) in turn."""
    return server_url


@pytest.fixture
def engine_url(engine_server_url: str) -> str:
    return engine_server_url


def script(client: redis.Redis, package: str, name: str) -> Any:
    return client.register_script(luascript.read(package, name))


def sink_keys(tag: str) -> list[str]:
    """A queue shard's five keys the check-and-add's sink takes (frontier/sink.lua)."""
    return [f"{{{tag}}}:queue", f"{{{tag}}}:ready", f"{{{tag}}}:slotdefaults",
            f"{{{tag}}}:slotwaiting", f"{{{tag}}}:slotrobots"]


def sink_args(tag: str, items: list[int], slot: str = "") -> list[Any]:
    """The sink's arguments: the slot prefix, then per item its slot ('' : the intake, a
    sorted set scored by the item), priority (or score), limits and entry."""
    return [f"{{{tag}}}:slot:", *(a for item in items for a in (
        slot, item if not slot else -item, 2 if slot else "", 0 if slot else "",
        f"request-{item}"))]


class CheckAdd:
    """One engine's check-and-add script on shard ``{t}``, with G generations made."""

    def __init__(self, client: redis.Redis, engine: str, generations: int = 1) -> None:
        self.client, self.engine, self.g = client, engine, generations
        name = "check_add_bits.lua" if engine == "lua" else "check_add_bf.lua"
        self.script = script(client, BLOOM, name)
        for key in BITS[:generations]:
            self.make(key)

    def make(self, key: str) -> None:
        if self.client.exists(key):
            return
        if self.engine == "lua":
            script(self.client, BLOOM, "create_shard.lua")(keys=[key], args=[64])
        else:
            self.client.execute_command("BF.RESERVE", key, 0.01, 100, "NONSCALING")

    def item_args(self, item: int) -> list[Any]:
        if self.engine == "lua":  # its name, then k distinct offsets per generation
            return [f"item-{item}",
                    *((item * 7 + i * 97) % 512 for _ in range(self.g) for i in range(K))]
        return [f"item-{item}"]

    def __call__(self, items: list[int], *, call: int = 1, ack: int = 1, token: str = "",
                 sink: bool = False, g: int | None = None, slot: str = "") -> Any:
        g = self.g if g is None else g
        gen_args: list[Any] = [g, *([K] * g)] if self.engine == "lua" else [g]
        item_args = [a for item in items for a in self.item_args(item)]
        script_keys = [OP_LOG, MARKER, LOCK, FORGOT, *BITS[:g]] + (sink_keys("t") if sink else [])
        sunk = sink_args("t", items, slot) if sink else []
        # The Lua engine's calls carry sections (one here): the sink flag, then its count.
        sections = ["1" if sink else "0"] if self.engine == "lua" else []
        return self.script(keys=script_keys, args=[token, call, ack, 60_000, *gen_args,
                                                     *sections, len(items), *item_args,
                                                     *sunk])

    def state(self) -> tuple[Any, ...]:
        """Everything the script may write."""
        c = self.client
        return (c.get(OP_LOG), c.get(MARKER), c.get(LOCK), *(c.dump(k) for k in BITS),
                c.zrange(QUEUE, 0, -1, withscores=True))


@pytest.fixture
def check_add(engine_client: redis.Redis, engine: str) -> CheckAdd:
    return CheckAdd(engine_client, engine)


def test_check_add_answers_new_then_seen_and_queues_only_the_new(check_add: CheckAdd) -> None:
    assert check_add([1, 2], sink=True) == b"11"
    assert check_add([2, 3], call=3, ack=3, sink=True) == b"01"
    assert check_add.client.zrange(QUEUE, 0, -1) == [b"request-1", b"request-2", b"request-3"]


def test_an_item_twice_in_one_call_is_new_once(check_add: CheckAdd) -> None:
    assert check_add([5, 5], sink=True) == b"10"
    assert check_add.client.zcard(QUEUE) == 1


def test_a_retried_call_gets_its_first_answer_and_writes_nothing(check_add: CheckAdd) -> None:
    """The reply was lost: the same call id and ack again is answered from the op log."""
    assert check_add([1, 2], call=10, ack=10, sink=True) == b"11"
    before = check_add.state()
    assert check_add([1, 2], call=10, ack=10, sink=True) == b"11"
    assert check_add.state() == before
    # A second call in the same round trip is recorded beside the first...
    assert check_add([3], call=12, ack=10, sink=True) == b"1"
    assert check_add([1, 2], call=10, ack=10, sink=True) == b"11"
    # ...and a new ack forgets both: the items are seen now.
    assert check_add([1, 2], call=13, ack=13) == b"00"


def test_a_retry_frees_the_lock_it_took_again(check_add: CheckAdd) -> None:
    check_add.client.set(LOCK, "tok")
    assert check_add([1], call=20, ack=20, token="tok") == b"1"
    assert check_add.client.get(LOCK) is None
    check_add.client.set(LOCK, "tok")
    assert check_add([1], call=20, ack=20, token="tok") == b"1"
    assert check_add.client.get(LOCK) is None


def test_a_token_the_lock_no_longer_holds_is_refused_having_written_nothing(
        check_add: CheckAdd) -> None:
    before = check_add.state()
    assert check_add([1], token="mine", sink=True) == -1  # no lock at all (it expired)
    check_add.client.set(LOCK, "theirs")
    assert check_add([1], token="mine", sink=True) == -1
    assert check_add.state()[3:] == before[3:]
    assert check_add.client.get(OP_LOG) is None
    assert check_add.client.get(LOCK) == b"theirs"


def test_a_missing_shard_is_reported_never_recreated(check_add: CheckAdd) -> None:
    check_add.client.delete(BITS[0])
    check_add.client.set(LOCK, "tok")
    assert check_add([1], token="tok", sink=True) == -3
    assert not check_add.client.exists(BITS[0], OP_LOG, QUEUE)
    assert check_add.client.get(LOCK) is None  # released


def test_a_worker_behind_on_generations_is_refused(engine_client: redis.Redis,
                                                   engine: str) -> None:
    check_add = CheckAdd(engine_client, engine, generations=2)
    assert check_add([1], g=2) == b"1"
    assert engine_client.get(MARKER) == b"2"
    assert check_add([2], call=2, ack=2, g=1) == -2  # knows one generation only
    assert check_add([2], call=3, ack=3, g=2) == b"1"


def test_an_item_in_an_older_generation_is_seen_and_not_added_again(
        engine_client: redis.Redis, engine: str) -> None:
    one = CheckAdd(engine_client, engine, generations=1)
    assert one([1]) == b"1"
    two = CheckAdd(engine_client, engine, generations=2)
    newest = engine_client.dump(BITS[1])
    assert two([1], call=2, ack=2) == b"0"
    assert engine_client.dump(BITS[1]) == newest


def test_a_forgotten_item_is_new_once_then_seen_again(check_add: CheckAdd) -> None:
    """`bloomdupe forget` puts the item's name in the shard's forgotten set: the next
    check answers new (and queues it) however many of its bits are set, once."""
    c = check_add.client
    assert check_add([1], sink=True) == b"1"
    c.sadd(FORGOT, "item-1", "item-9")
    assert check_add([1, 2, 1], call=2, ack=2, sink=True) == b"110"
    assert c.smembers(FORGOT) == {b"item-9"}
    assert c.zrange(QUEUE, 0, -1) == [b"request-1", b"request-2"]  # 1 queued again
    assert check_add([1, 2, 1], call=2, ack=2, sink=True) == b"110"  # a retry: the log
    assert check_add([1], call=5, ack=5) == b"0"


def test_a_sink_the_acl_refuses_fails_before_any_write(check_add: CheckAdd) -> None:
    c = check_add.client
    c.acl_setuser("nozadd", enabled=True, passwords=["+pw"], keys=["*"],
                  commands=["+@all", "-zadd"])
    try:
        limited = as_user(c, "nozadd")
        before = check_add.state()
        with pytest.raises(NoPermissionError, match="zadd"):
            CheckAdd.__call__(_as(check_add, limited), [1], sink=True)
        assert check_add.state() == before
        limited.close()
    finally:
        c.acl_deluser("nozadd")


def test_a_forget_the_acl_cannot_honour_fails_before_any_write(check_add: CheckAdd) -> None:
    """Without +srem a worker refuses a call while the shard has forgotten items, having
    written nothing; with none pending it needs no more than before."""
    c = check_add.client
    c.acl_setuser("nosrem", enabled=True, passwords=["+pw"], keys=["*"],
                  commands=["+@all", "-srem"])
    try:
        limited = as_user(c, "nosrem")
        assert CheckAdd.__call__(_as(check_add, limited), [1], sink=True) == b"1"
        c.sadd(FORGOT, "item-1")
        before = check_add.state()
        with pytest.raises(NoPermissionError, match="srem"):
            CheckAdd.__call__(_as(check_add, limited), [1, 2], call=2, ack=2, sink=True)
        assert check_add.state() == before and c.scard(FORGOT) == 1
        limited.close()
    finally:
        c.acl_deluser("nosrem")


# -- a Lua engine call of several shards (one Redis node, or one master of a cluster) -----


def second_shard(tag: str) -> dict[str, Any]:
    return {"marker": f"{{{tag}}}:gen", "lock": f"{{{tag}}}:lock", "forgot": f"{{{tag}}}:forgot",
            "bits": [f"{{{tag}}}:bits:0"], "queue": f"{{{tag}}}:queue", "tag": tag}


class TwoShards(CheckAdd):
    """``check_add_bits.lua`` with two sections: shard ``{t}`` (the op log's) and a second.

    On a cluster (``cluster``) the second shard is another slot of ``{t}``'s master, the
    script carries the cross-slot flag and takes every key but the op log in ARGV, as
    :class:`~scrapy_bloomdupe.bloom.lua.LuaEngine` sends it there."""

    def __init__(self, client: redis.Redis, second: str = "u", *, cluster: bool = False) -> None:
        super().__init__(client, "lua")
        self.second = second_shard(second)
        self.cluster = cluster
        if cluster:
            self.script = client.register_script(
                CROSS_SLOT + luascript.read(BLOOM, "check_add_bits.lua"))
        self.make(self.second["bits"][0])

    def call2(self, first: list[int], second: list[int], *, call: int = 1, ack: int = 1,
              token: str = "", g: int = 1, other: dict[str, Any] | None = None) -> Any:
        other = other or self.second
        script_keys = [OP_LOG, MARKER, LOCK, FORGOT, *BITS[:g], *sink_keys("t"),
                       other["marker"], other["lock"], other["forgot"],
                       *other["bits"][:g], *sink_keys(other["tag"])]
        args: list[Any] = [token, call, ack, 60_000, g, *([K] * g), "1"]
        for tag, items in (("t", first), (other["tag"], second)):
            args.append(len(items))
            args.extend(a for item in items for a in self.item_args(item))
            args.extend(sink_args(tag, items))
        if self.cluster:
            return self.script(keys=script_keys[:1],
                               args=[*args, *script_keys[1:], len(script_keys) - 1])
        return self.script(keys=script_keys, args=args)

    def state(self) -> tuple[Any, ...]:
        c = self.client
        return (*super().state(), c.get(self.second["marker"]), c.get(self.second["lock"]),
                c.dump(self.second["bits"][0]),
                c.zrange(self.second["queue"], 0, -1, withscores=True))


def owner(c: redis.Redis, tag: str) -> int:
    """The port of the master that holds ``{tag}``'s slot."""
    slot = key_slot(f"{{{tag}}}".encode())
    return next(int(master[1]) for first, last, master, *_ in
                c.execute_command("CLUSTER", "SLOTS") if first <= slot <= last)


def tag_on(c: redis.Redis, same: bool) -> str:
    """A hash tag of another slot than ``{t}``'s, on ``{t}``'s master (``same``) or not."""
    home = owner(c, "t")
    return next(f"s{i}" for i in range(10_000) if key_slot(f"{{s{i}}}".encode()) !=
                key_slot(b"{t}") and (owner(c, f"s{i}") == home) == same)


@pytest.fixture(params=["node", "cluster"])
def two(request: pytest.FixtureRequest) -> Iterator[TwoShards]:
    if request.param == "node":  # on Redis (the module's other tests run on Valkey too)
        c = redis.Redis.from_url(request.getfixturevalue("redis_server").url)
        c.flushall()
        yield TwoShards(c)
        c.close()
        return
    servers: LocalCluster = request.getfixturevalue("local_cluster")
    servers.wait_ok()
    servers.flushall()
    any_node = servers.node(servers.master_ports()[0]).client()
    c = servers.node(owner(any_node, "t")).client()
    any_node.close()
    yield TwoShards(c, tag_on(c, True), cluster=True)
    c.close()


def test_a_call_of_two_shards_answers_each_in_order_and_queues_each_in_its_own(
        two: TwoShards) -> None:
    assert two.call2([1, 2], [3]) == b"111"
    assert two.call2([2], [3, 4], call=4, ack=4) == b"001"
    assert two.client.zrange(QUEUE, 0, -1) == [b"request-1", b"request-2"]
    assert two.client.zrange(two.second["queue"], 0, -1) == [b"request-3", b"request-4"]


def test_a_section_whose_lock_is_busy_is_left_alone_the_others_go_ahead(
        two: TwoShards) -> None:
    c = two.client
    c.set(LOCK, "mine")
    c.set(two.second["lock"], "theirs")
    bits = c.dump(two.second["bits"][0])
    assert two.call2([1], [3], token="mine") == b"1B"
    assert c.get(LOCK) is None and c.get(two.second["lock"]) == b"theirs"
    assert c.dump(two.second["bits"][0]) == bits and not c.exists(two.second["queue"])
    # A retry after a lost reply gets the same answer and frees the locks it took again.
    c.set(LOCK, "mine")
    assert two.call2([1], [3], token="mine") == b"1B"
    assert c.get(LOCK) is None
    # No lock of the call holds its token: refused, nothing written.
    before = two.state()
    assert two.call2([5], [6], call=9, ack=9, token="mine") == -1
    assert two.state() == before


def test_a_retried_call_of_two_shards_writes_nothing(two: TwoShards) -> None:
    assert two.call2([1], [3], call=10, ack=10) == b"11"
    before = two.state()
    assert two.call2([1], [3], call=10, ack=10) == b"11"
    assert two.state() == before


def test_a_missing_shard_in_any_section_stops_the_call_before_any_write(
        two: TwoShards) -> None:
    c = two.client
    c.delete(two.second["bits"][0])
    c.set(LOCK, "tok")
    c.set(two.second["lock"], "tok")
    assert two.call2([1], [3], token="tok") == -3
    assert not c.exists(OP_LOG) and not c.exists(QUEUE)
    assert not c.exists(two.second["queue"]) and not c.exists(two.second["bits"][0])
    assert c.get(LOCK) is None and c.get(two.second["lock"]) is None  # released


def test_a_shard_ahead_of_the_call_s_generations_refuses_the_whole_call(
        two: TwoShards) -> None:
    c = two.client
    c.set(two.second["marker"], 2)
    before = two.state()
    assert two.call2([1], [3]) == -2
    assert two.state() == before


@pytest.mark.parametrize("two", ["cluster"], indirect=True)
def test_on_a_cluster_a_section_of_another_master_fails_the_call_before_any_write(
        two: TwoShards) -> None:
    """A shard whose slot moved to another master (the client's slot map is stale): the
    call reads every key before its first write, so the master refuses it having
    written nothing (the client then redoes its items a call a shard)."""
    c = two.client
    c.set(LOCK, "tok")
    before = two.state()
    with pytest.raises(ResponseError, match="non local key"):
        two.call2([1], [3], token="tok", other=second_shard(tag_on(c, False)))
    assert two.state() == before


def as_user(client: redis.Redis, user: str) -> redis.Redis:
    kwargs = client.connection_pool.connection_kwargs
    return redis.Redis(host=kwargs["host"], port=kwargs["port"], username=user, password="pw")


def _as(check_add: CheckAdd, client: redis.Redis) -> CheckAdd:
    other = object.__new__(CheckAdd)
    other.__dict__.update(check_add.__dict__, client=client,
                          script=client.register_script(check_add.script.script))
    return other


@pytest.mark.parametrize("bf_server", ["redisbloom_server", "valkey_redisbloom"])
def test_redisbloom_reports_a_full_shard_item_by_item(bf_server: str,
                                                      request: pytest.FixtureRequest) -> None:
    """Redis answers BF.INSERT into a full shard item by item; Valkey raises the whole
    call (bf_insert.lua): both come out as 'F' for each refused item."""
    server = request.getfixturevalue(bf_server)
    if isinstance(server, str):
        pytest.skip(server)
    bf_only = redis.Redis.from_url(server.url)
    bf_only.flushall()
    check_add = CheckAdd(bf_only, "redisbloom")
    bf_only.delete(BITS[0])
    bf_only.execute_command("BF.RESERVE", BITS[0], 0.01, 2, "NONSCALING")
    assert check_add(list(range(4))) == b"11FF"
    bf_only.close()


# -- the filter's other scripts ----------------------------------------------------------


def test_create_shard_makes_it_once_at_full_size(client: redis.Redis) -> None:
    create = script(client, BLOOM, "create_shard.lua")
    assert create(keys=["s"], args=[100]) == 100
    client.setbit("s", 3, 1)
    assert create(keys=["s"], args=[100]) == 100
    assert client.getbit("s", 3) == 1


def test_create_meta_never_overwrites(client: redis.Redis) -> None:
    create = script(client, BLOOM, "create_meta.lua")
    assert create(keys=["m"], args=["seed", 1]) == [b"seed", b"1"]
    assert create(keys=["m"], args=["seed", 2]) == [b"seed", b"1"]


def test_release_lock_deletes_only_its_own_token(client: redis.Redis) -> None:
    release = script(client, BLOOM, "release_lock.lua")
    client.set("l", "theirs")
    assert release(keys=["l"], args=["mine"]) == 0
    assert client.get("l") == b"theirs"
    assert release(keys=["l"], args=["theirs"]) == 1
    assert not client.exists("l")


# -- the queue's scripts ------------------------------------------------------------------

LEASES, OWNERS, RECORD = "{q}:leases", "{q}:owners", "{q}:push:me"
Q = "{q}:queue"


def test_push_runs_once_per_number(client: redis.Redis) -> None:
    push = script(client, FRONTIER, "push.lua")
    assert push(keys=[Q, RECORD], args=[1, 60_000, 0, "a", -1, "b"]) == 2
    assert push(keys=[Q, RECORD], args=[1, 60_000, 0, "a", -1, "b"]) == -1
    assert client.zrange(Q, 0, -1) == [b"b", b"a"]
    assert push(keys=[Q, RECORD], args=[2, 60_000, 0, "c"]) == 1


@pytest.fixture
def queued(client: redis.Redis) -> Iterator[redis.Redis]:
    client.zadd(Q, {"low": 5, "high": -5, "mid": 0})
    yield client


def test_pop_leases_by_priority_and_a_retry_gets_the_same(queued: redis.Redis) -> None:
    pop = script(queued, FRONTIER, "pop.lua")
    first = pop(keys=[Q, LEASES, OWNERS], args=["me", 1, 2])
    assert first == [b"-5|high", b"0|mid"]
    assert pop(keys=[Q, LEASES, OWNERS], args=["me", 1, 2]) == first
    assert queued.zrange(Q, 0, -1) == [b"low"]
    assert queued.hgetall(LEASES) == {b"me:1.0": b"-5|high", b"me:1.1": b"0|mid"}
    assert queued.zscore(OWNERS, "me")


def test_pop_the_acl_refuses_moves_nothing(queued: redis.Redis) -> None:
    queued.acl_setuser("nohset", enabled=True, passwords=["+pw"], keys=["*"],
                       commands=["+@all", "-hset"])
    try:
        limited = as_user(queued, "nohset")
        with pytest.raises(NoPermissionError, match="hset"):
            script(limited, FRONTIER, "pop.lua")(keys=[Q, LEASES, OWNERS], args=["me", 1, 2])
        assert queued.zcard(Q) == 3
        assert not queued.exists(LEASES, OWNERS)
        limited.close()
    finally:
        queued.acl_deluser("nohset")


def test_reap_gives_back_a_dead_owners_leases_counted(queued: redis.Redis) -> None:
    pop = script(queued, FRONTIER, "pop.lua")
    reap = script(queued, FRONTIER, "reap.lua")
    pop(keys=[Q, LEASES, OWNERS], args=["dead", 1, 1])
    pop(keys=[Q, LEASES, OWNERS], args=["live", 1, 1])
    assert reap(keys=[Q, LEASES, OWNERS], args=[60_000, ""]) == []  # both alive
    queued.zadd(OWNERS, {"dead": 0})  # its last heartbeat long ago
    assert reap(keys=[Q, LEASES, OWNERS], args=[60_000, ""]) == [b"-5|\x00rq1\x00high"]
    assert queued.zscore(Q, b"\x00rq1\x00high") == -5
    assert list(queued.hgetall(LEASES)) == [b"live:1.0"]
    assert queued.zscore(OWNERS, "dead") is None
    # Taken and expired again: counted twice.
    pop(keys=[Q, LEASES, OWNERS], args=["dead", 2, 1])
    queued.zadd(OWNERS, {"dead": 0})
    assert reap(keys=[Q, LEASES, OWNERS], args=[60_000, ""]) == [b"-5|\x00rq2\x00high"]


def test_reap_gives_back_a_closing_owners_leases_uncounted(queued: redis.Redis) -> None:
    script(queued, FRONTIER, "pop.lua")(keys=[Q, LEASES, OWNERS], args=["me", 1, 3])
    assert script(queued, FRONTIER, "reap.lua")(keys=[Q, LEASES, OWNERS],
                                                 args=[60_000, "me"]) == []
    assert sorted(queued.zrange(Q, 0, -1)) == [b"high", b"low", b"mid"]
    assert not queued.exists(LEASES)


def test_reclaim_puts_back_what_the_worker_does_not_hold(queued: redis.Redis) -> None:
    script(queued, FRONTIER, "pop.lua")(keys=[Q, LEASES, OWNERS], args=["me", 1, 3])
    reclaim = script(queued, FRONTIER, "reclaim.lua")
    assert sorted(reclaim(keys=[Q, LEASES], args=["me", "me:1.0"])) == [b"me:1.1", b"me:1.2"]
    assert queued.zrange(Q, 0, -1) == [b"mid", b"low"]
    assert list(queued.hgetall(LEASES)) == [b"me:1.0"]


def test_heartbeat_and_leave(client: redis.Redis) -> None:
    beat = script(client, FRONTIER, "heartbeat.lua")
    leave = script(client, FRONTIER, "leave.lua")
    assert beat(keys=[OWNERS], args=["a"]) == 1
    assert beat(keys=[OWNERS], args=["b"]) == 1
    assert beat(keys=[OWNERS], args=["a"]) == 0
    assert leave(keys=[OWNERS], args=["a", 60_000]) == 0  # b is live
    client.zadd(OWNERS, {"b": 0})  # b stopped long ago
    assert leave(keys=[OWNERS], args=["c", 60_000]) == 1


def test_a_heartbeat_given_the_lease_timeout_counts_the_other_live_workers(
        client: redis.Redis) -> None:
    beat = script(client, FRONTIER, "heartbeat.lua")
    assert beat(keys=[OWNERS], args=["a", "", 60_000]) == 0  # alone
    assert beat(keys=[OWNERS], args=["b", "", 60_000]) == 1
    client.zadd(OWNERS, {"gone": 0})  # silent for longer than the lease timeout
    assert beat(keys=[OWNERS], args=["a", "", 60_000]) == 1
    assert client.zcard(OWNERS) == 3  # counted, not removed (the reap's work)


def test_merge_moves_the_other_shards_into_shard_0_and_keeps_the_later_heartbeat(
        client: redis.Redis) -> None:
    merge = script(client, FRONTIER, "merge.lua")
    other = ["{r}:queue", "{r}:leases", "{r}:owners"]
    client.zadd(Q, {"a": 1})
    client.zadd(OWNERS, {"w1": 100, "w2": 900})
    client.zadd(other[0], {"b": -3, "c": 2})
    client.hset(other[1], "w1:4.0", "0|d")
    client.zadd(other[2], {"w1": 500, "w2": 400, "w3": 50})
    assert merge(keys=[Q, LEASES, OWNERS, *other]) == 3
    assert client.zrange(Q, 0, -1, withscores=True) == [(b"b", -3), (b"a", 1), (b"c", 2)]
    assert client.hgetall(LEASES) == {b"w1:4.0": b"0|d"}
    assert client.zrange(OWNERS, 0, -1, withscores=True) == [
        (b"w3", 50), (b"w1", 500), (b"w2", 900)]
    assert not client.exists(*other)
    assert merge(keys=[Q, LEASES, OWNERS, *other]) == 0  # nothing left: a no-op


def test_requeue_failed_moves_records_back_once(client: redis.Redis) -> None:
    stream = "{q}:failed"
    one = client.xadd(stream, {"score": -3, "request": "r1", "url": "u", "method": "GET",
                               "reason": "x"})
    requeue = script(client, FRONTIER, "requeue_failed.lua")
    assert requeue(keys=[stream, Q], args=[one, "0-1"]) == 1
    assert requeue(keys=[stream, Q], args=[one]) == 0
    assert client.zrange(Q, 0, -1, withscores=True) == [(b"r1", -3.0)]
    assert client.xlen(stream) == 0


def test_every_script_file_is_headed_by_its_keys_and_return() -> None:
    for package in (BLOOM, FRONTIER):
        for path in resources.files(package).iterdir():
            if path.name.endswith(".lua"):
                text = path.read_text()
                assert text.startswith("-- "), path.name
                head = text.split("\n\n")[0]
                if head.startswith("-- A block, not a script"):  # included (slot_state.lua)
                    continue
                assert "KEYS[1]" in head and "Returns" in head, path.name


def test_an_included_block_is_whole_in_the_script() -> None:
    """``-- #include`` (luascript.read): the slot scripts share slot_state.lua's block."""
    block = luascript.read(FRONTIER, "slot_state.lua")
    acl = luascript.read(FRONTIER, "slot_acl.lua")
    for name in ("slot_push.lua", "slot_pop.lua", "slot_ack.lua", "slot_reap.lua",
                 "slot_backoff.lua"):
        text = luascript.read(FRONTIER, name)
        assert block in text, name
        # The ACL is asked before the first command of the script.
        assert text.index(acl) < text.index("redis.call("), name
        assert not any(line.startswith(luascript.INCLUDE) for line in text.split("\n"))


def test_an_unknown_script_name_is_an_error() -> None:
    with pytest.raises(FileNotFoundError):
        luascript.read(BLOOM, "nope.lua")


def test_a_command_refused_inside_a_script_raises_and_the_push_is_not_recorded(
        client: redis.Redis) -> None:
    with pytest.raises(ResponseError, match="float"):
        script(client, FRONTIER, "push.lua")(keys=[Q, RECORD], args=[1, 60_000, "x", "a"])
    assert not client.exists(Q, RECORD)


# -- check-and-add with a window (bloom/window.py) ------------------------------------

SLICE_MS, SLICES = 60_000, 8
RECORD, SLICE_KEYS = "{t}:slices", "{t}:slice:"


class WindowCheckAdd:
    """One engine's windowed check-and-add script on shard ``{t}``: generation g holds
    ``cap * 2**g`` items (with ``max_gens`` above 1) and has ``K + g`` hashes."""

    def __init__(self, client: redis.Redis, engine: str, cap: int = 100,
                 max_gens: int = 1) -> None:
        self.client, self.engine, self.cap, self.max_gens = client, engine, cap, max_gens
        name = "check_add_window_bits.lua" if engine == "lua" else "check_add_window_bf.lua"
        self.script = script(client, BLOOM, name)
        client.hset(RECORD, "made", 1)  # as the filter's creation does

    def now_slice(self) -> int:
        seconds, micros = self.client.time()
        return (seconds * 1000 + micros // 1000) // SLICE_MS

    def key(self, s: int, g: int = 0) -> str:
        return f"{SLICE_KEYS}{s}" + (f":g{g}" if g else "")

    def __call__(self, items: list[int], c: int, *, call: int = 1, ack: int = 1,
                 gens: dict[int, int] | None = None) -> Any:
        believed = [(gens or {}).get(s, 1) for s in range(c - SLICES, c + 1)]
        most = max(believed)
        shapes = [x for g in range(most + 1) for x in (
            [64 << g, K + g, self.cap << g] if self.engine == "lua"
            else [0.01 / 2**g, (self.cap << g) * 2, self.cap << g])]
        item_args = [a for item in items for a in (
            [f"item-{item}", *((item * 7 + i * 97) % (512 << g)
                               for g in range(most) for i in range(K + g))]
            if self.engine == "lua" else [f"item-{item}"])]
        slice_keys = [self.key(s, g) for s, b in zip(range(c - SLICES, c + 1), believed,
                                                           strict=True)
                      for g in range(b)] + [self.key(c, believed[-1])]
        return self.script(keys=[OP_LOG, RECORD, LOCK, FORGOT, *slice_keys],
                           args=["", call, ack, 60_000, SLICE_MS, SLICES, c, len(items),
                                 most, self.max_gens, *shapes, *believed, *item_args])


@pytest.fixture
def window_check_add(engine_client: redis.Redis, engine: str) -> WindowCheckAdd:
    return WindowCheckAdd(engine_client, engine)


def test_a_window_call_makes_its_slice_and_sets_it_to_expire(
        window_check_add: WindowCheckAdd) -> None:
    w, c = window_check_add, window_check_add.now_slice()
    reply = w([1, 2, 1], c)
    if isinstance(reply, list):  # a slice had just started
        c = reply[0]
        reply = w([1, 2, 1], c, call=2, ack=2)
    assert reply == b"110"
    assert w.client.pexpiretime(w.key(c)) == (c + SLICES + 1) * SLICE_MS
    assert w.client.hget(RECORD, str(c)) == b"1"
    assert w([1], c, call=5, ack=5) == b"0"


def test_a_window_call_with_an_old_slice_is_told_redis_s_and_writes_nothing(
        window_check_add: WindowCheckAdd) -> None:
    w = window_check_add
    c = w.now_slice()
    reply = w([1], c - 3)
    assert isinstance(reply, list) and reply[0] in (c, c + 1)
    assert reply[1] // SLICE_MS == reply[0]
    assert reply[2:] == [0] * (SLICES + 1)  # the live slices' generations: none made
    assert w.client.keys("*") == [RECORD.encode()]


def test_a_recorded_slice_gone_before_its_time_is_reported(
        window_check_add: WindowCheckAdd) -> None:
    w = window_check_add
    c = w.now_slice()
    w.client.hset(RECORD, str(c - 2), 1)  # made, due to expire well after now
    reply = w([1], c)
    assert reply == -3 or isinstance(reply, list)
    assert not w.client.exists(OP_LOG, w.key(c))


def test_a_lost_slice_record_is_reported_not_made_again(
        window_check_add: WindowCheckAdd) -> None:
    """The record is made with the filter: without it a deleted slice would look like
    one never made (every item in it new again)."""
    w = window_check_add
    c = w.now_slice()
    w.client.delete(RECORD)
    reply = w([1], c)
    assert reply == -3 or isinstance(reply, list)
    assert w.client.keys("*") == []


def test_a_call_that_believes_other_generations_is_told_them_and_writes_nothing(
        window_check_add: WindowCheckAdd) -> None:
    w = window_check_add
    c = w.now_slice()
    reply = w([1], c, gens={c - 1: 2})
    assert isinstance(reply, list)
    assert reply[2:] == [0] * (SLICES + 1)
    assert w.client.keys("*") == [RECORD.encode()]


def test_a_slice_grows_a_generation_once_its_newest_holds_its_share(
        engine_client: redis.Redis, engine: str) -> None:
    w = WindowCheckAdd(engine_client, engine, cap=3, max_gens=3)
    c = w.now_slice()
    reply = w([1, 2, 3, 4, 5], c)
    if isinstance(reply, list):
        c = reply[0]
        reply = w([1, 2, 3, 4, 5], c, call=2, ack=2)
    if engine == "lua":
        # Generation 1 made at the 4th item: this call has no offsets for it ('G').
        assert reply == b"111GG"
        assert w.client.hget(RECORD, str(c)) == b"2"
        # Asked again (a new call) with two generations: added to the new one; the
        # three in generation 0 are still seen.
        assert w([4, 5, 1], c, call=9, ack=9, gens={c: 2}) == b"110"
    else:
        # RedisBloom needs no offsets: the call goes on in generation 1.
        assert reply == b"11111"
        assert w.client.hget(RECORD, str(c)) == b"2"
        assert w([4, 5, 1], c, call=9, ack=9, gens={c: 2}) == b"000"
    assert w.client.exists(w.key(c, 1))
    assert w.client.pexpiretime(w.key(c, 1)) == (c + SLICES + 1) * SLICE_MS
    # Another client that believes one generation is told two, having written nothing.
    stale = w([6], c, call=20, ack=20)
    assert isinstance(stale, list) and stale[2 + SLICES] == 2


def test_a_forgotten_item_is_answered_new_even_when_its_slice_is_full(
        engine_client: redis.Redis, engine: str) -> None:
    """With growth off a RedisBloom slice past its capacity refuses items ('F'): a
    forgotten one is still answered new (and taken out of the set), so the forget is
    not lost with the refusal."""
    w = WindowCheckAdd(engine_client, engine, cap=2)
    c = w.now_slice()
    reply = w(list(range(1, 9)), c)
    if isinstance(reply, list):
        c = reply[0]
        reply = w(list(range(1, 9)), c, call=2, ack=2)
    if engine == "redisbloom":
        assert b"F" in reply  # 4 items fit (cap 2, reserved for twice that)
    w.client.sadd(FORGOT, "item-1", "item-8")
    assert w([1, 8, 20], c, call=30, ack=30) == (b"11F" if engine == "redisbloom" else b"111")
    assert not w.client.exists(FORGOT)


def test_the_check_and_add_scripts_share_one_op_log_and_fence() -> None:
    """The op log's replay and record (op_log.lua), one shard's lock and fence
    (shard_lock.lua) and the window's slices (window_slices.lua) are blocks the
    check-and-add scripts include, whole (a retry must be answered alike by every
    engine); each script still reads on its own in its file."""
    names = sorted(path.name for path in resources.files(BLOOM).iterdir()
                   if path.name.startswith("check_add") and path.name.endswith(".lua"))
    assert names == ["check_add_bf.lua", "check_add_bits.lua", "check_add_window_bf.lua",
                     "check_add_window_bits.lua"]
    op_log = luascript.read(BLOOM, "op_log.lua")
    lock = luascript.read(BLOOM, "shard_lock.lua")
    slices = luascript.read(BLOOM, "window_slices.lua")
    for name in names:
        text = luascript.read(BLOOM, name)
        assert op_log in text, name
        assert text.rstrip().endswith("return answer(reply)"), name
        assert not any(line.startswith(luascript.INCLUDE) for line in text.split("\n"))
        # Nothing is written before a retry's recorded answer is looked up.
        assert "redis.call('S" not in text[:text.index(op_log)].replace(
            luascript.read(FRONTIER, "sink.lua"), ""), name
        if name != "check_add_bits.lua":  # one shard a call: its lock, then its fence
            assert text.index(lock) < text.index(op_log), name
            assert "if token ~= '' and not held then return -1 end" in text, name
        assert (slices in text) == ("window" in name), name


# -- the sink: the check-and-add queues into the download slots' lists --------------------


def test_check_add_queues_each_new_item_straight_into_its_slot_s_list(
        check_add: CheckAdd) -> None:
    """No intake: the new items go into the slot's list of their priority, the slot into
    the ready set, the waiting count up by as many; a seen item queues nothing."""
    c = check_add.client
    assert check_add([1, 2], sink=True, slot="a.example") == b"11"
    assert check_add([2, 3], call=3, ack=3, sink=True, slot="a.example") == b"01"
    assert not c.exists(QUEUE)
    assert c.lrange("{t}:slot:a.example:-1", 0, -1) == [b"request-1"]
    assert c.lrange("{t}:slot:a.example:-3", 0, -1) == [b"request-3"]
    assert c.zrange("{t}:ready", 0, -1) == [b"a.example"]
    assert c.get("{t}:slotwaiting") == b"3"
    assert c.hgetall("{t}:slot:a.example") == {b"prios": b"-1,-2,-3", b"conc": b"2"}


def test_a_retried_check_add_queues_nothing_twice(check_add: CheckAdd) -> None:
    c = check_add.client
    assert check_add([1, 2], call=10, ack=10, sink=True, slot="s") == b"11"
    before = (c.get("{t}:slotwaiting"), c.lrange("{t}:slot:s:-1", 0, -1))
    assert check_add([1, 2], call=10, ack=10, sink=True, slot="s") == b"11"
    assert (c.get("{t}:slotwaiting"), c.lrange("{t}:slot:s:-1", 0, -1)) == before


def test_the_sink_keeps_a_slot_s_robots_txt_delay(check_add: CheckAdd) -> None:
    c = check_add.client
    c.hset("{t}:slotrobots", "s", 1500)
    assert check_add([1], sink=True, slot="s") == b"1"
    assert c.hget("{t}:slot:s", "delay") == b"1500"


def test_a_sink_the_acl_refuses_a_list_push_fails_before_any_write(
        check_add: CheckAdd) -> None:
    c = check_add.client
    c.acl_setuser("norpush", enabled=True, passwords=["+pw"], keys=["*"],
                  commands=["+@all", "-rpush"])
    try:
        limited = as_user(c, "norpush")
        before = check_add.state()
        with pytest.raises(NoPermissionError, match="rpush"):
            CheckAdd.__call__(_as(check_add, limited), [1], sink=True, slot="s")
        assert check_add.state() == before and not c.exists("{t}:slot:s:-1")
        limited.close()
    finally:
        c.acl_deluser("norpush")
