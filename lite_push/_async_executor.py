"""The asyncio executor: lanes as coroutines on one event loop.

What differs from the thread executor is only how a lane waits and how the
listener is called:

* The pull thread is the same thread as with threads, off the loop.  A
  dispatch puts segments into the lanes it routed to, and the lanes that were
  waiting are woken with **one** ``call_soon_threadsafe`` per dispatch
  (:class:`~lite_push._lanes.LoopWaker`, flushed by the pull thread), not
  one per lane or message.
* One coroutine per lane takes everything queued in its lane and runs it
  through its :class:`~lite_push._lane_worker.LaneWorker`, awaiting the
  listener: the same routing, parking, hand-off and completion as a lane
  thread.  The hot path (one call per message) is inlined in the lane
  coroutine rather than awaited as a coroutine per segment: with a thousand
  lanes most segments hold one or two messages, and a coroutine per segment
  was a measurable share of the per-message cost.  A busy lane takes without
  a coroutine or a future (:meth:`~lite_push._lanes.AsyncLane.take_nowait`).
* :class:`Admission`: when the loop cannot turn over every lane with work
  within ``loop_turn_target``, only as many lanes as it can are in listener
  calls at once (the ones with the most work first), and KEY_ORDERLY places
  new keys on that many lanes once keys outnumber lanes (before, each key
  has a lane of its own).  The same throughput, a shorter turn: each
  key's next message waits less, so the busiest keys no longer finish long
  after the rest.
* A :class:`~lite_push._watchdog.LoopWatchdog` logs a listener that blocks
  the loop.

The loop is the application's (``AsyncLitePushConsumer``) or one of the
consumer's own on a thread of its own (:class:`LoopThread`, for
``LitePushConsumer`` with an ``async def`` listener).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ._admission import Admission
from ._lane_worker import LaneWorker
from ._lanemetrics import clock
from ._lanes import AsyncLane, Lane, LoopWaker
from ._shared import ABORT_GRACE
from ._steps import FENCE_WAIT, FENCED, PAUSE, Outcome, Steps
from ._types import AsyncListener, ConsumeResult, MessageExt
from ._watchdog import LoopWatchdog

__all__ = ["AsyncExecutor", "LoopThread", "new_event_loop", "uvloop_available"]

_SUCCESS = ConsumeResult.SUCCESS


def uvloop_available() -> bool:
    """Whether uvloop is installed (``pip install 'lite-push[uvloop]'``)."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def new_event_loop(use_uvloop: bool = True) -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when installed and ``use_uvloop``."""
    if use_uvloop and uvloop_available():
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        return loop
    return asyncio.new_event_loop()


#: What a listener may raise that is not a failed attempt: the process is
#: being stopped.
_FATAL = (KeyboardInterrupt, SystemExit)


def _reraise_if_cancelled(e: BaseException) -> None:
    """A listener's error is a failed attempt (retried like any other),
    except the ``CancelledError`` of this lane's own task being cancelled
    (shutdown): that one goes on up."""
    if isinstance(e, asyncio.CancelledError):
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise e


async def _adrive(steps: Steps, listener: AsyncListener, worker: LaneWorker) -> None:
    """Await the listener for each list of messages ``steps`` yields and
    send it the outcome."""
    lm = worker.metrics
    gate = worker.gate
    lane = worker.lane
    mono = worker.monotonic
    try:
        chunk = next(steps)
        while True:
            if chunk is FENCED:  # the queue's ownership is not certain now
                await asyncio.sleep(FENCE_WAIT)
                chunk = steps.send((None, None))
                continue
            if chunk is PAUSE:  # max_rate: this call starts later (not before: timers may fire early)
                while (left := gate.pause_until - gate.monotonic()) > 0.0:
                    await asyncio.sleep(left)
                chunk = steps.send((None, None))
                continue
            t0 = clock()
            lane.call = (chunk, mono())
            try:
                outcome: Outcome = (None, await listener(chunk))
            except _FATAL:
                raise
            except BaseException as e:
                _reraise_if_cancelled(e)
                outcome = (e, None)
            lane.call = None
            if lane.moving:  # a stealer moved what came after this call
                lane.settle()
            if lm is not None:
                lm.call(t0, len(chunk))
            chunk = steps.send(outcome)
    except StopIteration:
        pass


def _count(segments: list[tuple[Any, list[MessageExt]]]) -> int:
    """Messages in ``segments``."""
    n = 0
    for _, msgs in segments:
        n += len(msgs)
    return n


def _live(segments: list[tuple[Any, list[MessageExt]]]) -> bool:
    """Whether any segment is of a queue still owned (else the lane only
    skips them, which needs no slot)."""
    for pq, _ in segments:
        if not pq.dropped:
            return True
    return False


