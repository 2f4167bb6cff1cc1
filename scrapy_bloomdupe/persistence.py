"""When the Bloom filter outlives the crawl that closes: :func:`keeps_filter`.

Under a scheduler with a shared queue in Redis (scrapy-redis's, this
package's) ``SCHEDULER_PERSIST`` says, off by default as in scrapy-redis: the
queue and the filter go together, and this package's scheduler decides when
the crawl is done.

The dupefilter alone (Scrapy's own scheduler, ``BLOOMDUPE_SCHEDULER = False``)
plays a ``JOBDIR``'s ``requests.seen``: the filter is kept for the next run,
which fetches nothing already fetched. A crawl that stops before its end keeps
it only with ``JOBDIR``, where Scrapy keeps its queue too: without one, the
requests still queued are lost with the process and, marked seen in the
filter, would never be fetched; so the filter is deleted, and the next run
fetches every page again (twice, never skipped). ``SCHEDULER_PERSIST`` set
either way decides instead.
"""

from __future__ import annotations

from contextlib import suppress
from typing import TYPE_CHECKING

from scrapy.utils.misc import load_object
from scrapy_redis.scheduler import Scheduler as RedisScheduler

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

#: What :func:`keeps_filter` answers: keep the filter at close, delete it, or keep it
#: only when the crawl finished (its queue empty).
KEEP, CLEAR, KEEP_IF_FINISHED = "keep", "clear", "keep if finished"


def shared_queue(settings: BaseSettings) -> bool:
    """Whether the crawl's ``SCHEDULER`` keeps its queue in Redis (a scrapy-redis one)."""
    with suppress(ImportError, ValueError, NameError, AttributeError, TypeError):
        scheduler = load_object(settings.get("SCHEDULER"))
        return isinstance(scheduler, type) and issubclass(scheduler, RedisScheduler)
    return False


def keeps_filter(settings: BaseSettings) -> str:
    """:data:`KEEP`, :data:`CLEAR` or :data:`KEEP_IF_FINISHED`: what becomes of the filter
    when the crawl closes."""
    if shared_queue(settings) or settings.getpriority("SCHEDULER_PERSIST") is not None:
        return KEEP if settings.getbool("SCHEDULER_PERSIST") else CLEAR
    return KEEP if settings.get("JOBDIR") else KEEP_IF_FINISHED
