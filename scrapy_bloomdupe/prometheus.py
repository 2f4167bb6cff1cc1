"""What ``bloomdupe metrics`` and each worker's exporter (``BLOOMDUPE_METRICS_PORT``) share, on
the optional ``prometheus-client``: metric families built at scrape time (custom collector, no
global gauges), their server, and one clear error when the package is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from .exceptions import BloomDupeError

try:
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
except ImportError:  # the metrics extra is not installed
    AVAILABLE = False
else:
    AVAILABLE = True

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import Metric

#: What to install for metrics.
INSTALL = "pip install scrapy-bloomdupe[metrics]"

#: A family's samples: (label values, value).
Samples = Iterable[tuple[Sequence[str], float]]


class MetricsUnavailable(BloomDupeError):
    """prometheus-client is not installed."""


def missing(what: str) -> str:
    """The sentence for ``what`` (a setting, a command) without prometheus-client."""
    return f"{what} needs the prometheus-client package: {INSTALL}"


def require(what: str) -> None:
    if not AVAILABLE:
        raise MetricsUnavailable(missing(what))


def counter(name: str, doc: str, labels: Sequence[str], samples: Samples) -> Metric:
    """A counter family; ``name`` without ``_total`` (the exposition adds it)."""
    family = CounterMetricFamily(name, doc, labels=list(labels))
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


def gauge(name: str, doc: str, labels: Sequence[str], samples: Samples) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


class _Collector:
    """A collector whose metrics ``collect`` builds at each scrape."""

    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self.collect = collect


def registry(collect: Callable[[], Iterable[Metric]]) -> CollectorRegistry:
    """A registry of its own (not prometheus-client's global one) with one collector."""
    found = CollectorRegistry(auto_describe=False)
    found.register(_Collector(collect))
    return found


def serve(registry: CollectorRegistry, port: int, host: str) -> WSGIServer:
    """Serve ``registry`` at ``http://host:port/metrics`` from a daemon thread (``port`` 0:
    any free one, see ``server_port``)."""
    server, _thread = start_http_server(port, host, registry)
    return server
