"""One Redis client per crawler, shared by the scheduler, the dupefilter and the stats.

Settings, as in scrapy-redis: ``REDIS_URL`` (overridden by
``BLOOMDUPE_REDIS_URL``), ``REDIS_HOST``/``REDIS_PORT``/``REDIS_DB``, and
``REDIS_PARAMS`` (keyword arguments for the client, ``redis_cls`` included);
``BLOOMDUPE_REDIS_CLUSTER = True`` for Redis Cluster. They are parsed by
:class:`~scrapy_bloomdupe.settings.RedisSettings`, and the client is built by
:mod:`scrapy_bloomdupe.transport.client`.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from .settings import RedisSettings
from .transport import client as client_module

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

_clients: weakref.WeakKeyDictionary[Crawler, Redis | RedisCluster] = weakref.WeakKeyDictionary()


def get_client(crawler: Crawler) -> Redis | RedisCluster:
    """The crawler's shared client, made on first use."""
    client = _clients.get(crawler)
    if client is None:
        client = from_settings(crawler.settings)
        _clients[crawler] = client
    return client


def from_settings(settings: BaseSettings) -> Redis | RedisCluster:
    """A new client built from Scrapy ``settings`` (for tools and tests; a crawl shares
    :func:`get_client`'s)."""
    return client_module.build(RedisSettings.from_settings(settings))
