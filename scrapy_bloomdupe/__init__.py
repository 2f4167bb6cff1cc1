"""Race-free, sharded Redis Bloom-filter deduplication for distributed Scrapy crawls."""

from __future__ import annotations

__version__ = "0.2.0"
