"""Whether a request can be stored in the shared queue, and if not, what in it cannot.

A queued request is serialized (:mod:`.entry`: ``Request.to_dict(spider=...)`` through
``SCHEDULER_SERIALIZER``), so its callback and errback must be spider methods and its
``meta`` and ``cb_kwargs`` values serializable. Such a request costs only itself: one ERROR,
and the rest of its output is queued. Each new request is serialized before the filter
check, so one that cannot be stored is kept out of the filter."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy import Request, Spider

#: What the scheduler's ERROR says to do.
ADVICE = ("a request in a shared queue must be serializable: give it a callback and an "
          "errback that are methods of the spider, and meta and cb_kwargs values that "
          "SCHEDULER_SERIALIZER (pickle by default) can serialize")


def entries(encode: Callable[[Request], Any], requests: Sequence[Request]
            ) -> tuple[list[Any], list[tuple[int, Exception]]]:
    """Each request's entry (None where ``encode`` failed), and the failures (index, error)."""
    out: list[Any] = []
    failures: list[tuple[int, Exception]] = []
    for i, request in enumerate(requests):
        try:
            out.append(encode(request))
        except Exception as e:  # whatever the serializer raises (PicklingError, TypeError, ...)
            out.append(None)
            failures.append((i, e))
    return out, failures


def what_fails(request: Request, spider: Spider | None, serializer: Any,
               error: Exception) -> str:
    """What in ``request`` cannot be serialized, in a few words."""
    for name in ("callback", "errback"):
        func = getattr(request, name)
        if callable(func) and not _spider_method(spider, func):
            return f"its {name} {_name(func)} is not a method of the spider"
    for field in ("meta", "cb_kwargs"):
        values: dict[str, Any] = getattr(request, field)
        for key, value in values.items():
            try:
                serializer.dumps({key: value})
            except Exception as e:
                return (f"its {field} key {key!r} (a {type(value).__name__}) cannot be "
                        f"serialized ({type(e).__name__}: {e})")
    return f"it cannot be serialized ({type(error).__name__}: {error})"


def _spider_method(spider: Spider | None, func: Callable[..., Any]) -> bool:
    # Request.to_dict's own test: a method whose function is one of the spider's.
    inner = getattr(func, "__func__", None)
    if spider is None or inner is None:
        return False
    return getattr(getattr(spider, func.__name__, None), "__func__", None) is inner


def _name(func: Callable[..., Any]) -> str:
    return getattr(func, "__qualname__", None) or repr(func)
