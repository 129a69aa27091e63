"""The lane worker: what one lane does with the work it takes.

One :class:`LaneWorker` per lane, used only by the task that drains the lane
(a thread or a coroutine), so its parked keys need no lock.  It is written
once for both executors; an executor only takes work from the lane and calls
the listener (plainly, or with ``await``).  The worker hands it the messages
to call the listener with, as *steps*: a generator that yields each list of
messages and is sent back ``(exception, result)`` of that call.

* **Hot path** (no key parked in the lane, ``batch_size`` 1): the executor
  calls the listener per message inline, then :meth:`LaneWorker.completed`;
  on the first failure :meth:`LaneWorker.failed_at` takes over.
* **Slow path** (:meth:`LaneWorker.segment_steps`): while keys are parked in
  this lane, a message of a parked key queues up behind it instead of
  running; with ``batch_size`` > 1 messages go in chunks.
* **Failures** (``_lanes.lane_failures``): the consumer's
  :class:`~lite_push._lanes.failures.FailurePolicy` decides per message: parked
  (KEY_ORDERLY: its key waits ``suspend_ms`` on the consumer's one timer
  while the lane goes on with other keys, ``_lanes.parked_keys``), sent back to
  the retry topic (CONCURRENTLY) or dead-lettered; sends are handed off to
  the pull thread through the outbox, and it completes the offsets once the
  source stored them.
* **What the lane gives back** (``_lanes.handback``): completions, skips and
  hand-offs, each per batch, and whether the lane is busy.
* **Due keys** (:meth:`LaneWorker.due_steps`): the lane is handed
  :class:`~lite_push._state.timer.LaneWork`, each of which runs itself: a due
  key (:meth:`LaneWorker.retry_due`: its head is retried, then what queued
  behind it, in order, until one fails again), ``PURGE``
  (:meth:`LaneWorker.purge`) or a change of the keys the application
  paused (:meth:`LaneWorker.apply_pauses`: a paused key is parked without
  a timer entry; its resume runs it as a due key).
* **Held keys** (``dead_letter_order="key"``, ``_lanes.held_keys``): while
  some key is held, segments go the slow way, and a message of a held key
  is dead-lettered behind it instead of running (collected per lane and
  handed off with the lane's next hand-off, or before it takes or waits
  for more work; the router keeps the key on this lane until then).
* **Rate limits** (``_lanes.rate_limit``): with ``max_rate`` every call first
  reserves its start (``_lanes.call_gate``); with ``key_min_interval`` a message
  whose key started less than the interval ago is held on the timer like a
  parked key, and the lane goes on with its other keys.  Either sends every
  segment the slow way.

Before every call the lane's :class:`~lite_push._lanes.call_gate.CallGate`
checks the shutdown deadline, the queue's fence and ``max_rate``.  Messages
of a revoked queue, or any after the shutdown deadline, are skipped: left
unfinished, so they stay uncommitted and run again.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import replace

from .._kernels.lanemetrics import LaneMetrics
from .._state.process_queue import ProcessQueue
from .._state.shared import per_queue
from .._state.timer import LaneWork
from .._types import ConsumeResult, MessageExt
from .call_gate import CallGate
from .failures import Failure, SendItem
from .handback import Handback
from .lane_failures import LaneFailures
from .lanes import Lane, Segment
from .parked_keys import ParkedKeys
from .rate_limit import KeyPacer
from .steps import Steps, no_steps

__all__ = ["LaneWorker"]

_SUCCESS = ConsumeResult.SUCCESS


class LaneWorker:
    """The lane logic of lane ``index`` (see the module docstring): what it
    holds, what it does with the work it takes, and its bookkeeping
    (complete, skip, hand off)."""

    __slots__ = (
        "_back",
        "_failures",
        "_keys",
        "_pacer",
        "_size",
        "aborted",
        "gate",
        "held",
        "hot",
        "index",
        "lane",
        "metrics",
        "monotonic",
        "parked",
    )

    def __init__(
        self,
        lane: Lane,
        *,
        gate: CallGate,
        parked: ParkedKeys,
        back: Handback,
        failures: LaneFailures,
        batch_size: int = 1,
        metrics: LaneMetrics | None = None,
        pacer: KeyPacer | None = None,
    ) -> None:
        #: The lane this worker drains: it shows the call in progress and
        #: what the task holds (``_lanes.lanes``: read by the call watch, changed
        #: by a stealer).
        self.lane = lane
        self.index = lane.index
        #: The checks before every call: shutdown, fence, ``max_rate``.
        self.gate = gate
        #: This lane's parked keys.
        self._keys = parked
        #: Keys parked in this lane (the executor's hot path reads it:
        #: empty, no segment waits behind one).
        self.parked = parked.keys
        #: What the lane gives back: completions, skips, hand-offs, busy.
        self._back = back
        #: Failed calls (park, send back, dead-letter) and the lane's own bugs.
        self._failures = failures
        #: Most messages per listener call.
        self._size = batch_size
        #: The lane's histogram recorder (``None``: metrics off).
        self.metrics = metrics
        #: ``key_min_interval``: when each key last started (``None``: off).
        self._pacer = pacer
        #: The consumer's clock, which fences are on (read before every call).
        self.monotonic = gate.monotonic
        #: One listener call per message (``batch_size`` 1) and no rate
        #: limit: the hot path applies.
        self.hot = batch_size == 1 and gate.limiter is None and pacer is None
        #: Whether the shutdown deadline passed (lanes skip what is left).
        self.aborted = gate.aborted
        #: The consumer's held keys (``dead_letter_order="key"``): while
        #: ``held.keys`` is empty, nothing here looks further.
        self.held = back.held

    # -- taking work -----------------------------------------------------------------

    def idle(self) -> None:
        """The task is about to wait for work."""
        self._back.idle()

    def busy(self) -> None:
        """The task holds work it has not started (waiting for a slot)."""
        self._back.busy()

    def took(
        self, taken: tuple[list[Segment], list[LaneWork]], stamps: list[tuple[float, int]]
    ) -> tuple[list[Segment], list[LaneWork]]:
        """The task took ``taken`` from the lane (``stamps``: when it was
        put, for the lane-wait metric)."""
        self._back.took()
        if self.metrics is not None and stamps:
            self.metrics.waited(stamps)
        lane = self.lane
        lane.hand = taken[0]  # what a stealer may move, while the task is in a call
        lane.seg = None  # due keys run first, outside any segment
        return taken

    def stop(self) -> None:
        """The task stops: parked messages stay unfinished (uncommitted;
        the offset map keeps what finished above them)."""
        self._back.stop(self._keys.clear())

    def crashed(self, exc: BaseException) -> None:
        """A bug in the lane itself (not the listener's failure, which is
        handled): logged; its messages stay unfinished."""
        self._failures.crashed(exc)

    # -- segments --------------------------------------------------------------------

    def segment_steps(self, pq: ProcessQueue, msgs: list[MessageExt]) -> Steps | None:
        """``None``: run ``msgs`` on the hot path (one listener call per
        message, then :meth:`completed`).  Otherwise the steps to drive
        instead: the slow path, or nothing (a revoked queue's messages, or
        after the shutdown deadline, are skipped)."""
        if pq.dropped or self.aborted():
            self._back.skip(pq, msgs)
            return no_steps()
        if self.parked or not self.hot or self.held.keys:
            return self._slow_steps(pq, msgs)
        return None

    def completed(self, pq: ProcessQueue, msgs: list[MessageExt], t0: float) -> None:
        """The hot path processed a whole segment (listener calls from
        ``t0`` on, the recorder's clock)."""
        self._back.complete(pq, msgs)
        if self.metrics is not None:
            self.metrics.segment(t0, msgs)

    def failed_at(
        self, pq: ProcessQueue, msgs: list[MessageExt], j: int, exc: BaseException | None, result: object
    ) -> Steps:
        """The hot path stopped at ``msgs[j]``: complete what came before;
        then either the listener failed it (``exc`` set, or a result other
        than success: handle the failure) or the queue's fence was reached
        (it was not called).  The rest goes the slow way (the steps
        returned), which waits at the fence."""
        if j:
            self._back.complete(pq, msgs[:j])
        if exc is None and (result is None or result is _SUCCESS):
            return self._slow_steps(pq, msgs, j)  # fenced before msgs[j]
        self.fail(pq, [msgs[j]], exc, result)
        return self._slow_steps(pq, msgs, j + 1) if j + 1 < len(msgs) else no_steps()

    def _slow_steps(self, pq: ProcessQueue, msgs: list[MessageExt], start: int = 0) -> Steps:
        """Yield the chunks (up to ``batch_size``) of a segment to process,
        from ``msgs[start]`` on: a message of a parked key queues up behind
        it instead, and one whose key started less than ``key_min_interval``
        ago is held for it.  Failed chunks are parked, sent back or
        dead-lettered; the rest is completed at the end, at once.  ``msgs``
        is the segment itself, not a copy: while a call runs, a stealer may
        cut what follows it (and complete ``done`` so far, emptying it)."""
        size = self._size
        parked = self._keys
        waiting = self.parked  # its dict: a plain truth test per message
        pacer = self._pacer
        gate = self.gate
        held = self.held
        done: list[MessageExt] = []
        chunk: list[MessageExt] = []
        keys: list[Hashable] = []  # pacing: the keys of the chunk
        last = len(msgs) - 1
        lane = self.lane
        lane.seg = msgs
        lane.done = done
        for i in range(start, len(msgs)):
            if i >= len(msgs):  # a stealer cut the segment during the last call
                break
            m = msgs[i]
            if waiting and parked.queue_behind(pq, m):
                pass
            elif held.keys and self._back.hold_behind(pq, m):
                pass
            elif pacer is None:
                chunk.append(m)
            else:
                key = pacer.key(m)
                at = 0.0
                if key is not None:
                    now = self.monotonic()
                    at = now + pacer.interval if key in keys else pacer.due(key, now)
                if at:
                    parked.pace([(pq, m)], key, at, 1)
                else:
                    chunk.append(m)
                    if key is not None:
                        keys.append(key)
            if not chunk or (len(chunk) < size and i < last):
                continue
            if not (yield from gate.may_call(pq, len(chunk))):
                self._back.skip(pq, chunk)
                chunk = []
                keys = []
                continue
            if keys and pacer is not None:
                pacer.started_all(keys, self.monotonic())
                keys = []
            exc, result = yield chunk
            if exc is None and (result is None or result is _SUCCESS):
                done += chunk
            else:
                self.fail(pq, chunk, exc, result)
            chunk = []
        if done:
            self._back.complete(pq, done)
            if self.metrics is not None:
                self.metrics.completed(done[0], done[-1], len(done))

    # -- failures --------------------------------------------------------------------

    def fail(self, pq: ProcessQueue, chunk: list[MessageExt], exc: BaseException | None, result: object) -> None:
        """The listener failed ``chunk``: park, send back or dead-letter
        each message, as the failure policy decides (``_lanes.lane_failures``)."""
        self._failures.fail(pq, chunk, exc, result)

    # -- work handed to the lane -----------------------------------------------------

    def due_steps(self, due: list[LaneWork]) -> Steps:
        """The calls of the work the lane was handed (due keys, purges),
        in order."""
        for work in due:
            yield from work.steps(self)

    def retry_due(self, key: Hashable, gen: int) -> Steps:
        """Parked ``key``'s time came (if ``gen`` is still its park): yield
        its messages one at a time, the head first, then what queued behind
        it, in order, until one fails again (then the key is parked again
        with what still waits behind it) or, with ``key_min_interval``,
        until the next one must wait for its interval (then the key is held
        with the rest).  A failed message that is dead-lettered, or (a
        resumed key in CONCURRENTLY) sent back, lets the rest go on."""
        parked = self._keys
        p = parked.take(key, gen)
        if p is None:
            return  # stale: the key was purged or parked again since
        pacer = self._pacer
        gate = self.gate
        items = p.items
        done: list[tuple[ProcessQueue, MessageExt]] = []
        out: list[SendItem] = []
        again: tuple[ProcessQueue, MessageExt, Failure] | None = None
        paced_until = 0.0  # pacing: the rest waits until then
        left = 0  # messages that left the park: items[left] is the next (no pop per message)
        while left < len(items):
            pq, m = items[left]
            live = not (pq.dropped or gate.aborted())
            if live and self.held.keys and self._back.hold_behind(pq, m, out):
                left += 1  # an earlier message of the key was dead-lettered: the rest follows it
                continue
            pace = pacer.key(m) if pacer is not None and live else None
            if pace is not None and pacer is not None:
                paced_until = pacer.due(pace, self.monotonic())
                if paced_until:
                    break
            if not live or not (yield from gate.may_call(pq, 1)):
                left += 1
                self._back.skip(pq, [m])
                continue
            if pace is not None and pacer is not None:
                pacer.started(pace, self.monotonic())
            exc, result = yield [m]
            left += 1
            if exc is None and (result is None or result is _SUCCESS):
                done.append((pq, m))
                continue
            failure = self._failures.fail_due(pq, m, exc, result, out)
            if failure is None:  # dead-lettered or sent back: the key moves on
                continue
            again = (pq, replace(m, reconsume_times=m.reconsume_times + 1), failure)
            break
        parked.unparked(left)
        rest = items[left:]
        for pq, ms in per_queue(done).items():
            self._back.complete(pq, ms)
        if done and self.metrics is not None:
            self.metrics.completed(done[0][1], done[-1][1], len(done))
        if out:
            self._back.hand_off(out)
        if again is not None:  # parked again, with what still waits behind it
            pq, retry, failure = again
            parked.park(pq, retry, failure, rest)
        elif paced_until:  # paced to the key's interval, with what waits behind
            parked.pace(rest, key, paced_until, 0)

    def apply_pauses(
        self, paused: frozenset[Hashable], added: frozenset[Hashable], removed: frozenset[Hashable]
    ) -> Steps:
        """The application paused ``added`` and resumed ``removed`` keys
        (``paused``: all paused now): from now on this lane holds the paused
        keys' messages; each resumed key with nothing else to wait for runs
        what waited, as a due key does (:meth:`retry_due`)."""
        for key, gen in self._keys.apply_pauses(paused, added, removed):
            yield from self.retry_due(key, gen)

    def purge(self) -> None:
        """Skip the parked messages of revoked queues."""
        dropped = self._keys.purge()
        for pq, ms in per_queue(dropped).items():
            pq.skip(ms)
        self._back.done_with([m for _, m in dropped])
