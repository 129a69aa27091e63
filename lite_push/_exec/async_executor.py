"""The asyncio executor: lanes as coroutines on one event loop.

What differs from the thread executor is only how a lane waits and how the
listener is called:

* The pull side is a task on the same loop (``PullLoop.run_on_loop``): a
  dispatch puts segments into the lanes it routed to, and the lanes that
  had no task get one, all at once per dispatch
  (:class:`~lite_push._lanes.lanes.LoopWaker`, flushed by the pull side; from
  its helper thread, during a rebalance or at shutdown, with one
  ``call_soon_threadsafe``).
* A lane's task runs while the lane has work: it takes everything queued
  in its lane and runs it through its
  :class:`~lite_push._lanes.worker.LaneWorker`, awaiting the listener: the
  same routing, parking, hand-off and completion as a lane thread; when
  its lane is empty it ends (the next put starts another), so an idle lane
  costs no coroutine, future or task.  The hot path (one call per message)
  is inlined in the lane coroutine rather than awaited as a coroutine per
  segment: with a thousand lanes most segments hold one or two messages,
  and a coroutine per segment was a measurable share of the per-message
  cost.  A busy lane takes without a coroutine or a future
  (:meth:`~lite_push._lanes.lanes.AsyncLane.take_nowait`).
* :class:`Admission`: when the loop cannot turn over every lane with work
  within ``loop_turn_target``, only as many lanes as it can are in listener
  calls at once (the ones with the most work first), and KEY_ORDERLY places
  new keys on that many lanes once keys outnumber lanes (before, each key
  has a lane of its own).  The same throughput, a shorter turn: each
  key's next message waits less, so the busiest keys no longer finish long
  after the rest.
* A :class:`~lite_push._exec.watchdog.LoopWatchdog` logs a listener that blocks
  the loop.

The loop is the application's (``AsyncLitePushConsumer``) or one of the
consumer's own on a thread of its own (:class:`LoopThread`, for
``LitePushConsumer`` with an ``async def`` listener).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from .._kernels.lanemetrics import clock
from .._lanes.lanes import AsyncLane, Lane, LoopWaker
from .._lanes.steps import FENCE_WAIT, FENCED, PAUSE, Outcome, Steps
from .._lanes.worker import LaneWorker
from .._state.shared import ABORT_GRACE
from .._types import AsyncListener, ConsumeResult, MessageExt
from .admission import Admission
from .watchdog import LoopWatchdog

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


async def _adrive(steps: Steps, listener: AsyncListener, worker: LaneWorker, waker: LoopWaker) -> None:
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
                while (left := gate.pause_until - gate.monotonic()) > 0.0 and not gate.aborted():
                    await _pause(waker.stopping, left)
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


async def _pause(stopping: asyncio.Event | None, seconds: float) -> None:
    """``max_rate``'s wait before a call: ``seconds``, or until the consumer
    stops (a stop does not wait for calls that have not started)."""
    if stopping is None:
        await asyncio.sleep(seconds)
        return
    try:
        async with asyncio.timeout(seconds):
            await stopping.wait()
    except TimeoutError:
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
    """A lane task's body: ``_exec.thread_executor.run_lane``, awaiting, until
    the lane is empty (:meth:`~lite_push._lanes.lanes.AsyncLane.take_nowait`
    returns ``None``).

    The hot path (a segment with no key parked in the lane nor held, ``batch_size``
    1, its queue neither dropped nor the shutdown deadline passed) is inlined
    here, and so is the choice of it: with a thousand lanes most segments
    hold one or two messages, so every call per segment shows in the cost
    per message.  A segment of one message is itself the call's list.  With
    ``admission``, the lane holds a slot while it has work.  Why the hot
    loop is written twice (here and in ``thread_executor.run_lane``), with
    its cost measured: ``run_lane``'s docstring.
    """
    lm = worker.metrics
    mono = worker.monotonic
    success = _SUCCESS
    take = lane.take_nowait
    parked = worker.parked
    held_keys = worker.held  # dead_letter_order="key": its keys are replaced whole, read per segment
    hot = worker.hot
    aborted = worker.aborted
    slot_since = -1.0  # since when this lane holds an admission slot (-1: none)
    try:
        while True:
            taken = take()
            if taken is None:  # idle: the next put starts another task
                return
            if admission is not None:
                if slot_since >= 0 and admission.must_yield(mono() - slot_since):
                    slot_since = -1.0
                    admission.leave()  # over the limit, or had it long: queue again
                if slot_since < 0 and (taken[1] or (not aborted() and _live(taken[0]))):
                    worker.busy()
                    await admission.admitted(_count(taken[0]) + lane.depth)
                    slot_since = mono()
                    more = lane.take_queued()  # what came meanwhile: one pass over all of it
                    if more is not None:
                        taken = (taken[0] + more[0], taken[1] + more[1])
            segments, due = worker.took(taken, lane.taken)
            if due:
                await _adrive(worker.due_steps(due), listener, worker, lane.waker)
            for pq, msgs in segments:
                if parked or not hot or held_keys.keys or pq.dropped or aborted():
                    steps = worker.segment_steps(pq, msgs)
                    if steps is not None:
                        await _adrive(steps, listener, worker, lane.waker)
                        continue
                # The hot path: one listener call per message, inline,
                # each shown in lane.call while it runs.
                t0 = clock() if lm is not None else 0.0
                j = 0
                exc: BaseException | None = None
                result: object = None
                lane.seg = msgs
                lane.done = None
                single = len(msgs) == 1
                for msg in msgs:
                    now = mono()
                    if now >= pq.owned_until:  # fenced: not certain the queue is ours
                        break
                    call = msgs if single else [msg]
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
                await _adrive(worker.failed_at(pq, msgs, j, exc, result), listener, worker, lane.waker)
    except Exception as e:
        worker.crashed(e)
    finally:
        if slot_since >= 0:
            admission.leave()  # type: ignore[union-attr]
        worker.idle()


#: The lane code the watchdog recognises on the loop thread's stack.
_LANE_FUNCTIONS = frozenset({run_async_lane.__name__, _adrive.__name__})


class AsyncExecutor:
    """Lanes drained by coroutines on one event loop, each while its lane
    has work."""

    def __init__(
        self, group: str, *, listener: AsyncListener, block_threshold: float, turn_target: float = 0.0
    ) -> None:
        self._group = group
        self._turn_target = turn_target
        self._listener = listener
        self._waker = LoopWaker()
        #: Each lane's worker, by lane index (set by ``start``).
        self._workers: list[LaneWorker] = []
        #: The lanes' tasks running now (loop thread).
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._crashed = False
        self.watchdog = LoopWatchdog(
            group, threshold=block_threshold, lane_file=__file__, lane_functions=_LANE_FUNCTIONS
        )
        #: Lanes' slots in listener calls (``None``: no admission; set by ``start``).
        self.admission: Admission | None = None

    def make_lanes(self, n: int, wake: Callable[[], None]) -> list[Lane]:
        """The lanes this executor drains."""
        return [AsyncLane(i, wake=wake, waker=self._waker) for i in range(n)]

    def flush(self) -> None:
        """After a dispatch (the pull side): start the tasks of the lanes it
        gave work to that had none."""
        self._waker.flush()

    def start(self, lanes: list[tuple[Lane, LaneWorker]]) -> None:
        """Get ready to run lanes on the running loop (call on the loop's
        thread), and start the watchdog; a lane's task starts with its
        first work."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._workers = [worker for _, worker in lanes]
        waker = self._waker
        waker.loop = loop
        waker.thread = threading.get_ident()
        waker.start = self._start_lanes
        waker.stopping = asyncio.Event()
        admission = self.admission = (
            Admission(len(lanes), loop=loop, target=self._turn_target) if self._turn_target else None
        )
        if admission is not None:
            admission.start()
        self.watchdog.start(loop)

    def _start_lanes(self, lanes: list[AsyncLane]) -> None:
        """(loop thread) A task for each of ``lanes``, which got work while
        they had none."""
        loop = self._loop
        assert loop is not None
        workers = self._workers
        listener = self._listener
        admission = self.admission
        tasks = self._tasks
        group = self._group
        for lane in lanes:
            task = loop.create_task(
                run_async_lane(lane, workers[lane.index], listener, admission),
                name=f"lite-push-lane-{group}-{lane.index}",
            )
            tasks.add(task)
            task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._crashed = True  # run_async_lane catches its own bugs: only a fatal error gets here

    def lanes_alive(self) -> bool:
        """Whether no lane's task ended by an error it could not handle."""
        return not self._crashed

    def join(self, deadline: float, final: bool = False) -> bool:
        """(the pull side's helper thread, lanes closed) Wait until
        ``deadline`` (``time.monotonic``) for every lane task to end, and
        return whether they did.  ``final``: past the grace, cancel the
        listener calls still running; their messages stay unfinished
        (uncommitted) and are delivered again.  Then each worker lets go of
        what it still holds (parked keys: unfinished)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return True
        done = self._wait(loop, self._drained(), deadline - time.monotonic())
        if not done and final:
            self._wait(loop, self._cancel(), ABORT_GRACE)
        if done or final:
            self._wait(loop, self._stop_workers(), ABORT_GRACE)
        return done

    @staticmethod
    def _wait(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None], timeout: float) -> bool:
        """Run ``coro`` on ``loop`` (from another thread); whether it ended
        within ``timeout`` seconds."""
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError:  # the loop closed: nothing runs on it any more
            coro.close()
            return True
        try:
            fut.result(max(0.0, timeout))
        except concurrent.futures.TimeoutError:
            fut.cancel()
            return False
        except concurrent.futures.CancelledError:
            return True
        return True

    async def _drained(self) -> None:
        """Until no lane task runs (the starts scheduled before this ran
        first: ``call_soon_threadsafe`` keeps its order)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def _cancel(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await self._drained()

    async def _stop_workers(self) -> None:
        for worker in self._workers:
            worker.stop()

    def stop_waits(self) -> None:
        """(any thread) The consumer stops: lanes waiting for their turn
        under ``max_rate`` stop waiting (they start no more calls)."""
        loop, stopping = self._loop, self._waker.stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stopping.set)
            except RuntimeError:  # closed meanwhile: nothing waits on it any more
                pass

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
