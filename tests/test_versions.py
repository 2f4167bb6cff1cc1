"""The floors pyproject.toml declares, read back from the installed metadata and checked
at start (scrapy_bloomdupe/versions.py): a worker below a floor refuses to start."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from importlib import metadata

import pytest
from helpers import ROOT
from packaging.requirements import Requirement
from packaging.version import Version
from scrapy.settings import Settings

from scrapy_bloomdupe import connection, versions
from scrapy_bloomdupe.exceptions import BloomDupeError, DependencyVersionError

REQUIREMENTS = [Requirement("scrapy>=2.16"), Requirement("redis[hiredis]>=8.0,<9"),
                Requirement("mmh3>=4.0")]


def installed(**found: str) -> Callable[[str], str]:
    def version_of(name: str) -> str:
        if name not in found:
            raise metadata.PackageNotFoundError(name)
        return found[name]
    return version_of


@pytest.fixture
def fresh_check() -> Iterator[None]:
    """The process-wide check forgotten before and after the test."""
    versions._installed_mismatches.cache_clear()
    yield
    versions._installed_mismatches.cache_clear()


def test_versions_in_range_pass() -> None:
    assert versions.mismatches(REQUIREMENTS, installed(
        scrapy="2.16.0", redis="8.1.0", mmh3="5.3.1")) == []


@pytest.mark.parametrize(("name", "version", "shown"), [
    ("scrapy", "2.15.2", "scrapy 2.15.2 installed, needs scrapy>=2.16"),
    ("mmh3", "3.1.0", "mmh3 3.1.0 installed, needs mmh3>=4.0"),
    # The upper bound counts too; the extra is not part of what to install.
    ("redis", "9.0.0", "redis 9.0.0 installed, needs redis<9,>=8.0"),
    ("redis", "7.4.1", "redis 7.4.1 installed, needs redis<9,>=8.0"),
])
def test_a_version_out_of_range_is_named_with_its_floor(name: str, version: str,
                                                        shown: str) -> None:
    found = {"scrapy": "2.19.0", "redis": "8.1.0", "mmh3": "5.3.1", name: version}
    (mismatch,) = versions.mismatches(REQUIREMENTS, installed(**found))
    assert (mismatch.name, mismatch.installed) == (name, version)
    assert str(mismatch) == shown


def test_a_pre_release_at_the_floor_passes_and_below_it_does_not() -> None:
    assert versions.mismatches(REQUIREMENTS[:1], installed(scrapy="2.17.0rc1")) == []
    (mismatch,) = versions.mismatches(REQUIREMENTS[:1], installed(scrapy="2.16.0rc1"))
    assert mismatch.installed == "2.16.0rc1"


def test_a_missing_package_is_named() -> None:
    (mismatch,) = versions.mismatches(REQUIREMENTS, installed(
        scrapy="2.19.0", redis="8.1.0"))
    assert str(mismatch) == "mmh3 not installed, needs mmh3>=4.0"


def test_a_version_that_does_not_parse_is_left_alone() -> None:
    assert versions.mismatches(REQUIREMENTS[2:], installed(mmh3="local-build")) == []


def test_the_floors_are_read_from_the_installed_metadata() -> None:
    names = {r.name for r in versions.runtime_requirements()}
    assert {"scrapy", "scrapy-redis", "redis", "greenlet", "mmh3", "tqdm",
            "packaging"} <= names
    # Extras (the test tools) are not runtime requirements.
    assert not names & {"pytest", "hypothesis", "sphinx", "prometheus-client"}
    for requirement in versions.runtime_requirements():
        assert requirement.specifier, f"{requirement.name} has no floor"


def test_this_environment_meets_the_floors(fresh_check: None) -> None:
    versions.check_installed()


def test_a_dependency_below_its_floor_stops_the_client(monkeypatch: pytest.MonkeyPatch,
                                                       fresh_check: None) -> None:
    real = metadata.version
    monkeypatch.setattr(metadata, "version",
                        lambda name: "3.1.0" if name == "mmh3" else real(name))
    with pytest.raises(DependencyVersionError) as info:
        connection.from_settings(Settings({"REDIS_URL": "redis://127.0.0.1:1/0"}))
    assert isinstance(info.value, BloomDupeError)
    floor = next(r for r in versions.runtime_requirements() if r.name == "mmh3").specifier
    assert info.value.problems == [f"mmh3 3.1.0 installed, needs mmh3{floor}"]
    assert f"pip install 'mmh3{floor}'" in str(info.value)


def floor_of(requirement: Requirement) -> Version:
    (floor,) = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
    return floor


def test_the_floor_lane_pins_every_floor_at_the_floor_python() -> None:
    """constraints-floor.txt (scripts/floor-lane) pins each runtime requirement at the
    floor pyproject.toml declares, and the lane runs on the lowest Python it allows."""
    pins = {}
    for line in (ROOT / "constraints-floor.txt").read_text().splitlines():
        if line.split("#")[0].strip():
            pin = Requirement(line)
            (spec,) = pin.specifier
            assert spec.operator == "==", line
            pins[pin.name] = Version(spec.version)
    for requirement in versions.runtime_requirements():
        assert pins.get(requirement.name) == floor_of(requirement), requirement
    declared = metadata.metadata(versions.DISTRIBUTION)["Requires-Python"]
    requires_python = Requirement(f"python{declared}")
    lane = re.search(r"^want=(\S+)$", (ROOT / "scripts" / "floor-lane").read_text(), re.M)
    assert lane is not None and Version(lane.group(1)) == floor_of(requires_python)
