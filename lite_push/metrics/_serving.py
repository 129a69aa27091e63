"""A consumer's place in the metrics: the registry's collector and the
HTTP endpoint (``metrics_port``), joined at start and left at stop.

Several consumers of one process that name the same address and port share
one endpoint (``metrics._exporter``); each registers with its registry's collector
(``metrics``), which reads its samples at scrape time.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, Protocol

from .._config import ConsumerConfig
from .._errors import ConfigError
from . import collector_for
from ._exporter import exporter_for, release_exporter

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .._core.snapshots import ConsumerMetrics

__all__ = ["MetricsServing"]


class Served(Protocol):
    """A consumer as the collector and the endpoint see it."""

    @property
    def name(self) -> str: ...

    def health(self) -> tuple[str, str]: ...

    def metrics_snapshot(self) -> ConsumerMetrics | None: ...


class MetricsServing:
    """Joins and leaves the collector and the endpoint for one consumer
    (nothing when its metrics are off)."""

    __slots__ = ("_config", "_exporter", "_on", "_registry", "url")

    def __init__(self, config: ConsumerConfig, registry: CollectorRegistry | None, on: bool) -> None:
        self._config = config
        self._registry = registry
        self._on = on
        self._exporter: tuple[str, int] | None = None
        #: ``http://addr:port/metrics`` once started with ``metrics_port``.
        self.url: str | None = None

    def start(self, consumer: Served) -> None:
        """Register with the registry's collector; start or share the
        endpoint when ``metrics_port`` is set (a port that cannot be served
        raises :class:`~lite_push.ConfigError` naming the field at fault)."""
        if not self._on:
            return
        collector_for(self._registry).add(consumer)
        port = self._config.metrics_port
        if port is None:
            return
        addr = self._config.metrics_addr
        try:
            self._exporter, bound = exporter_for(addr, port, self._registry, consumer)
        except (OSError, ValueError) as e:
            collector_for(self._registry).remove(consumer)
            # A port taken or not allowed is the port's fault; anything
            # else (no such address here, not an address) the address's.
            port_fault = isinstance(e, OSError) and e.errno in (errno.EADDRINUSE, errno.EACCES)
            field = "metrics_port" if port_fault else "metrics_addr"
            raise ConfigError(field, f"cannot serve metrics on {addr}:{port}: {e}") from e
        self.url = f"http://{addr}:{bound}/metrics"

    def stop(self, consumer: Served) -> None:
        """Leave the collector and the endpoint (idempotent)."""
        if not self._on:
            return
        collector_for(self._registry).remove(consumer)
        if self._exporter is not None:
            release_exporter(self._exporter, consumer)
            self._exporter = None
