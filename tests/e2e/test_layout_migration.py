"""Each queue layout an earlier build wrote, taken over by today's workers at their start.

The fixtures (``tests/fixtures/queue-<commit>.json``) are the whole Redis database that
build left, made by ``scripts/make_queue_fixtures.py``: two workers of that build
crawled the demo site part-way; one was SIGKILLed (its leases stay in Redis), the other
stopped gracefully. af26940 (2026-11-27) wrote the sorted-set layout: pickled entries
in ``{K:0}:queue``, leases in the ``{K:0}:leases`` hash, no ``{K:0}:format`` record;
68cfe88 (the main of 2026-11-28) the intake layout, format 2 (its workers moved what
the filter queued into the download slots at once: requests wait in the slots, leases
are lists). Loaded into a fresh redis-server, two of today's workers finish the crawl:
every request that waited or was leased is fetched once, nothing else twice, no page is
left, and the migration says what it did in one INFO line.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from harness.processes import start_site, start_worker, stop

from scrapy_bloomdupe.frontier import entry
from scrapy_bloomdupe.frontier.queue import status

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LINE = re.compile(r"INFO: Migrated the shared queue from (.+?) to format (\d+): (\d+) waiting "
                  r"request\(s\) moved into the download slots, (\d+) lease\(s\) of stopped "
                  r"workers put back")


def load(client: redis.Redis, state: dict[str, Any]) -> None:
    for row in state["keys"]:
        client.restore(row["key"], row["pttl"], bytes.fromhex(row["dump"]), replace=True)


def queued_and_leased(client: redis.Redis) -> tuple[int, int]:
    """What the earlier build left waiting and leased, whatever its layout."""
    waiting = leased = 0
    for name in client.scan_iter(count=1000):
        kind, text = client.type(name), name.decode()
        if text.endswith(":queue") and kind == b"zset":
            waiting += client.zcard(name)
        elif text.endswith(":leases") and kind == b"hash":
            leased += client.hlen(name)
        elif ":slotleased:" in text:
            leased += client.llen(name)
        elif ":slot:" in text and kind == b"list":
            waiting += client.llen(name)
    return waiting, leased


@pytest.mark.parametrize(("commit", "layout"), [
    ("af26940", "the sorted-set layout (the build of 2026-11-27, no format record)"),
    ("68cfe88", "the intake layout (format 2)")])
def test_a_layout_an_earlier_build_left_is_migrated_at_start(
        tmp_path: Path, redis_url: str, client: redis.Redis, commit: str, layout: str) -> None:
    state = json.loads((FIXTURES / f"queue-{commit}.json").read_text())
    load(client, state)
    waiting, leased = queued_and_leased(client)
    assert waiting and leased, "the fixture holds requests waiting and leased"
    before = state["fetches"]
    # The same site on the same port: the queued requests name it.
    site = start_site(tmp_path, pages=state["pages"], seed=state["seed"],
                      port=state["site_port"])
    crew = []
    try:
        settings = {"REDIS_URL": redis_url, "DEMO_SITE_URL": site.url,
                    "BLOOMDUPE_KEY": state["key"], "BLOOMDUPE_LEASE_TIMEOUT": "5",
                    "BLOOMDUPE_DONE_GRACE": "2"}
        crew = [start_worker(i, tmp_path, settings) for i in (1, 2)]
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and any(w.process.poll() is None for w in crew):
            time.sleep(0.5)
        codes = [w.process.poll() for w in crew]
        fetches = site.stats()["fetches"]
    finally:
        for worker in crew:
            stop(worker.process)
            worker.close()
        site.stop()
    logs = "".join(w.log.read_text(errors="replace") for w in crew)
    assert codes == [0, 0], logs[-3000:]
    # No page left; nothing fetched twice now; what the old build had fetched is fetched
    # again only if it was leased (its work may not have been done).
    assert [i for i, (a, b) in enumerate(zip(before, fetches, strict=True)) if not a + b] == []
    assert max(fetches) == 1
    assert sum(1 for a, b in zip(before, fetches, strict=True) if a and b) <= leased
    assert sum(fetches) >= waiting
    lines = LINE.findall(logs)
    assert lines, logs[-3000:]
    assert {(found, int(now)) for found, now, _, _ in lines} == {(layout, entry.STATE_FORMAT)}
    moved = sum(int(m) for _, _, m, _ in lines)
    back = sum(int(b) for _, _, _, b in lines)
    if commit == "af26940":  # the sorted sets and the dead worker's leases, moved
        assert back == leased and moved == waiting + leased
    else:  # already in the slots: the dead worker's leases come back by the reap
        assert moved == back == 0
    # The crawl is done: nothing waits or is leased, in either layout.
    assert queued_and_leased(client) == (0, 0)
    assert status(client, state["key"], 1) == (0, 0)
