"""The asyncio executor: lanes as coroutines on one event loop.

``ConsumerConfig(executor="asyncio")`` with an ``async def`` listener.  What
differs from the thread executor is only who drains the lanes:

* The **pull thread** is the same thread as before (poll, track, route,
  flow control, timers, commits), off the event loop.  It hands work over in
  batches: a dispatch puts segments into the lanes it routed to, and the
  lanes that were waiting are woken with **one** ``call_soon_threadsafe`` per
  dispatch (``LoopWaker``), not one per lane or message.
* One **lane coroutine** per lane (``AsyncLane``) takes everything queued in
  its lane and awaits the listener message by message (``batch_size`` at a
  time), exactly as a lane thread does: the same routing, the same parking of
  failed keys on the same retry timer, the same hand-off of dead letters and
  send-backs to the pull thread, the same completion of offsets.  So a key's
  messages never run concurrently and run in offset order, and commits never
  pass an unfinished message.
* A **watchdog thread** notices when the loop stops turning (a listener that
  blocks instead of awaiting) for longer than ``loop_block_threshold`` while
  the rest of the process runs (a stall of the whole process, say a VM pause
  or a long GC, is not blamed on a listener), and,
  when it turns again, logs how long it was blocked and where (the loop
  thread's stack, sampled while it was blocked, and the message the lane was
  on).  Nothing is added to the hot path: the loop only re-arms a timer every
  quarter threshold.

Use ``await consumer.start()`` / ``await consumer.shutdown()`` (or ``async
with consumer:``) inside an application's loop, or ``consumer.run()`` to run
stand-alone on uvloop (when installed) until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Generator, Hashable
from types import FrameType, TracebackType
from typing import Any, cast

from ._config import ConsumerConfig
from ._consumer import ABORT_GRACE, LitePushConsumer, Listener
from ._errors import ConfigError, LitePushError
from ._failures import Parked
from ._lanemetrics import clock
from ._lanes import AsyncLane
from ._process_queue import ProcessQueue
from ._types import ConsumeResult, MessageExt

__all__ = ["AsyncLitePushConsumer", "uvloop_available"]

logger = logging.getLogger("lite_push._consumer")

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def uvloop_available() -> bool:
    """Whether uvloop is installed (``pip install 'lite-push[uvloop]'``)."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


