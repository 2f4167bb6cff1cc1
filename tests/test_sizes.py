"""The sizes issue 36 declares, held: a maintainer can keep each piece in their head.

Lines are counted as ``wc -l`` counts them (newlines). ``benchmarks/`` is its
scripts (``cat benchmarks/*.py | wc -l``); ``benchmarks/docsite`` is data.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "scrapy_bloomdupe"

BENCHMARKS_LIMIT = 2000
MODULE_LIMIT = 600
SCHEDULER_LIMIT = 400
README_LIMIT = 250


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n")


def over(path: Path, limit: int) -> str:
    return f"{path.relative_to(ROOT)}: {lines(path):,} lines, over the limit of {limit:,}"


def test_benchmarks_within_their_limit() -> None:
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    assert scripts
    total = sum(lines(p) for p in scripts)
    biggest = ", ".join(f"{p.name} {lines(p)}" for p in
                        sorted(scripts, key=lines, reverse=True)[:3])
    assert total <= BENCHMARKS_LIMIT, (
        f"benchmarks/*.py: {total:,} lines in all, over the limit of {BENCHMARKS_LIMIT:,} "
        f"(largest: {biggest})")


@pytest.mark.parametrize("module", sorted(PACKAGE.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_package_module_within_its_limit(module: Path) -> None:
    assert lines(module) <= MODULE_LIMIT, over(module, MODULE_LIMIT)


def test_scheduler_within_its_limit() -> None:
    scheduler = PACKAGE / "scheduler.py"
    assert lines(scheduler) <= SCHEDULER_LIMIT, over(scheduler, SCHEDULER_LIMIT)


def test_readme_within_its_limit() -> None:
    readme = ROOT / "README.md"
    assert lines(readme) <= README_LIMIT, over(readme, README_LIMIT)
