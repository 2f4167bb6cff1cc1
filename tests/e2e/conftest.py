"""Fixtures of the end-to-end tests; every test here is ``slow`` (real worker processes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import demo_site

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def site(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The demo site with the test module's ``PAGES`` pages, served from a thread."""
    with demo_site(request.module.PAGES) as server:
        yield server
