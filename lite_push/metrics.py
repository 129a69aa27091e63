"""Prometheus metrics of a running consumer, and the HTTP exporter.

Names, types and labels: :mod:`lite_push.metric_names` (the one place they
live).  Turn metrics on with ``ConsumerConfig(metrics_port=9464)`` (an
exporter on ``metrics_addr``, 127.0.0.1 by default; ``0`` picks a free port,
see :attr:`LitePushConsumer.metrics_url`), or pass ``registry=`` to the
consumer to have its metrics in the application's own
``prometheus_client.CollectorRegistry`` (served however the application
serves it).  Consumers in one process share a registry's collector (each
consumer's series carry its ``group``) and an exporter bound to the same
address and port.

How it stays off the hot path
-----------------------------
Nothing is done per message.  Counters the runtime keeps anyway (per lane:
consumed, retried, parked; per queue in the pull thread: polled, filtered,
pauses, resumes; commits, rebalances, lock renewals) are plain ints, each
written by one thread, and are read by a collector only when Prometheus
scrapes.  The three distributions are recorded per *segment* (the run of
one queue's messages a lane took in one go) into the lane's own bucket
arrays (:class:`LaneMetrics`): the listener time of a segment divided over
its messages, the end-to-end latency from the store timestamps of its first
and last message, and the time a dispatch waited in the lane.  With metrics
off the lanes skip even that (one ``is None`` test per segment).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .metric_names import METRICS

if TYPE_CHECKING:
    from ._consumer import LitePushConsumer
    from ._types import MessageExt

__all__ = [
    "E2E_BUCKETS",
    "LISTENER_BUCKETS",
    "WAIT_BUCKETS",
    "LaneMetrics",
    "collector_for",
    "exporter_for",
    "release_exporter",
]

logger = logging.getLogger(__name__)

#: Listener time per message, seconds.
LISTENER_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
#: Time in the lane, seconds.
WAIT_BUCKETS: tuple[float, ...] = (
    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
#: Store timestamp to processed, seconds (retries and replays take minutes).
E2E_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip


class _Hist:
    """Bucket counts (``le`` semantics, the last one is +Inf) and the sum;
    written by one lane, read (summed over lanes) by the collector."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float, n: int) -> None:
        """``n`` observations of ``value``."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.total += value * n


class LaneMetrics:
    """One lane's distributions, recorded per segment by the lane's task."""

    __slots__ = ("e2e", "listener", "wait")

    def __init__(self) -> None:
        self.listener = _Hist(LISTENER_BUCKETS)
        self.wait = _Hist(WAIT_BUCKETS)
        self.e2e = _Hist(E2E_BUCKETS)

    def segment(self, t0: float, msgs: Sequence[MessageExt]) -> None:
        """A segment processed from ``t0`` (``time.perf_counter``) to now,
        all of it successfully: its listener time per message, and its
        end-to-end latency."""
        n = len(msgs)
        self.call(t0, n)
        self.completed(msgs[0], msgs[-1], n)

    def call(self, t0: float, n: int) -> None:
        """One listener call on ``n`` messages that started at ``t0``."""
        self.listener.observe((time.perf_counter() - t0) / n, n)

    def completed(self, first: MessageExt, last: MessageExt, n: int) -> None:
        """``n`` messages from ``first`` to ``last`` finished now: the mean
        of their store timestamps stands for all (they were stored
        together)."""
        if first.store_timestamp <= 0:
            return  # a source that does not stamp messages
        stored_ms = (first.store_timestamp + last.store_timestamp) / 2
        self.e2e.observe(max(0.0, time.time() - stored_ms / 1000.0), n)

    def waited(self, stamps: list[tuple[float, int]], now: float) -> None:
        """Dispatches of ``(monotonic time put, messages)`` taken at ``now``."""
        wait = self.wait
        for at, n in stamps:
            wait.observe(now - at, n)


def _family(name: str) -> Metric:
    kind, labels, doc = METRICS[name]
    if kind == "counter":
        return CounterMetricFamily(name[: -len("_total")], doc, labels=labels)
    if kind == "histogram":
        return HistogramMetricFamily(name, doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


class ConsumerCollector(Collector):
    """Reads every registered consumer's counters and state at scrape time
    (one per registry; consumers add and remove themselves)."""

    def __init__(self) -> None:
        self._consumers: weakref.WeakSet[LitePushConsumer] = weakref.WeakSet()
        self._lock = threading.Lock()

    def add(self, consumer: LitePushConsumer) -> None:
        with self._lock:
            self._consumers.add(consumer)

    def remove(self, consumer: LitePushConsumer) -> None:
        with self._lock:
            self._consumers.discard(consumer)

    def describe(self) -> Iterator[Metric]:
        for name in METRICS:
            yield _family(name)

    def collect(self) -> Iterator[Metric]:
        from . import OFFSETS_IMPL, ROUTER_IMPL, __version__

        fams: dict[str, Any] = {name: _family(name) for name in METRICS}
        fams["lite_push_build_info"].add_metric([__version__, ROUTER_IMPL, OFFSETS_IMPL], 1)
        with self._lock:
            consumers = list(self._consumers)
        for c in consumers:
            try:
                c._collect_metrics(fams)
            except Exception:  # a scrape must not fail because one consumer is closing
                logger.debug(
                    "collecting metrics of consumer %r failed",
                    c.config.group,
                    exc_info=True,
                )
        yield from fams.values()


def histogram_samples(hists: Sequence[_Hist]) -> tuple[list[tuple[str, float]], float]:
    """One distribution merged over the lanes: cumulative ``(le, count)``
    buckets ending with ``+Inf``, and the sum."""
    bounds = hists[0].bounds
    counts = [0] * (len(bounds) + 1)
    total = 0.0
    for h in hists:
        for i, c in enumerate(list(h.counts)):
            counts[i] += c
        total += h.total
    buckets: list[tuple[str, float]] = []
    running = 0
    for le, c in zip((*map(repr, bounds), "+Inf"), counts, strict=True):
        running += c
        buckets.append((le, running))
    return buckets, total


_collectors: dict[int, tuple[CollectorRegistry, ConsumerCollector]] = {}
_collectors_lock = threading.Lock()


def collector_for(registry: CollectorRegistry | None) -> ConsumerCollector:
    """The consumers' collector of ``registry`` (the default registry when
    None), registered with it on first use."""
    reg = REGISTRY if registry is None else registry
    with _collectors_lock:
        entry = _collectors.get(id(reg))
        if entry is None or entry[0] is not reg:
            collector = ConsumerCollector()
            reg.register(collector)
            _collectors[id(reg)] = (reg, collector)
            return collector
        return entry[1]


class _Exporter:
    __slots__ = ("port", "refs", "registry", "server", "thread")

    def __init__(self, server: Any, thread: threading.Thread, registry: CollectorRegistry) -> None:
        self.server = server
        self.thread = thread
        self.registry = registry
        self.port: int = server.server_port
        self.refs = 0


_exporters: dict[tuple[str, int], _Exporter] = {}
_exporters_lock = threading.Lock()


def exporter_for(addr: str, port: int, registry: CollectorRegistry | None) -> tuple[tuple[str, int], int]:
    """Start (or share) the HTTP exporter on ``addr:port`` serving
    ``registry``; return its key (for :func:`release_exporter`) and the
    port it listens on.  Port 0 starts a new exporter on a free port."""
    reg = REGISTRY if registry is None else registry
    with _exporters_lock:
        if port:
            ex = _exporters.get((addr, port))
            if ex is not None:
                if ex.registry is not reg:
                    raise ValueError(f"{addr}:{port} already serves another registry")
                ex.refs += 1
                return (addr, port), port
        server, thread = start_http_server(port, addr=addr, registry=reg)
        ex = _Exporter(server, thread, reg)
        ex.refs = 1
        key = (addr, ex.port)
        _exporters[key] = ex
        logger.info("metrics exporter on http://%s:%d/metrics", addr, ex.port)
        return key, ex.port


def release_exporter(key: tuple[str, int]) -> None:
    """A consumer stopped: shut the exporter down when nobody uses it."""
    with _exporters_lock:
        ex = _exporters.get(key)
        if ex is None:
            return
        ex.refs -= 1
        if ex.refs > 0:
            return
        del _exporters[key]
    ex.server.shutdown()
    ex.server.server_close()
    ex.thread.join(5.0)
