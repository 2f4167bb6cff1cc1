"""Errors raised by scrapy-bloomdupe, all under :class:`BloomDupeError`."""

from __future__ import annotations

from collections.abc import Mapping

from . import __version__, redaction


class BloomDupeError(Exception):
    """Base class of every error this package raises."""


class ConfigError(BloomDupeError, ValueError):
    """A setting has a value that cannot work; the message names both. A value that may hold
    a password is redacted or left out (:func:`~.redaction.shown`); ``value`` keeps only what
    the message shows."""

    def __init__(self, setting: str, value: object, reason: str) -> None:
        self.setting = setting
        self.reason = reason
        self.value = redaction.safe_value(setting, value)
        shown = redaction.shown(setting, value)
        super().__init__(f"{setting}: {reason}" if shown is None
                         else f"{setting}={shown}: {reason}")


class FilterMismatchError(BloomDupeError):
    """The filter stored in Redis was made with other parameters than this worker's."""

    def __init__(self, key: str, differences: Mapping[str, tuple[object, object]]) -> None:
        self.key = key
        self.differences = dict(differences)
        listed = ", ".join(
            f"{name}: stored {stored!r}, this worker {ours!r}"
            for name, (stored, ours) in sorted(differences.items())
        )
        super().__init__(
            f"The Bloom filter at {key!r} was created with other parameters ({listed}). "
            "Every worker must use the same ones: set the worker's BLOOMDUPE_* settings to "
            "the stored values, or give the new configuration a new key (BLOOMDUPE_KEY) or "
            "delete the old filter (`bloomdupe clear`)."
        )


class NewerFilterError(BloomDupeError):
    """The filter stored in Redis is of a format newer than this worker reads."""

    def __init__(self, key: str, found: int, reads: int) -> None:
        self.key, self.found = key, found
        super().__init__(
            f"The Bloom filter at {key!r} is of format {found}, written by a newer "
            f"scrapy-bloomdupe; this worker is scrapy-bloomdupe {__version__} and reads "
            f"formats up to {reads}: upgrade this worker (docs/upgrading.md)")


class BuildError(BloomDupeError):
    """This build cannot run on the crawl's state or beside its live workers' builds
    (see :func:`scrapy_bloomdupe.versions.refusal`)."""


class FilterFullError(BloomDupeError):
    """The newest generation refused items (a shard past its headroom) and the filter may not
    grow; ``reason`` is what stops it, if any."""

    def __init__(self, key: str, capacity: int, growth: bool, reason: str | None) -> None:
        self.key = key
        why = ("BLOOMDUPE_GROWTH is off" if not growth
               else f"it cannot grow ({reason})" if reason else "no generation was added")
        super().__init__(
            f"The Bloom filter at {key!r} is full (its newest generation holds {capacity} "
            f"items, and a shard refused more) and {why}. Start a new filter with a larger "
            "BLOOMDUPE_CAPACITY under another BLOOMDUPE_KEY, or turn BLOOMDUPE_GROWTH on "
            "(and raise BLOOMDUPE_MAX_BYTES if that is what stops it)."
        )


class FilterLostError(BloomDupeError):
    """The filter's state in Redis is gone or replaced (deleted, evicted, flushed, restart
    without persistence): the crawl cannot go on."""


class DependencyVersionError(BloomDupeError):
    """Installed dependencies outside the tested versions: ``problems`` (one entry each) and
    ``requirements`` (what to install)."""

    def __init__(self, problems: list[str], requirements: list[str]) -> None:
        self.problems = list(problems)
        self.requirements = list(requirements)
        wanted = " ".join(f"'{r}'" for r in requirements)
        super().__init__(
            f"{'; '.join(problems)} (the versions scrapy-bloomdupe is tested with: "
            f"docs/install.md). Install them with `pip install {wanted}`."
        )
