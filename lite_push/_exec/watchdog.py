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

Each blocking episode is reported once, on its own:

* The watch thread looks every quarter threshold.  When the loop has not
  turned for more than the threshold, an episode starts: the thread samples
  where the loop thread is and queues a probe on the loop
  (``call_soon_threadsafe``), which stamps the first turn after the block.
  The re-armed timer alone is not enough: when the block ends, the lane's
  next step may already be queued ahead of the timer, and a second block
  right after the first would run before the loop is seen to turn, merging
  the two.
* While the loop stays blocked, every look samples again: when the loop
  thread is in another listener call (another message: a listener that
  never awaits, or two lanes one after the other), the first episode ends
  there and the next one starts.
* Closing wakes the thread for a last look and waits for it, so a block
  just before a shutdown is reported before the shutdown returns.

A block's duration is measured from the loop's last turn before it, less
the timer's period (the block started within that period): it is never
overstated, and may be understated by up to a quarter threshold, so a block
that barely passes the threshold may be judged under it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from .._types import MessageExt

__all__ = ["CLOSE_WAIT", "LoopWatchdog"]

logger = logging.getLogger(__name__)

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep

#: Longest wait of :meth:`LoopWatchdog.close` for the watch thread's last
#: look (seconds); it takes a few microseconds unless the process stalls.
CLOSE_WAIT = 1.0


@dataclass(slots=True)
class _Episode:
    """A block of the loop under way, as the watch thread saw it."""

    #: The loop's turn count when it was last seen turning before the block.
    turns: int
    #: When the block is taken to have started, for its duration (which
    #: is the end less this, less a timer period): the loop's last turn
    #: before it, or, for a listener call that followed another with no
    #: turn between, a timer period before the look that first saw it.
    since: float
    #: The last look that saw the loop still blocked by this episode.
    seen: float
    #: Which listener call the loop thread was in (the message or its list),
    #: ``None`` outside a listener.
    call: object
    #: The sampled stack and message, ``None`` outside a listener.
    where: str | None


