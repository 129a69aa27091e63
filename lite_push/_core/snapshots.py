"""What a running consumer reports: ``stats()`` and the metrics snapshot.

Both are read from the consumer's parts (:class:`Readings`: counters,
owned queues, timer, latch; what the lanes show, :class:`LaneReadings`:
depths, calls, admission, rate limit, distributions; the keys held back,
:class:`KeyReadings`: paused, held behind dead letters) and its queues
without stopping anything: counters are plain ints with one writer each,
and a queue's numbers are read under its own lock (one short hold per
queue).
:mod:`lite_push.metrics` turns a :class:`ConsumerMetrics` into Prometheus
families at scrape time; nothing here is done per message.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .._config import ConsumerConfig
from .._exec.call_watch import CallInProgress, CallWatch
from .._kernels.lanemetrics import LaneMetrics
from .._lanes.held_keys import HeldKeys
from .._lanes.lanes import Lane
from .._lanes.rate_limit import RateLimiter
from .._pull.key_pauses import KeyPauses
from .._state.process_queue import ProcessQueue
from .._state.shared import Counters, FailureLatch
from .._state.timer import RetryTimer
from .._types import MessageQueue
from ..sources.contract import PullSource

__all__ = [
    "ConsumerMetrics",
    "ConsumerStats",
    "KeyReadings",
    "LaneReadings",
    "QueueMetrics",
    "Readings",
    "metrics_of",
    "stats_of",
]

_DEPTH = operator.attrgetter("depth")


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneReadings:
    """What the lanes show: what waits in them, their calls, how many may
    call at once and what ``max_rate`` delayed (only read)."""

    lanes: list[Lane]
    #: Per lane; ``None`` when metrics are off.
    metrics: list[LaneMetrics] | None = None
    #: The asyncio executor's admission: lanes allowed in calls now.
    limit: Callable[[], int | None] | None = None
    #: Watches the lanes' calls (``None``: the baseline, whose lanes make no calls).
    watch: CallWatch | None = None
    #: ``max_rate``: gates the lanes' calls (``None``: no limit).
    limiter: RateLimiter | None = None

    def depths(self) -> tuple[int, ...]:
        """Messages waiting in each lane."""
        return tuple(map(_DEPTH, self.lanes))

    def admitted(self) -> int:
        """Lanes allowed in listener calls at once now (all without admission)."""
        limit = None if self.limit is None else self.limit()
        return len(self.lanes) if limit is None else min(limit, len(self.lanes))

    def busy(self, busy: Sequence[bool]) -> int:
        """Lanes holding taken work (``busy``: ``Counters.busy``) or with
        messages waiting."""
        return sum(1 for i, lane in enumerate(self.lanes) if busy[i] or lane.depth)

    def distributions(self) -> list[list[tuple[list[int], float]]]:
        """Per distribution (listener duration, lane wait, end-to-end
        latency): each lane's ``(bucket counts, sum)``; empty lists when
        metrics are off."""
        snaps = [lm.snapshot() for lm in self.metrics or ()]
        return [[snap[i] for snap in snaps] for i in range(3)]

    def longest(self) -> CallInProgress | None:
        """The call in progress that started first (``None``: none runs)."""
        return None if self.watch is None else self.watch.longest()

    def slow_calls(self) -> int:
        """Calls logged for running longer than ``slow_call_warning``."""
        return 0 if self.watch is None else self.watch.warnings

    def steal_after(self) -> float | None:
        """Seconds after which a call's lane is stolen from (``None``: never)."""
        return None if self.watch is None else self.watch.threshold

    def rate_limited(self) -> tuple[int, float]:
        """``max_rate``: (messages delayed, seconds waited)."""
        lim = self.limiter
        return (0, 0.0) if lim is None else (lim.delayed, lim.waited)


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyReadings:
    """The keys held back: paused by the application, or held behind their
    dead letters (only read)."""

    #: The keys the application paused.
    pauses: KeyPauses | None = None
    #: The keys held behind their dead letters (``dead_letter_order="key"``).
    held: HeldKeys | None = None

    def paused(self) -> frozenset[str]:
        """The keys the application paused now."""
        return frozenset() if self.pauses is None else self.pauses.keys

    def held_count(self) -> int:
        """How many keys are held now."""
        return 0 if self.held is None else len(self.held.keys)

    def held_shown(self) -> tuple[int, tuple[str, ...]]:
        """How many keys are held now, and the first of them by name."""
        return (0, ()) if self.held is None else self.held.shown()


