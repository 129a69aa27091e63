"""Prometheus metrics of a running consumer (the HTTP endpoint: :mod:`lite_push.metrics._exporter`).

Names, types and labels: :mod:`lite_push.metrics.names` (the one place they
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
arrays (``LaneMetrics``, a compiled kernel with a pure-Python twin,
:mod:`lite_push._kernels.lanemetrics_py`): the listener time of a segment divided
over its messages, the end-to-end latency from the store timestamps of its
first and last message, and the time a dispatch waited in the lane.  With
metrics off the lanes skip even that (one ``is None`` test per segment).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .._core.snapshots import ConsumerMetrics
from .._kernels.lanemetrics import LANE_METRICS_IMPL, LaneMetrics
from .._kernels.offsets import OFFSETS_IMPL
from .._kernels.router import ROUTER_IMPL
from .._version import __version__
from .names import METRICS

__all__ = [
    "E2E_BUCKETS",
    "LISTENER_BUCKETS",
    "WAIT_BUCKETS",
    "ConsumerCollector",
    "MetricsSource",
    "add_samples",
    "collector_for",
    "histogram_samples",
    "new_lane_metrics",
]

logger = logging.getLogger(__name__)

#: Listener time per message, seconds.
LISTENER_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
#: Time in the lane, seconds.
WAIT_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.0005,
    0.001,
    0.005,
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
#: Store timestamp to processed, seconds (retries and replays take minutes).
E2E_BUCKETS: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)


def new_lane_metrics() -> LaneMetrics:
    """A lane's recorder with the buckets above (compiled when built; see
    :mod:`lite_push._kernels.lanemetrics_py`)."""
    return LaneMetrics(LISTENER_BUCKETS, WAIT_BUCKETS, E2E_BUCKETS)


def _family(name: str) -> Metric:
    kind, labels, doc = METRICS[name]
    if kind == "counter":
        return CounterMetricFamily(name[: -len("_total")], doc, labels=labels)
    if kind == "histogram":
        return HistogramMetricFamily(name, doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


class MetricsSource(Protocol):
    """What the collector reads: a consumer (``LitePushConsumer`` or
    ``AsyncLitePushConsumer``)."""

    def metrics_snapshot(self) -> ConsumerMetrics | None:
        """This consumer's samples now (None: metrics off or stopped)."""


class ConsumerCollector(Collector):
    """Reads every registered consumer's snapshot at scrape time (one per
    registry; consumers add and remove themselves)."""

    def __init__(self) -> None:
        self._consumers: weakref.WeakSet[MetricsSource] = weakref.WeakSet()
        self._lock = threading.Lock()

    def add(self, consumer: MetricsSource) -> None:
        with self._lock:
            self._consumers.add(consumer)

    def remove(self, consumer: MetricsSource) -> None:
        with self._lock:
            self._consumers.discard(consumer)

    def describe(self) -> Iterator[Metric]:
        for name in METRICS:
            yield _family(name)

    def collect(self) -> Iterator[Metric]:
        fams: dict[str, Any] = {name: _family(name) for name in METRICS}
        fams["lite_push_build_info"].add_metric([__version__, ROUTER_IMPL, OFFSETS_IMPL, LANE_METRICS_IMPL], 1)
        with self._lock:
            consumers = list(self._consumers)
        for c in consumers:
            try:
                snap = c.metrics_snapshot()
            except Exception:  # a scrape must not fail because one consumer is closing
                logger.debug("collecting metrics of a consumer failed", exc_info=True)
                continue
            if snap is not None:
                add_samples(fams, snap)
        yield from fams.values()


