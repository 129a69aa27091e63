"""One scrape target for the members of a :class:`~lite_push.ProcessSupervisor`.

Each member's consumer serves its own metrics on a free loopback port and
tells the supervisor the URL.  The supervisor serves one endpoint
(:mod:`lite_push.metrics._exporter`: ``/metrics``, ``/``, ``/healthz``, ``/readyz``)
whose registry holds a :class:`MembersCollector`: at scrape time it fetches
every running member's ``/metrics`` at once (loopback, a short timeout),
parses them, adds the label ``member="<index>"`` to every sample and merges
the families of one name into one, and adds the supervisor's own series
(:data:`lite_push.metrics.names.SUPERVISOR_METRICS`).  A member that does not
answer is left out of that scrape (logged at DEBUG); the scrape never fails
because of it.

The probes are one :class:`MemberProbe` per member on that endpoint, so the
exporter's rules hold as they are: 200 ``ok`` when every member is, else 503
with one line naming the first member that is not and why
(``member 1: not running (killed by SIGKILL)``).  A running member answers
with its own ``/healthz`` and ``/readyz``; one whose consumer has not
started yet is alive but not ready.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from .._errors import ConfigError
from ..supervisor._member_process import MemberState
from ._exporter import exporter_for, release_exporter
from .names import SUPERVISOR_METRICS

__all__ = [
    "PROBE_TIMEOUT",
    "SCRAPE_TIMEOUT",
    "MemberProbe",
    "MembersCollector",
    "MembersEndpoint",
    "fetch",
    "merge_member_pages",
]

logger = logging.getLogger(__name__)

#: Longest wait for one member's ``/metrics`` (seconds).
SCRAPE_TIMEOUT = 2.0
#: Longest wait for one member's ``/healthz`` or ``/readyz`` (seconds).
PROBE_TIMEOUT = 1.0

#: Loopback requests never go through an ``http_proxy`` of the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(url: str, timeout: float) -> tuple[int, str]:
    """``(HTTP status, body)`` of a GET of ``url``; raises ``OSError`` when
    nothing answers within ``timeout`` seconds."""
    try:
        with _OPENER.open(url, timeout=timeout) as r:
            return int(r.status), r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read().decode(errors="replace")


def merge_member_pages(pages: Iterable[tuple[int, str]]) -> list[Metric]:
    """The metric families of several members' Prometheus text pages
    (``(member index, page)``), one family per name, every sample labelled
    ``member="<index>"``.  A page that does not parse is left out (DEBUG)."""
    merged: dict[str, Metric] = {}
    for index, page in pages:
        member = str(index)
        try:
            families = list(text_string_to_metric_families(page))
        except ValueError:
            logger.debug("member %d: its metrics page does not parse; left out", index, exc_info=True)
            continue
        for fam in families:
            out = merged.get(fam.name)
            if out is None:
                out = merged[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            for s in fam.samples:
                out.add_sample(s.name, {**s.labels, "member": member}, s.value, s.timestamp, s.exemplar)
    return list(merged.values())


def _own_family(name: str) -> CounterMetricFamily | GaugeMetricFamily:
    kind, labels, doc = SUPERVISOR_METRICS[name]
    if kind == "counter":
        return CounterMetricFamily(name.removesuffix("_total"), doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


class MembersCollector(Collector):
    """The members' metrics and the supervisor's own, read at scrape time
    (see the module docstring).  ``members`` gives the members' states now."""

    def __init__(
        self, members: Callable[[], Sequence[MemberState]], processes: int, timeout: float = SCRAPE_TIMEOUT
    ) -> None:
        self._members = members
        self._processes = processes
        self._timeout = timeout
        self._pool = ThreadPoolExecutor(max_workers=min(processes, 32), thread_name_prefix="lite-push-scrape")

    def collect(self) -> Iterator[Metric]:
        states = list(self._members())
        configured = _own_family("lite_push_supervisor_members")
        configured.add_metric([], self._processes)
        up = _own_family("lite_push_supervisor_member_up")
        restarts = _own_family("lite_push_supervisor_member_restarts_total")
        for st in states:
            up.add_metric([str(st.index)], 1 if st.alive else 0)
            restarts.add_metric([str(st.index)], st.restarts)
        yield from (configured, up, restarts)
        yield from merge_member_pages(self._pages(states))

    def _pages(self, states: Sequence[MemberState]) -> list[tuple[int, str]]:
        """Every running member's ``/metrics`` page, fetched at once."""
        targets = [(st.index, st.metrics_url) for st in states if st.alive and st.metrics_url is not None]
        futures = [(index, self._pool.submit(fetch, url, self._timeout)) for index, url in targets]
        pages: list[tuple[int, str]] = []
        for index, future in futures:
            try:
                status, page = future.result(self._timeout + 1.0)
            except Exception as e:  # a member that does not answer is left out of this scrape
                logger.debug("member %d did not answer a scrape: %s: %s", index, type(e).__name__, e)
                continue
            if status != 200:
                logger.debug("member %d answered a scrape with HTTP %d; left out", index, status)
                continue
            pages.append((index, page))
        return pages

    def close(self) -> None:
        """Stop the fetching threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)


class MemberProbe:
    """One member on the supervisor's health endpoint (an
    :class:`~lite_push.metrics._exporter.HealthSource`)."""

    def __init__(self, index: int, state: Callable[[], MemberState], timeout: float = PROBE_TIMEOUT) -> None:
        self._index = index
        self._state = state
        self._timeout = timeout

    @property
    def name(self) -> str:
        return f"member {self._index}"

    def health(self) -> tuple[str, str]:
        """``(liveness, readiness)``: ``"ok"`` or why not, for this member."""
        st = self._state()
        if not st.alive:
            why = f"not running ({st.last_exit})" if st.last_exit else "not running"
            return why, why
        if st.metrics_url is None:
            return "ok", f"starting (pid {st.pid})"
        base = st.metrics_url.removesuffix("/metrics")
        return self._ask(base + "/healthz"), self._ask(base + "/readyz")

    def _ask(self, url: str) -> str:
        path = url.rpartition("/")[2]
        try:
            status, text = fetch(url, self._timeout)
        except Exception as e:  # a probe must answer, whatever happened
            return f"did not answer /{path}: {type(e).__name__}: {e}"
        if status == 200:
            return "ok"
        return " ".join(text.split()) or f"/{path} answered HTTP {status}"


def _nth(members: Callable[[], Sequence[MemberState]], index: int) -> MemberState:
    return members()[index]


class MembersEndpoint:
    """The supervisor's one HTTP endpoint on ``addr:port`` (port 0: a free
    one): a :class:`MembersCollector` on a registry of its own and one
    :class:`MemberProbe` per member.  A port that cannot be served raises
    :class:`~lite_push.ConfigError` naming ``metrics_port``."""

    def __init__(self, addr: str, port: int, members: Callable[[], Sequence[MemberState]], processes: int) -> None:
        registry = CollectorRegistry()
        self._collector = MembersCollector(members, processes)
        registry.register(self._collector)
        self._probes: list[MemberProbe] = []
        self._key: tuple[str, int] | None = None
        try:
            for i in range(processes):
                probe = MemberProbe(i, partial(_nth, members, i))
                self._key, port = exporter_for(addr, port, registry, probe)
                self._probes.append(probe)
        except (OSError, ValueError) as e:
            self.close()
            raise ConfigError("metrics_port", f"cannot serve metrics on {addr}:{port}: {e}") from e
        #: ``http://addr:port/metrics``.
        self.url = f"http://{addr}:{port}/metrics"

    def close(self) -> None:
        """Leave the endpoint (it shuts down) and stop the fetching threads."""
        key, self._key = self._key, None
        if key is not None:
            for probe in self._probes:
                release_exporter(key, probe)
        self._probes.clear()
        self._collector.close()
