"""The thread executor: one OS thread per lane (the default).

Each thread takes everything queued in its lane (blocking while it is
empty), and runs it through its :class:`~lite_push._lanes.worker.LaneWorker`,
calling the listener plainly.  A put wakes a waiting thread by itself, so
there is nothing to flush after a dispatch.  For I/O-bound listeners that
release the GIL.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .._kernels.lanemetrics import clock
from .._lanes.lanes import Lane
from .._lanes.steps import FENCED, PAUSE, Outcome, Steps
from .._lanes.worker import LaneWorker
from .._types import ConsumeResult, MessageExt

__all__ = ["SyncListener", "ThreadExecutor"]

#: A plain listener: the messages of one call -> None, a ConsumeResult, or raises.
SyncListener = Callable[[list[MessageExt]], object]

_SUCCESS = ConsumeResult.SUCCESS
#: What a listener may raise that is not a failed attempt: the process is
#: being stopped.
_FATAL = (KeyboardInterrupt, SystemExit)


def _drive(steps: Steps, listener: SyncListener, worker: LaneWorker) -> None:
    """Call the listener for each list of messages ``steps`` yields and
    send it the outcome (each call shown in ``lane.call`` while it runs)."""
    lm = worker.metrics
    gate = worker.gate
    lane = worker.lane
    mono = worker.monotonic
    try:
        chunk = next(steps)
        while True:
            if chunk is FENCED:  # the queue's ownership is not certain now
                gate.wait_fenced()
                chunk = steps.send((None, None))
                continue
            if chunk is PAUSE:  # max_rate: this call starts later
                gate.wait_paused()
                chunk = steps.send((None, None))
                continue
            t0 = clock()
            lane.call = (chunk, mono())
            try:
                outcome: Outcome = (None, listener(chunk))
            except _FATAL:
                raise
            except BaseException as e:  # any other error of the listener is a failed attempt
                outcome = (e, None)
            lane.call = None
            if lane.moving:  # a stealer moved what came after this call
                lane.settle()
            if lm is not None:
                lm.call(t0, len(chunk))
            chunk = steps.send(outcome)
    except StopIteration:
        pass


def run_lane(lane: Lane, worker: LaneWorker, listener: SyncListener) -> None:
    """A lane thread's body: take, consume, until the lane is closed.

    The hot path (a segment with no key parked in the lane nor held,
    ``batch_size`` 1, its queue neither dropped nor the shutdown deadline
    passed) is inlined here, and so is the choice of it.  It is written
    twice, here and in ``async_executor.run_async_lane``, alike but for what
    the executors do differently (the ``await``, cancellation, admission,
    and asyncio passing a one-message segment as the call's list).  Python
    cannot share one loop body between a call and an ``await``: written
    once, the loop would be a generator driven per call, as the slow path
    is, which costs 144-168 ns more CPU a message in segments of four and
    564-575 ns in segments of one (``benchmarks/hot_loop_shape.py``; the
    numbers are in ``benchmarks/history/issue-44-layout.md``), up to a
    sixth of a no-op message's 3.1-3.5 us on threads.
    """
    lm = worker.metrics
    mono = worker.monotonic
    success = _SUCCESS
    parked = worker.parked
    held_keys = worker.held  # dead_letter_order="key": its keys are replaced whole, read per segment
    hot = worker.hot
    aborted = worker.aborted
    try:
        while True:
            worker.idle()
            taken = lane.take()
            if taken is None:
                return
            segments, due = worker.took(taken, lane.taken)
            if due:
                _drive(worker.due_steps(due), listener, worker)
            for pq, msgs in segments:
                if parked or not hot or held_keys.keys or pq.dropped or aborted():
                    steps = worker.segment_steps(pq, msgs)
                    if steps is not None:
                        _drive(steps, listener, worker)
                        continue
                # The hot path: one listener call per message, inline,
                # each shown in lane.call while it runs.
                t0 = clock() if lm is not None else 0.0
                j = 0
                exc: BaseException | None = None
                result: object = None
                lane.seg = msgs
                lane.done = None
                for msg in msgs:
                    now = mono()
                    if now >= pq.owned_until:  # fenced: not certain the queue is ours
                        break
                    call = [msg]  # its own list: a listener may change what it is given
                    lane.call = (call, now)
                    try:
                        result = listener(call)
                    except _FATAL:
                        raise
                    except BaseException as e:  # any other error of the listener is a failed attempt
                        exc = e
                    lane.call = None
                    if lane.moving:  # a stealer took what came before and after this call
                        j -= lane.settle()
                    if exc is not None or (result is not None and result is not success):
                        break
                    j += 1
                if j == len(msgs):  # all succeeded (outside the try: a lane bug is not a listener failure)
                    worker.completed(pq, msgs, t0)
                    continue
                _drive(worker.failed_at(pq, msgs, j, exc, result), listener, worker)
    except Exception as e:
        worker.crashed(e)
    finally:
        worker.stop()


class ThreadExecutor:
    """Lanes drained by threads."""

    def __init__(self, group: str, listener: SyncListener) -> None:
        self._group = group
        self._listener = listener
        self._threads: list[threading.Thread] = []

    @staticmethod
    def make_lanes(n: int, wake: Callable[[], None]) -> list[Lane]:
        """The lanes this executor drains."""
        return [Lane(i, wake) for i in range(n)]

    def flush(self) -> None:
        """After a dispatch: nothing to do, a put wakes its thread."""

    def start(self, lanes: list[tuple[Lane, LaneWorker]]) -> None:
        """Start one thread per lane."""
        for lane, worker in lanes:
            t = threading.Thread(
                target=run_lane,
                args=(lane, worker, self._listener),
                name=f"lite-push-lane-{self._group}-{lane.index}",
                daemon=True,
            )
            t.start()
            self._threads.append(t)

    def stop_waits(self) -> None:
        """The consumer stops: nothing to do (a lane thread waiting for its
        ``max_rate`` turn waits on the abort event)."""

    def lanes_alive(self) -> bool:
        """Whether every lane's thread runs (before start: none to run)."""
        return all(t.is_alive() for t in self._threads)

    def join(self, deadline: float, final: bool = False) -> bool:
        """Wait (until ``deadline``, ``time.monotonic``) for the lane
        threads to exit; return whether they all did."""
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)
