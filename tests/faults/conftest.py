"""Fixtures of the fault tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from racing import RACE_WORKERS, spawn_pool


@pytest.fixture(scope="module")
def pool() -> Iterator[Any]:
    """The races' spawned worker processes, reused by every case of a module, and a
    barrier they share."""
    with spawn_pool(RACE_WORKERS) as p:
        yield p
