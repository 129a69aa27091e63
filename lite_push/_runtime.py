"""The state one consumer's data path shares, and who writes what.

A consumer is built from a few parts, each in its own module: the pull loop
(``_pull_loop``), assignment (``_assignment``), the committer
(``_committer``), the failure sender (``_failure_sender``), one lane worker
per lane (``_lane_worker``) and an executor that drives the workers
(``_thread_executor`` or ``_async_executor``).  They meet in one
:class:`Runtime`: the configuration, the source, the lanes, the owned
queues, the retry timer, the outbox and the counters.

Every field has one writer (written where it is declared below); other
threads only read, and a racy read of an ``int`` or a list slot is fine for
statistics.  The locks are elsewhere: each :class:`~lite_push._lanes.Lane`
and :class:`~lite_push._process_queue.ProcessQueue` has its own, taken once
per batch or segment.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import defaultdict, deque
from collections.abc import Callable

from ._clock import Clock
from ._config import ConsumeMode, ConsumerConfig
from ._failures import Outbox, RetryTimer, SendItem
from ._lanemetrics import LaneMetrics
from ._lanes import Lane
from ._process_queue import ProcessQueue
from ._rate_limit import KeyPacer, RateLimiter
from ._router import KeyRouter
from ._types import MessageExt, MessageQueue
from .sources._base import MessageModel, PullSource

__all__ = [
    "ABORT_GRACE", "MAX_SEGMENT", "Counters", "Episode", "KeyOf", "QueueCounters", "Runtime", "per_queue",
    "safe_key_of",
]  # fmt: skip

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
        "busy", "consumed", "dead_lettered", "lock_failed", "lock_ok", "paced", "parked", "queues", "rebalances",
        "retried", "sent_back",
    )  # fmt: skip

    def __init__(self, lanes: int) -> None:
        # Per lane, each written by its lane's task.
        self.consumed = [0] * lanes
        self.retried = [0] * lanes
        self.parked = [0] * lanes
        self.paced = [0] * lanes  # messages held for their key's minimum interval
        self.busy = [False] * lanes  # holding taken work
        # Written by the pull thread.
        self.dead_lettered = 0
        self.sent_back = 0
        self.rebalances = 0
        self.lock_ok = 0
        self.lock_failed = 0
        self.queues: defaultdict[MessageQueue, QueueCounters] = defaultdict(QueueCounters)


class Episode:
    """Logs a source operation that keeps failing once per episode: the
    first failure as a warning with its traceback, the next ones at debug,
    and the first success after them at info (a Redis outage must not log
    once per poll or per commit)."""

    __slots__ = ("failing", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self.failing = False

    def failed(self, group: str, detail: str = "") -> None:
        if self.failing:
            logger.debug("%s failed again for consumer %r%s", self.what, group, detail, exc_info=True)
        else:
            self.failing = True
            logger.warning("%s failed for consumer %r%s; retrying", self.what, group, detail, exc_info=True)

    def ok(self, group: str) -> None:
        if self.failing:
            self.failing = False
            logger.info("%s recovered for consumer %r", self.what, group)


def per_queue(pairs: list[tuple[ProcessQueue, MessageExt]]) -> dict[ProcessQueue, list[MessageExt]]:
    """Messages grouped by their ProcessQueue, in order: one complete/skip
    (one lock) per queue instead of per message."""
    out: dict[ProcessQueue, list[MessageExt]] = {}
    for pq, m in pairs:
        out.setdefault(pq, []).append(m)
    return out


class Runtime:
    """What the parts of one consumer share (see the module docstring)."""

    __slots__ = (
        "abort", "app_paused", "broadcasting", "clock", "config", "counters", "failure", "flush", "key_of",
        "lane_limit", "lane_metrics", "lanes", "limiter", "on_failure", "outbox", "pacer", "park_generations", "pqs",
        "released", "router", "source", "timer",
    )  # fmt: skip

    def __init__(
        self,
        config: ConsumerConfig,
        source: PullSource,
        clock: Clock,
        lanes: list[Lane],
        flush: Callable[[], None],
        key_of: KeyOf | None,
        lane_metrics: list[LaneMetrics] | None,
    ) -> None:
        self.config = config
        self.source = source
        #: Queues the application paused (``consumer.pause``): replaced, never
        #: changed in place, so the pull thread reads it without a lock.
        self.app_paused: frozenset[MessageQueue] = frozenset()
        #: The consumer's injectable clock (retry delays, commit and lock
        #: intervals).
        self.clock = clock
        self.lanes = lanes
        #: The pull thread calls this once after a dispatch's puts: the one
        #: call into the event loop for async lanes (threads are woken by
        #: the put itself).
        self.flush = flush
        #: ``None``: the router reads ``message.keys`` itself (the fast path).
        self.key_of = key_of
        #: KEY_ORDERLY: places keys on lanes (``config.lane_placement``);
        #: used by the pull thread only.  ``None`` in the other modes.
        self.router: KeyRouter | None = (
            KeyRouter(len(lanes), config.lane_placement, key_of, MAX_SEGMENT)
            if config.mode is ConsumeMode.KEY_ORDERLY
            else None
        )
        #: Load placement: ``(lane, messages)`` a lane is done with (completed,
        #: dead-lettered or skipped), appended by the lanes once per segment
        #: and drained into the router by the pull thread before each
        #: dispatch.  A deque: appends and pops are atomic without a lock.
        self.released: deque[tuple[int, list[MessageExt]]] | None = (
            deque() if self.router is not None and self.router.tracks_load else None
        )
        #: Per lane, written by its task; ``None`` when metrics are off.
        self.lane_metrics = lane_metrics
        #: Load placement: how many lanes new keys may go to now (the
        #: executor's; ``None``: all of them).  Read by the pull thread
        #: before each dispatch.
        self.lane_limit: Callable[[], int | None] | None = None
        #: Owned queues; written by the pull thread only (assignment).
        self.pqs: dict[MessageQueue, ProcessQueue] = {}
        #: Parked keys (lanes add) and local retries (the pull thread adds);
        #: the pull thread pops what is due.
        self.timer = RetryTimer()
        #: Dead letters and send-backs, from the lanes to the pull thread.
        self.outbox = Outbox()
        #: ``max_rate``: the lanes (and the baseline's pool) reserve their
        #: calls' starts here; ``None``: no limit.
        self.limiter: RateLimiter | None = (
            None if config.max_rate is None else RateLimiter(config.max_rate, clock.monotonic)
        )
        #: ``key_min_interval``: when each key last started (lanes write,
        #: the pull thread rotates); ``None``: off.
        self.pacer: KeyPacer | None = KeyPacer(config.key_min_interval) if config.key_min_interval > 0 else None
        #: Set at the shutdown deadline: lanes skip what is left.
        self.abort = threading.Event()
        self.counters = Counters(len(lanes))
        #: Park generations (``next()`` is atomic).
        self.park_generations = itertools.count(1)
        #: BROADCASTING: no retry topic; CONCURRENTLY failures are retried here.
        self.broadcasting = source.message_model is MessageModel.BROADCASTING
        #: The first unexpected error of a lane or the pull thread (the
        #: consumer then stops); written once, by :meth:`fail`.
        self.failure: BaseException | None = None
        #: Called once on the first failure (the consumer core stops polling).
        self.on_failure: Callable[[], None] = _nothing

    @property
    def keyed(self) -> bool:
        """KEY_ORDERLY: failures park their key."""
        return self.config.mode is ConsumeMode.KEY_ORDERLY

    def fail(self, exc: BaseException) -> None:
        """A lane or the pull thread failed unexpectedly (already logged
        with its traceback): the consumer moves to its failed state and
        stops; ``stats().failure`` reports the first such error."""
        if self.failure is None:
            self.failure = exc
            self.on_failure()

    def hand_off(self, items: list[SendItem]) -> None:
        """From a lane (or the baseline's pool): messages for the pull
        thread to store in the dead-letter queue or the retry topic."""
        self.outbox.put(items)
        self.source.wakeup()


def _nothing() -> None:
    pass


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
