"""One Redis client per crawler, shared by the scheduler, the dupefilter and the stats.

Settings, as in scrapy-redis: ``REDIS_URL`` (overridden by
``BLOOMDUPE_REDIS_URL``), ``REDIS_HOST``/``REDIS_PORT``/``REDIS_DB``, and
``REDIS_PARAMS`` (keyword arguments for the client, ``redis_cls`` included);
``BLOOMDUPE_REDIS_CLUSTER = True`` for Redis Cluster. They are parsed by
:class:`~scrapy_bloomdupe.settings.RedisSettings`, and the client is built by
:mod:`scrapy_bloomdupe.transport.client`.

Also how a crawl that cannot start says so: one line. A setting that cannot
work, a Redis that cannot be used or a dependency below its floor raises a
:class:`~scrapy_bloomdupe.exceptions.BloomDupeError` from one of the package's
components while Scrapy builds it. Scrapy then marks the crawl failed (``scrapy
crawl`` exits with status 1), and asyncio reports the crawl's task with a
traceback, often chained to a second one of Scrapy's own ("Engine slot not
assigned"). :class:`StartErrorFilter`, installed on asyncio's logger when this
module is imported (every component imports it), turns that report into one
CRITICAL line: the error's message, which names the setting and the fix.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING

from scrapy import signals

from .exceptions import BloomDupeError
from .settings import RedisSettings
from .transport import client as client_module
from .transport.diagnose import find_cause
from .versions import check_installed

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

_clients: weakref.WeakKeyDictionary[Crawler, Redis | RedisCluster] = weakref.WeakKeyDictionary()


def get_client(crawler: Crawler) -> Redis | RedisCluster:
    """The crawler's shared client, made on first use, closed when its engine stops."""
    client = _clients.get(crawler)
    if client is None:
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
    """A new client built from Scrapy ``settings`` (for tools and tests; a crawl shares
    :func:`get_client`'s). Every component and tool builds its client here, so this is
    where a dependency below its floor stops the worker (:mod:`.versions`)."""
    check_installed()
    return client_module.build(RedisSettings.from_settings(settings))


# -- a crawl that cannot start: one line ------------------------------------------------

#: Loggers that report an exception nobody caught (asyncio: "Task exception was never
#: retrieved", the crawl's task under ``scrapy crawl``).
UNHANDLED_LOGGERS = ("asyncio",)
#: The logger name the one line is shown under.
LOGGER_NAME = "scrapy_bloomdupe"


class StartErrorFilter(logging.Filter):
    """Shows an uncaught :class:`BloomDupeError` (also one chained under another
    exception) as one CRITICAL line, its message, without the traceback.

    Only reports of exceptions nobody caught pass through the loggers it is
    put on, so a traceback the user asked for (a caught error logged with
    ``exc_info``) is left alone. Any other exception keeps its traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if isinstance(record.exc_info, tuple) else None
        error = find_cause(exc, BloomDupeError) if exc is not None else None
        if error is None:
            return True
        record.name = LOGGER_NAME
        record.levelno, record.levelname = logging.CRITICAL, logging.getLevelName(
            logging.CRITICAL)
        record.msg, record.args = "Cannot start the crawl: %s", (str(error),)
        record.exc_info = record.exc_text = record.stack_info = None
        return True


def install_start_error_filter() -> None:
    """Put one :class:`StartErrorFilter` on each of :data:`UNHANDLED_LOGGERS` (once)."""
    for name in UNHANDLED_LOGGERS:
        target = logging.getLogger(name)
        if not any(isinstance(f, StartErrorFilter) for f in target.filters):
            target.addFilter(StartErrorFilter())


install_start_error_filter()
