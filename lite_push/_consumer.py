"""LitePushConsumer: key-affinity push consumption on top of a pull source.

Threads and what each owns
--------------------------
* The **pull thread** is the only thread that touches the source: it polls,
  runs the rebalance callbacks (they are called from inside ``poll``), hands
  each poll's messages to the lanes, applies pause/resume, and commits.  It
  never blocks indefinitely: a lane never blocks a put, and waiting for a
  revoked queue to drain is bounded by ``revoke_timeout``.
* One **lane thread** per lane takes everything queued in its lane, calls the
  listener ``batch_size`` messages at a time, and marks the offsets done in the
  messages' ProcessQueue (one lock per lane segment).
* ``stats()`` may be called from any thread; it only reads.

Ordering: in KEY_ORDERLY mode the lane of a message is ``floorMod(
java_hash(key), lanes)``, so the messages of one key are drained by one thread
in the order the pull thread saw them, which is offset order within a queue.
Keyless messages go to a lane chosen by their queue, which keeps queue order.

Commit: the committable offset of a queue is the lowest offset not finished
(see ``_offsets_py``), so a commit never passes a message that is still in a
lane, in the listener, or being retried.  With it goes the offset map: the
finished offsets above it (``_offset_map``), so the next owner skips them.
Commits happen every ``commit_interval`` seconds, when a queue is revoked,
and at shutdown.  Delivery is at-least-once.

Failures (``_failures``): a failed message is retried after ``suspend_ms``
(orderly) or sent back to ``%RETRY%<group>`` (CONCURRENTLY; a BROADCASTING
member, which has no retry topic, waits the delay level here), and after
``max_reconsume_times`` goes to ``%DLQ%<group>``.  In KEY_ORDERLY its key is
*parked* in its lane: the lane goes on with other keys, later messages of the
key queue up behind it, and one timer, run by the pull thread on the
injectable clock, wakes the key when its retry is due.  Dead letters and
send-backs are handed to the pull thread, which stores them in the source and
only then completes their offsets.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import math
import operator
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Generator, Hashable, Mapping
from dataclasses import dataclass, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ._clock import SYSTEM_CLOCK, Clock
from ._config import ConsumeMode, ConsumerConfig
from ._errors import ConfigError, LitePushError, SourceClosedError
from ._failures import Outbox, Parked, RetryTimer, SendItem, classify
from ._lanemetrics import LaneMetrics, clock
from ._lanes import AsyncLane, Lane, LoopWaker, Segment
from ._offset_map import FinishedOffsets, OffsetMapError, decode
from ._offsets import OFFSETS_IMPL
from ._process_queue import ProcessQueue
from ._queue_orderly import QueueOrderlyService
from ._router import ROUTER_IMPL, lane_of, route
from ._types import (
    ConsumeResult,
    MessageExt,
    MessageQueue,
    OffsetAndMetadata,
    PollBatch,
)
from .metrics import (
    E2E_BUCKETS,
    LISTENER_BUCKETS,
    WAIT_BUCKETS,
    collector_for,
    exporter_for,
    histogram_samples,
    new_lane_metrics,
    release_exporter,
)
from .sources._base import MessageModel, PullSource, RebalanceListener, retry_topic

__all__ = ["ConsumerStats", "LitePushConsumer", "Listener"]

logger = logging.getLogger(__name__)

#: The user's code: takes a batch of messages, returns ``None`` or
#: ``ConsumeResult.SUCCESS`` when they are done; raising or returning
#: ``RETRY_LATER`` means "process them again later".
Listener = Callable[[list[MessageExt]], "ConsumeResult | None"]

#: A queue resumes when its unfinished messages, bytes and span are all at or
#: below this fraction of their thresholds (hysteresis, so it does not flap).
RESUME_FRACTION = 0.5
#: After a poll returned messages, the pull thread polls again without
#: waiting, while more is ready, until it holds this many messages; then it
#: routes them all with one put per lane.
DISPATCH_BUDGET = 1024
#: Seconds between attempts to lock queues another member still holds
#: (QUEUE_ORDERLY).
LOCK_RETRY_INTERVAL = 1.0
#: Seconds the pull thread backs off after a failed poll.
POLL_ERROR_BACKOFF = 1.0
#: Seconds granted, after the shutdown deadline, to listener calls already
#: running before the final commit.
ABORT_GRACE = 0.5
#: Seconds before the pull thread tries again to store dead letters the
#: source refused.
SEND_RETRY_INTERVAL = 1.0

#: Lane token: skip the parked messages of revoked queues.
_PURGE = object()

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

_DEPTH = operator.attrgetter("depth")


def is_async_callable(fn: object) -> bool:
    """Whether calling ``fn`` returns a coroutine: an ``async def``
    function, a partial of one, or an object with an ``async def
    __call__``."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _coprime_near(lanes: int, queues: int) -> int:
    """The lane count nearest ``lanes`` (above first) coprime with ``queues``."""
    for d in range(lanes):
        for n in (lanes + d, lanes - d):
            if n >= 1 and math.gcd(n, queues) == 1:
                return n
    return 1


class _Episode:
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


def _per_queue(pairs: list[tuple[ProcessQueue, MessageExt]]) -> dict[ProcessQueue, list[MessageExt]]:
    """Messages grouped by their ProcessQueue, in order: one complete/skip
    (one lock) per queue instead of per message."""
    out: dict[ProcessQueue, list[MessageExt]] = {}
    for pq, m in pairs:
        out.setdefault(pq, []).append(m)
    return out


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
    #: Messages waiting in each lane (not yet taken by its thread).
    lane_depths: tuple[int, ...]
    #: Messages stored in the dead-letter queue by this consumer.
    dead_lettered: int = 0
    #: Messages sent back to the retry topic (CONCURRENTLY).
    sent_back: int = 0
    #: Messages of parked keys waiting for a retry (KEY_ORDERLY), the
    #: failed head of each key included.
    parked: int = 0


class _Rebalance(RebalanceListener):
    def __init__(self, consumer: LitePushConsumer) -> None:
        self._consumer = consumer

    def on_assigned(self, queues: object) -> None:
        self._consumer._on_assigned(list(queues))  # type: ignore[call-overload]

    def on_revoked(self, queues: object) -> None:
        self._consumer._on_revoked(list(queues))  # type: ignore[call-overload]


