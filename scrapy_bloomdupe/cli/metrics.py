"""``bloomdupe metrics``: a Prometheus exporter of one or more crawls (``--spider a --spider
b``), reading Redis at each scrape (:class:`~scrapy_bloomdupe.crawlfigures.CrawlReader`:
read-only, no ``KEYS``), labelled ``crawl`` (the filter's key). Metrics: docs/metrics.md."""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import redis

from .. import prometheus
from ..crawlfigures import CrawlFigures, CrawlReader, FilterFigures
from ..exceptions import BloomDupeError
from .context import Context

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from ..frontier.busiest import SlotFigures

logger = logging.getLogger(__name__)

#: The default --host: every interface, as Prometheus exporters do.
DEFAULT_HOST = "0.0.0.0"

LABELS = ("crawl",)

#: Crawl-wide counters (``K:stats``): (field, name, help).
COUNTERS = (
    ("checked", "bloomdupe_requests_checked", "Requests checked against the Bloom filter."),
    ("new", "bloomdupe_requests_new", "Requests the filter found new (queued)."),
    ("duplicates", "bloomdupe_requests_duplicate",
     "Requests the filter found seen before (dropped)."),
    ("pages", "bloomdupe_pages", "Responses the crawl's workers received (pages)."),
    ("requeued", "bloomdupe_leases_requeued",
     "Leases put back in the queue (workers that stopped heartbeating, reclaimed leases)."),
    ("failed", "bloomdupe_requests_failed",
     "Requests that failed for good (after retries, or an HTTP error status) and queue "
     "entries that cannot be decoded."),
    ("redis_errors", "bloomdupe_redis_errors", "Redis errors the workers gave up on."),
)

#: The filter's gauges: (name, help, value).
FILTER_GAUGES: tuple[tuple[str, str, Callable[[FilterFigures], float]], ...] = (
    ("bloomdupe_filter_fill_ratio", "Share of the filter's bits set (0-1), every generation.",
     lambda f: f.fill_ratio),
    ("bloomdupe_filter_estimated_false_positive_rate",
     "Chance that a new request is taken for seen now, estimated from the fill.",
     lambda f: f.estimated_false_positive_rate),
    ("bloomdupe_filter_configured_false_positive_rate",
     "BLOOMDUPE_ERROR_RATE the filter was made with.", lambda f: f.configured_error_rate),
    ("bloomdupe_filter_estimated_items", "Items in the filter, estimated from the fill.",
     lambda f: f.estimated_items),
    ("bloomdupe_filter_capacity", "Items the filter's generations hold at that rate.",
     lambda f: f.capacity),
    ("bloomdupe_filter_memory_bytes", "Memory of the filter's shards in Redis.",
     lambda f: f.memory_bytes),
    ("bloomdupe_filter_generations", "Generations of the filter (growth adds them).",
     lambda f: f.generations),
)

#: Busiest download slots' gauges (crawl-wide politeness): (name, help, value).
SLOT_GAUGES: tuple[tuple[str, str, Callable[[SlotFigures], float]], ...] = (
    ("bloomdupe_slot_requests_in_flight", "Requests of one of the busiest download slots in "
     "flight, crawl-wide (leased by a worker, not yet done).", lambda s: s.in_flight),
    ("bloomdupe_slot_requests_waiting", "Requests waiting in one of the busiest download "
     "slots.", lambda s: s.waiting),
    ("bloomdupe_slot_backoff_seconds", "Seconds until the back-off of one of the busiest "
     "download slots ends (0: not backed off).", lambda s: s.backoff),
    ("bloomdupe_slot_next_start_seconds", "Seconds until one of the busiest download slots "
     "may start its next request (0: now).", lambda s: s.next_start),
)


def collect(readers: Sequence[CrawlReader]) -> Iterable[Metric]:
    """Every crawl's metrics, read from Redis now."""
    read: list[CrawlFigures] = []
    up: list[tuple[tuple[str], float]] = []
    for reader in readers:
        try:
            read.append(reader.read())
        except (redis.RedisError, BloomDupeError, OSError) as e:
            logger.warning("Could not read the figures of %r from Redis: %s", reader.key, e)
            up.append(((reader.key,), 0.0))
        else:
            up.append(((reader.key,), 1.0))
    yield prometheus.gauge("bloomdupe_up", "1 when the crawl's figures were read from Redis at "
                           "this scrape, else 0.", LABELS, up)
    for field, name, doc in COUNTERS:
        yield prometheus.counter(name, doc, LABELS,
                                 [((f.key,), float(f.totals[field])) for f in read])
    for name, doc, value in FILTER_GAUGES:
        yield prometheus.gauge(name, doc, LABELS, [((f.key,), float(value(f.filter)))
                                                   for f in read if f.filter is not None])
    yield prometheus.gauge(
        "bloomdupe_queue_requests", "Requests in the shared queue: waiting, or leased by a "
        "worker and not yet done.", (*LABELS, "state"),
        [s for f in read for s in (((f.key, "waiting"), float(f.waiting)),
                                   ((f.key, "leased"), float(f.leased)))])
    yield prometheus.gauge("bloomdupe_failed_requests_stored", "Failed requests kept in Redis "
                           "(`bloomdupe failed`).", LABELS,
                           [((f.key,), float(f.failed_kept)) for f in read])
    yield prometheus.gauge("bloomdupe_workers", "Workers alive: heartbeat within the lease "
                           "timeout.", LABELS, [((f.key,), float(f.workers_alive)) for f in read])
    for name, doc, slot_value in SLOT_GAUGES:
        yield prometheus.gauge(name, doc, (*LABELS, "slot"),
                               [((f.key, s.slot), float(slot_value(s))) for f in read
                                if f.slots is not None for s in f.slots.slots])


def run(ctx: Context, opts: argparse.Namespace) -> int:
    prometheus.require("bloomdupe metrics")
    readers = [CrawlReader(ctx.client, key, lease_timeout=opts.lease_timeout,
                           filter_every=opts.filter_every) for key in ctx.crawls]
    for reader in readers:
        figures = reader.read()
        if figures.filter is None and not figures.workers and not any(figures.totals.values()):
            ctx.note(f"{ctx.prog}: no crawl at key {reader.key!r} in Redis at {ctx.where} yet: "
                     "its metrics appear once its workers start")
    server = prometheus.serve(prometheus.registry(lambda: collect(readers)), opts.port,
                              opts.host)
    try:
        ctx.note(f"{ctx.prog}: serving the Prometheus metrics of "
                 f"{', '.join(repr(r.key) for r in readers)} (Redis at {ctx.where}) at "
                 f"http://{opts.host}:{server.server_port}/metrics; Ctrl-C stops")
        while True:
            time.sleep(3600)
    finally:
        server.shutdown()
        server.server_close()