class AsyncLitePushConsumer(LitePushConsumer):
    """A :class:`LitePushConsumer` whose lanes are coroutines.

    ``LitePushConsumer(ConsumerConfig(executor="asyncio"), ...)`` returns one
    of these.  The listener is an ``async def`` taking a list of up to
    ``batch_size`` messages; returning ``None`` or ``SUCCESS`` marks them
    done, raising or returning ``RETRY_LATER`` retries them, exactly as with
    the thread executor.  A listener should await its I/O: one that blocks
    the loop blocks every lane (and is logged, see ``loop_block_threshold``).
    """

    def __init__(
        self, config: ConsumerConfig, source: Any, listener: Listener, *, clock: Any = None, registry: Any = None
    ) -> None:
        if isinstance(config, ConsumerConfig) and config.executor != "asyncio":
            raise ConfigError("executor", f"AsyncLitePushConsumer needs executor='asyncio', got {config.executor!r}")
        super().__init__(config, source, listener, clock=clock, registry=registry)
        self._alisteners = cast(Any, listener)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._lanes_done = threading.Event()
        self._tick = 0.0
        self._tick_handle: asyncio.TimerHandle | None = None
        self._loop_thread_id = 0
        self._watch_stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        #: Longest loop block seen, in seconds (tests, diagnostics).
        self.longest_block = 0.0

    # -- lifecycle --------------------------------------------------------------

    async def start(self) -> None:  # type: ignore[override]
        """Start the lane coroutines on the running loop, the watchdog and
        the pull thread.  Only once."""
        if self._started:
            raise LitePushError("consumer already started")
        if not self._subscriptions:
            raise LitePushError("subscribe() to at least one topic before start()")
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._waker.loop = loop
        self._loop_thread_id = threading.get_ident()
        self._start_metrics()
        self._started = True
        group = self.config.group
        self._tasks = [
            loop.create_task(self._alane_loop(cast(AsyncLane, lane)), name=f"lite-push-lane-{group}-{lane.index}")
            for lane in self._lanes
        ]
        done = asyncio.gather(*self._tasks, return_exceptions=True)
        done.add_done_callback(lambda _f: self._lanes_done.set())
        self._arm_tick()
        self._watchdog = threading.Thread(target=self._watch, name=f"lite-push-loop-watch-{group}", daemon=True)
        self._watchdog.start()
        self._pull_thread = threading.Thread(target=self._pull_loop, name=f"lite-push-pull-{group}", daemon=True)
        self._pull_thread.start()
        logger.info(
            "lite_push consumer %r started: mode=%s executor=asyncio lanes=%d loop=%s",
            group, self.config.mode.name, self.config.lanes, type(loop).__module__,
        )  # fmt: skip

    async def shutdown(self, timeout: float = 10.0) -> bool:  # type: ignore[override]
        """Stop polling, let the lanes finish what they hold (at most
        ``timeout`` seconds; the loop keeps running them meanwhile), commit,
        close the source.  Returns whether everything queued was processed
        in time.  Idempotent."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(None, LitePushConsumer.shutdown, self, timeout)
        finally:
            self._watch_stop.set()
            if self._tick_handle is not None:
                self._tick_handle.cancel()
                self._tick_handle = None

    def run(self, until: Awaitable[object] | None = None, *, use_uvloop: bool = True) -> None:
        """Run stand-alone: a new event loop (uvloop when installed and
        ``use_uvloop``), :meth:`start`, then wait for ``until`` or, without
        it, for SIGINT/SIGTERM; then :meth:`shutdown` (drain, commit)."""

        async def main() -> None:
            await self.start()
            try:
                if until is not None:
                    await until
                else:
                    stop = asyncio.Event()
                    loop = asyncio.get_running_loop()
                    for sig in (signal.SIGINT, signal.SIGTERM):
                        loop.add_signal_handler(sig, stop.set)
                    await stop.wait()
            finally:
                await self.shutdown()

        if use_uvloop and uvloop_available():
            import uvloop

            uvloop.run(main())
        else:
            asyncio.run(main())

    async def __aenter__(self) -> AsyncLitePushConsumer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.shutdown()

    def __enter__(self) -> AsyncLitePushConsumer:
        raise LitePushError("the asyncio executor runs on an event loop: use `async with consumer:` or consumer.run()")

    def _join_lanes(self, deadline: float, final: bool = False) -> bool:
        # pull thread (shutdown): wait for the lane coroutines to exit
        done = self._lanes_done.wait(max(0.0, deadline - time.monotonic()))
        if not done and final and self._loop is not None and not self._loop.is_closed():
            # past the grace: cancel the listener calls still running; their
            # messages stay unfinished (uncommitted) and are delivered again
            try:
                self._loop.call_soon_threadsafe(lambda: [t.cancel() for t in self._tasks])
            except RuntimeError:
                pass
            self._lanes_done.wait(ABORT_GRACE)
        return done

    # -- loop-block watchdog ----------------------------------------------------

    def _arm_tick(self) -> None:
        assert self._loop is not None
        self._tick = time.monotonic()
        self._tick_handle = self._loop.call_later(self.config.loop_block_threshold / 4, self._arm_tick)

    def _watch(self) -> None:
        threshold = self.config.loop_block_threshold
        interval = threshold / 4
        since: float | None = None
        where: str | None = None
        last = time.monotonic()
        while not self._watch_stop.wait(interval):
            now = time.monotonic()
            if now - last > threshold + interval:
                # This thread did not run either: the whole process stalled
                # (the machine, the cyclic GC, C code holding the GIL), not
                # the loop alone; blame no listener for it.
                logger.debug("consumer %r: the process stalled for %.0f ms", self.config.group, (now - last) * 1000)
                since = None
                where = None
                last = now
                continue
            last = now
            tick = self._tick
            if now - tick > threshold + interval:
                if since is None:
                    since = tick
                if where is None:  # blocked now: see where, while it still is
                    where = self._where()
            elif since is not None:
                blocked = max(0.0, tick - since - interval)
                if blocked > threshold:
                    if where is not None:
                        self.longest_block = max(self.longest_block, blocked)
                        logger.warning(
                            "consumer %r: a listener blocked the event loop for %.0f ms (threshold %.0f ms)%s",
                            self.config.group, blocked * 1000, threshold * 1000, where,
                        )  # fmt: skip
                    else:  # not in a listener (GIL contention, another callback, start-up)
                        logger.debug(
                            "consumer %r: the event loop did not turn for %.0f ms, not in a listener",
                            self.config.group, blocked * 1000,
                        )  # fmt: skip
                since = None
                where = None

    def _where(self) -> str | None:
        """Where the loop thread is, if it is in a listener call (None
        otherwise): the innermost frames and the message."""
        frame: FrameType | None = sys._current_frames().get(self._loop_thread_id)
        if frame is None:
            return None
        # In a listener call iff, inside the lane's frame, some frame runs
        # code outside lite_push (the listener's own, or what it calls).
        msg = None
        inside = False
        f: FrameType | None = frame
        while f is not None:
            if f.f_code.co_name in ("_alane_loop", "_adrive") and f.f_code.co_filename == __file__:
                msg = f.f_locals.get("msg") or (f.f_locals.get("chunk") or [None])[0]
                break
            if not f.f_code.co_filename.startswith(_PACKAGE_DIR):
                inside = True
            f = f.f_back
        if f is None or not inside:
            return None
        stack = traceback.extract_stack(frame)
        own = [s for s in stack if not s.filename.startswith(_PACKAGE_DIR) and "asyncio" not in s.filename]
        inner = own[-3:] if own else stack[-3:]
        text = "; ".join(f"{s.name} ({s.filename}:{s.lineno})" for s in reversed(inner))
        on = ""
        if isinstance(msg, MessageExt):
            on = f" on {msg.topic}#{msg.queue_id} offset {msg.queue_offset} key {msg.keys!r}"
        return f"{on}, in {text}"

    # -- lanes ------------------------------------------------------------------

    async def _alane_loop(self, lane: AsyncLane) -> None:
        """``LitePushConsumer._lane_loop``, awaiting the listener.

        The hot path (nothing parked, ``batch_size`` 1: one listener call
        per message) is inlined here rather than awaited as a coroutine per
        segment: with a thousand lanes most segments hold one or two
        messages, and a coroutine per segment was a measurable share of the
        per-message cost.  It is ``LitePushConsumer._consume`` line for line."""
        idx = lane.index
        abort = self._abort
        batch_size = self.config.batch_size
        listener = self._alisteners
        success = ConsumeResult.SUCCESS
        consumed = self._consumed
        busy = self._busy
        lm = self._lane_metrics[idx] if self._lane_metrics is not None else None
        perf = clock
        parked: dict[Hashable, Parked] = {}
        try:
            while True:
                busy[idx] = False
                taken = await lane.take()
                if taken is None:
                    return
                busy[idx] = True
                segments, due = taken
                if lm is not None and lane.taken:
                    lm.waited(lane.taken)
                if due:
                    await self._arun_due(idx, parked, due)
                for pq, msgs in segments:
                    if pq.dropped or abort.is_set():
                        pq.skip(msgs)
                        continue
                    if parked or batch_size != 1:
                        await self._aconsume_slow(idx, parked, pq, msgs)
                        continue
                    t0 = perf() if lm is not None else 0.0
                    j = 0
                    exc: BaseException | None = None
                    result: object = None
                    try:
                        for msg in msgs:
                            result = await listener([msg])
                            if result is not None and result is not success:
                                break
                            j += 1
                        else:
                            pq.complete(msgs)
                            consumed[idx] += len(msgs)
                            if lm is not None:
                                lm.segment(t0, msgs)
                            continue
                    except Exception as e:
                        exc = e
                    rest = self._consume_failed(idx, parked, pq, msgs, j, exc, result)
                    if rest:
                        await self._aconsume_slow(idx, parked, pq, rest)
        except Exception:  # a bug in the lane itself: its messages stay unfinished
            logger.exception("consumer %r: lane %d failed", self.config.group, idx)
        finally:
            busy[idx] = False
            self._leave_parked(idx, parked)

    async def _aconsume_slow(
        self, idx: int, parked: dict[Hashable, Parked], pq: ProcessQueue, msgs: list[MessageExt]
    ) -> None:
        """``LitePushConsumer._consume_slow``, awaiting the listener."""
        await self._adrive(idx, self._slow_steps(idx, parked, pq, msgs))

    async def _arun_due(self, idx: int, parked: dict[Hashable, Parked], due: list[object]) -> None:
        """``LitePushConsumer._run_due``, awaiting the listener."""
        await self._adrive(idx, self._due_steps(idx, parked, due))

    async def _adrive(
        self, idx: int, steps: Generator[list[MessageExt], tuple[BaseException | None, object], None]
    ) -> None:
        """Await the listener for each list of messages ``steps`` yields
        and send it the outcome (see ``LitePushConsumer._slow_steps``)."""
        listener = self._alisteners
        lm = self._lane_metrics[idx] if self._lane_metrics is not None else None
        try:
            chunk = next(steps)
            while True:
                t0 = clock()
                try:
                    outcome: tuple[BaseException | None, object] = (None, await listener(chunk))
                except Exception as e:
                    outcome = (e, None)
                if lm is not None:
                    lm.call(t0, len(chunk))
                chunk = steps.send(outcome)
        except StopIteration:
            pass