class LitePushConsumer:
    """Consumes a :class:`~lite_push.sources.PullSource` with ``config.lanes``
    threads, keeping per-key order in ``KEY_ORDERLY`` mode.

    Use as a context manager, or call :meth:`start` and :meth:`shutdown`.
    The listener is called from lane threads with a list of up to
    ``config.batch_size`` messages; returning ``None`` or ``SUCCESS`` marks
    them done, raising or returning ``RETRY_LATER`` processes them again after
    ``config.suspend_ms`` (their ``reconsume_times`` incremented).
    """

    def __new__(cls, config: ConsumerConfig, *args: Any, **kwargs: Any) -> LitePushConsumer:
        # executor="asyncio" makes the asyncio flavour (same constructor)
        if cls is LitePushConsumer and isinstance(config, ConsumerConfig) and config.executor == "asyncio":
            from ._async_consumer import AsyncLitePushConsumer

            return object.__new__(AsyncLitePushConsumer)
        return object.__new__(cls)

    def __init__(
        self,
        config: ConsumerConfig,
        source: PullSource,
        listener: Listener,
        *,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if not isinstance(config, ConsumerConfig):
            raise ConfigError("config", f"must be a ConsumerConfig, got {type(config).__name__}")
        if not isinstance(source, PullSource):
            raise ConfigError("source", f"must be a PullSource, got {type(source).__name__}")
        if not callable(listener):
            raise ConfigError("listener", f"must be callable, got {listener!r}")
        if config.executor == "asyncio" and not is_async_callable(listener):
            raise ConfigError(
                "listener",
                "is a plain function; executor='asyncio' needs an `async def` listener "
                "(or use executor='thread' for a plain one)",
            )
        if config.executor == "thread" and is_async_callable(listener):
            raise ConfigError(
                "listener",
                "is an async function; the thread executor needs a plain function "
                "(or use ConsumerConfig(executor='asyncio') for an `async def` listener)",
            )
        self.config = config
        self._source = source
        self._listener = listener
        self._clock: Clock = clock or SYSTEM_CLOCK
        n = config.lanes
        # The pull thread hands work to the lanes with put/put_due and then
        # calls _flush once: for async lanes that is the one call into the
        # event loop per dispatch; threads are woken by the put itself.
        self._waker = LoopWaker()
        self._lanes: list[Lane] = (
            [AsyncLane(i, source.wakeup, self._waker) for i in range(n)]
            if config.executor == "asyncio"
            else [Lane(i, source.wakeup) for i in range(n)]
        )
        self._flush: Callable[[], None] = self._waker.flush
        self._threads: list[threading.Thread] = []
        self._pull_thread: threading.Thread | None = None
        # Per-lane counters: each is written by its lane thread only.
        self._consumed = [0] * n
        self._retried = [0] * n
        self._parked = [0] * n
        # Written by the pull thread only.
        self._dead_lettered = 0
        self._sent_back = 0
        self._timer = RetryTimer()
        self._gens = itertools.count(1)  # park generations (next() is atomic)
        self._outbox = Outbox()
        # Dead letters the source refused, tried again every SEND_RETRY_INTERVAL.
        self._unsent: list[SendItem] = []
        self._unsent_at = 0.0
        # Queue -> ProcessQueue; written by the pull thread only.
        self._pqs: dict[MessageQueue, ProcessQueue] = {}
        self._rr = 0
        # None: the router reads ``message.keys`` itself (the fast path).
        self._key_of: Callable[[MessageExt], str | None] | None = (
            None if config.key_extractor is None else self._safe_extractor(config.key_extractor)
        )
        # Batches tracked by the pull thread and not yet routed to lanes.
        self._pending: list[tuple[ProcessQueue, list[MessageExt], int]] = []
        self._pending_index: dict[ProcessQueue, int] = {}
        self._started = False
        # QUEUE_ORDERLY (the baseline) replaces the lanes with RocketMQ's
        # consume pool; see _queue_orderly.
        self._orderly: QueueOrderlyService | None = None
        self._stopping = threading.Event()  # stop polling
        self._abort = threading.Event()  # stop processing: the deadline passed
        self._stopped = threading.Event()  # the pull thread finished shutdown
        self._deadline = 0.0
        self._subscriptions: list[tuple[str, str]] = []
        # BROADCASTING: no retry topic; CONCURRENTLY failures are retried here.
        self._broadcasting = source.message_model is MessageModel.BROADCASTING
        # Failing source calls of the pull thread, each logged once per episode.
        self._episodes = {what: _Episode(what) for what in ("poll", "commit", "lock")}
        # Metrics (lite_push.metrics), read by its collector at scrape time.
        # Per queue, written by the pull thread only: polled, filtered,
        # pauses, resumes; and when the committed offset was last current.
        self._qstats: defaultdict[MessageQueue, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        self._rebalances = 0
        self._lock_renewals = [0, 0]  # ok, failed
        # Per lane, written by its task: holding taken work.
        self._busy = [False] * n
        self._registry = registry
        # None: metrics off (no exporter, no registry), and the lanes skip them
        self._lane_metrics: list[LaneMetrics] | None = None
        if config.metrics_port is not None or registry is not None:
            self._lane_metrics = [new_lane_metrics() for _ in range(n)]
            for lane in self._lanes:
                lane.stamp()
        self._exporter: tuple[str, int] | None = None
        #: ``http://addr:port/metrics`` once started with ``metrics_port``.
        self.metrics_url: str | None = None
        if config.mode is ConsumeMode.QUEUE_ORDERLY:
            self._orderly = QueueOrderlyService(config, listener, self._abort, self._clock.monotonic, self._hand_off)
        source.set_rebalance_listener(_Rebalance(self))

    # -- public API ---------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume ``topic``, filtered by tag ``expression`` (``"*"`` or
        ``"TagA || TagB"``).  Only before :meth:`start`.  In CONCURRENTLY
        mode the group's retry topic ``%RETRY%<group>`` is subscribed too
        (once), as RocketMQ does."""
        if self._started:
            raise LitePushError("subscribe() must be called before start()")
        self._source.subscribe(topic, expression)
        self._subscriptions.append((topic, expression))
        retry = retry_topic(self.config.group)
        if (
            self.config.mode is ConsumeMode.CONCURRENTLY
            and not self._broadcasting  # a BROADCASTING member retries its failures itself
            and topic != retry
            and all(t != retry for t, _ in self._subscriptions)
        ):
            self._source.subscribe(retry, "*")
            self._subscriptions.append((retry, "*"))

    def start(self) -> None:
        """Start the lane threads and the pull thread.  Only once."""
        if self._started:
            raise LitePushError("consumer already started")
        if not self._subscriptions:
            raise LitePushError("subscribe() to at least one topic before start()")
        self._start_metrics()
        self._started = True
        group = self.config.group
        for lane in self._lanes if self._orderly is None else ():
            t = threading.Thread(
                target=self._lane_loop, args=(lane,), name=f"lite-push-lane-{group}-{lane.index}", daemon=True
            )
            t.start()
            self._threads.append(t)
        self._pull_thread = threading.Thread(target=self._pull_loop, name=f"lite-push-pull-{group}", daemon=True)
        self._pull_thread.start()
        logger.info(
            "lite_push consumer %r started: mode=%s lanes=%d router=%s offsets=%s",
            group,
            self.config.mode.name,
            self.config.lanes,
            ROUTER_IMPL,
            OFFSETS_IMPL,
        )

    def shutdown(self, timeout: float = 10.0) -> bool:
        """Stop polling, let the lanes finish what they hold (at most
        ``timeout`` seconds), commit final offsets, close the source.

        Returns whether everything queued was processed in time; what was not
        stays uncommitted and is delivered again.  Idempotent."""
        if not self._started:
            self._source.close()
            return True
        if not self._stopping.is_set():
            self._deadline = time.monotonic() + max(0.0, timeout)
            self._stopping.set()
            self._source.wakeup()
        assert self._pull_thread is not None
        self._pull_thread.join(max(0.0, timeout) + ABORT_GRACE + 5.0)
        return self._stopped.is_set() and not self._abort.is_set()

    # -- metrics (see lite_push.metrics) ----------------------------------------

    def _start_metrics(self) -> None:
        """Register with the registry's collector; start or share the
        exporter when ``metrics_port`` is set."""
        if self._lane_metrics is None:
            return
        collector_for(self._registry).add(self)
        port = self.config.metrics_port
        if port is not None:
            addr = self.config.metrics_addr
            try:
                self._exporter, bound = exporter_for(addr, port, self._registry)
            except (OSError, ValueError) as e:
                collector_for(self._registry).remove(self)
                raise ConfigError("metrics_port", f"cannot serve metrics on {addr}:{port}: {e}") from e
            self.metrics_url = f"http://{addr}:{bound}/metrics"

    def _stop_metrics(self) -> None:
        if self._lane_metrics is None:
            return
        collector_for(self._registry).remove(self)
        if self._exporter is not None:
            release_exporter(self._exporter)
            self._exporter = None

    def _collect_metrics(self, fams: dict[str, Any]) -> None:
        """Add this consumer's samples to the scrape's metric families
        (exporter thread; reads counters other threads write, never blocks
        them beyond each queue's snapshot lock)."""
        g = self.config.group
        mode = self.config.mode.name
        pqs = list(self._pqs.items())
        qstats = dict(self._qstats)
        try:
            ends = self._source.end_offsets([q for q, _ in pqs]) if pqs else {}
        except Exception:  # the source is down: no lag this scrape
            ends = {}
        for q, pq in pqs:
            labels = [g, q.topic, str(q.queue_id)]
            count, size, _span, _map = pq.snapshot()
            fams["lite_push_in_flight_messages"].add_metric(labels, count)
            fams["lite_push_in_flight_bytes"].add_metric(labels, size)
            fams["lite_push_queue_paused"].add_metric(labels, 1 if pq.paused else 0)
            fams["lite_push_committed_offset"].add_metric(labels, pq.last_committed)
            at = pq.last_commit_time
            if at is not None:
                fams["lite_push_last_commit_timestamp_seconds"].add_metric(labels, at)
            end = ends.get(q)
            if end is not None:
                fams["lite_push_lag_messages"].add_metric(labels, max(0, end - pq.last_committed))
        for q, (polled, filtered, pauses, resumes) in qstats.items():
            labels = [g, q.topic, str(q.queue_id)]
            fams["lite_push_messages_polled_total"].add_metric(labels, polled)
            fams["lite_push_messages_filtered_total"].add_metric(labels, filtered)
            fams["lite_push_queue_pauses_total"].add_metric(labels, pauses)
            fams["lite_push_queue_resumes_total"].add_metric(labels, resumes)
        consumed, retried = self._orderly.counts() if self._orderly is not None else (0, 0)
        processed = fams["lite_push_messages_processed_total"]
        processed.add_metric([g, mode, "success"], sum(self._consumed) + consumed)
        processed.add_metric([g, mode, "retry"], sum(self._retried) + retried)
        processed.add_metric([g, mode, "dlq"], self._dead_lettered)
        fams["lite_push_messages_sent_back_total"].add_metric([g], self._sent_back)
        fams["lite_push_parked_messages"].add_metric([g], sum(self._parked))
        lms = self._lane_metrics
        if lms is not None:
            snaps = [lm.snapshot() for lm in lms]
            for i, (name, bounds, labels) in enumerate(
                (
                    ("lite_push_listener_duration_seconds", LISTENER_BUCKETS, [g, mode]),
                    ("lite_push_lane_wait_seconds", WAIT_BUCKETS, [g]),
                    ("lite_push_end_to_end_latency_seconds", E2E_BUCKETS, [g]),
                )
            ):
                buckets, total = histogram_samples(bounds, (snap[i] for snap in snaps))
                fams[name].add_metric(labels, buckets, total)
        lanes = self._lanes
        busy = self._busy
        fams["lite_push_lanes_busy"].add_metric([g], sum(1 for i, lane in enumerate(lanes) if busy[i] or lane.depth))
        fams["lite_push_lanes"].add_metric([g], len(lanes))
        fams["lite_push_rebalances_total"].add_metric([g], self._rebalances)
        fams["lite_push_assigned_queues"].add_metric([g], len(pqs))
        ok, failed = self._lock_renewals
        fams["lite_push_lock_renewals_total"].add_metric([g, "ok"], ok)
        fams["lite_push_lock_renewals_total"].add_metric([g, "failed"], failed)

    def stats(self) -> ConsumerStats:
        """A snapshot of counters and per-queue state."""
        pqs = list(self._pqs.items())
        snaps = {q: pq.snapshot() for q, pq in pqs}
        consumed, retried = self._orderly.counts() if self._orderly is not None else (0, 0)
        return ConsumerStats(
            consumed=sum(self._consumed) + consumed,
            retried=sum(self._retried) + retried,
            in_flight={q: s[0] for q, s in snaps.items()},
            in_flight_bytes={q: s[1] for q, s in snaps.items()},
            paused=frozenset(q for q, pq in pqs if pq.paused),
            committed={q: pq.last_committed for q, pq in pqs},
            lane_depths=tuple(map(_DEPTH, self._lanes)),
            dead_lettered=self._dead_lettered,
            sent_back=self._sent_back,
            parked=sum(self._parked),
        )

    def __enter__(self) -> LitePushConsumer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()

    # -- pull thread --------------------------------------------------------

    def _pull_loop(self) -> None:
        cfg = self.config
        source = self._source
        clock = self._clock
        next_commit = clock.monotonic() + cfg.commit_interval
        next_lock = clock.monotonic() + cfg.lock_renew_interval
        next_relock = clock.monotonic() + LOCK_RETRY_INTERVAL
        polling = self._episodes["poll"]
        try:
            while not self._stopping.is_set():
                timeout = cfg.poll_timeout
                due = self._timer.next_due()
                if due is not None:  # never sleep past a parked key's retry
                    timeout = min(timeout, max(0.0, due - clock.monotonic()))
                try:
                    batches = source.poll(timeout, cfg.pull_batch_size)
                except SourceClosedError:
                    logger.error("source closed under consumer %r; stopping", cfg.group)
                    break
                except Exception:
                    polling.failed(cfg.group)  # logged once per episode, not per poll
                    clock.wait(self._stopping, POLL_ERROR_BACKOFF)
                    continue
                polling.ok(cfg.group)
                if batches:
                    self._gather(batches)
                now = clock.monotonic()
                if due is not None and due <= now:
                    self._fire_timers(now)
                if self._outbox or self._unsent:
                    self._send_failed(now)
                self._flow_control()
                if now >= next_commit:
                    self._commit(list(self._pqs.values()))
                    next_commit = now + cfg.commit_interval
                if self._orderly is not None:
                    if now >= next_lock:  # renew every lease (RocketMQ's lockAll)
                        self._lock_queues(list(self._pqs.values()))
                        next_lock = now + cfg.lock_renew_interval
                    elif now >= next_relock:  # retry the queues not locked yet
                        self._lock_queues(self._orderly.unlocked())
                        next_relock = now + LOCK_RETRY_INTERVAL
        except BaseException:
            logger.exception("pull thread of consumer %r died; shutting down", cfg.group)
            if not self._deadline:
                self._deadline = time.monotonic() + 10.0
            raise
        finally:
            self._finish()

    def _finish(self) -> None:
        # Shutdown order: (1) polling has stopped (we left the loop), so no
        # new work arrives; (2) close the lanes, whose threads exit once they
        # have processed what is queued; (3) at the deadline, abort: lanes skip
        # what is left, running listener calls get a short grace; (4) commit
        # the lowest unfinished offsets; (5) close the source, which releases
        # the queues to the other members only after that commit.
        try:
            if self._orderly is not None:
                self._orderly.close(self._deadline)
            for lane in self._lanes:
                lane.close()
            self._flush()
            if not self._join_lanes(self._deadline):
                self._abort.set()
                left = 0
                for lane in self._lanes:
                    for pq, msgs in lane.drain():
                        left += len(msgs)
                        pq.skip(msgs)
                self._join_lanes(time.monotonic() + ABORT_GRACE, final=True)
                logger.warning(
                    "consumer %r: shutdown deadline passed with %d queued messages unprocessed; "
                    "they stay uncommitted and will be delivered again",
                    self.config.group,
                    left,
                )
            # Dead letters and send-backs the lanes handed over: store them,
            # so their offsets may be committed (what fails stays unfinished).
            if self._outbox or self._unsent:
                self._send_failed(self._clock.monotonic(), final=True)
            self._commit(list(self._pqs.values()))
        finally:
            try:
                self._source.close()
            finally:
                self._stop_metrics()
                self._stopped.set()
                logger.info("lite_push consumer %r stopped", self.config.group)

    def _join_lanes(self, deadline: float, final: bool = False) -> bool:
        """Wait (until ``deadline``, ``time.monotonic``) for the lane tasks
        to exit; return whether they all did.  ``final``: the last wait
        (the asyncio executor then cancels what still runs)."""
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def _gather(self, batches: list[PollBatch]) -> None:
        """Track a poll's batches, keep polling without waiting while more is
        ready (up to ``DISPATCH_BUDGET`` messages, and never past
        ``lane_capacity``, so one dispatch cannot overfill a lane by more than
        a capacity and a poll), then route it all at once: one put per lane
        per dispatch, so lanes wake once per dispatch rather than once per
        poll."""
        total = self._track(batches)
        cfg = self.config
        budget = min(DISPATCH_BUDGET, cfg.lane_capacity)
        while total < budget:
            try:
                more = self._source.poll(0.0, cfg.pull_batch_size)
            except Exception:
                break  # the next regular poll reports it
            if not more:
                break
            total += self._track(more)
        self._route()

    def _track(self, batches: list[PollBatch]) -> int:
        """Add polled batches to their ProcessQueues and to the pending
        groups (one group per queue: a queue's batches are contiguous, so
        they are joined); pause at once every queue that crossed a threshold,
        so gathering more polls never overshoots one by more than a batch."""
        pqs = self._pqs
        groups = self._pending
        index = self._pending_index
        qstats = self._qstats
        to_pause = []
        total = 0
        for batch in batches:
            pq = pqs.get(batch.queue)
            if pq is None:
                logger.warning("poll returned messages of %s, which is not assigned; ignored", batch.queue)
                continue
            msgs = batch.messages
            st = qstats[batch.queue]
            st[0] += len(msgs)
            skipped = batch.next_offset - pq.next_offset - len(msgs)  # offsets the source's tag filter passed over
            if skipped > 0:
                st[1] += skipped
            if pq.finished is not None:
                msgs = pq.drop_finished(msgs, batch.next_offset)
            count, size, span, map_bytes = pq.add_batch(msgs, batch.next_offset)
            if msgs:
                at = index.get(pq)
                if at is None:
                    index[pq] = len(groups)
                    # a copy we own, so later batches of the queue extend it
                    # (linear, where concatenating would copy it each time)
                    groups.append((pq, list(msgs), pq.keyless_lane))
                else:
                    groups[at][1].extend(msgs)
                total += len(msgs)
            if not pq.paused and self._over_threshold(count, size, span, map_bytes):
                pq.paused = True
                to_pause.append(batch.queue)
                st[2] += 1
        if to_pause:
            self._source.pause(to_pause)
        return total

    def _route(self) -> None:
        """Hand the gathered messages to the lanes: one put per lane."""
        groups = self._pending
        if not groups:
            return
        self._pending = []
        self._pending_index.clear()
        if self._orderly is not None:
            self._orderly.dispatch(groups)
            return
        n = len(self._lanes)
        if self.config.mode is ConsumeMode.KEY_ORDERLY:
            segments, counts = route(groups, n, self._key_of)
        else:
            segments, counts = self._round_robin(groups, n)
        capacity = self.config.lane_capacity
        for i, segs in enumerate(segments):
            if segs is not None:
                lane = self._lanes[i]
                if lane.put(segs, counts[i]) > capacity:
                    lane.blocked = True
                    for pq, _ in segs:
                        pq.lane_blocked.add(i)
        self._flush()

    def _round_robin(
        self, groups: list[tuple[ProcessQueue, list[MessageExt], int]], n: int
    ) -> tuple[list[list[Segment] | None], list[int]]:
        """CONCURRENTLY: message ``j`` of the dispatch goes to lane
        ``(start + j) % n``; one segment per queue batch per lane."""
        segments: list[list[Segment] | None] = [None] * n
        counts = [0] * n
        start = self._rr
        for pq, msgs, _ in groups:
            k = len(msgs)
            for j in range(min(n, k)):
                i = (start + j) % n
                sub = msgs[j::n]
                segs = segments[i]
                if segs is None:
                    segs = segments[i] = []
                segs.append((pq, sub))
                counts[i] += len(sub)
            start = (start + k) % n
        self._rr = start
        return segments, counts

    def _over_threshold(self, count: int, size: int, span: int, map_bytes: int) -> bool:
        """Whether a queue's unfinished messages, bytes, span or offset-map
        size pass the pause thresholds (RocketMQ's pullThresholdForQueue,
        ...SizeForQueue, consumeConcurrentlyMaxSpan; ``offset_map_max_bytes``)."""
        cfg = self.config
        return (
            count > cfg.pull_threshold_for_queue
            or size > cfg.pull_threshold_size_for_queue
            or span > cfg.max_span
            or map_bytes > cfg.offset_map_max_bytes
        )

    def _flow_control(self) -> None:
        """Pause queues over a threshold; resume them below the low-water mark."""
        lanes = self._lanes
        lane_low = self.config.lane_capacity * RESUME_FRACTION
        to_pause: list[MessageQueue] = []
        to_resume: list[MessageQueue] = []
        for q, pq in self._pqs.items():
            if pq.lane_blocked:
                pq.lane_blocked = {i for i in pq.lane_blocked if lanes[i].depth > lane_low}
            if not pq.paused:
                if pq.lane_blocked or self._over_threshold(*pq.snapshot()):
                    pq.paused = True
                    to_pause.append(q)
                    self._qstats[q][2] += 1
            elif not pq.lane_blocked and pq.check_resume():
                pq.mark_resumed()
                to_resume.append(q)
                self._qstats[q][3] += 1
        if to_pause:
            self._source.pause(to_pause)
            logger.debug("paused %s", to_pause)
        if to_resume:
            self._source.resume(to_resume)
            logger.debug("resumed %s", to_resume)

    def _commit(self, pqs: list[ProcessQueue]) -> None:
        """Commit each queue's lowest unfinished offset with its offset map
        (skipped when neither changed since the last commit)."""
        offsets: dict[MessageQueue, OffsetAndMetadata] = {}
        now = time.time()
        for pq in pqs:
            offset, offset_map = pq.commit_point()
            if offset != pq.last_committed or offset_map != pq.last_map:
                offsets[pq.queue] = OffsetAndMetadata(offset, offset_map)
            else:  # the committed offset is current: as good as a commit now
                pq.last_commit_time = now
        if not offsets:
            return
        try:
            self._source.commit(offsets)
        except Exception:
            # the same offsets (or higher) are committed again next time
            self._episodes["commit"].failed(self.config.group, f" ({len(offsets)} queue(s))")
            return
        self._episodes["commit"].ok(self.config.group)
        for pq in pqs:
            c = offsets.get(pq.queue)
            if c is not None:
                pq.last_committed = c.offset
                pq.last_map = c.metadata
                pq.last_commit_time = now

    def _on_assigned(self, queues: list[MessageQueue]) -> None:
        n = len(self._lanes)
        cfg = self.config
        low = (
            int(cfg.pull_threshold_for_queue * RESUME_FRACTION),
            int(cfg.pull_threshold_size_for_queue * RESUME_FRACTION),
            int(cfg.max_span * RESUME_FRACTION),
            int(cfg.offset_map_max_bytes * RESUME_FRACTION),
        )
        new = []
        if queues:
            self._rebalances += 1
        for q in queues:
            position = self._source.position(q)
            pq = self._pqs[q] = ProcessQueue(
                q, position, lane_of(str(q), n), low, self._source.wakeup, self._finished_map(q, position)
            )
            new.append(pq)
        if self._orderly is not None:
            for pq in new:
                self._orderly.add_queue(pq)
            self._lock_queues(new)  # lock 1: consumed only while held
        logger.info("consumer %r assigned %s", self.config.group, [str(q) for q in queues])
        if cfg.mode is ConsumeMode.KEY_ORDERLY and cfg.key_extractor is None:
            self._check_lane_reach({q.topic for q in queues})

    def _check_lane_reach(self, topics: set[str]) -> None:
        """Warn when the owned queues' keys cannot reach every lane.  A
        producer's hash selector puts key k in queue ``h(k) mod Q`` and the
        lane is ``h(k) mod L`` with the same Java hash, so queue q's keys
        only reach the lanes ``l = q (mod gcd(L, Q))``: L/g lanes per queue.
        A member owning a few of the queues then leaves lanes idle unless L
        is coprime with Q."""
        lanes = len(self._lanes)
        for topic in sorted(topics):
            try:
                total = self._source.queue_count(topic)
            except Exception:  # only a hint
                continue
            if not total:
                continue
            g = math.gcd(lanes, total)
            owned = {q.queue_id % g for q in self._pqs if q.topic == topic}
            reach = len(owned) * (lanes // g)
            if reach < lanes:
                logger.warning(
                    "consumer %r: the keys of its %d queue(s) of %r (of %d) can reach only %d of its %d lanes: "
                    "the producers' hash selector and the lane hash are the same Java hash and %d lanes share "
                    "the factor %d with %d queues; a lane count coprime with %d (e.g. %d) uses every lane",
                    self.config.group, sum(1 for q in self._pqs if q.topic == topic), topic, total, reach, lanes,
                    lanes, g, total, total, _coprime_near(lanes, total),
                )

    def _finished_map(self, q: MessageQueue, position: int) -> FinishedOffsets | None:
        """The offset map committed with ``q``'s offset, when polling starts
        exactly there; a map that cannot be read is ignored (logged): every
        message above the offset is then processed again, never lost."""
        try:
            committed = self._source.committed(q)
        except Exception:
            logger.exception("consumer %r: reading the committed offset of %s failed", self.config.group, q)
            return None
        if committed is None or not committed.metadata or committed.offset != position:
            return None
        try:
            finished = decode(committed.metadata, committed.offset)
        except OffsetMapError as exc:
            logger.warning(
                "consumer %r: ignoring the offset map committed for %s (%s); messages above offset %d "
                "will be processed again",
                self.config.group, q, exc, committed.offset,
            )
            return None
        if finished is not None:
            logger.info(
                "consumer %r: %s resumes at %d; %d finished offsets below %d will be skipped (offset map)",
                self.config.group, q, position, finished.finished_count(), finished.end,
            )
        return finished

    def _on_revoked(self, queues: list[MessageQueue]) -> None:
        # Stop routing the queues, let their in-flight work finish (bounded),
        # commit, and only then return: the source releases them after this.
        # Batches gathered but not yet routed go to the lanes first (this runs
        # inside a poll of _gather), so waiting for the queues to drain ends.
        self._route()
        pqs = [self._pqs[q] for q in queues if q in self._pqs]
        if pqs:
            self._rebalances += 1
        for pq in pqs:
            pq.dropped = True
        if pqs and any(self._parked):
            for lane in self._lanes:  # parked messages of these queues are left to the next owner
                lane.put_due([_PURGE])
            self._flush()
        if pqs and (self._outbox or self._unsent):
            self._send_failed(self._clock.monotonic())
        deadline = time.monotonic() + self.config.revoke_timeout
        for pq in pqs:
            if not pq.wait_idle(max(0.0, deadline - time.monotonic())):
                logger.warning(
                    "consumer %r: %s revoked with work still running after %.1fs; "
                    "committing below it and releasing",
                    self.config.group,
                    pq.queue,
                    self.config.revoke_timeout,
                )
        self._commit(pqs)
        for pq in pqs:
            del self._pqs[pq.queue]
        if self._orderly is not None:
            for pq in pqs:
                self._orderly.remove_queue(pq)
            # Only now, drained and committed, may the next owner lock it.
            try:
                self._source.unlock([pq.queue for pq in pqs])
            except Exception:  # the lease then runs out on its own
                logger.warning(
                    "consumer %r: unlocking %d revoked queue(s) failed; their locks expire with the lease",
                    self.config.group, len(pqs), exc_info=True,
                )
        logger.info("consumer %r revoked %s", self.config.group, [str(q) for q in queues])

    def _lock_queues(self, pqs: list[ProcessQueue]) -> None:
        """Take or renew the broker lock of these queues (QUEUE_ORDERLY)."""
        assert self._orderly is not None
        if not pqs:
            return
        lease = self.config.lock_lease
        try:
            held = self._source.lock([pq.queue for pq in pqs], lease)
        except Exception:
            # consumption stops when the leases run out (set_locked below)
            self._episodes["lock"].failed(self.config.group, f" ({len(pqs)} queue(s))")
            self._lock_renewals[1] += 1
            return
        self._episodes["lock"].ok(self.config.group)
        self._lock_renewals[0] += 1
        until = self._clock.monotonic() + lease
        for pq in pqs:
            self._orderly.set_locked(pq, until if pq.queue in held else 0.0)
        missed = [str(pq.queue) for pq in pqs if pq.queue not in held]
        if missed:
            logger.info("consumer %r: queues locked by another member, retrying: %s", self.config.group, missed)

    # -- failures: timer and hand-off (pull thread) -----------------------------

    def _fire_timers(self, now: float) -> None:
        """Hand due parked keys to their lanes (one put per lane) and
        re-dispatch due local retries."""
        per_lane: dict[int, list[object]] = {}
        local: list[tuple[ProcessQueue, MessageExt]] = []
        for lane, token in self._timer.pop_due(now):
            if lane < 0:
                local.append(token)  # type: ignore[arg-type]
            else:
                per_lane.setdefault(lane, []).append(token)
        for lane, tokens in per_lane.items():
            self._lanes[lane].put_due(tokens)
        if local:
            # CONCURRENTLY messages whose send-back failed: run them again
            # here (their offsets are still unfinished), spread over lanes.
            n = len(self._lanes)
            gone = [(pq, m) for pq, m in local if pq.dropped or pq.queue not in self._pqs]
            for pq, ms in _per_queue(gone).items():
                pq.skip(ms)
            puts: dict[int, list[Segment]] = {}
            for pq, msg in local:
                if not (pq.dropped or pq.queue not in self._pqs):
                    self._rr = (self._rr + 1) % n
                    puts.setdefault(self._rr, []).append((pq, [replace(msg, reconsume_times=msg.reconsume_times + 1)]))
            for i, segs in puts.items():
                self._lanes[i].put(segs, len(segs))
        self._flush()

    def _hand_off(self, items: list[SendItem]) -> None:
        """From a lane (or the baseline's pool): messages for the pull thread
        to store in the dead-letter queue or the retry topic."""
        self._outbox.put(items)
        self._source.wakeup()

    def _send_failed(self, now: float, final: bool = False) -> None:
        """Store handed-off messages in the source (one call per kind) and
        complete their offsets once stored.  A dead letter the source refuses
        is tried again every SEND_RETRY_INTERVAL (its offset stays
        unfinished); a send-back that fails is retried locally."""
        items = self._outbox.take()
        if self._unsent and (final or now >= self._unsent_at):
            items = self._unsent + items
            self._unsent = []
        live = [it for it in items if not it.pq.dropped]
        # revoked: the next owner replays them
        for pq, ms in _per_queue([(it.pq, it.message) for it in items if it.pq.dropped]).items():
            pq.skip(ms)
        stored: list[tuple[ProcessQueue, MessageExt]] = []
        dead = [it for it in live if it.dead_letter]
        back = [it for it in live if not it.dead_letter]
        group = self.config.group
        if back and self._broadcasting:
            # no retry topic: wait the delay level's time here, then run again
            # (the offsets stay unfinished meanwhile, so nothing is lost)
            levels = self._source.delay_levels
            for it in back:
                delay = levels[min(max(it.delay_level, 1), len(levels)) - 1]
                self._timer.add(now + delay, -1, (it.pq, it.message))
            back = []
        if dead:
            errors = self._store(dead, lambda: self._source.send_to_dlq([(it.message, it.reason, it.exception) for it in dead]))
            for it, err in zip(dead, errors, strict=True):
                if err is None:
                    stored.append((it.pq, it.message))
                    self._dead_lettered += 1
                    logger.warning(
                        "consumer %r: %s offset %d sent to the dead-letter queue after %d attempt(s): %s",
                        group, it.pq.queue, it.message.queue_offset, it.message.reconsume_times + 1, it.reason,
                    )
                else:
                    self._unsent.append(it)
            if self._unsent:
                self._unsent_at = now + SEND_RETRY_INTERVAL
                logger.error(
                    "consumer %r: %d dead letter(s) not stored (%s); their offsets stay uncommitted, retrying",
                    group, len(self._unsent), next(e for e in errors if e is not None),
                )
        if back:
            errors = self._store(back, lambda: self._source.send_back([(it.message, it.delay_level) for it in back]))
            delay = self.config.suspend_ms / 1000.0
            for it, err in zip(back, errors, strict=True):
                if err is None:
                    stored.append((it.pq, it.message))
                    self._sent_back += 1
                elif final:
                    self._unsent.append(it)  # skipped below: stays unfinished, delivered again
                else:
                    logger.warning(
                        "consumer %r: send-back of %s offset %d failed (%s); retrying it here in %d ms",
                        group, it.pq.queue, it.message.queue_offset, err, self.config.suspend_ms,
                    )
                    self._timer.add(now + delay, -1, (it.pq, it.message))
        for pq, ms in _per_queue(stored).items():
            pq.complete(ms)
        if final:
            for pq, ms in _per_queue([(it.pq, it.message) for it in self._unsent]).items():
                pq.skip(ms)
            self._unsent = []

    @staticmethod
    def _store(items: list[SendItem], call: Callable[[], list[BaseException | None]]) -> list[BaseException | None]:
        try:
            errors = call()
        except Exception as exc:  # the whole call failed: every item did
            return [exc] * len(items)
        if len(errors) != len(items):
            return [LitePushError(f"source returned {len(errors)} results for {len(items)} messages")] * len(items)
        return errors

    # -- lane threads -------------------------------------------------------------

    def _lane_loop(self, lane: Lane) -> None:
        idx = lane.index
        abort = self._abort
        busy = self._busy
        lm = self._lane_metrics[idx] if self._lane_metrics is not None else None
        # Keys parked in this lane, owned by this thread alone.
        parked: dict[Hashable, Parked] = {}
        try:
            while True:
                busy[idx] = False
                taken = lane.take()
                if taken is None:
                    return
                busy[idx] = True
                segments, due = taken
                if lm is not None and lane.taken:
                    lm.waited(lane.taken)
                if due:
                    self._run_due(idx, parked, due)
                for pq, msgs in segments:
                    if pq.dropped or abort.is_set():
                        pq.skip(msgs)
                    elif parked or self.config.batch_size != 1:
                        self._consume_slow(idx, parked, pq, msgs)
                    else:
                        self._consume(idx, parked, pq, msgs)
        finally:
            busy[idx] = False
            self._leave_parked(idx, parked)

    def _leave_parked(self, idx: int, parked: dict[Hashable, Parked]) -> None:
        """A lane stops: its parked messages stay unfinished (uncommitted;
        the offset map keeps what finished above them)."""
        for pq, ms in _per_queue([item for p in parked.values() for item in p.items]).items():
            pq.skip(ms)
        self._parked[idx] = 0

    # The lane logic that does not depend on how the listener is called is
    # written once, for both executors: ``_consume_failed`` (the end of the
    # hot path) and the generators ``_slow_steps`` and ``_due_steps``, which
    # yield each list of messages to hand to the listener and are sent back
    # ``(exception, result)``.  ``_consume``, ``_consume_slow`` and
    # ``_run_due`` drive them with plain calls; the asyncio executor's twins
    # with ``await``.

    def _consume(self, idx: int, parked: dict[Hashable, Parked], pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """The hot path: one listener call per message, nothing parked in
        this lane.  On the first failure the rest goes the slow way."""
        listener = self._listener
        success = ConsumeResult.SUCCESS
        lms = self._lane_metrics
        t0 = clock() if lms is not None else 0.0
        j = 0
        exc: BaseException | None = None
        result: object = None
        try:
            for msg in msgs:
                result = listener([msg])
                if result is not None and result is not success:
                    break
                j += 1
            else:
                pq.complete(msgs)
                self._consumed[idx] += len(msgs)
                if lms is not None:
                    lms[idx].segment(t0, msgs)
                return
        except Exception as e:
            exc = e
        rest = self._consume_failed(idx, parked, pq, msgs, j, exc, result)
        if rest:
            self._consume_slow(idx, parked, pq, rest)

    def _consume_failed(
        self,
        idx: int,
        parked: dict[Hashable, Parked],
        pq: ProcessQueue,
        msgs: list[MessageExt],
        j: int,
        exc: BaseException | None,
        result: object,
    ) -> list[MessageExt]:
        """The hot path failed at ``msgs[j]``: complete what came before,
        handle the failure; return what is left for the slow path."""
        if j:
            pq.complete(msgs[:j])
            self._consumed[idx] += j
        self._failed(idx, parked, pq, [msgs[j]], exc, result)
        return msgs[j + 1 :]

    def _consume_slow(
        self, idx: int, parked: dict[Hashable, Parked], pq: ProcessQueue, msgs: list[MessageExt]
    ) -> None:
        """A segment while keys are parked in this lane, or with
        ``batch_size`` > 1 (see :meth:`_slow_steps`)."""
        listener = self._listener
        lm = self._lane_metrics[idx] if self._lane_metrics is not None else None
        steps = self._slow_steps(idx, parked, pq, msgs)
        try:
            chunk = next(steps)
            while True:
                t0 = clock()
                try:
                    outcome: tuple[BaseException | None, object] = (None, listener(chunk))
                except Exception as e:
                    outcome = (e, None)
                if lm is not None:
                    lm.call(t0, len(chunk))
                chunk = steps.send(outcome)
        except StopIteration:
            pass

    def _slow_steps(
        self, idx: int, parked: dict[Hashable, Parked], pq: ProcessQueue, msgs: list[MessageExt]
    ) -> Generator[list[MessageExt], tuple[BaseException | None, object], None]:
        """Yield the chunks (up to ``batch_size``) of a segment to process:
        a message of a parked key queues up behind it instead.  Failed
        chunks are parked, sent back or dead-lettered; the rest is
        completed at the end, at once."""
        success = ConsumeResult.SUCCESS
        size = self.config.batch_size
        park_key = self._park_key
        done: list[MessageExt] = []
        chunk: list[MessageExt] = []
        last = len(msgs) - 1
        for i, m in enumerate(msgs):
            if parked:
                p = parked.get(park_key(pq, m))
                if p is not None:
                    p.items.append((pq, m))
                    self._parked[idx] += 1
                    if i < last or not chunk:
                        continue
                else:
                    chunk.append(m)
            else:
                chunk.append(m)
            if len(chunk) < size and i < last:
                continue
            if not chunk:
                continue
            if self._abort.is_set():
                pq.skip(chunk)
                chunk = []
                continue
            exc, result = yield chunk
            if exc is None and (result is None or result is success):
                done += chunk
            else:
                self._failed(idx, parked, pq, chunk, exc, result)
            chunk = []
        if done:
            pq.complete(done)
            self._consumed[idx] += len(done)
            if self._lane_metrics is not None:
                self._lane_metrics[idx].completed(done[0], done[-1], len(done))

    def _park_key(self, pq: ProcessQueue, msg: MessageExt) -> Hashable:
        """What a failure parks: the message's key, or its queue when it has
        none (keyless messages keep queue order, so they wait together)."""
        key_of = self._key_of
        key = msg.keys if key_of is None else key_of(msg)
        return key if key else pq.queue

    def _failed(
        self,
        idx: int,
        parked: dict[Hashable, Parked],
        pq: ProcessQueue,
        chunk: list[MessageExt],
        exc: BaseException | None,
        result: object,
    ) -> None:
        """The listener failed ``chunk``: park, send back or dead-letter
        each message, per mode and attempt count."""
        if pq.dropped:
            pq.skip(chunk)
            return
        cfg = self.config
        dead_now, reason, text = classify(exc, result)
        self._retried[idx] += len(chunk)
        first = chunk[0]
        logger.warning(
            "consumer %r: %s for %d message(s) from %s offset %d (attempt %d)",
            cfg.group, reason, len(chunk), pq.queue, first.queue_offset, first.reconsume_times + 1,
            exc_info=exc if exc is not None and first.reconsume_times == 0 else None,
        )
        limit = cfg.max_reconsume_times
        out: list[SendItem] = []
        keyed = cfg.mode is ConsumeMode.KEY_ORDERLY
        for m in chunk:
            p = parked.get(self._park_key(pq, m)) if keyed and parked else None
            if p is not None:
                # An earlier message of its key (same batch) parked it: wait behind.
                p.items.append((pq, m))
                self._parked[idx] += 1
            elif dead_now or 0 <= limit <= m.reconsume_times:
                out.append(SendItem(pq, m, True, reason, text))
            elif keyed:
                self._park(idx, parked, pq, replace(m, reconsume_times=m.reconsume_times + 1), reason, text)
            else:
                level = cfg.retry_start_level + m.reconsume_times
                out.append(SendItem(pq, m, False, reason, text, level))
        if out:
            self._hand_off(out)

    def _park(
        self, idx: int, parked: dict[Hashable, Parked], pq: ProcessQueue, retry: MessageExt, reason: str, text: str
    ) -> None:
        key = self._park_key(pq, retry)
        p = parked[key] = Parked(next(self._gens), reason, text)
        p.items.append((pq, retry))
        self._parked[idx] += 1
        self._timer.add(self._clock.monotonic() + self.config.suspend_ms / 1000.0, idx, (key, p.gen))
        self._source.wakeup()  # the pull thread may be waiting past the new due time

    def _run_due(self, idx: int, parked: dict[Hashable, Parked], due: list[object]) -> None:
        """Retry the parked keys whose time came (see :meth:`_due_steps`)."""
        listener = self._listener
        lm = self._lane_metrics[idx] if self._lane_metrics is not None else None
        steps = self._due_steps(idx, parked, due)
        try:
            msgs = next(steps)
            while True:
                t0 = clock()
                try:
                    outcome: tuple[BaseException | None, object] = (None, listener(msgs))
                except Exception as e:
                    outcome = (e, None)
                if lm is not None:
                    lm.call(t0, len(msgs))
                msgs = steps.send(outcome)
        except StopIteration:
            pass

    def _due_steps(
        self, idx: int, parked: dict[Hashable, Parked], due: list[object]
    ) -> Generator[list[MessageExt], tuple[BaseException | None, object], None]:
        """Yield, one at a time, the messages of the parked keys whose time
        came: the head first, then the messages that queued behind it, in
        order, until one fails again (then the key is parked again with what
        still waits behind it)."""
        success = ConsumeResult.SUCCESS
        limit = self.config.max_reconsume_times
        for token in due:
            if token is _PURGE:
                self._purge(idx, parked)
                continue
            key: Hashable
            gen: int
            key, gen = token  # type: ignore[misc]
            p = parked.get(key)
            if p is None or p.gen != gen:
                continue  # stale: the key was purged or parked again since
            items = p.items
            done: list[tuple[ProcessQueue, MessageExt]] = []
            out: list[SendItem] = []
            again = None
            skipped = 0
            while items:
                pq, m = items[0]
                if pq.dropped or self._abort.is_set():
                    pq.skip([m])
                    items.pop(0)
                    skipped += 1
                    continue
                exc, result = yield [m]
                items.pop(0)
                if exc is None and (result is None or result is success):
                    done.append((pq, m))
                    continue
                dead_now, reason, text = classify(exc, result)
                self._retried[idx] += 1
                logger.warning(
                    "consumer %r: %s for %s offset %d (attempt %d)",
                    self.config.group, reason, pq.queue, m.queue_offset, m.reconsume_times + 1,
                )
                if dead_now or 0 <= limit <= m.reconsume_times:
                    out.append(SendItem(pq, m, True, reason, text))
                    continue  # the key moves on
                again = (pq, replace(m, reconsume_times=m.reconsume_times + 1), reason, text)
                break
            self._parked[idx] -= skipped + len(done) + len(out) + (1 if again else 0)
            for pq, ms in _per_queue(done).items():
                pq.complete(ms)
            self._consumed[idx] += len(done)
            if done and self._lane_metrics is not None:
                self._lane_metrics[idx].completed(done[0][1], done[-1][1], len(done))
            if out:
                self._hand_off(out)
            del parked[key]
            if again is not None:  # parked again, with what still waits behind it
                pq, retry, reason, text = again
                self._park(idx, parked, pq, retry, reason, text)
                parked[key].items += items

    def _purge(self, idx: int, parked: dict[Hashable, Parked]) -> None:
        """Skip the parked messages of revoked queues."""
        dropped: list[tuple[ProcessQueue, MessageExt]] = []
        for key in list(parked):
            p = parked[key]
            keep = [(pq, m) for pq, m in p.items if not pq.dropped]
            dropped += [(pq, m) for pq, m in p.items if pq.dropped]
            if keep:
                p.items = keep
            else:
                del parked[key]
        self._parked[idx] -= len(dropped)
        for pq, ms in _per_queue(dropped).items():
            pq.skip(ms)

    @staticmethod
    def _safe_extractor(extract: Callable[[MessageExt], str | None]) -> Callable[[MessageExt], str | None]:
        def key_of(msg: MessageExt) -> str | None:
            try:
                return extract(msg)
            except Exception:
                # Routing by queue keeps the message in its queue's order,
                # which is never wrong, only less parallel.
                logger.exception(
                    "key_extractor failed for %s offset %d; routing it by its queue", msg.queue, msg.queue_offset
                )
                return None

        return key_of