def add_samples(fams: dict[str, Any], snap: ConsumerMetrics) -> None:
    """Add one consumer's samples to a scrape's metric families."""
    g = snap.group
    mode = snap.mode
    for qm in snap.queues:
        q = qm.queue
        labels = [g, q.topic, str(q.queue_id)]
        fams["lite_push_in_flight_messages"].add_metric(labels, qm.in_flight)
        fams["lite_push_in_flight_bytes"].add_metric(labels, qm.in_flight_bytes)
        fams["lite_push_queue_paused"].add_metric(labels, 1 if qm.paused else 0)
        fams["lite_push_committed_offset"].add_metric(labels, qm.committed)
        if qm.last_commit_time is not None:
            fams["lite_push_last_commit_timestamp_seconds"].add_metric(labels, qm.last_commit_time)
        if qm.end_offset is not None:
            fams["lite_push_lag_messages"].add_metric(labels, max(0, qm.end_offset - qm.committed))
    for q, (polled, filtered, pauses, resumes) in snap.queue_counts.items():
        labels = [g, q.topic, str(q.queue_id)]
        fams["lite_push_messages_polled_total"].add_metric(labels, polled)
        fams["lite_push_messages_filtered_total"].add_metric(labels, filtered)
        fams["lite_push_queue_pauses_total"].add_metric(labels, pauses)
        fams["lite_push_queue_resumes_total"].add_metric(labels, resumes)
    processed = fams["lite_push_messages_processed_total"]
    processed.add_metric([g, mode, "success"], snap.consumed)
    processed.add_metric([g, mode, "retry"], snap.retried)
    processed.add_metric([g, mode, "dlq"], snap.dead_lettered)
    fams["lite_push_messages_sent_back_total"].add_metric([g], snap.sent_back)
    fams["lite_push_parked_messages"].add_metric([g], snap.parked)
    fams["lite_push_paused_keys"].add_metric([g], snap.paused_keys)
    fams["lite_push_paused_key_messages"].add_metric([g], snap.paused_key_messages)
    fams["lite_push_held_keys"].add_metric([g], snap.held_keys)
    fams["lite_push_held_messages_total"].add_metric([g], snap.held_behind)
    for (name, bounds, labels), dists in zip(
        (
            ("lite_push_listener_duration_seconds", LISTENER_BUCKETS, [g, mode]),
            ("lite_push_lane_wait_seconds", WAIT_BUCKETS, [g]),
            ("lite_push_end_to_end_latency_seconds", E2E_BUCKETS, [g]),
        ),
        snap.distributions,
        strict=True,
    ):
        buckets, total = histogram_samples(bounds, dists)
        fams[name].add_metric(labels, buckets, total)
    fams["lite_push_lanes_busy"].add_metric([g], snap.lanes_busy)
    fams["lite_push_lanes"].add_metric([g], snap.lanes)
    fams["lite_push_lanes_admitted"].add_metric([g], snap.lanes_admitted)
    fams["lite_push_rebalances_total"].add_metric([g], snap.rebalances)
    fams["lite_push_assigned_queues"].add_metric([g], len(snap.queues))
    fams["lite_push_lock_renewals_total"].add_metric([g, "ok"], snap.lock_renewals_ok)
    fams["lite_push_lock_renewals_total"].add_metric([g, "failed"], snap.lock_renewals_failed)
    if snap.max_rate is not None:
        fams["lite_push_rate_limit_messages_per_second"].add_metric([g], snap.max_rate)
    fams["lite_push_rate_limit_delayed_messages_total"].add_metric([g], snap.rate_limited[0])
    fams["lite_push_rate_limit_wait_seconds_total"].add_metric([g], snap.rate_limited[1])
    fams["lite_push_key_interval_holds_total"].add_metric([g], snap.key_interval_holds)
    fams["lite_push_oldest_call_seconds"].add_metric([g], snap.oldest_call_seconds)
    fams["lite_push_slow_calls_total"].add_metric([g], snap.slow_calls)
    fams["lite_push_lane_steals_total"].add_metric([g], snap.steals)
    fams["lite_push_stolen_messages_total"].add_metric([g], snap.stolen)


def histogram_samples(
    bounds: Sequence[float], dists: Iterable[tuple[list[int], float]]
) -> tuple[list[tuple[str, float]], float]:
    """One distribution merged over the lanes (``(counts, sum)`` each, as
    :meth:`LaneMetrics.snapshot` gives them): cumulative ``(le, count)``
    buckets ending with ``+Inf``, and the sum."""
    counts = [0] * (len(bounds) + 1)
    total = 0.0
    for cs, s in dists:
        for i, c in enumerate(cs):
            counts[i] += c
        total += s
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
