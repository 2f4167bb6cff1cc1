"""One Redis client per crawler, shared by the scheduler, the dupefilter and the stats.

Settings as in scrapy-redis (``BLOOMDUPE_REDIS_URL`` overrides ``REDIS_URL``): see
:class:`~scrapy_bloomdupe.settings.RedisSettings` and :mod:`scrapy_bloomdupe.transport.client`.

A :class:`~scrapy_bloomdupe.exceptions.BloomDupeError` while Scrapy builds a component fails
the crawl, and :class:`StartErrorFilter` (installed on import) turns the logged traceback(s)
into one CRITICAL line, the message naming the setting and fix.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from scrapy import signals
from scrapy.utils.reactor import is_asyncio_reactor_installed
from twisted.logger import globalLogBeginner

from .exceptions import BloomDupeError
from .settings import RedisSettings, warn_unknown_names
from .transport import client as client_module
from .transport.diagnose import find_cause
from .versions import check_installed

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

P = ParamSpec("P")
R = TypeVar("R")

_clients: weakref.WeakKeyDictionary[Crawler, Redis | RedisCluster] = weakref.WeakKeyDictionary()


def get_client(crawler: Crawler) -> Redis | RedisCluster:
    """The crawler's shared client, made on first use, closed when its engine stops."""
    client = _clients.get(crawler)
    if client is None:
        warn_unknown_names(crawler.settings)  # once a crawl: at its first component
        client = from_settings(crawler.settings)
        _clients[crawler] = client
        def close(**_: object) -> None:
            close_client(crawler)

        crawler.signals.connect(close, signal=signals.engine_stopped, weak=False)
    return client


def close_client(crawler: Crawler) -> None:
    """Close the crawler's shared client (its pooled connections), if it has one."""
    client = _clients.pop(crawler, None)
    if client is not None:
        client.close()


def from_settings(settings: BaseSettings) -> Redis | RedisCluster:
    """A new client from Scrapy ``settings`` (a crawl shares :func:`get_client`'s). Every
    client is built here, so a dependency below its floor stops the worker here."""
    check_installed()
    return client_module.build(RedisSettings.from_settings(settings))


# -- a crawl that cannot start: one line ------------------------------------------------

#: Loggers that report uncaught exceptions ("Task exception was never retrieved",
#: "Unhandled error in Deferred").
UNHANDLED_LOGGERS = ("asyncio", "twisted")
#: The logger name the one line is shown under.
LOGGER_NAME = "scrapy_bloomdupe"


def start_error_line(error: BaseException) -> str:
    """The one line a crawl that cannot start shows for ``error`` (one of ours)."""
    return f"Cannot start the crawl: {' '.join(str(error).split())}"


def mark_failed(crawler: Crawler | None, error: BloomDupeError) -> None:
    """Fail ``crawler``'s crawl on ``error`` (exit status 1) if it is crawling. Scrapy before
    2.19 fails a crawl only when its crawler has no spider at the end; no public way."""
    if crawler is not None and getattr(crawler, "crawling", False):
        crawler.spider = None
        _START_ERRORS.append(start_error_line(error))
        if "twisted.internet.reactor" in sys.modules and not is_asyncio_reactor_installed():
            _twisted_to_logging_only()


def _twisted_to_logging_only() -> None:
    """Begin Twisted's logging (once): until then Twisted also prints critical events raw
    to stderr (Scrapy never begins it), a traceback beside :class:`StartErrorFilter`'s line."""
    global _twisted_begun
    if not _twisted_begun:
        _twisted_begun = True
        globalLogBeginner.beginLoggingTo([], discardBuffer=True, redirectStandardIO=False)


_twisted_begun = False


#: Start error lines (:func:`mark_failed`) for Twisted's report. Not the errors: their
#: frames would keep the failed Deferred, which Twisted reports when collected.
_START_ERRORS: list[str] = []


def fails_the_crawl(build: Callable[P, R]) -> Callable[P, R]:
    """Decorates ``from_crawler`` (under ``@classmethod``): our errors fail the crawl."""
    @functools.wraps(build)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return build(*args, **kwargs)
        except BloomDupeError as e:
            mark_failed(args[1] if len(args) > 1 else kwargs.get("crawler"), e)  # type: ignore[arg-type]
            raise

    return wrapper


class StartErrorFilter(logging.Filter):
    """Shows an uncaught :class:`BloomDupeError` (even chained) as one CRITICAL line.

    Its loggers carry only uncaught exceptions: a caught one logged with ``exc_info``, or any
    other exception, keeps its traceback. Twisted reports a failed start twice, as text:
    "Unhandled error in Deferred" (shown as the recorded error), then the chain (dropped)."""

    def __init__(self) -> None:
        super().__init__()
        #: Lines shown for Twisted's reports.
        self.shown: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if isinstance(record.exc_info, tuple) else None
        error = find_cause(exc, BloomDupeError) if exc is not None else None
        if error is not None:
            line = start_error_line(error)
            if line in _START_ERRORS:
                _START_ERRORS.remove(line)
        elif record.name != "twisted":
            return True
        elif record.getMessage().startswith("Unhandled error in Deferred") and _START_ERRORS:
            line = _START_ERRORS.pop()
        elif found := _OURS.search(record.getMessage()):
            line = start_error_line(BloomDupeError(found.group(1)))
        else:
            return True
        if record.name == "twisted":
            if line in self.shown:
                return False
            self.shown.add(line)
        return self._show(record, line)

    @staticmethod
    def _show(record: logging.LogRecord, line: str) -> bool:
        record.name = LOGGER_NAME
        record.levelno, record.levelname = logging.CRITICAL, logging.getLevelName(
            logging.CRITICAL)
        record.msg, record.args = "%s", (line,)
        record.exc_info = record.exc_text = record.stack_info = None
        return True


#: A line of a traceback (as text) naming one of our errors, its message in group 1.
_OURS = re.compile(r"^scrapy_bloomdupe\.exceptions\.\w+: (.+)$", re.M)


def install_start_error_filter() -> None:
    """Put one :class:`StartErrorFilter` on each of :data:`UNHANDLED_LOGGERS` (once)."""
    for name in UNHANDLED_LOGGERS:
        target = logging.getLogger(name)
        if not any(isinstance(f, StartErrorFilter) for f in target.filters):
            target.addFilter(StartErrorFilter())


install_start_error_filter()
