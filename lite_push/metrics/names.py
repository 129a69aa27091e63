"""Every Prometheus metric lite_push exports: its name, type, labels and meaning.

This module is the one place metric names live (the Grafana dashboard in
``grafana/`` may use only these; ``tests/test_grafana.py`` checks it).  Names
follow Prometheus practice: the ``lite_push_`` prefix, base units as suffix
(``_seconds``, ``_bytes``), ``_total`` on counters, ``_info`` for build
metadata.  Labels have bounded cardinality: ``group``, ``topic``, ``queue``
(the queue id), ``mode`` and ``outcome`` -- never a message key, never a lane.

Each entry is ``NAME: (type, labels, help)``.  Histograms also export
``_bucket``, ``_sum`` and ``_count`` series; counters are exported with their
``_total`` name (prometheus-client also adds a ``_created`` series).
"""

from __future__ import annotations

from typing import Final

__all__ = ["METRICS", "PREFIX", "exported_series"]

PREFIX: Final = "lite_push_"

#: name -> (Prometheus type, label names, help text)
METRICS: Final[dict[str, tuple[str, tuple[str, ...], str]]] = {
    # -- build --------------------------------------------------------------
    #: 1, with the package version and the implementations of the three
    #: compiled kernels in use ("cython" or "python") as labels: the router
    #: (``ROUTER_IMPL``), the offset tracker (``OFFSETS_IMPL``) and the
    #: lanes' distribution recorder (``LANE_METRICS_IMPL``).
    "lite_push_build_info": (
        "gauge",
        ("version", "router", "offsets", "lane_metrics"),
        "lite_push version and kernels in use",
    ),
    # -- the pull side (per queue) --------------------------------------------
    #: Messages the source returned to the pull thread.
    "lite_push_messages_polled_total": (
        "counter",
        ("group", "topic", "queue"),
        "Messages polled from the source",
    ),
    #: Offsets the source skipped by tag filter (never handed to the consumer).
    "lite_push_messages_filtered_total": (
        "counter",
        ("group", "topic", "queue"),
        "Messages skipped by the subscription's tag filter",
    ),
    #: Messages polled and not finished: queued in a lane, in the listener,
    #: or parked for a retry.  Flow control pauses a queue above its threshold.
    "lite_push_in_flight_messages": (
        "gauge",
        ("group", "topic", "queue"),
        "Messages polled and not yet finished",
    ),
    #: Body bytes of those messages.
    "lite_push_in_flight_bytes": (
        "gauge",
        ("group", "topic", "queue"),
        "Body bytes polled and not yet finished",
    ),
    #: 1 while flow control keeps the queue paused, else 0.
    "lite_push_queue_paused": (
        "gauge",
        ("group", "topic", "queue"),
        "1 while the queue is paused by flow control",
    ),
    #: Times flow control paused the queue.
    "lite_push_queue_pauses_total": (
        "counter",
        ("group", "topic", "queue"),
        "Times the queue was paused",
    ),
    #: Times flow control resumed the queue.
    "lite_push_queue_resumes_total": (
        "counter",
        ("group", "topic", "queue"),
        "Times the queue was resumed",
    ),
    # -- commits and lag (per queue) ------------------------------------------
    #: The offset last committed: the lowest unfinished one.
    "lite_push_committed_offset": (
        "gauge",
        ("group", "topic", "queue"),
        "Last committed offset",
    ),
    #: When it was committed (Unix time).
    "lite_push_last_commit_timestamp_seconds": (
        "gauge",
        ("group", "topic", "queue"),
        "Unix time of the last successful commit",
    ),
    #: The queue's end offset at the source minus the committed offset.
    "lite_push_lag_messages": (
        "gauge",
        ("group", "topic", "queue"),
        "Broker end offset minus committed offset",
    ),
    # -- processing (per group; counted per batch by the lanes) ----------------
    #: Listener outcomes: ``success`` (finished), ``retry`` (a failed attempt,
    #: to be tried again), ``dlq`` (sent to the dead-letter queue).
    "lite_push_messages_processed_total": (
        "counter",
        ("group", "mode", "outcome"),
        "Messages processed, by outcome (success, retry, dlq)",
    ),
    #: Messages sent back to the group's retry topic (CONCURRENTLY).
    "lite_push_messages_sent_back_total": (
        "counter",
        ("group",),
        "Messages sent back to the retry topic",
    ),
    #: ``dead_letter_order="key"``: keys held behind their dead letters now
    #: in the queues this member owns (their later messages go to the
    #: dead-letter queue until ``lite-push dlq resend --key`` releases them).
    "lite_push_held_keys": (
        "gauge",
        ("group",),
        "Keys held behind their dead letters",
    ),
    #: Messages dead-lettered because their key was held (not because they
    #: failed); also counted in ``outcome="dlq"`` of messages processed.
    "lite_push_held_messages_total": (
        "counter",
        ("group",),
        "Messages dead-lettered behind a held key",
    ),
    #: Messages whose key is parked right now: for a retry (KEY_ORDERLY),
    #: for its ``key_min_interval``, or paused by the application.
    "lite_push_parked_messages": (
        "gauge",
        ("group",),
        "Messages waiting behind a parked key (a retry, key_min_interval, a paused key)",
    ),
    #: Keys the application paused (``consumer.pause_keys``) and has not
    #: resumed.
    "lite_push_paused_keys": (
        "gauge",
        ("group",),
        "Keys the application paused",
    ),
    #: Messages waiting for the application to resume their key (counted
    #: in ``lite_push_parked_messages`` too).
    "lite_push_paused_key_messages": (
        "gauge",
        ("group",),
        "Messages waiting for a key the application paused",
    ),
    #: Time in the listener per message (a segment's listener time over its
    #: messages: one observation per segment, weighted by its message count).
    "lite_push_listener_duration_seconds": (
        "histogram",
        ("group", "mode"),
        "Listener time per message",
    ),
    #: Time from the pull thread handing messages to a lane until the lane
    #: took them.
    "lite_push_lane_wait_seconds": (
        "histogram",
        ("group",),
        "Time messages waited in their lane",
    ),
    #: From the message's store timestamp to the end of its processing.
    "lite_push_end_to_end_latency_seconds": (
        "histogram",
        ("group",),
        "Store timestamp to processed",
    ),
    # -- lanes --------------------------------------------------------------
    #: Lanes holding or processing messages now.
    "lite_push_lanes_busy": (
        "gauge",
        ("group",),
        "Lanes with messages queued or in the listener",
    ),
    #: Lanes configured.
    "lite_push_lanes": ("gauge", ("group",), "Lanes configured"),
    #: asyncio executor: lanes admission lets into listener calls at once
    #: now (the lane count while the event loop keeps up; fewer while it
    #: cannot turn over every lane within ``loop_turn_target``).
    "lite_push_lanes_admitted": (
        "gauge",
        ("group",),
        "Lanes allowed in listener calls at once (asyncio admission)",
    ),
    # -- slow calls (``_exec.call_watch``, ``_pull.lane_steal``) ---------------------------
    #: How long the oldest listener call in progress has run (0: none);
    #: ``stats().longest_call`` names its key, queue and offset.
    "lite_push_oldest_call_seconds": (
        "gauge",
        ("group",),
        "Seconds the oldest listener call in progress has run",
    ),
    #: Listener calls logged for running longer than ``slow_call_warning``.
    "lite_push_slow_calls_total": (
        "counter",
        ("group",),
        "Listener calls that ran longer than slow_call_warning",
    ),
    #: Times messages of other keys were moved off a lane stuck in a call
    #: longer than ``steal_after``.
    "lite_push_lane_steals_total": (
        "counter",
        ("group",),
        "Times keys were moved off a lane stuck in a listener call",
    ),
    #: Messages so moved.
    "lite_push_stolen_messages_total": (
        "counter",
        ("group",),
        "Messages moved off a lane stuck in a listener call",
    ),
    # -- rate limits ----------------------------------------------------------
    #: ``max_rate``: the limit, messages per second (only while one is set).
    "lite_push_rate_limit_messages_per_second": (
        "gauge",
        ("group",),
        "The consumer's max_rate (messages per second)",
    ),
    #: Messages whose listener call waited for ``max_rate`` before it started.
    "lite_push_rate_limit_delayed_messages_total": (
        "counter",
        ("group",),
        "Messages whose listener call waited for max_rate",
    ),
    #: Seconds listener calls waited for ``max_rate`` (summed over calls;
    #: its rate is the average number of calls waiting).
    "lite_push_rate_limit_wait_seconds_total": (
        "counter",
        ("group",),
        "Seconds listener calls waited for max_rate",
    ),
    #: Times a key's next message was held for ``key_min_interval``.
    "lite_push_key_interval_holds_total": (
        "counter",
        ("group",),
        "Times a key's message was held for key_min_interval",
    ),
    # -- membership and locks ----------------------------------------------------
    #: Rebalances seen by this member (each assignment change).
    "lite_push_rebalances_total": (
        "counter",
        ("group",),
        "Assignment changes seen by this member",
    ),
    #: Queues assigned to this member now.
    "lite_push_assigned_queues": (
        "gauge",
        ("group",),
        "Queues assigned to this member",
    ),
    #: Queue lock renewals (QUEUE_ORDERLY), by outcome ``ok`` / ``failed``.
    "lite_push_lock_renewals_total": (
        "counter",
        ("group", "outcome"),
        "Queue lock renewals, by outcome",
    ),
}


