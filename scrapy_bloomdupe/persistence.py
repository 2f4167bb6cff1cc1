"""When the Bloom filter outlives the crawl that closes: :func:`keeps_filter`.

With a shared queue in Redis (scrapy-redis's scheduler or ours), ``SCHEDULER_PERSIST`` decides
(off by default): queue and filter go together. The dupefilter alone (Scrapy's scheduler)
plays ``requests.seen``: kept for the next run, but after an unfinished crawl only with
``JOBDIR``, which keeps Scrapy's queue too. Without it the queued requests die with the
process and, marked seen, would never be fetched, so the filter is deleted (pages fetched
twice, never skipped). ``SCHEDULER_PERSIST`` set explicitly decides instead.
"""

from __future__ import annotations

from contextlib import suppress
from typing import TYPE_CHECKING

from scrapy.utils.misc import load_object
from scrapy_redis.scheduler import Scheduler as RedisScheduler

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

#: :func:`keeps_filter`'s answers: keep the filter at close, delete it, or keep it if finished.
KEEP, CLEAR, KEEP_IF_FINISHED = "keep", "clear", "keep if finished"


def shared_queue(settings: BaseSettings) -> bool:
    """Whether the crawl's ``SCHEDULER`` keeps its queue in Redis (a scrapy-redis one)."""
    with suppress(ImportError, ValueError, NameError, AttributeError, TypeError):
        scheduler = load_object(settings.get("SCHEDULER"))
        return isinstance(scheduler, type) and issubclass(scheduler, RedisScheduler)
    return False


def keeps_filter(settings: BaseSettings) -> str:
    """The filter's fate at close: :data:`KEEP`, :data:`CLEAR` or :data:`KEEP_IF_FINISHED`."""
    if shared_queue(settings) or settings.getpriority("SCHEDULER_PERSIST") is not None:
        return KEEP if settings.getbool("SCHEDULER_PERSIST") else CLEAR
    return KEEP if settings.get("JOBDIR") else KEEP_IF_FINISHED
