"""QUEUE_ORDERLY: the baseline, a model of RocketMQ's ConsumeMessageOrderlyService.

lite_push is measured against this, in the same process and on the same
data, so it reproduces what makes RocketMQ's orderly consumer slow: a whole
queue is serialised behind three locks, and its concurrency is at most the
number of queues the consumer owns, whatever its thread count.

* Lock 1, the broker-side queue lock: the pull thread takes it
  (``PullSource.lock``) when a queue is assigned, renews it every
  ``lock_renew_interval`` (RocketMQ: 20 s) for ``lock_lease`` (60 s), and
  releases it only after a revoked queue drained and committed.  A consume
  request finds the lease run out -> it tries again later (RocketMQ's
  ``tryLockLaterAndReconsume``).
* Lock 2, the per-queue object lock (``messageQueueLock.fetchLockObject``):
  a consume request holds it for its whole run, so only one thread ever
  consumes a queue.
* Lock 3, the ProcessQueue consume lock: held around each listener call
  (RocketMQ takes it so that a rebalance can tell "in the listener").

Messages of a queue wait in ``pending`` (RocketMQ's ``msgTreeMap``) in offset
order; a consume request takes ``batch_size`` at a time
(``consumeMessageBatchMaxSize``, default 1).  A queue has at most one request
submitted or running (``consuming``: RocketMQ's ``dispatchToConsume``); the
requests run on one shared pool of ``consume_thread_max`` threads.  A request
that has run for ``max_continuous_consume`` seconds (60 s) yields and
resubmits itself.  A failed batch goes back to the head of ``pending`` and the
queue waits ``suspend_ms`` (``SUSPEND_CURRENT_QUEUE_A_MOMENT``) -- the whole
queue, not just the key.  After ``max_reconsume_times`` failed retries (or at
once for ``NonRetryableError`` / ``DLQ_NOW``) the batch is handed to the
consumer for the dead-letter queue and the queue moves on (RocketMQ's
``checkReconsumeTimes``).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from .._config import ConsumerConfig
from .._lanes.failures import FailurePolicy, SendItem, Verdict
from .._lanes.rate_limit import RateLimiter
from .._state.process_queue import ProcessQueue
from .._tracing import settle
from .._types import ConsumeResult, MessageExt, MessageQueue

__all__ = ["QueueOrderlyService"]

logger = logging.getLogger(__name__)

#: Seconds before a request that found its queue unlocked tries again
#: (RocketMQ: 100 ms when not locked, 10 ms after yielding).
RETRY_UNLOCKED = 0.1
RETRY_YIELDED = 0.01

_OK = (None, ConsumeResult.SUCCESS)


class _QueueState:
    """The baseline's per-queue state.  ``tree`` guards ``pending`` and
    ``consuming``; ``consume_lock`` is lock 3."""

    __slots__ = ("pq", "tree", "pending", "consuming", "consume_lock", "locked_until")

    def __init__(self, pq: ProcessQueue) -> None:
        self.pq = pq
        self.tree = threading.Lock()
        self.pending: deque[MessageExt] = deque()
        self.consuming = False
        self.consume_lock = threading.Lock()
        #: End of the broker lock's lease (monotonic), written by the pull thread.
        self.locked_until = 0.0


class _Scheduler:
    """One thread that runs callbacks when they are due (RocketMQ's
    scheduled executor for ``submitConsumeRequestLater``)."""

    def __init__(self, name: str) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def later(self, delay: float, fn: Callable[[], None]) -> None:
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + delay, next(self._seq), fn))
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    self._cond.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                if self._closed:
                    return
                _, _, fn = heapq.heappop(self._heap)
            try:
                fn()
            except Exception:
                logger.exception("scheduled consume request failed")


class QueueOrderlyService:
    """Consumes queues one thread at a time each, behind three locks."""

    def __init__(
        self,
        config: ConsumerConfig,
        *,
        listener: Callable[[list[MessageExt]], object],
        abort: threading.Event,
        clock_monotonic: Callable[[], float],
        dead_letter: Callable[[list[SendItem]], None],
        policy: FailurePolicy,
        limiter: RateLimiter | None = None,
        clock_wait: Callable[[threading.Event, float], bool] | None = None,
    ) -> None:
        self._config = config
        self._limiter = limiter  # max_rate: a pool thread waits for its call's start
        # waits on the consumer's clock (a ManualClock moves when waited on)
        self._wait = clock_wait or threading.Event.wait
        self._listener = listener
        self._abort = abort
        self._now = clock_monotonic
        self._dead_letter = dead_letter
        #: Failures: dead-lettered, or the queue suspended (``Verdict.PARK``).
        self._policy = policy
        self._states: dict[ProcessQueue, _QueueState] = {}
        self._mq_locks: dict[MessageQueue, threading.Lock] = {}  # lock 2, one per queue
        self._pool = ThreadPoolExecutor(
            max_workers=config.consume_thread_min, thread_name_prefix=f"lite-push-orderly-{config.group}"
        )
        self._scheduler = _Scheduler(f"lite-push-orderly-timer-{config.group}")
        self._counters: list[list[int]] = []  # [consumed, retried] per pool thread
        self._local = threading.local()
        self._counters_lock = threading.Lock()

    # -- pull thread ---------------------------------------------------------------

    def add_queue(self, pq: ProcessQueue) -> None:
        self._states[pq] = _QueueState(pq)
        self._mq_locks.setdefault(pq.queue, threading.Lock())

    def remove_queue(self, pq: ProcessQueue) -> None:
        self._states.pop(pq, None)

    def set_locked(self, pq: ProcessQueue, until: float) -> None:
        """The pull thread holds (or renewed) the broker lock until ``until``."""
        st = self._states.get(pq)
        if st is not None:
            st.locked_until = until

    def unlocked(self) -> list[ProcessQueue]:
        """Owned queues whose broker lock is not held now."""
        now = self._now()
        return [pq for pq, st in self._states.items() if st.locked_until <= now]

    def dispatch(self, groups: list[tuple[ProcessQueue, list[MessageExt], int]]) -> None:
        """Queue polled messages; submit a consume request for each queue
        that has none (RocketMQ's ``submitConsumeRequest`` with
        ``dispatchToConsume``)."""
        for pq, msgs, _ in groups:
            st = self._states.get(pq)
            if st is None:
                pq.skip(msgs)
                continue
            with st.tree:
                st.pending.extend(msgs)
                submit = not st.consuming
                st.consuming = True
            if submit:
                self._submit(st)

    def close(self, deadline: Callable[[], float]) -> None:
        """Let the queued work finish until ``deadline()`` (monotonic, read
        again as it waits: a hurried stop brings it forward), then stop;
        past the deadline the consumer's abort is set, and what is left
        stays unfinished (uncommitted).  With the abort set already (a stop
        that does not drain), only the consume requests running finish."""
        while any(st.consuming for st in list(self._states.values())):
            if time.monotonic() >= deadline():
                self._abort.set()
                break
            time.sleep(0.005)
        self._scheduler.close()
        for st in list(self._states.values()):
            self._drop_pending(st)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def counts(self) -> tuple[int, int]:
        """(consumed, retried) over all pool threads."""
        with self._counters_lock:
            return sum(c[0] for c in self._counters), sum(c[1] for c in self._counters)

    # -- consume requests (pool threads) ---------------------------------------------

    def _submit(self, st: _QueueState) -> None:
        try:
            self._pool.submit(self._run, st)
        except RuntimeError:  # the pool is shut down
            pass

    def _later(self, st: _QueueState, delay: float) -> None:
        self._scheduler.later(delay, lambda: self._submit(st))

    def _counter(self) -> list[int]:
        try:
            return self._local.counter  # type: ignore[no-any-return]
        except AttributeError:
            c = self._local.counter = [0, 0]
            with self._counters_lock:
                self._counters.append(c)
            return c

    def _run(self, st: _QueueState) -> None:
        pq = st.pq
        cfg = self._config
        counter = self._counter()
        with self._mq_locks[pq.queue]:  # lock 2: one thread per queue
            begin = self._now()
            while True:
                if pq.dropped or self._abort.is_set():
                    self._drop_pending(st)
                    return
                now = self._now()
                if st.locked_until <= now:  # lock 1 not held: try again later
                    self._later(st, RETRY_UNLOCKED)
                    return
                if now - begin > cfg.max_continuous_consume:
                    self._later(st, RETRY_YIELDED)
                    return
                with st.tree:
                    if not st.pending:
                        st.consuming = False
                        return
                    n = min(cfg.batch_size, len(st.pending))
                    msgs = [st.pending.popleft() for _ in range(n)]
                if self._limiter is not None:
                    now = self._now()
                    until = now + self._limiter.reserve(n, now)
                    while (left := until - self._now()) > 0.0 and not self._wait(self._abort, left):
                        pass
                    if self._abort.is_set():  # the shutdown deadline passed meanwhile
                        with st.tree:
                            st.pending.extendleft(reversed(msgs))
                        continue
                exc: BaseException | None = None
                with st.consume_lock:  # lock 3: around the listener
                    try:
                        result = self._listener(msgs)
                    except (KeyboardInterrupt, SystemExit):
                        raise
                    except BaseException as e:  # any other error of the listener is a failed attempt
                        exc, result = e, None
                if exc is None and result in _OK:
                    pq.complete(msgs)
                    counter[0] += len(msgs)
                    continue
                counter[1] += len(msgs)
                policy = self._policy
                failure = policy.classify(exc, result)
                verdict = policy.verdict(msgs[0], failure)
                settle()  # the call's span, when traced
                if verdict is Verdict.DEAD_LETTER:
                    # Retries used up: dead-letter the batch, the queue moves on.
                    self._dead_letter([policy.dead_letter(pq, m, failure) for m in msgs])
                    continue
                logger.warning(
                    "consumer %r: %s for %s offset %d (attempt %d); suspending the queue %d ms",
                    cfg.group,
                    failure.reason,
                    pq.queue,
                    msgs[0].queue_offset,
                    msgs[0].reconsume_times + 1,
                    cfg.suspend_ms,
                    exc_info=exc if msgs[0].reconsume_times == 0 else None,
                )
                # SUSPEND_CURRENT_QUEUE_A_MOMENT: the batch goes back to the
                # head and the whole queue waits.
                again = [replace(m, reconsume_times=m.reconsume_times + 1) for m in msgs]
                with st.tree:
                    st.pending.extendleft(reversed(again))
                self._later(st, cfg.suspend_ms / 1000.0)
                return

    def _drop_pending(self, st: _QueueState) -> None:
        with st.tree:
            left = list(st.pending)
            st.pending.clear()
            st.consuming = False
        if left:
            st.pq.skip(left)