def exported_series() -> frozenset[str]:
    """Every series name a scrape can show: counters' ``_total`` (and
    ``_created``), histograms' ``_bucket``/``_sum``/``_count``; a
    consumer's (:data:`METRICS`) and a process supervisor's
    (:data:`SUPERVISOR_METRICS`)."""
    out: set[str] = set()
    for name, (kind, _, _) in (METRICS | SUPERVISOR_METRICS).items():
        if kind == "counter":
            out.add(name)
            out.add(name[: -len("_total")] + "_created")
        elif kind == "histogram":
            out.update(name + s for s in ("_bucket", "_sum", "_count", "_created"))
        else:
            out.add(name)
    return frozenset(out)


# -- the process supervisor (lite_push.supervisor) -------------------------------
#
# A separate table: these series come from a ProcessSupervisor's own endpoint,
# never from a consumer.  On that endpoint every consumer series of the
# members (METRICS above) carries one more label, ``member`` (the member's
# index, 0 .. processes-1).

__all__ += ["SUPERVISOR_METRICS"]

#: name -> (Prometheus type, label names, help text) of the supervisor's series
SUPERVISOR_METRICS: Final[dict[str, tuple[str, tuple[str, ...], str]]] = {
    #: The ``processes`` the supervisor runs.
    "lite_push_supervisor_members": (
        "gauge",
        (),
        "Member processes configured",
    ),
    #: 1 while the member's process runs, 0 while it waits for a restart.
    "lite_push_supervisor_member_up": (
        "gauge",
        ("member",),
        "1 while the member process is running",
    ),
    #: Times the supervisor started the member again after it died.
    "lite_push_supervisor_member_restarts_total": (
        "counter",
        ("member",),
        "Restarts of the member process after it died",
    ),
}
