"""Make the fixtures of tests/e2e/test_layout_migration.py: the Redis state an earlier
build of this package left, written by that build itself.

For each build (a commit): ``git worktree add /work/old/<hash> <hash>`` with its own
venv (``python3 -m venv /work/old/<hash>/.venv && /work/old/<hash>/.venv/bin/pip install
-e /work/old/<hash>``; reused when it is there). Then a fresh redis-server and this
checkout's demo site (``--delay``, so that requests are in flight), and two ``scrapy
crawl site`` workers of that build (its own example_project, its own venv): once part
of the site is fetched, one worker is SIGKILLed (its leases stay in Redis) and the
other stopped gracefully (SIGINT: its queue kept). Every key of the database is then
written to ``tests/fixtures/queue-<hash>.json``: its name, type, TTL and ``DUMP`` (hex),
with the site's pages, seed and port (the queued URLs name it) and the times each
page was fetched so far.

    .venv/bin/python scripts/make_queue_fixtures.py af26940 68cfe88
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from harness.processes import start_site, stop  # noqa: E402

from scrapy_bloomdupe.testing import RedisServer  # noqa: E402

OLD = Path("/work/old")
PAGES = 120
SEED = 48
KEY = "fixture:bloomdupe"


def build(commit: str) -> Path:
    """The worktree of ``commit`` with its venv (made when absent, else waited for)."""
    tree = OLD / commit
    scrapy = tree / ".venv" / "bin" / "scrapy"
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", str(tree), commit],
                       check=True)
        subprocess.run(["python3", "-m", "venv", str(tree / ".venv")], check=True)
        subprocess.run([str(tree / ".venv" / "bin" / "pip"), "install", "-q", "-e", str(tree)],
                       check=True)
    for _ in range(600):
        if scrapy.exists():
            return tree
        time.sleep(1)
    raise SystemExit(f"{scrapy} did not appear: another helper's venv is not ready")


def worker(tree: Path, index: int, out: Path, redis_url: str, site_url: str
           ) -> subprocess.Popen[bytes]:
    settings = {"REDIS_URL": redis_url, "DEMO_SITE_URL": site_url, "BLOOMDUPE_KEY": KEY,
                "SCHEDULER_PERSIST": "True", "CONCURRENT_REQUESTS": "4",
                "BLOOMDUPE_LEASE_TIMEOUT": "5", "LOG_FILE": str(out / f"w{index}.log")}
    command = [str(tree / ".venv" / "bin" / "python"), "-m", "scrapy", "crawl", "site"]
    for name, value in settings.items():
        command += ["-s", f"{name}={value}"]
    return subprocess.Popen(command, cwd=tree / "example_project",
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**{k: v for k, v in os.environ.items()
                                    if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
                                 "REDIS_URL": redis_url})


def dump(client: redis.Redis) -> list[dict[str, object]]:
    rows = []
    for name in sorted(client.scan_iter(count=1000)):
        value = client.dump(name)
        if value is None:
            continue
        rows.append({"key": name.decode(), "type": client.type(name).decode(),
                     "pttl": max(0, client.pttl(name)), "dump": value.hex()})
    return rows


def make(commit: str, out_dir: Path) -> Path:
    tree = build(commit)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        server = RedisServer().start()
        site = start_site(out, pages=PAGES, seed=SEED, delay=0.5)
        try:
            client = redis.Redis.from_url(server.url)
            crew = [worker(tree, i, out, server.url, site.url) for i in (1, 2)]
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                fetched = sum(1 for n in site.stats()["fetches"] if n)
                if fetched >= PAGES // 4:
                    break
                time.sleep(0.2)
            else:
                raise SystemExit(f"{commit}: the crawl did not get going (logs: {out})")
            crew[1].kill()  # SIGKILL: its leases stay in Redis
            crew[1].wait()
            crew[0].send_signal(signal.SIGINT)  # graceful: its own leases go back
            try:
                crew[0].wait(60)
            except subprocess.TimeoutExpired:
                stop(crew[0])
            state = {"commit": commit, "pages": PAGES, "seed": SEED, "key": KEY,
                     "site_port": site.port,
                     "fetches": site.stats()["fetches"], "keys": dump(client)}
            client.close()
        finally:
            site.stop()
            server.stop()
    path = out_dir / f"queue-{commit}.json"
    path.write_text(json.dumps(state, indent=1) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("commits", nargs="+")
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for commit in args.commits:
        path = make(commit, args.out)
        state = json.loads(path.read_text())
        sys.stdout.write(f"{path}: {len(state['keys'])} keys, "
                         f"{sum(1 for n in state['fetches'] if n)} of {PAGES} pages fetched\n")


if __name__ == "__main__":
    main()
