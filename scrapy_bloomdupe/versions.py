"""The versions this package is tested with: a worker below a floor stops at start.

The floors are written once, in ``pyproject.toml``; they are read back here from
the package's installed metadata (``importlib.metadata.requires``), so a
dependency installed below its floor (``pip install --no-deps``, a pinned
environment) is caught when the Redis client is first built
(:func:`scrapy_bloomdupe.connection.from_settings`), before a crawl that could
fetch nothing and still exit 0. Every runtime requirement is checked against
its whole specifier, the upper bounds too (docs/install.md says why each is
there).
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
    """A runtime requirement the installed version does not meet (``installed`` is None
    when the package is not installed at all)."""

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
    """The ``requirements`` whose installed version (``version_of(name)``) is outside
    their specifier. A version that does not parse is left alone (a local build)."""
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
    """Raise :class:`DependencyVersionError` if an installed runtime dependency is outside
    what ``pyproject.toml`` declares (read once per process)."""
    found = _installed_mismatches()
    if found:
        raise DependencyVersionError([str(m) for m in found], [m.requirement for m in found])
