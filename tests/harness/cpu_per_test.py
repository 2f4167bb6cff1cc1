"""A pytest plugin: each test's wall time and the CPU of the processes it started and
reaped (``getrusage``), one JSON line a test in ``$CPU_PER_TEST_DIR/<pid>.jsonl``.

``CPU_PER_TEST_DIR=out PYTHONPATH=tests/harness pytest -p cpu_per_test -n auto``:
what docs/development.md says of where the suite's time goes (waiting, not CPU)."""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[None]:
    started, own, children = (time.monotonic(), _cpu(resource.RUSAGE_SELF),
                              _cpu(resource.RUSAGE_CHILDREN))
    yield
    out = Path(os.environ.get("CPU_PER_TEST_DIR", "cpu-per-test"))
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"{os.getpid()}.jsonl").open("a") as f:
        f.write(json.dumps({"id": item.nodeid, "wall": time.monotonic() - started,
                            "self": _cpu(resource.RUSAGE_SELF) - own,
                            "children": _cpu(resource.RUSAGE_CHILDREN) - children}) + "\n")
