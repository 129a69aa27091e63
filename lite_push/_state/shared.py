"""The small pieces a consumer's parts share, each with its writers named.

A consumer is built from parts, each in its own module and each constructed
with the few collaborators it uses (``_core.consumer_core`` wires them): the pull
loop (``_pull.loop``), the dispatcher (``_pull.dispatch``), assignment
(``_pull.assignment``), flow control (``_pull.flow_control``), the committer
(``_pull.committer``), the failure sender (``_pull.failure_sender``), one lane worker
per lane (``_lanes.worker``) and an executor that drives the workers
(``_exec.thread_executor`` or ``_exec.async_executor``).  What several of them touch
is here: the counters (each field has one writer; other threads only read,
and a racy read of an ``int`` or a list slot is fine for statistics), the
first failure (:class:`FailureLatch`), the application's paused queues
(:class:`AppPauses`), and helpers.  The other shared objects have their own
modules and locks: each :class:`~lite_push._lanes.lanes.Lane` and
:class:`~lite_push._state.process_queue.ProcessQueue`, the timer (``_state.timer``)
and the outbox (``_lanes.failures``).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable

from .._types import MessageExt, MessageQueue
from .process_queue import ProcessQueue

__all__ = [
    "ABORT_GRACE",
    "MAX_SEGMENT",
    "AppPauses",
    "Counters",
    "Episode",
    "FailureLatch",
    "KeyOf",
    "QueueCounters",
    "error_line",
    "per_queue",
    "safe_key_of",
]

logger = logging.getLogger(__name__)

#: Seconds granted, after the shutdown deadline, to listener calls already
#: running before the final commit (the asyncio executor then cancels them).
ABORT_GRACE = 0.5

#: Most messages in one segment (a lane's run of one queue's messages from
#: one dispatch).  A lane completes, and releases to the router, its work a
#: segment at a time; with larger segments a lane handed many messages of one
#: queue counts as loaded by all of them until the last is done, and the load
#: placement avoids it while it is about to go idle.  8 measured best in
#: ``benchmarks/placement_sim.py`` (pc-bench, 16 and 64 lanes); it costs the
#: no-op path nothing measurable (RESULTS.md, issue 17).
MAX_SEGMENT = 8

#: The key a message is routed and parked by (``None``: route by queue).
KeyOf = Callable[[MessageExt], "str | None"]


class QueueCounters:
    """Per queue, written by the pull thread: what the metrics report."""

    __slots__ = ("filtered", "pauses", "polled", "resumes")

    def __init__(self) -> None:
        self.polled = 0
        self.filtered = 0
        self.pauses = 0
        self.resumes = 0


class Counters:
    """The consumer's counters: plain ints, each with one writer, read by
    ``stats()`` and the metrics collector without a lock."""

    __slots__ = (
        "busy",
        "consumed",
        "dead_lettered",
        "held_behind",
        "key_paused",
        "lock_failed",
        "lock_ok",
        "paced",
        "parked",
        "queues",
        "rebalances",
        "retried",
        "sent_back",
        "steals",
        "stolen",
    )

    def __init__(self, lanes: int) -> None:
        # Per lane, each written by its lane's task.
        self.consumed = [0] * lanes
        self.retried = [0] * lanes
        self.parked = [0] * lanes
        self.paced = [0] * lanes  # messages held for their key's minimum interval
        self.key_paused = [0] * lanes  # parked messages of keys the application paused
        self.busy = [False] * lanes  # holding taken work
        # Written by the pull thread.
        self.dead_lettered = 0
        self.held_behind = 0  # dead letters stored because their key was held (dead_letter_order="key")
        self.sent_back = 0
        self.rebalances = 0
        self.lock_ok = 0
        self.lock_failed = 0
        self.steals = 0  # times messages were moved off a lane stuck in a call
        self.stolen = 0  # messages so moved
        self.queues: defaultdict[MessageQueue, QueueCounters] = defaultdict(QueueCounters)


class Episode:
    """Logs a source operation that keeps failing once per episode: the
    first failure as one warning line naming the error (its traceback at
    debug), the next ones at debug, and the first success after them at
    info (a Redis outage must not log once per poll or per commit, nor a
    client library's chained traceback at each outage)."""

    __slots__ = ("failing", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self.failing = False

    def failed(self, group: str, detail: str = "", error: BaseException | None = None) -> None:
        """The operation failed for ``group``'s consumer (``detail`` is
        added to the line) with ``error``, by default the exception being
        handled."""
        if error is None:
            error = sys.exc_info()[1]
        trace = None if error is None else (type(error), error, error.__traceback__)
        if self.failing:
            logger.debug("%s failed again for consumer %r%s", self.what, group, detail, exc_info=trace)
            return
        self.failing = True
        reason = "" if error is None else f" ({error_line(error)})"
        logger.warning("%s failed for consumer %r%s; retrying%s", self.what, group, detail, reason)
        if trace is not None:
            logger.debug("%s failed for consumer %r: the traceback", self.what, group, exc_info=trace)

    def ok(self, group: str) -> None:
        """The operation succeeded: the episode, if any, is over."""
        if self.failing:
            self.failing = False
            logger.info("%s recovered for consumer %r", self.what, group)


def error_line(error: BaseException) -> str:
    """``error`` as one line: its type's name and its message, whitespace
    folded (``ConnectionError: Error 111 connecting to ...``)."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def per_queue(pairs: list[tuple[ProcessQueue, MessageExt]]) -> dict[ProcessQueue, list[MessageExt]]:
    """Messages grouped by their ProcessQueue, in order: one complete/skip
    (one lock) per queue instead of per message."""
    out: dict[ProcessQueue, list[MessageExt]] = {}
    for pq, m in pairs:
        out.setdefault(pq, []).append(m)
    return out


class FailureLatch:
    """The first unexpected error of a lane or the pull thread: recorded
    once, then ``on_failure`` is called once (the consumer stops polling and
    shuts down as ``shutdown()`` would).  Written by :meth:`fail` from any
    thread; a second failure racing the first is logged by its thread and
    otherwise ignored."""

    __slots__ = ("_lock", "_on_failure", "failure")

    def __init__(self, on_failure: Callable[[], None]) -> None:
        self._on_failure = on_failure
        #: Makes the first failure the one recorded and reported.
        self._lock = threading.Lock()
        #: ``None`` while healthy.
        self.failure: BaseException | None = None

    def fail(self, exc: BaseException) -> None:
        """A lane or the pull thread failed (already logged with its
        traceback): the consumer moves to its failed state and stops."""
        with self._lock:
            if self.failure is not None:
                return
            self.failure = exc
        self._on_failure()


class AppPauses:
    """The queues the application paused (``consumer.pause``): flow control
    never resumes them.  ``queues`` is replaced, never changed in place, so
    the pull thread reads it without a lock; ``_lock`` makes concurrent
    pauses and resumes of the application's threads add up."""

    __slots__ = ("_lock", "queues")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.queues: frozenset[MessageQueue] = frozenset()

    def pause(self, queues: Iterable[MessageQueue]) -> None:
        """Hold ``queues`` paused (any thread)."""
        with self._lock:
            self.queues = self.queues | frozenset(queues)

    def resume(self, queues: Iterable[MessageQueue]) -> None:
        """Let ``queues`` go (any thread)."""
        with self._lock:
            self.queues = self.queues - frozenset(queues)


def safe_key_of(extract: KeyOf) -> KeyOf:
    """``extract``, with a failure logged and the message routed (and
    parked) by its queue instead: that keeps it in its queue's order, which
    is never wrong, only less parallel."""

    def key_of(msg: MessageExt) -> str | None:
        try:
            return extract(msg)
        except Exception:
            logger.exception(
                "key_extractor failed for %s offset %d; routing it by its queue", msg.queue, msg.queue_offset
            )
            return None

    return key_of