async def run_async_lane(
    lane: AsyncLane, worker: LaneWorker, listener: AsyncListener, admission: Admission | None = None
) -> None:
    """A lane coroutine's body: ``_thread_executor.run_lane``, awaiting.

    The hot path (a segment with no key parked in the lane nor held, ``batch_size``
    1, its queue neither dropped nor the shutdown deadline passed) is inlined
    here, and so is the choice of it: with a thousand lanes most segments
    hold one or two messages, so every call per segment shows in the cost
    per message.  With ``admission``, the lane holds a slot while it has
    work.
    """
    lm = worker.metrics
    mono = worker.monotonic
    success = _SUCCESS
    take = lane.take_nowait
    parked = worker.parked
    held_keys = worker.held  # dead_letter_order="key": its keys are replaced whole, read per segment
    hot = worker.hot
    aborted = worker.aborted
    held = -1.0  # since when this lane holds an admission slot (-1: none)
    try:
        while True:
            taken = take()
            if not isinstance(taken, tuple):
                if held >= 0:
                    held = -1.0
                    admission.leave()  # type: ignore[union-attr]
                if taken is None:  # closed and empty
                    return
                worker.idle()
                await taken  # resolved by the next put (or close)
                continue
            if admission is not None:
                if held >= 0 and admission.must_yield(mono() - held):
                    held = -1.0
                    admission.leave()  # over the limit, or held long: queue again
                if held < 0 and (taken[1] or (not aborted() and _live(taken[0]))):
                    worker.busy()
                    await admission.admitted(_count(taken[0]) + lane.depth)
                    held = mono()
                    more = lane.take_queued()  # what came meanwhile: one pass over all of it
                    if more is not None:
                        taken = (taken[0] + more[0], taken[1] + more[1])
            segments, due = worker.took(taken, lane.taken)
            if due:
                await _adrive(worker.due_steps(due), listener, worker)
            for pq, msgs in segments:
                if parked or not hot or held_keys.keys or pq.dropped or aborted():
                    steps = worker.segment_steps(pq, msgs)
                    if steps is not None:
                        await _adrive(steps, listener, worker)
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
                    call = [msg]
                    lane.call = (call, now)
                    try:
                        result = await listener(call)
                    except _FATAL:
                        raise
                    except BaseException as e:
                        _reraise_if_cancelled(e)
                        exc = e
                    lane.call = None
                    if lane.moving:  # a stealer took what came before and after this call
                        j -= lane.settle()
                    if exc is not None or (result is not None and result is not success):
                        break
                    j += 1
                if admission is not None:
                    admission.calls += j
                if j == len(msgs):  # all succeeded (outside the try: a lane bug is not a listener failure)
                    worker.completed(pq, msgs, t0)
                    continue
                await _adrive(worker.failed_at(pq, msgs, j, exc, result), listener, worker)
    except Exception as e:
        worker.crashed(e)
    finally:
        if held >= 0:
            admission.leave()  # type: ignore[union-attr]
        worker.stop()


#: The lane code the watchdog recognises on the loop thread's stack.
_LANE_FUNCTIONS = frozenset({run_async_lane.__name__, _adrive.__name__})


class AsyncExecutor:
    """Lanes drained by coroutines on one event loop."""

    def __init__(self, group: str, listener: AsyncListener, block_threshold: float, turn_target: float = 0.0) -> None:
        self._group = group
        self._turn_target = turn_target
        self._listener = listener
        self._waker = LoopWaker()
        self._tasks: list[asyncio.Task[None]] = []
        self._done = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.watchdog = LoopWatchdog(group, block_threshold, __file__, _LANE_FUNCTIONS)
        #: Lanes' slots in listener calls (``None``: no admission; set by ``start``).
        self.admission: Admission | None = None

    def make_lanes(self, n: int, wake: Callable[[], None]) -> list[Lane]:
        """The lanes this executor drains."""
        return [AsyncLane(i, wake, self._waker) for i in range(n)]

    def flush(self) -> None:
        """After a dispatch (pull thread): wake the lanes it filled, with one
        call into the loop."""
        self._waker.flush()

    def start(self, lanes: list[tuple[Lane, LaneWorker]]) -> None:
        """Start the lane coroutines and the watchdog on the running loop
        (call on the loop's thread)."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._waker.loop = loop
        self._waker.thread = threading.get_ident()
        admission = self.admission = Admission(len(lanes), loop, self._turn_target) if self._turn_target else None
        if admission is not None:
            admission.start()
        self._tasks = [
            loop.create_task(
                run_async_lane(lane, worker, self._listener, admission),  # type: ignore[arg-type]
                name=f"lite-push-lane-{self._group}-{lane.index}",
            )
            for lane, worker in lanes
        ]
        done = asyncio.gather(*self._tasks, return_exceptions=True)
        done.add_done_callback(lambda _f: self._done.set())
        self.watchdog.start(loop)

    def lanes_alive(self) -> bool:
        """Whether every lane's task still runs (before start: none to run)."""
        return not any(t.done() for t in self._tasks)

    def join(self, deadline: float, final: bool = False) -> bool:
        """(pull thread) Wait until ``deadline`` (``time.monotonic``) for
        the lane coroutines to exit.  ``final``: past the grace, cancel the
        listener calls still running; their messages stay unfinished
        (uncommitted) and are delivered again."""
        done = self._done.wait(max(0.0, deadline - time.monotonic()))
        loop = self._loop
        if not done and final and loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._cancel)
            except RuntimeError:
                pass
            self._done.wait(ABORT_GRACE)
        return done

    def _cancel(self) -> None:
        for t in self._tasks:
            t.cancel()

    def lane_limit(self) -> int | None:
        """(any thread) How many lanes admission lets into listener calls
        at once now; ``None`` without admission (or before ``start``)."""
        admission = self.admission
        return None if admission is None else admission.limit

    def close(self) -> None:
        """The consumer stopped: stop the watchdog and the admission probe."""
        self.watchdog.close()
        if self.admission is not None:
            self.admission.close()


class LoopThread:
    """An event loop of the consumer's own, running on a thread of its own
    (uvloop when installed): lets a synchronous application use an
    ``async def`` listener."""

    def __init__(self, name: str) -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        """Run ``coro`` on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Let the loop finish what is scheduled now, stop it, close it."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()