@dataclass(frozen=True, slots=True, kw_only=True)
class Readings:
    """The parts of one consumer that ``stats()`` and the metrics read
    (only read: each is written by its own owner)."""

    config: ConsumerConfig
    source: PullSource
    counters: Counters
    owned: dict[MessageQueue, ProcessQueue]
    timer: RetryTimer
    latch: FailureLatch
    #: What the lanes show.
    lanes: LaneReadings
    #: The keys held back.
    keys: KeyReadings


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """A snapshot of a consumer, safe to read from any thread."""

    #: Messages the listener finished successfully.
    consumed: int
    #: Listener attempts that failed and were scheduled again (per message).
    retried: int
    #: Unfinished messages per owned queue (queued in lanes or running).
    in_flight: Mapping[MessageQueue, int]
    #: Unfinished message body bytes per owned queue.
    in_flight_bytes: Mapping[MessageQueue, int]
    #: Owned queues that flow control has paused.
    paused: frozenset[MessageQueue]
    #: Offset last committed per owned queue (next offset to consume).
    committed: Mapping[MessageQueue, int]
    #: Messages waiting in each lane (not yet taken by its task).
    lane_depths: tuple[int, ...]
    #: Messages stored in the dead-letter queue by this consumer.
    dead_lettered: int = 0
    #: Messages sent back to the retry topic (CONCURRENTLY).
    sent_back: int = 0
    #: Messages of parked keys waiting for a retry (KEY_ORDERLY), the
    #: failed head of each key included, or for their key's interval
    #: (``key_min_interval``), or for the application to resume their key
    #: (``paused_key_messages``).
    parked: int = 0
    #: When the earliest retry on the consumer's timer is due (the
    #: consumer clock's ``monotonic()``): a parked key, or a local retry;
    #: None when nothing waits.
    next_retry_due: float | None = None
    #: Whether the pull thread is running (polling, dispatching, committing).
    polling: bool = False
    #: ``None`` while healthy; else the unexpected error of a lane or the
    #: pull thread that stopped the consumer (``"TypeName: message"``).
    failure: str | None = None
    #: How many lanes may be in listener calls at once now: the lane count,
    #: or fewer while the asyncio executor's admission limits them (the
    #: event loop cannot turn over every lane within ``loop_turn_target``).
    lanes_admitted: int = 0
    #: Liveness, as ``/healthz`` says it: ``"ok"`` or why not (failed,
    #: stopped, a thread not running).
    health: str = "ok"
    #: Readiness, as ``/readyz`` says it: ``"ok"`` or why not (not started,
    #: not subscribed, no queue assigned yet).
    readiness: str = "ok"
    #: ``max_rate``: messages whose call waited for the limit, and the
    #: seconds calls waited in all.
    rate_limit_delayed: int = 0
    rate_limit_wait_seconds: float = 0.0
    #: ``key_min_interval``: times a key's message was held for it.
    key_interval_holds: int = 0
    #: The keys the application paused (``pause_keys``), as
    #: ``paused_keys()`` says.
    paused_keys: frozenset[str] = frozenset()
    #: Messages waiting for the application to resume their key (counted in
    #: ``parked`` too, and in their queue's ``in_flight``).
    paused_key_messages: int = 0
    #: The listener call in progress that started first (its key, queue,
    #: offset and how long it has run); ``None`` when no call runs.
    longest_call: CallInProgress | None = None
    #: Calls logged for running longer than ``slow_call_warning``.
    slow_calls: int = 0
    #: ``steal_after``: times other keys' messages were moved off a lane
    #: stuck in a call, and how many messages moved.
    steals: int = 0
    stolen: int = 0
    #: Seconds after which a call's lane is stolen from now (``"auto"``:
    #: as learnt so far); ``None``: keys never move.
    steal_after: float | None = None
    #: ``dead_letter_order="key"``: keys held behind their dead letters now
    #: (in the owned queues), the first of them by name (at most 20,
    #: sorted), and the messages this consumer dead-lettered behind a held
    #: key (counted in ``dead_lettered`` too).
    held_keys: int = 0
    held_key_names: tuple[str, ...] = ()
    held_behind: int = 0

    def __repr__(self) -> str:
        """One summary line (the fields hold per-queue maps: read them for
        the detail)."""
        failure = "" if self.failure is None else f", failure={self.failure!r}"
        return (
            f"ConsumerStats(consumed={self.consumed}, retried={self.retried}, dead_lettered={self.dead_lettered}, "
            f"sent_back={self.sent_back}, in_flight={sum(self.in_flight.values())} in {len(self.in_flight)} queues, "
            f"paused={len(self.paused)} queues, parked={self.parked}, lanes={len(self.lane_depths)} "
            f"(queued {sum(self.lane_depths)}), polling={self.polling}, health={self.health!r}, "
            f"readiness={self.readiness!r}{failure})"
        )


@dataclass(frozen=True, slots=True)
class QueueMetrics:
    """One owned queue's state at a scrape."""

    queue: MessageQueue
    in_flight: int
    in_flight_bytes: int
    paused: bool
    committed: int
    #: ``time.time()`` when the committed offset was last current (None: never).
    last_commit_time: float | None
    #: The source's end offset (None: unknown, e.g. the source is down).
    end_offset: int | None


