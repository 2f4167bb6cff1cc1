"""Errors raised by scrapy-bloomdupe, all under :class:`BloomDupeError`."""

from __future__ import annotations

from collections.abc import Mapping


class BloomDupeError(Exception):
    """Base class of every error this package raises."""


class ConfigError(BloomDupeError, ValueError):
    """A setting has a value that cannot work; the message names both."""

    def __init__(self, setting: str, value: object, reason: str) -> None:
        self.setting = setting
        self.value = value
        self.reason = reason
        super().__init__(f"{setting}={value!r}: {reason}")


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


class LockError(BloomDupeError):
    """A problem with a shard lock; ``name`` is the lock's Redis key."""

    def __init__(self, message: str, name: str) -> None:
        self.name = name
        super().__init__(f"{message} (lock {name!r})")


class LockNotOwnedError(LockError):
    """The lock expired while held and was possibly taken by another worker."""


class FilterLostError(BloomDupeError):
    """The filter's state in Redis is gone or was replaced under the crawl (deleted,
    evicted, flushed, a restart without persistence): the crawl cannot go on with it."""