class LoopWatchdog:
    """Watches one event loop on behalf of consumer ``group``.

    ``lane_file`` and ``lane_functions`` name the code of a lane task: a
    block counts as a listener's when the loop thread is inside such a frame
    and, below it, in code outside lite_push.  ``stop`` ends the watch (an
    event the tests may replace to simulate a stalled process).  ``clock``
    reads the time (``time.monotonic``)."""

    def __init__(
        self,
        group: str,
        *,
        threshold: float,
        lane_file: str,
        lane_functions: frozenset[str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.group = group
        self.threshold = threshold
        self._lane_file = lane_file
        self._lane_functions = lane_functions
        self._clock = clock
        self.stop = threading.Event()
        #: Longest listener block seen, in seconds (tests, diagnostics).
        self.longest_block = 0.0
        #: Listener blocks reported (tests, diagnostics).
        self.blocks = 0
        #: ``(turns, when)``: how many times the loop was seen turning, and
        #: the last time (one tuple, replaced whole: the watch thread reads
        #: both at once without a lock).
        self._turn: tuple[int, float] = (0, 0.0)
        self._tick_handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id = 0
        self._thread: threading.Thread | None = None
        # (watch thread) the episode under way, and the previous look
        self._episode: _Episode | None = None
        self._last_look = 0.0

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start watching ``loop`` (call on the loop's thread)."""
        self._loop = loop
        self._loop_thread_id = threading.get_ident()
        self.tick()
        self._last_look = self._clock()
        self._thread = threading.Thread(target=self._watch, name=f"lite-push-loop-watch-{self.group}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop watching (any thread): the watch thread takes a last look,
        reporting a block that ended (or is still under way) since the one
        before, and ends; this waits for it (at most :data:`CLOSE_WAIT`)."""
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
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(CLOSE_WAIT)

    def tick(self) -> None:
        """(loop thread) The loop turned: note when, and re-arm."""
        assert self._loop is not None
        self._turned()
        if not self.stop.is_set():
            self._tick_handle = self._loop.call_later(self.threshold / 4, self.tick)

    def _turned(self) -> None:
        """(loop thread) The loop turned (the timer, or a probe)."""
        self._turn = (self._turn[0] + 1, self._clock())

    def _watch(self) -> None:
        interval = self.threshold / 4
        while not self.stop.wait(interval):
            self._look()
        self._look(last=True)

    def _look(self, last: bool = False) -> None:
        """(watch thread) Judge the loop now: end the episode under way if
        the loop turned since, or if the loop thread moved on to another
        listener call; start one if the loop has not turned for more than
        the threshold.  ``last``: the watch is closing; an episode still
        under way is reported as it stands."""
        threshold = self.threshold
        interval = threshold / 4
        now = self._clock()
        since_look = now - self._last_look
        self._last_look = now
        stalled = since_look > threshold + interval
        turns, turned_at = self._turn
        ep = self._episode
        if ep is not None and turns != ep.turns:
            # The loop turned again: the episode ended at that turn (if this
            # thread stalled meanwhile, after the last look that saw it:
            # only that much is certain).
            self._episode = None
            self._report(ep, ep.seen if stalled else turned_at)
            ep = None
        if stalled:
            # This thread did not run either: the whole process stalled
            # (the machine, the cyclic GC, C code holding the GIL), not
            # the loop alone; blame no listener for it (an episode under
            # way goes on: it was seen while this thread ran).
            logger.debug("consumer %r: the process stalled for %.0f ms", self.group, since_look * 1000)
            return
        if now - turned_at <= threshold:
            return
        call, where = self._where()
        if ep is None:
            ep = self._episode = _Episode(turns, turned_at, now, call, where)
            self._probe()
        elif call is not ep.call:
            # Still blocked, in another listener call: the one seen before
            # ended after the previous look, this one started before now.
            self._report(ep, ep.seen)
            ep = self._episode = _Episode(turns, now - interval, now, call, where)
        else:
            ep.seen = now
        if last:
            self._episode = None
            self._report(ep, now, " (still blocked as the consumer stopped)")

    def _probe(self) -> None:
        """Queue a stamp of the loop's next turn: it runs right after the
        blocking callback returns, ahead of what that callback queues."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._turned)
        except RuntimeError:  # closed meanwhile
            pass

    def _report(self, ep: _Episode, end: float, note: str = "") -> None:
        blocked = max(0.0, end - ep.since - self.threshold / 4)
        if blocked <= self.threshold:
            return
        if ep.where is not None:
            self.longest_block = max(self.longest_block, blocked)
            self.blocks += 1
            logger.warning(
                "consumer %r: a listener blocked the event loop for %.0f ms (threshold %.0f ms)%s%s",
                self.group,
                blocked * 1000,
                self.threshold * 1000,
                ep.where,
                note,
            )
        else:  # not in a listener (GIL contention, another callback, start-up)
            logger.debug(
                "consumer %r: the event loop did not turn for %.0f ms, not in a listener", self.group, blocked * 1000
            )

    def _where(self) -> tuple[object, str | None]:
        """Which listener call the loop thread is in and where: ``(the
        message or its list, the innermost frames and the message)``, or
        ``(None, None)`` outside a listener call."""
        frame: FrameType | None = sys._current_frames().get(self._loop_thread_id)
        if frame is None:
            return None, None
        # In a listener call iff, inside the lane's frame, some frame runs
        # code outside lite_push (the listener's own, or what it calls).
        msg = None
        call: object = None
        inside = False
        f: FrameType | None = frame
        while f is not None:
            code = f.f_code
            if code.co_name in self._lane_functions and code.co_filename == self._lane_file:
                local = f.f_locals
                msg = local.get("msg") or (local.get("chunk") or [None])[0]
                # one listener call: the lane's record of it (a new tuple per call)
                call = getattr(local.get("lane"), "call", None) or msg
                break
            if not code.co_filename.startswith(_PACKAGE_DIR):
                inside = True
            f = f.f_back
        if f is None or not inside:
            return None, None
        stack = traceback.extract_stack(frame)
        own = [s for s in stack if not s.filename.startswith(_PACKAGE_DIR) and "asyncio" not in s.filename]
        inner = own[-3:] if own else stack[-3:]
        text = "; ".join(f"{s.name} ({s.filename}:{s.lineno})" for s in reversed(inner))
        on = ""
        if isinstance(msg, MessageExt):
            on = f" on {msg.topic}#{msg.queue_id} offset {msg.queue_offset} key {msg.keys!r}"
        return call, f"{on}, in {text}"
