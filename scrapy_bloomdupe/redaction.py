"""What an error or a log line may show of a setting that can hold a password.

:func:`redacted` hides a Redis URL's password, whatever characters it holds; :func:`shown` is what
a :class:`~.exceptions.ConfigError` prints: the value, the URL redacted for settings naming a Redis
(:data:`URL_SETTINGS`), nothing for client arguments or passwords (:data:`HIDDEN_SETTINGS`).
"""

from __future__ import annotations

import re
from typing import Any

#: Settings never shown (client arguments or a password), as is any named like _HIDDEN_MARKS.
HIDDEN_SETTINGS = frozenset({"REDIS_PARAMS", "BLOOMDUPE_SENTINEL_PARAMS",
                             "BLOOMDUPE_SENTINEL_PASSWORD"})
#: Settings that name a Redis, shown with :func:`redacted` (a URL's password hidden).
URL_SETTINGS = frozenset({"REDIS_URL", "BLOOMDUPE_REDIS_URL", "REDIS_HOST",
                          "BLOOMDUPE_SENTINELS"})
_HIDDEN_MARKS = ("PASSWORD", "PARAMS", "SECRET", "TOKEN", "CREDENTIAL")
#: Shown instead of a hidden value.
MASK = "***"

_SECRET_QUERY = "password"
#: Characters that end a URL's authority (``user:password@host:port``) for a URL parser.
AUTHORITY_ENDS = "/?#"
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)(.*)", re.DOTALL)


def is_hidden(setting: str) -> bool:
    """Whether no part of ``setting``'s value may be shown."""
    return setting in HIDDEN_SETTINGS or any(mark in setting for mark in _HIDDEN_MARKS)


def may_hold_secret(setting: str) -> bool:
    """Whether ``setting``'s value may hold a password (hidden or shown redacted)."""
    return is_hidden(setting) or setting in URL_SETTINGS or "URL" in setting


def safe_value(setting: str, value: Any) -> Any:
    """``value`` as it may be kept or shown: redacted if it names a Redis, None if hidden."""
    if is_hidden(setting):
        return None
    return _redacted_value(value) if may_hold_secret(setting) else value


def shown(setting: str, value: Any) -> str | None:
    """``repr`` of what may be shown of ``setting``'s ``value``; None: nothing may be."""
    return None if is_hidden(setting) else repr(safe_value(setting, value))


def _redacted_value(value: Any) -> Any:
    if isinstance(value, str):
        return redacted(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_redacted_value(item) for item in value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return f"<{type(value).__name__}>"  # a dict or an object may hold anything


def scrub(text: str, *secrets: object) -> str:
    """``text`` (an error from redis-py or the system) with each non-empty secret masked."""
    for secret in secrets:
        if isinstance(secret, bytes):
            secret = secret.decode(errors="replace")
        if isinstance(secret, str) and secret:
            text = text.replace(secret, MASK)
    return text


def split_userinfo(url: str) -> tuple[str, str | None, str]:
    """``url`` as (``scheme://``, user info or None, rest), up to the *last* ``@`` (a
    password may hold ``/?#``, where a URL parser stops)."""
    match = _SCHEME.fullmatch(url)
    prefix, body = match.groups() if match else ("", url)
    if "@" not in body:
        return prefix, None, body
    userinfo, _, rest = body.rpartition("@")
    return prefix, userinfo, rest


def _redact_query(rest: str) -> str:
    """``rest`` (host, path, query, fragment) with a ``?password=`` value and all after it
    masked (a password with ``&`` or ``#`` spills into what follows), and any fragment."""
    head, sep, query = rest.partition("?")
    if sep:
        params = query.split("&")
        for i, param in enumerate(params):
            name = param.split("=", 1)[0]
            if name.split("#", 1)[0].strip().lower() == _SECRET_QUERY:
                return head + sep + "&".join([*params[:i], f"{_SECRET_QUERY}={MASK}"])
        rest = head + sep + query
    if "#" in rest:
        rest = rest.split("#", 1)[0] + "#" + MASK
    return rest


def redacted(url: str) -> str:
    """``url`` with any password replaced by ``***``: from the user's ``:`` to the last ``@``
    (unencoded ``#/?@`` included), or a ``?password=`` value to the end; a fragment too."""
    prefix, userinfo, rest = split_userinfo(url)
    rest = _redact_query(rest)
    if userinfo is None:
        return prefix + rest
    user, colon, _ = userinfo.partition(":")
    if any(c in user for c in AUTHORITY_ENDS):
        return f"{prefix}{MASK}@{rest}"
    if colon:
        return f"{prefix}{user}:{MASK}@{rest}"
    return f"{prefix}{userinfo}@{rest}"
