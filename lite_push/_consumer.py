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
lane, in the listener, or being retried.  Commits happen every
``commit_interval`` seconds, when a queue is revoked, and at shutdown.
Delivery is at-least-once.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import TracebackType

from ._clock import SYSTEM_CLOCK, Clock
from ._config import ConsumeMode, ConsumerConfig
from ._errors import ConfigError, LitePushError, SourceClosedError
from ._lanes import Lane, Segment
from ._process_queue import ProcessQueue
from ._queue_orderly import QueueOrderlyService
from ._offsets import OFFSETS_IMPL
from ._router import ROUTER_IMPL, lane_of, route
from ._types import ConsumeResult, MessageExt, MessageQueue, PollBatch
from .sources._base import PullSource, RebalanceListener

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

_OK = (None, ConsumeResult.SUCCESS)
_RETRY = (ConsumeResult.RETRY_LATER, ConsumeResult.SUSPEND_CURRENT_QUEUE_A_MOMENT)


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

    def __init__(
        self,
        config: ConsumerConfig,
        source: PullSource,
        listener: Listener,
        *,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(config, ConsumerConfig):
            raise ConfigError("config", f"must be a ConsumerConfig, got {type(config).__name__}")
        if not isinstance(source, PullSource):
            raise ConfigError("source", f"must be a PullSource, got {type(source).__name__}")
        if not callable(listener):
            raise ConfigError("listener", f"must be callable, got {listener!r}")
        if inspect.iscoroutinefunction(listener):
            raise ConfigError("listener", "is an async function; the thread executor needs a plain function")
        self.config = config
        self._source = source
        self._listener = listener
        self._clock: Clock = clock or SYSTEM_CLOCK
        n = config.lanes
        self._lanes = [Lane(i, source.wakeup) for i in range(n)]
        self._threads: list[threading.Thread] = []
        self._pull_thread: threading.Thread | None = None
        # Per-lane counters: each is written by its lane thread only.
        self._consumed = [0] * n
        self._retried = [0] * n
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
        if config.mode is ConsumeMode.QUEUE_ORDERLY:
            self._orderly = QueueOrderlyService(config, listener, self._abort, self._clock.monotonic)
        source.set_rebalance_listener(_Rebalance(self))

    # -- public API ---------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume ``topic``, filtered by tag ``expression`` (``"*"`` or
        ``"TagA || TagB"``).  Only before :meth:`start`."""
        if self._started:
            raise LitePushError("subscribe() must be called before start()")
        self._source.subscribe(topic, expression)
        self._subscriptions.append((topic, expression))

    def start(self) -> None:
        """Start the lane threads and the pull thread.  Only once."""
        if self._started:
            raise LitePushError("consumer already started")
        if not self._subscriptions:
            raise LitePushError("subscribe() to at least one topic before start()")
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
            lane_depths=tuple(lane.depth for lane in self._lanes),
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
        failing = False
        try:
            while not self._stopping.is_set():
                try:
                    batches = source.poll(cfg.poll_timeout, cfg.pull_batch_size)
                except SourceClosedError:
                    logger.error("source closed under consumer %r; stopping", cfg.group)
                    break
                except Exception:
                    if not failing:  # log once per episode, not per poll
                        logger.exception("poll failed for consumer %r; retrying", cfg.group)
                        failing = True
                    clock.wait(self._stopping, POLL_ERROR_BACKOFF)
                    continue
                if failing:
                    logger.info("poll recovered for consumer %r", cfg.group)
                    failing = False
                if batches:
                    self._gather(batches)
                self._flow_control()
                now = clock.monotonic()
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
            for t in self._threads:
                t.join(max(0.0, self._deadline - time.monotonic()))
            if any(t.is_alive() for t in self._threads):
                self._abort.set()
                left = 0
                for lane in self._lanes:
                    for pq, msgs in lane.drain():
                        left += len(msgs)
                        pq.skip(msgs)
                grace = time.monotonic() + ABORT_GRACE
                for t in self._threads:
                    t.join(max(0.0, grace - time.monotonic()))
                logger.warning(
                    "consumer %r: shutdown deadline passed with %d queued messages unprocessed; "
                    "they stay uncommitted and will be delivered again",
                    self.config.group,
                    left,
                )
            self._commit(list(self._pqs.values()))
        finally:
            try:
                self._source.close()
            finally:
                self._stopped.set()
                logger.info("lite_push consumer %r stopped", self.config.group)

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
        to_pause = []
        total = 0
        for batch in batches:
            pq = pqs.get(batch.queue)
            if pq is None:
                logger.warning("poll returned messages of %s, which is not assigned; ignored", batch.queue)
                continue
            msgs = batch.messages
            count, size, span = pq.add_batch(msgs, batch.next_offset)
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
            if not pq.paused and self._over_threshold(count, size, span):
                pq.paused = True
                to_pause.append(batch.queue)
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

    def _over_threshold(self, count: int, size: int, span: int) -> bool:
        """Whether a queue's unfinished messages, bytes or span pass the
        pause thresholds (RocketMQ's pullThresholdForQueue, ...SizeForQueue,
        consumeConcurrentlyMaxSpan)."""
        cfg = self.config
        return (
            count > cfg.pull_threshold_for_queue
            or size > cfg.pull_threshold_size_for_queue
            or span > cfg.max_span
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
            elif not pq.lane_blocked and pq.check_resume():
                pq.mark_resumed()
                to_resume.append(q)
        if to_pause:
            self._source.pause(to_pause)
            logger.debug("paused %s", to_pause)
        if to_resume:
            self._source.resume(to_resume)
            logger.debug("resumed %s", to_resume)

    def _commit(self, pqs: list[ProcessQueue]) -> None:
        offsets = {}
        for pq in pqs:
            offset = pq.committable()
            if offset != pq.last_committed:
                offsets[pq.queue] = offset
        if not offsets:
            return
        try:
            self._source.commit(offsets)
        except Exception:
            logger.exception("commit of %d queue(s) failed for consumer %r", len(offsets), self.config.group)
            return
        for pq in pqs:
            if pq.queue in offsets:
                pq.last_committed = offsets[pq.queue]

    def _on_assigned(self, queues: list[MessageQueue]) -> None:
        n = len(self._lanes)
        cfg = self.config
        low = (
            int(cfg.pull_threshold_for_queue * RESUME_FRACTION),
            int(cfg.pull_threshold_size_for_queue * RESUME_FRACTION),
            int(cfg.max_span * RESUME_FRACTION),
        )
        new = []
        for q in queues:
            pq = self._pqs[q] = ProcessQueue(q, self._source.position(q), lane_of(str(q), n), low, self._source.wakeup)
            new.append(pq)
        if self._orderly is not None:
            for pq in new:
                self._orderly.add_queue(pq)
            self._lock_queues(new)  # lock 1: consumed only while held
        logger.info("consumer %r assigned %s", self.config.group, [str(q) for q in queues])

    def _on_revoked(self, queues: list[MessageQueue]) -> None:
        # Stop routing the queues, let their in-flight work finish (bounded),
        # commit, and only then return: the source releases them after this.
        # Batches gathered but not yet routed go to the lanes first (this runs
        # inside a poll of _gather), so waiting for the queues to drain ends.
        self._route()
        pqs = [self._pqs[q] for q in queues if q in self._pqs]
        for pq in pqs:
            pq.dropped = True
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
            self._source.unlock([pq.queue for pq in pqs])
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
            logger.exception("consumer %r: locking %d queue(s) failed", self.config.group, len(pqs))
            return
        until = self._clock.monotonic() + lease
        for pq in pqs:
            self._orderly.set_locked(pq, until if pq.queue in held else 0.0)
        missed = [str(pq.queue) for pq in pqs if pq.queue not in held]
        if missed:
            logger.info("consumer %r: queues locked by another member, retrying: %s", self.config.group, missed)

    # -- lane threads -------------------------------------------------------

    def _lane_loop(self, lane: Lane) -> None:
        idx = lane.index
        abort = self._abort
        while True:
            segments = lane.take()
            if segments is None:
                return
            for pq, msgs in segments:
                if pq.dropped or abort.is_set():
                    pq.skip(msgs)
                    continue
                done = self._consume(idx, pq, msgs)
                if done == len(msgs):
                    pq.complete(msgs)
                else:
                    if done:
                        pq.complete(msgs[:done])
                    pq.skip(msgs[done:])
                self._consumed[idx] += done

    def _consume(self, idx: int, pq: ProcessQueue, msgs: list[MessageExt]) -> int:
        """Run the listener over ``msgs``; return how many finished (fewer
        than all only when the queue was revoked or the consumer aborted
        during a retry).  The success path stays in this loop; failures go
        to :meth:`_retry`."""
        listener = self._listener
        size = self.config.batch_size
        success = ConsumeResult.SUCCESS
        n = len(msgs)
        i = 0
        if size == 1:
            # The hot loop: one listener call per message, nothing else.
            while i < n:
                j = i
                exc: BaseException | None = None
                result: object = None
                try:
                    for msg in msgs if i == 0 else msgs[i:]:
                        result = listener([msg])
                        if result is not None and result is not success:
                            break
                        j += 1
                    else:
                        return n
                except Exception as e:
                    exc = e
                if not self._retry(idx, pq, [msgs[j]], exc, result):
                    return j
                i = j + 1
            return n
        while i < n:
            chunk = msgs[i : i + size]
            try:
                result = listener(chunk)
            except Exception as e:
                if not self._retry(idx, pq, chunk, e, None):
                    return i
            else:
                if result is not None and result is not success and not self._retry(idx, pq, chunk, None, result):
                    return i
            i += len(chunk)
        return n

    def _retry(
        self, idx: int, pq: ProcessQueue, chunk: list[MessageExt], exc: BaseException | None, result: object
    ) -> bool:
        """The listener failed ``chunk`` (raised ``exc`` or returned
        ``result``): process it again after ``suspend_ms`` until it succeeds.
        Returns False when it was given up (queue revoked or aborting)."""
        listener = self._listener
        attempt = 0
        while True:
            if exc is not None:
                reason = f"listener raised {type(exc).__name__}: {exc}"
                exc_info: BaseException | None = exc if attempt == 0 else None
            elif result in _OK:
                return True
            else:
                if result in _RETRY:
                    reason = f"listener returned {result.name}"  # type: ignore[union-attr]
                else:
                    reason = f"listener returned {result!r}, not a ConsumeResult or None; treated as RETRY_LATER"
                exc_info = None
            attempt += 1
            self._retried[idx] += len(chunk)
            logger.warning(
                "consumer %r: %s for %d message(s) from %s offset %d (attempt %d); retrying in %d ms",
                self.config.group,
                reason,
                len(chunk),
                pq.queue,
                chunk[0].queue_offset,
                attempt,
                self.config.suspend_ms,
                exc_info=exc_info,
            )
            if self._clock.wait(self._abort, self.config.suspend_ms / 1000.0) or pq.dropped:
                return False
            chunk = [replace(m, reconsume_times=m.reconsume_times + 1) for m in chunk]
            exc = None
            try:
                result = listener(chunk)
            except Exception as e:
                exc = e

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
