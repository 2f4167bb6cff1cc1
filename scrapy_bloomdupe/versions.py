"""The versions this package is tested with (a worker below a floor stops at start), and
the builds of this package that may run on one crawl's state together (:func:`refusal`).

The floors are written once, in ``pyproject.toml``, and read back from the installed metadata,
so a dependency outside its specifier (upper bounds too: docs/install.md) is caught when the
Redis client is first built (:func:`scrapy_bloomdupe.connection.from_settings`), before a crawl
that could fetch nothing and still exit 0.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

from .exceptions import DependencyVersionError

#: The distribution whose metadata holds the floors.
DISTRIBUTION = "scrapy-bloomdupe"


@dataclass(frozen=True)
class Mismatch:
    """A runtime requirement the installed version does not meet (``installed`` None: absent)."""

    name: str
    installed: str | None
    required: str

    def __str__(self) -> str:
        installed = "not installed" if self.installed is None else f"{self.installed} installed"
        return f"{self.name} {installed}, needs {self.requirement}"

    @property
    def requirement(self) -> str:
        return f"{self.name}{self.required}"


def runtime_requirements(distribution: str = DISTRIBUTION) -> list[Requirement]:
    """The requirements of ``distribution`` that apply without extras, on this Python."""
    found = []
    for line in metadata.requires(distribution) or ():
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            found.append(requirement)
    return found


def mismatches(requirements: Sequence[Requirement],
               version_of: Callable[[str], str] = metadata.version) -> list[Mismatch]:
    """The ``requirements`` whose installed version (``version_of(name)``) is outside their
    specifier; a version that does not parse is left alone (a local build)."""
    found = []
    for requirement in requirements:
        required = str(requirement.specifier)
        try:
            installed = version_of(requirement.name)
        except metadata.PackageNotFoundError:
            found.append(Mismatch(requirement.name, None, required))
            continue
        try:
            version = Version(installed)
        except InvalidVersion:
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            found.append(Mismatch(requirement.name, installed, required))
    return found


@functools.cache
def _installed_mismatches() -> tuple[Mismatch, ...]:
    try:
        requirements = runtime_requirements()
    except metadata.PackageNotFoundError:
        return ()  # run from a source tree that was never installed: nothing to read
    # Looked up through the module at call time, so a test can stand in for it.
    return tuple(mismatches(requirements, lambda name: metadata.version(name)))


def check_installed() -> None:
    """Raise :class:`DependencyVersionError` if a runtime dependency is outside its range."""
    found = _installed_mismatches()
    if found:
        raise DependencyVersionError([str(m) for m in found], [m.requirement for m in found])


# -- the builds of one crawl: which may run on its state together --------------------------

#: What a build before 0.2.0 (which records no version in Redis) is called in a refusal.
UNRECORDED = "0.1.0 (or another release before 0.2.0)"


@dataclass(frozen=True)
class Build:
    """A worker's build as its heartbeat records it (``keys.builds``): version and state format."""

    version: str
    format: int

    def __str__(self) -> str:
        return f"{self.version} {self.format}"

    @classmethod
    def parse(cls, text: bytes | str) -> Build | None:
        """A recorded build (None when the record cannot be read: another tool's)."""
        if isinstance(text, bytes):
            text = text.decode(errors="replace")
        version, _, written = text.partition(" ")
        return cls(version, int(written)) if version and written.isdigit() else None


def _newest(builds: Sequence[Build]) -> str | None:
    """The version of the newest of ``builds`` (by format, then version)."""
    def order(build: Build) -> tuple[int, Version]:
        try:
            return build.format, Version(build.version)
        except InvalidVersion:  # a local build: its format still orders it
            return build.format, Version("0")
    return max(builds, key=order).version if builds else None


def refusal(tag: str, ours: Build, state: str | None, live: Sequence[Build | None],
            recorded: Sequence[Build] = ()) -> str | None:
    """Why a worker of build ``ours`` must not start on the crawl ``tag`` (one line naming both
    builds and what to do), or None when it may. ``state``: the crawl's format record (None:
    none); ``live``: the builds of its live workers (None: one before 0.2.0); ``recorded``:
    every build recorded on it (to name the one that wrote a newer state)."""
    newer_live = [b for b in live if b is not None and b.format > ours.format]
    newer_state = state is not None and (not state.isdigit() or int(state) > ours.format)
    if newer_state or newer_live:
        found = state if newer_state else str(max(b.format for b in newer_live))
        writers = [b for b in [*recorded, *newer_live] if b.format > ours.format]
        newest = _newest(writers)
        wrote = f"scrapy-bloomdupe {newest}" if newest else "a newer scrapy-bloomdupe"
        to = newest if newest else f"a release that reads format {found}"
        return (f"The crawl {tag!r} holds state of format {found}, written by {wrote}; this "
                f"worker is scrapy-bloomdupe {ours.version} and reads formats up to "
                f"{ours.format}: upgrade this worker to {to}")
    older = sorted({b.version if b is not None else UNRECORDED for b in live
                    if b is None or b.format < ours.format})
    if older:
        count = sum(1 for b in live if b is None or b.format < ours.format)
        return (f"The crawl {tag!r} has {count} live worker(s) of scrapy-bloomdupe "
                f"{', '.join(older)}, which cannot read the state this worker "
                f"(scrapy-bloomdupe {ours.version}, format {ours.format}) writes: stop the "
                f"workers of {', '.join(older)} first (a worker killed less than "
                "BLOOMDUPE_LEASE_TIMEOUT ago counts as live until then), then start this one")
    return None
