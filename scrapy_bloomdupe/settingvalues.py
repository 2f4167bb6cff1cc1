"""Parsers of setting values: Python objects from settings.py, or strings from ``-s NAME=VALUE``.
A setting's name is taken only for the :class:`ConfigError` raised (see :mod:`.settings`)."""

from __future__ import annotations

import json
import math
from typing import Any

from .exceptions import ConfigError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
#: ``-s NAME=none`` means ``NAME = None`` in settings.py: the default.
_NONE = {"none", "null"}


def is_none(value: Any) -> bool:
    """Whether ``value`` is None, or ``None`` (``null``) written on the command line."""
    return value is None or (isinstance(value, str) and value.strip().lower() in _NONE)


def is_unset(value: Any) -> bool:
    """:func:`is_none`, or empty: an optional setting left out."""
    return is_none(value) or (isinstance(value, str) and not value.strip())


def parse_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool):
        raise ConfigError(name, value, "must be a whole number, not a boolean")
    if isinstance(value, str):
        # What Python accepts in settings.py, accepted from -s too: 10_000_000, 1e7.
        text = value.strip().replace("_", "")
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise ConfigError(name, value, "must be a whole number") from None
            if not value.is_integer():
                raise ConfigError(name, text, "must be a whole number") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise ConfigError(name, value, "must be a whole number")
    if value < minimum:
        raise ConfigError(name, value, f"must be at least {minimum}")
    return value


def parse_float(name: str, value: Any, *, low: float, high: float = math.inf,
                low_open: bool = False, high_open: bool = False) -> float:
    if isinstance(value, bool):
        raise ConfigError(name, value, "must be a number, not a boolean")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(name, value, "must be a number") from None
    if math.isnan(number) or number < low or (low_open and number == low) or number > high \
            or (high_open and number == high):
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        raise ConfigError(name, value, f"must be in {left}{low}, {high}{right}")
    return number


def parse_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigError(name, value, "must be true or false")


def parse_choice(name: str, value: object, choices: tuple[str, ...], meaning: str = "") -> str:
    """``value``, one of ``choices`` in any case (``meaning`` says what each is)."""
    if isinstance(value, str) and value.strip().lower() in choices:
        return value.strip().lower()
    raise ConfigError(name, value, f"must be one of {', '.join(choices)}{meaning}")


def parse_codes(name: str, value: Any) -> tuple[int, ...]:
    """A list of HTTP status codes (a list, or a comma-separated string)."""
    items = value.split(",") if isinstance(value, str) else value
    try:
        codes = tuple(int(str(item)) for item in items if str(item).strip())
    except (TypeError, ValueError):
        codes = ()
    if codes and all(100 <= code <= 599 for code in codes):
        return codes
    raise ConfigError(name, value, "must be a list of HTTP status codes, such as [429, 503]")


def parse_dict(name: str, value: Any) -> dict[str, Any]:
    """A dict setting as Scrapy's ``getdict`` reads it: a dict, or a JSON object string."""
    if is_unset(value):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ConfigError(name, value, f"is not valid JSON ({e}); write a JSON object, "
                              'for example {"socket_timeout": 30}') from None
    if hasattr(value, "copy_to_dict"):  # a Scrapy BaseSettings
        value = value.copy_to_dict()
    if not isinstance(value, dict):
        raise ConfigError(name, value, "must be a dict (or a JSON object) of redis client "
                          f"arguments, not {type(value).__name__}")
    return dict(value)
