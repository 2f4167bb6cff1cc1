#!/usr/bin/env python
"""Duplicates accepted during a minority network partition of a Redis Cluster.

``sudo python benchmarks/partition.py`` (root: it makes a network namespace, a
veth pair and nftables rules; needs ``ip``, ``nft``, ``redis-server`` 7+).
``--quick`` runs one short scenario. Prints a Markdown table; ``--json FILE``
keeps the raw figures. Not part of the test suite.

Set-up (all on this machine, real processes, a real network cut):

* a network namespace ``bdpart`` joined to the root namespace by a veth pair:
  10.77.0.1 (root, "majority side") and 10.77.0.2 (namespace, "minority
  side");
* a Redis Cluster of 3 masters and 3 replicas, ``cluster-node-timeout``
  2000 ms (``--node-timeout``): master M1 and one worker process run in the
  namespace; M1's replica R1, the other masters and replicas, and the other
  workers run in the root namespace. M1 owns the slot of the filter's shard 0
  (with one shard: the whole filter);
* the partition is an nftables table in the namespace that drops every packet
  in and out of its veth (silent loss, as a cut cable or a dead switch: TCP
  hangs, nothing is refused); healing deletes the table.

Workload: every worker checks the same URL stream in the same order on a
shared clock (URL i is due at start + i / rate), as when every worker finds
the same links at the same time: the worst case for duplicates. A worker is
single-threaded and calls ``BloomFilter.add_many`` with ``--batch`` URLs at a
time (1: Scrapy's scheduler path, one check per request; 20: the batch
middleware's). It waits out errors as the dupefilter does (retry the same call
with growing pauses, never skip a URL), and after a stall it catches up as fast
as Redis answers. It records each URL the filter reported new to it.

Timeline per run: partition at ``--before`` seconds, heal ``--hold`` seconds
later, stop when every worker has checked every URL (``--after`` seconds of
stream after the heal). Counted from the workers' records: URLs accepted by
two workers (a duplicate crawl), by nobody (a URL never crawled; minus the
Bloom filter's false positives, measured by the no-partition control), and
the moments that explain them: the minority side's last accepted URL during
the cut (M1 stops taking writes once it sees it lost the majority), when R1
was promoted, when the minority side's checks resumed after the heal.
``--keep DIR`` keeps every worker's records (JSON) for a closer look.

Workers start the shared clock only once every one has connected and opened
the filter (which needs ``K:meta``, on whichever master owns its slot).
Results and method: ``docs/guarantees.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NS = "bdpart"
VETH_ROOT, VETH_NS = "bdp0", "bdp1"
IP_MAJ, IP_MIN = "10.77.0.1", "10.77.0.2"
NFT_TABLE = "bdpart"
BASE_PORT = 7301
KEY = "part:bloomdupe"
REPO = Path(__file__).resolve().parent.parent


def run(cmd: list[str], *, ns: bool = False, check: bool = True
        ) -> subprocess.CompletedProcess[str]:
    if ns:
        cmd = ["ip", "netns", "exec", NS, *cmd]
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


# -- the network --------------------------------------------------------------


class Network:
    """The namespace, the veth pair, and the cut."""

    def up(self) -> None:
        self.down()
        run(["ip", "netns", "add", NS])
        run(["ip", "link", "add", VETH_ROOT, "type", "veth", "peer", "name", VETH_NS])
        run(["ip", "link", "set", VETH_NS, "netns", NS])
        run(["ip", "addr", "add", f"{IP_MAJ}/24", "dev", VETH_ROOT])
        run(["ip", "link", "set", VETH_ROOT, "up"])
        run(["ip", "addr", "add", f"{IP_MIN}/24", "dev", VETH_NS], ns=True)
        run(["ip", "link", "set", VETH_NS, "up"], ns=True)
        run(["ip", "link", "set", "lo", "up"], ns=True)

    def cut(self) -> None:
        rules = (f"table inet {NFT_TABLE} {{\n"
                 "  chain in { type filter hook input priority 0; "
                 f"iifname \"{VETH_NS}\" drop; }}\n"
                 "  chain out { type filter hook output priority 0; "
                 f"oifname \"{VETH_NS}\" drop; }}\n"
                 "}\n")
        subprocess.run(["ip", "netns", "exec", NS, "nft", "-f", "-"], input=rules, text=True,
                       check=True, capture_output=True)

    def heal(self) -> None:
        run(["nft", "delete", "table", "inet", NFT_TABLE], ns=True, check=False)

    def down(self) -> None:
        run(["ip", "link", "del", VETH_ROOT], check=False)
        run(["ip", "netns", "del", NS], check=False)


# -- the cluster --------------------------------------------------------------


@dataclass
class Node:
    name: str
    ip: str
    port: int
    dir: Path
    node_timeout: int
    in_ns: bool
    extra: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None
    node_id: str = ""

    def start(self) -> None:
        args = ["redis-server", "--bind", self.ip, "--port", str(self.port),
                "--cluster-port", str(self.port + 10000), "--protected-mode", "no",
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(self.node_timeout),
                "--cluster-announce-ip", self.ip, "--dir", str(self.dir),
                "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0",
                "--maxmemory", "1gb", "--logfile", str(self.dir / "redis.log"), *self.extra]
        if self.in_ns:
            args = ["ip", "netns", "exec", NS, *args]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)

    def client(self) -> Any:
        import redis
        return redis.Redis(host=self.ip, port=self.port, socket_timeout=1,
                           socket_connect_timeout=1, decode_responses=True)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class Cluster:
    """M1 (minority side), M2, M3 and their replicas R1, R2, R3 (majority side)."""

    def __init__(self, node_timeout: int, m1_slots: tuple[int, int],
                 server_args: tuple[str, ...] = ()) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="bloomdupe-partition-"))
        self.nodes: dict[str, Node] = {}
        for i, name in enumerate(("M1", "M2", "M3", "R1", "R2", "R3")):
            d = self.dir / name
            d.mkdir()
            in_ns = name == "M1"
            self.nodes[name] = Node(name, IP_MIN if in_ns else IP_MAJ, BASE_PORT + i, d,
                                    node_timeout, in_ns, list(server_args))
        # M1 gets the range that holds the filter's shard 0; M2 and M3 share the rest.
        lo, hi = m1_slots
        rest = [(0, lo - 1)] if lo > 0 else []
        rest += [(hi + 1, 16383)] if hi < 16383 else []
        free = [s for a, b in rest for s in range(a, b + 1)]
        half = len(free) // 2
        self.slots = {"M1": [(lo, hi)], "M2": _ranges(free[:half]), "M3": _ranges(free[half:])}

    def start(self) -> None:
        for node in self.nodes.values():
            node.start()
        for node in self.nodes.values():
            _wait(lambda n=node: n.client().ping(), f"{node.name} up")
            node.node_id = node.client().execute_command("CLUSTER", "MYID")
        first = self.nodes["M2"].client()
        for node in self.nodes.values():
            first.execute_command("CLUSTER", "MEET", node.ip, node.port, node.port + 10000)
        for name, ranges in self.slots.items():
            c = self.nodes[name].client()
            for a, b in ranges:
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", a, b)
        for r, m in (("R1", "M1"), ("R2", "M2"), ("R3", "M3")):
            master = self.nodes[m].node_id
            _wait(lambda r=r, master=master: self.nodes[r].client().execute_command(
                "CLUSTER", "REPLICATE", master), f"{r} replicates {m}", tolerate=True)
        _wait(self.settled, "cluster ok on every node", timeout=30)

    def settled(self) -> bool:
        for node in self.nodes.values():
            c = node.client()
            info = c.execute_command("CLUSTER", "INFO")
            if "cluster_state:ok" not in info:
                return False
            masters = [line for line in c.execute_command("CLUSTER", "NODES").splitlines()
                       if "master" in line.split()[2] and "fail" not in line.split()[2]]
            if len(masters) != 3:
                return False
            if (node.name.startswith("R")
                    and c.info("replication").get("master_link_status") != "up"):
                return False
        return True

    def role_of(self, name: str, observer: str = "M2") -> str:
        """``name``'s flags as ``observer`` sees them (majority side)."""
        try:
            text = self.nodes[observer].client().execute_command("CLUSTER", "NODES")
        except Exception:
            return "?"
        for line in text.splitlines():
            parts = line.split()
            if parts[0] == self.nodes[name].node_id:
                return parts[2]
        return "?"

    def close(self) -> None:
        for node in self.nodes.values():
            node.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _ranges(slots: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s in slots:
        if out and out[-1][1] == s - 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def _wait(check: Any, what: str, timeout: float = 15.0, tolerate: bool = False) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:
            if not tolerate and time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for: {what}")
        time.sleep(0.1)


# -- a worker -------------------------------------------------------------------


def _fingerprint(i: int) -> bytes:
    import hashlib
    return hashlib.sha1(f"http://part.example/page/{i}".encode()).digest()


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    import redis
    from scrapy.settings import Settings

    from scrapy_bloomdupe import connection
    from scrapy_bloomdupe.bloom.filter import BloomFilter

    settings = Settings({
        "REDIS_URL": spec["url"],
        "REDIS_PARAMS": {"redis_cls": "redis.cluster.RedisCluster",
                         "socket_timeout": spec["socket_timeout"],
                         "socket_connect_timeout": spec["socket_timeout"]},
    })
    client = connection.from_settings(settings)
    bloom = BloomFilter.open(client, KEY, None, use_lock=spec["lock"],
                             wait_replicas=spec["wait_replicas"])
    bloom.contains(_fingerprint(-1))  # connected to the shards' masters too
    # Ready; the clock starts when every worker is.
    Path(spec["ready"]).touch()
    go = Path(spec["go"])
    while not go.exists():
        time.sleep(0.01)
    start = float(go.read_text())
    accepted: list[tuple[int, float]] = []
    errors: list[tuple[float, str]] = []
    rate, batch, count = spec["rate"], spec["batch"], spec["count"]
    stop_by = start + count / rate + spec["grace"]
    i = 0
    while i < count:
        due = start + i / rate
        now = time.time()
        if due > now:
            time.sleep(due - now)
        fps = [_fingerprint(j) for j in range(i, min(i + batch, count))]
        pause = 0.25
        while True:
            try:
                new = bloom.add_many(fps)
                break
            except (redis.RedisError, OSError) as e:
                errors.append((time.time(), f"{type(e).__name__}: {str(e)[:120]}"))
                if time.time() > stop_by:
                    return {"accepted": accepted, "errors": errors, "gave_up_at": i}
                time.sleep(pause)
                pause = min(pause * 2, 2.0)
        t = time.time()
        accepted.extend((j, t) for j, is_new in zip(range(i, i + len(fps)), new, strict=True)
                        if is_new)
        i += len(fps)
    return {"accepted": accepted, "errors": errors, "gave_up_at": None}


# -- one run ------------------------------------------------------------------


@dataclass
class Scenario:
    name: str
    shards: int
    batch: int
    partition: bool = True
    minority_workers: int = 1
    majority_workers: int = 3
    lock: bool = True
    wait_replicas: int = 0
    #: Extra redis-server arguments for every node, e.g. min-replicas-to-write.
    server_args: tuple[str, ...] = ()
    #: cluster-node-timeout for this scenario (None: --node-timeout).
    node_timeout: int | None = None


@dataclass
class Result:
    scenario: Scenario
    duplicates: int
    dup_minority_majority: int
    never: int
    accepted_by_minority_in_window: int
    minority_last_accepted_after: float | None
    minority_first_error_after: float | None
    r1_promoted_after: float | None
    minority_resumed_after: float | None
    urls: int
    errors: dict[str, int] = field(default_factory=dict)


def run_scenario(sc: Scenario, args: argparse.Namespace, net: Network) -> Result:
    from redis.crc import key_slot

    from scrapy_bloomdupe import sizing
    from scrapy_bloomdupe.bloom.filter import BloomFilter

    slot0 = key_slot(f"{{{KEY}:0}}".encode())
    lo = max(0, min(slot0 - 2730, 16383 - 5461))
    node_timeout = sc.node_timeout or args.node_timeout
    cluster = Cluster(node_timeout, (lo, lo + 5460), sc.server_args)
    procs: list[subprocess.Popen[str]] = []
    try:
        cluster.start()
        from redis.cluster import RedisCluster
        admin = RedisCluster(host=IP_MAJ, port=cluster.nodes["M2"].port)
        plan = sizing.plan(args.capacity, 0.001, sc.shards)
        BloomFilter.open(admin, KEY, plan, growth=False)
        admin.close()
        count = int(args.rate * (args.before + args.hold + args.after))
        out = cluster.dir / "out"
        out.mkdir()
        sides = ["minority"] * sc.minority_workers + ["majority"] * sc.majority_workers
        for w, side in enumerate(sides):
            spec = {"url": f"redis://{IP_MAJ}:{cluster.nodes['M2'].port}" if side == "majority"
                    else f"redis://{IP_MIN}:{cluster.nodes['M1'].port}",
                    "ready": str(out / f"{w}.ready"), "go": str(out / "go"),
                    "rate": args.rate, "batch": sc.batch, "count": count,
                    "lock": sc.lock, "wait_replicas": sc.wait_replicas,
                    "socket_timeout": args.socket_timeout,
                    "grace": args.hold + args.after + 60}
            cmd = [sys.executable, __file__, "_worker", json.dumps(spec), str(out / f"{w}.json")]
            if side == "minority":
                cmd = ["ip", "netns", "exec", NS, *cmd]
            procs.append(subprocess.Popen(cmd, cwd=REPO, text=True))
        # Every worker has imported, connected and opened the filter: start the clock.
        _wait(lambda: all((out / f"{w}.ready").exists() for w in range(len(sides)))
              or any(p.poll() is not None for p in procs), "workers ready", timeout=120)
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a worker exited before the start")
        start = time.time() + 0.5
        (out / "go.tmp").write_text(repr(start))
        (out / "go.tmp").rename(out / "go")
        cut_at = start + args.before
        heal_at = cut_at + args.hold
        promoted_at = None
        while time.time() < cut_at:
            time.sleep(0.01)
        if sc.partition:
            net.cut()
        cut_at = time.time()
        while time.time() < heal_at:
            if sc.partition and promoted_at is None and "master" in cluster.role_of("R1"):
                promoted_at = time.time()
            time.sleep(0.05)
        if sc.partition:
            net.heal()
        for p in procs:
            p.wait(timeout=args.before + args.hold + args.after + 180)
        results = [json.loads((out / f"{w}.json").read_text()) for w in range(len(sides))]
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            name = f"{len(list(args.keep.iterdir())):02d}"
            (args.keep / f"{name}.json").write_text(json.dumps({
                "scenario": sc.__dict__, "cut_at": cut_at, "heal_at": heal_at,
                "promoted_at": promoted_at, "sides": sides, "workers": results}))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        net.heal()
        cluster.close()
    by_url: dict[int, list[str]] = {}
    for side, res in zip(sides, results, strict=True):
        for url, _ in res["accepted"]:
            by_url.setdefault(url, []).append(side)
    duplicates = sum(len(v) - 1 for v in by_url.values() if len(v) > 1)
    mixed = sum(1 for v in by_url.values() if "minority" in v and "majority" in v)
    never = count - len(by_url)
    minority = [r for s, r in zip(sides, results, strict=True) if s == "minority"]
    in_window = sum(1 for r in minority for _, t in r["accepted"] if cut_at <= t < heal_at)
    window = [t for r in minority for _, t in r["accepted"] if cut_at <= t < heal_at]
    failed = [t for r in minority for t, e in r["errors"] if t >= cut_at]
    resumed = [t for r in minority for _, t in r["accepted"] if t >= heal_at]
    errors = Counter(e.split(":")[0] for r in results for _, e in r["errors"])
    return Result(
        sc, duplicates, mixed, never, in_window,
        minority_last_accepted_after=round(max(window) - cut_at, 2) if window and sc.partition
        else None,
        minority_first_error_after=round(min(failed) - cut_at, 2) if failed and sc.partition
        else None,
        r1_promoted_after=round(promoted_at - cut_at, 2) if promoted_at else None,
        minority_resumed_after=round(min(resumed) - cut_at, 2) if resumed and sc.partition
        else None,
        urls=count, errors=dict(errors),
    )


SCENARIOS = [
    Scenario("control: no partition, 1 shard, batch 1", shards=1, batch=1, partition=False),
    Scenario("1 shard (on M1), batch 1", shards=1, batch=1),
    Scenario("1 shard (on M1), batch 20", shards=1, batch=20),
    Scenario("1 shard (on M1), batch 1, atomic mode", shards=1, batch=1, lock=False),
    Scenario("12 shards over 3 masters, batch 1", shards=12, batch=1),
    Scenario("12 shards over 3 masters, batch 20", shards=12, batch=20),
    Scenario("1 shard (on M1), batch 1, 2 minority workers", shards=1, batch=1,
             minority_workers=2, majority_workers=2),
    Scenario("1 shard (on M1), batch 1, WAIT 1 replica", shards=1, batch=1, wait_replicas=1),
    Scenario("1 shard (on M1), batch 1, min-replicas-to-write 1, max-lag 1 s", shards=1,
             batch=1, server_args=("--min-replicas-to-write", "1",
                                   "--min-replicas-max-lag", "1")),
    Scenario("1 shard (on M1), batch 1, cluster-node-timeout 5000 ms", shards=1, batch=1,
             node_timeout=5000),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short partition scenario")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each scenario")
    parser.add_argument("--rate", type=float, default=200.0,
                        help="URLs per second per worker on the shared clock")
    parser.add_argument("--before", type=float, default=3.0)
    parser.add_argument("--hold", type=float, default=10.0, help="seconds of partition")
    parser.add_argument("--after", type=float, default=6.0)
    parser.add_argument("--node-timeout", type=int, default=2000)
    parser.add_argument("--socket-timeout", type=float, default=10.0,
                        help="client socket timeout (the package's default is 10 s)")
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--only", help="run the scenarios whose name contains this")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--keep", type=Path, help="keep every worker's records in this directory")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("partition.py needs root (network namespace, veth, nftables)")
    for tool in ("ip", "nft", "redis-server"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found (Debian: apt-get install -y iproute2 nftables "
                     "redis-server)")
    scenarios = SCENARIOS
    if args.quick:
        scenarios = [SCENARIOS[1]]
        args.hold, args.after = 8.0, 4.0
    if args.only:
        scenarios = [s for s in scenarios if args.only in s.name]
    net = Network()
    net.up()
    results: list[Result] = []
    try:
        for sc in scenarios:
            for _ in range(args.repeat):
                print(f"running: {sc.name}", file=sys.stderr, flush=True)
                results.append(run_scenario(sc, args, net))
                r = results[-1]
                print(f"  duplicates {r.duplicates}, never {r.never}, minority accepted "
                      f"{r.accepted_by_minority_in_window} during the cut, the last "
                      f"{r.minority_last_accepted_after}s after it; R1 promoted after "
                      f"{r.r1_promoted_after}s; errors {r.errors}", file=sys.stderr, flush=True)
    finally:
        net.down()
    print(f"\nRedis Cluster 3 masters + 3 replicas, cluster-node-timeout {args.node_timeout} ms; "
          f"partition of {args.hold:g} s cutting M1 and its worker(s) off; {args.rate:g} URLs/s "
          f"per worker on a shared clock (every worker checks every URL); client socket "
          f"timeout {args.socket_timeout:g} s.\n")
    print("| scenario | URLs | accepted twice | never accepted | accepted by the minority "
          "during the cut | its last one, after the cut | R1 promoted after | minority resumed "
          "after | worker errors (after client retries) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        def s(x: float | None) -> str:
            return "-" if x is None else f"{x:.1f} s"
        errors = ", ".join(f"{k} {v}" for k, v in sorted(r.errors.items())) or "0"
        in_cut = r.accepted_by_minority_in_window if r.scenario.partition else "-"
        print(f"| {r.scenario.name} | {r.urls} | {r.duplicates} | {r.never} | "
              f"{in_cut} | {s(r.minority_last_accepted_after)} | "
              f"{s(r.r1_promoted_after)} | {s(r.minority_resumed_after)} | {errors} |")
    if args.json:
        args.json.write_text(json.dumps([
            {**r.__dict__, "scenario": r.scenario.__dict__} for r in results], indent=2))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "_worker":
        spec = json.loads(sys.argv[2])
        with contextlib.suppress(KeyboardInterrupt):
            Path(sys.argv[3]).write_text(json.dumps(worker(spec)))
    else:
        main()
