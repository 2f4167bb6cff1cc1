"""End to end: what a real Redis does to a crawl (issue 14's table), with real ``scrapy
crawl`` workers of the example project on its local site, one row each.

Every row ends with no page skipped: each page fetched at least once, at the end.
A page fetched twice, or a stop, only ever comes with a worker that exited with status
1 and said why in one error line. A passing event (Redis full for 2 s) is waited out:
no error exit, no page twice. The rows are ``tests/harness/operator_events.py``'s, which
prints the same figures as a table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from harness import operator_events as ops


@dataclass
class Expect:
    #: What the first stopping worker's error line says; None: the crawl goes through.
    error: str | None
    #: The row's event is at start: no page is fetched before the fix.
    at_start: bool = False
    warning: str | None = None


EXPECT = {
    "oom-passing": Expect(None),
    "oom-lasting": Expect("is out of memory, refusing writes"),
    "allkeys-lru-at-start": Expect("maxmemory-policy allkeys-lru", at_start=True),
    "allkeys-lru-mid-crawl": Expect("maxmemory-policy allkeys-lru"),
    "volatile-lru-squeezed": Expect(None, warning="(maxmemory-policy volatile-lru)"),
    "restart-empty": Expect("lost its state in Redis"),
    "flushdb": Expect("lost its state in Redis"),
    "meta-deleted-then-join": Expect("lost its state in Redis"),
    "shard-deleted": Expect("lost its state in Redis: {site:bloomdupe:0}:bits is gone"),
    "acl-revoked-zadd": Expect("Add +zadd"),
    **{f"acl-lacking-{c}": Expect(f"Add +{c} ", at_start=True) for c in ops.ACL_LACKING},
}


def about(row: ops.Row) -> str:
    lines = [f"{row.name}: twice {row.fetched_twice}, never {row.never_fetched}"]
    for i, phase in enumerate(row.phases, 1):
        lines.append(f"phase {i}: exits {phase.exit_codes}, reasons {phase.finish_reasons}")
        lines.extend(f"  {line}" for line in phase.errors[:5])
        lines.extend(phase.hung)  # a worker that did not exit: its threads' stacks
    return "\n".join(lines)


@pytest.mark.parametrize("name", list(ops.EVENTS))
def test_a_redis_event_never_skips_a_page_silently(tmp_path: Path, name: str) -> None:
    expect = EXPECT[name]
    row = ops.run_row(name, tmp_path)
    first = row.phases[0]
    info = f"{about(row)}\n(logs in {tmp_path})"
    assert row.never_fetched == 0, info
    assert not row.silent, info
    if expect.error is None:
        # Waited out: the crawl goes through, every page once, status 0.
        assert first.exit_codes == [0, 0], info
        assert first.finish_reasons == ["finished", "finished"], info
        assert row.fetched_twice == 0, info
        assert len(row.phases) == 1, info
    else:
        # Stopped: every worker of the first phase exits 1 and says why in one line.
        assert all(code == 1 for code in first.exit_codes), info
        assert any(expect.error in line for line in first.errors), info
        assert not [line for line in first.errors if "Traceback" in line], info
        # Once a worker stopped, nothing more goes to Redis: no Redis job already in line
        # waits the outage out again (each one did, for BLOOMDUPE_OUTAGE_TIMEOUT, and a
        # worker took a minute to close). At most the one under way when it stopped.
        waits = [line for line in first.errors if "retrying for up to" in line]
        assert len(waits) <= 2 * len(first.exit_codes), info
        if expect.at_start:
            assert row.fetched_first == 0, info  # refused before any page
        # After the operator's fix, the next workers finish the crawl.
        assert row.phases[1].exit_codes == [0, 0], info
    if expect.warning is not None:
        assert any(expect.warning in line for line in first.warnings), info