@dataclass(frozen=True, slots=True)
class ConsumerMetrics:
    """A consumer's samples for one scrape (see :mod:`lite_push.metrics`)."""

    group: str
    mode: str
    queues: Sequence[QueueMetrics]
    #: ``(polled, filtered, pauses, resumes)`` per queue ever owned.
    queue_counts: Mapping[MessageQueue, tuple[int, int, int, int]]
    consumed: int
    retried: int
    dead_lettered: int
    sent_back: int
    parked: int
    #: Per distribution (listener duration, lane wait, end-to-end latency):
    #: each lane's ``(bucket counts, sum)``.
    distributions: Sequence[Sequence[tuple[list[int], float]]]
    lanes_busy: int
    lanes: int
    #: Lanes allowed in listener calls at once (admission; ``lanes`` without).
    lanes_admitted: int
    rebalances: int
    lock_renewals_ok: int
    lock_renewals_failed: int
    #: ``max_rate`` (``None``: no limit) and what it delayed:
    #: ``(messages, seconds waited)``.
    max_rate: float | None = None
    rate_limited: tuple[int, float] = (0, 0.0)
    key_interval_holds: int = 0
    #: Keys the application paused, and the messages waiting for them.
    paused_keys: int = 0
    paused_key_messages: int = 0
    #: How long the oldest call in progress has run (0.0: none).
    oldest_call_seconds: float = 0.0
    slow_calls: int = 0
    steals: int = 0
    stolen: int = 0
    #: ``dead_letter_order="key"``: keys held now, and messages dead-lettered
    #: behind a held key.
    held_keys: int = 0
    held_behind: int = 0


def stats_of(rt: Readings, extra: tuple[int, int], polling: bool) -> ConsumerStats:
    """``stats()``: ``extra`` is the baseline's (consumed, retried)."""
    c = rt.counters
    pqs = list(rt.owned.items())
    snaps = {q: pq.snapshot() for q, pq in pqs}
    lanes, keys = rt.lanes, rt.keys
    delayed, waited = lanes.rate_limited()
    held, names = keys.held_shown()
    return ConsumerStats(
        consumed=sum(c.consumed) + extra[0],
        retried=sum(c.retried) + extra[1],
        in_flight={q: s[0] for q, s in snaps.items()},
        in_flight_bytes={q: s[1] for q, s in snaps.items()},
        paused=frozenset(q for q, pq in pqs if pq.paused),
        committed={q: pq.last_committed for q, pq in pqs},
        lane_depths=lanes.depths(),
        dead_lettered=c.dead_lettered,
        sent_back=c.sent_back,
        parked=sum(c.parked),
        next_retry_due=rt.timer.next_due(),
        polling=polling,
        failure=None if (failure := rt.latch.failure) is None else f"{type(failure).__name__}: {failure}",
        lanes_admitted=lanes.admitted(),
        rate_limit_delayed=delayed,
        rate_limit_wait_seconds=waited,
        key_interval_holds=sum(c.paced),
        paused_keys=keys.paused(),
        paused_key_messages=sum(c.key_paused),
        longest_call=lanes.longest(),
        slow_calls=lanes.slow_calls(),
        steals=c.steals,
        stolen=c.stolen,
        steal_after=lanes.steal_after(),
        held_keys=held,
        held_key_names=names,
        held_behind=c.held_behind,
    )


def metrics_of(rt: Readings, extra: tuple[int, int]) -> ConsumerMetrics:
    """The metrics snapshot (exporter thread); the source is asked for the
    owned queues' end offsets (a failure there leaves the lag out)."""
    c = rt.counters
    pqs = list(rt.owned.items())
    try:
        ends = rt.source.end_offsets([q for q, _ in pqs]) if pqs else {}
    except Exception:  # the source is down: no lag this scrape
        ends = {}
    queues = []
    for q, pq in pqs:
        count, size, _span, _map = pq.snapshot()
        queues.append(QueueMetrics(q, count, size, pq.paused, pq.last_committed, pq.last_commit_time, ends.get(q)))
    lanes = rt.lanes
    return ConsumerMetrics(
        group=rt.config.group,
        mode=rt.config.consume_mode.name,
        queues=queues,
        queue_counts={q: (s.polled, s.filtered, s.pauses, s.resumes) for q, s in list(c.queues.items())},
        consumed=sum(c.consumed) + extra[0],
        retried=sum(c.retried) + extra[1],
        dead_lettered=c.dead_lettered,
        sent_back=c.sent_back,
        parked=sum(c.parked),
        distributions=lanes.distributions(),
        lanes_busy=lanes.busy(c.busy),
        lanes=len(lanes.lanes),
        lanes_admitted=lanes.admitted(),
        rebalances=c.rebalances,
        lock_renewals_ok=c.lock_ok,
        lock_renewals_failed=c.lock_failed,
        max_rate=rt.config.max_rate,
        rate_limited=lanes.rate_limited(),
        key_interval_holds=sum(c.paced),
        paused_keys=len(rt.keys.paused()),
        paused_key_messages=sum(c.key_paused),
        oldest_call_seconds=0.0 if (call := lanes.longest()) is None else call.seconds,
        slow_calls=lanes.slow_calls(),
        steals=c.steals,
        stolen=c.stolen,
        held_keys=rt.keys.held_count(),
        held_behind=c.held_behind,
    )
