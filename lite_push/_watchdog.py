"""The loop watchdog: notices a listener that blocks the event loop.

With the asyncio executor every lane is a coroutine on one loop, so a
listener that blocks instead of awaiting stops every lane.  A watchdog
thread notices when the loop stops turning for longer than
``loop_block_threshold`` while the rest of the process runs and, when it
turns again, logs how long it was blocked and where: the loop thread's stack,
sampled while it was blocked, and the message the lane was on.  A stall of the
whole process (a VM pause, a long GC: this thread did not run either) is not
blamed on a listener, and neither is a block outside a listener call.

Nothing is added to the hot path: the loop only re-arms a timer every
quarter threshold (:meth:`LoopWatchdog.tick`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import traceback
from types import FrameType

from ._types import MessageExt

__all__ = ["LoopWatchdog"]

logger = logging.getLogger(__name__)

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class LoopWatchdog:
    """Watches one event loop on behalf of consumer ``group``.

    ``lane_file`` and ``lane_functions`` name the code of a lane task: a
    block counts as a listener's when the loop thread is inside such a frame
    and, below it, in code outside lite_push.  ``stop`` ends the watch (an
    event the tests may replace to simulate a stalled process)."""

    def __init__(self, group: str, threshold: float, lane_file: str, lane_functions: frozenset[str]) -> None:
        self.group = group
        self.threshold = threshold
        self._lane_file = lane_file
        self._lane_functions = lane_functions
        self.stop = threading.Event()
        #: Longest listener block seen, in seconds (tests, diagnostics).
        self.longest_block = 0.0
        self._tick = 0.0
        self._tick_handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id = 0
        self._thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start watching ``loop`` (call on the loop's thread)."""
        self._loop = loop
        self._loop_thread_id = threading.get_ident()
        self.tick()
        self._thread = threading.Thread(target=self._watch, name=f"lite-push-loop-watch-{self.group}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop watching (any thread)."""
        self.stop.set()
        handle = self._tick_handle
        self._tick_handle = None
        if handle is not None:
            loop = self._loop
            if loop is not None and not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(handle.cancel)
                except RuntimeError:  # closed meanwhile
                    pass

    def tick(self) -> None:
        """(loop thread) The loop turned: note when, and re-arm."""
        assert self._loop is not None
        self._tick = time.monotonic()
        if not self.stop.is_set():
            self._tick_handle = self._loop.call_later(self.threshold / 4, self.tick)

    def _watch(self) -> None:
        threshold = self.threshold
        interval = threshold / 4
        since: float | None = None
        where: str | None = None
        last = time.monotonic()
        while not self.stop.wait(interval):
            now = time.monotonic()
            if now - last > threshold + interval:
                # This thread did not run either: the whole process stalled
                # (the machine, the cyclic GC, C code holding the GIL), not
                # the loop alone; blame no listener for it.
                logger.debug("consumer %r: the process stalled for %.0f ms", self.group, (now - last) * 1000)
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
                self._report(max(0.0, tick - since - interval), where)
                since = None
                where = None

    def _report(self, blocked: float, where: str | None) -> None:
        if blocked <= self.threshold:
            return
        if where is not None:
            self.longest_block = max(self.longest_block, blocked)
            logger.warning(
                "consumer %r: a listener blocked the event loop for %.0f ms (threshold %.0f ms)%s",
                self.group, blocked * 1000, self.threshold * 1000, where,
            )  # fmt: skip
        else:  # not in a listener (GIL contention, another callback, start-up)
            logger.debug(
                "consumer %r: the event loop did not turn for %.0f ms, not in a listener", self.group, blocked * 1000
            )

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
            code = f.f_code
            if code.co_name in self._lane_functions and code.co_filename == self._lane_file:
                msg = f.f_locals.get("msg") or (f.f_locals.get("chunk") or [None])[0]
                break
            if not code.co_filename.startswith(_PACKAGE_DIR):
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
