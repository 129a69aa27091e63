"""librdkafka settings: the properties lite_push sets itself and refuses
from users (:data:`RESERVED`), a user's settings checked, and the settings
of a group member's client."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..._errors import ConfigError
from ..contract import ConsumeFromWhere
from .client_log import LIBRDKAFKA_LOG
from .ownership import STATS_INTERVAL

__all__ = [
    "FETCH_WAIT_MAX_MS",
    "RECONNECT_BACKOFF_MS",
    "RESERVED",
    "checked_settings",
    "fetcher_settings",
    "member_settings",
]

#: librdkafka properties lite_push sets itself.
RESERVED = frozenset(
    {
        "bootstrap.servers",
        "group.id",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "partition.assignment.strategy",
        "group.protocol",
        "session.timeout.ms",
        "statistics.interval.ms",
        "stats_cb",
        "on_commit",
        "logger",
    }
)
#: librdkafka's ``reconnect.backoff.ms`` of a member unless set (its default is 100).
RECONNECT_BACKOFF_MS = "10"
#: librdkafka's ``fetch.wait.max.ms`` of a member unless set (its default,
#: like the Java client's, is 500).  librdkafka keeps one fetch request in
#: flight per broker, and a partition resumed after a flow-control pause
#: joins only the next one: with nothing new to return the broker holds the
#: request this long, and the resumed queue's lanes ran dry meanwhile (a
#: median 300 ms from resume to its next records; at the default
#: ``pull_threshold_for_queue`` and 1 ms listeners 23,000 msg/s against
#: 46,000-49,000 with 50-100 ms: benchmarks/RESULTS.md, issue 31).  The cost
#: is an idle member's fetches: ten a second per broker instead of two.
FETCH_WAIT_MAX_MS = "100"


def checked_settings(name: str, raw: Mapping[str, Any] | None) -> dict[str, Any]:
    """The librdkafka properties of ``raw`` (the broker argument ``name``)
    as strings; ``ConfigError`` naming a key that is not a string or is
    :data:`RESERVED`, or a value that is not a string, a number or a bool."""
    out: dict[str, Any] = {}
    for k, v in (raw or {}).items():
        if not isinstance(k, str):
            raise ConfigError(name, f"keys must be librdkafka property names, got {k!r}")
        if k in RESERVED:
            raise ConfigError(f"{name}[{k!r}]", "is set by lite_push and cannot be overridden")
        if isinstance(v, bool):
            v = "true" if v else "false"
        elif not isinstance(v, (str, int, float)):
            raise ConfigError(f"{name}[{k!r}]", f"must be a string or a number, got {v!r}")
        out[k] = str(v)
    return out


def member_settings(
    base: Mapping[str, Any],
    group: str,
    client_id: str,
    consume_from: ConsumeFromWhere,
    session_timeout: float,
    stats_cb: Callable[[str], None],
) -> dict[str, Any]:
    """A member's librdkafka settings: the broker's ``base`` settings, what
    lite_push sets (the group, manual commits, the cooperative-sticky
    assignor, the session, statistics to ``stats_cb``), and defaults the
    base may override."""
    timeout_ms = int(session_timeout * 1000)
    settings = {
        **base,
        "group.id": group,
        "client.id": client_id,
        "partition.assignment.strategy": "cooperative-sticky",
        "enable.auto.commit": "false",
        "enable.auto.offset.store": "false",
        "auto.offset.reset": "earliest" if consume_from is ConsumeFromWhere.FIRST_OFFSET else "latest",
        "session.timeout.ms": str(timeout_ms),
        "heartbeat.interval.ms": str(max(100, timeout_ms // 10)),
        "statistics.interval.ms": str(int(STATS_INTERVAL * 1000)),
        "stats_cb": stats_cb,
        "logger": LIBRDKAFKA_LOG,
    }
    settings.setdefault("max.poll.interval.ms", str(max(timeout_ms + 1000, 300_000)))
    # librdkafka holds back new broker connections for half of this
    # (50 ms by default): at start that delays joining the group.
    settings.setdefault("reconnect.backoff.ms", RECONNECT_BACKOFF_MS)
    # A queue resumed after a flow-control pause waits for the fetch in flight.
    settings.setdefault("fetch.wait.max.ms", FETCH_WAIT_MAX_MS)
    # Connect to every broker as soon as it is known, not when first
    # needed: joining waits for one (measured on the mock cluster: the
    # join took 4 ms, or 15 ms half of the time with sparse connections).
    settings.setdefault("enable.sparse.connections", "false")
    return settings


def fetcher_settings(base: Mapping[str, Any], group: str, client_id: str) -> dict[str, Any]:
    """The settings of a member's fetcher: a second client that reads the
    member's partitions by manual assignment (it joins no group, commits
    nothing and runs no rebalance callback, so the event loop may read it;
    see ``consumer.py``); its log lines go to ``LIBRDKAFKA_LOG`` (the
    fetch client's ``logger``).  ``group.id`` is required by confluent-kafka;
    the fetcher's is the group's with a suffix and is never joined."""
    settings = {
        **base,
        "group.id": f"{group}.lite-push-fetcher",
        "client.id": f"{client_id}-fetcher",
        "enable.auto.commit": "false",
        "enable.auto.offset.store": "false",
    }
    settings.setdefault("reconnect.backoff.ms", RECONNECT_BACKOFF_MS)
    settings.setdefault("fetch.wait.max.ms", FETCH_WAIT_MAX_MS)
    settings.setdefault("enable.sparse.connections", "false")
    return settings
