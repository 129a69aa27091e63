"""Lanes: bounded FIFOs of work, each drained by exactly one task.

The pull thread puts one list of *segments* per lane per dispatch (a segment
is the run of one queue's messages routed to that lane), so a hand-off costs
one lock per lane per dispatch, not per message.  The lane's task takes everything
queued at once.  Messages of one key always go to the same lane, and one task
drains it, so they never run concurrently and run in arrival order.

"Bounded" is enforced by flow control, not by blocking the producer: the pull
thread never waits on a lane.  When a put leaves a lane above its capacity the
pull thread pauses the queues that fed it; the lane's task wakes the pull
thread when it has taken the backlog, and the queues resume.

A lane also shows what its task is doing, for the threads that watch it
(``_exec.call_watch``) and move work off it (``_pull.lane_steal``): ``call`` is the
listener call in progress (its messages and when it started, on the
consumer's clock), ``hand`` what the task took and ``seg`` the segment it
is in.  The task writes ``call`` before each call and clears it after; a
stealer that wants to change what the task holds sets ``moving`` first and
then checks that ``call`` is still the same call: the task, which clears
``call`` before it reads ``moving``, then waits for the stealer in
:meth:`Lane.settle` before it goes on (each attribute access is atomic
under the GIL, so one of the two sees the other's write).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from .._kernels.lanemetrics import clock
from .._state.process_queue import ProcessQueue
from .._state.timer import LaneWork
from .._types import MessageExt

__all__ = ["AsyncLane", "Call", "Lane", "LoopWaker", "Segment", "put_all"]

#: The messages of one queue routed to one lane by one poll.
Segment = tuple[ProcessQueue, list[MessageExt]]
#: A listener call in progress: its messages, and when it started (the
#: consumer's clock).
Call = tuple[list[MessageExt], float]

#: What a take hands back as the due keys when none is due (shared, never
#: appended to: one list less per take).
_NO_DUE: list[LaneWork] = []


class Lane:
    """A FIFO of segments with a message count, for one consumer task.

    ``_lock`` guards ``_segments``, ``depth``, ``_waiting`` and ``_closed``.
    The task sleeps on ``_signal``, a lock used as a binary semaphore (held
    while nobody has signalled): a put releases it only when the task said
    it is waiting, so a put to a busy lane costs one uncontended lock and
    no wake-up.  (A ``threading.Condition`` does the same in Python code,
    several times slower on this path.)
    """

    __slots__ = (
        "index",
        "depth",
        "blocked",
        "taken",
        "_lock",
        "_signal",
        "_waiting",
        "_segments",
        "_due",
        "_closed",
        "_wake",
        "_stamps",
        "call",
        "seg",
        "done",
        "hand",
        "moving",
        "cut",
        "stolen_for",
    )

    def __init__(self, index: int, wake: Callable[[], None]) -> None:
        self.index = index
        #: Messages queued and not yet taken.
        self.depth = 0
        #: Set by a put that overfilled the lane; the task clears it and
        #: wakes the pull thread once it took the backlog (under ``_lock``).
        self.blocked = False
        self._lock = threading.Lock()
        self._signal = threading.Lock()
        self._signal.acquire()
        self._waiting = False
        self._segments: list[Segment] = []
        #: Parked keys whose retry is due (or control tokens), from the pull
        #: thread's retry timer.
        self._due: list[LaneWork] = []
        self._closed = False
        self._wake = wake
        #: With metrics on: ``(clock() when put, messages)`` per put
        #: since the last take (``None``: not recorded).
        self._stamps: list[tuple[float, int]] | None = None
        #: The stamps of what the last take took (read by the lane's task).
        self.taken: list[tuple[float, int]] = []
        #: The listener call in progress: ``(messages, started)`` on the
        #: consumer's clock; ``None`` between calls (the task writes it).
        self.call: Call | None = None
        #: The segment's messages the task is going through (``None``: not
        #: in a segment; due keys run before the take's segments).
        self.seg: list[MessageExt] | None = None
        #: The slow path's finished messages of ``seg`` not yet completed
        #: (``None`` on the hot path, where everything before the call
        #: finished).
        self.done: list[MessageExt] | None = None
        #: The segments of the task's last take (it goes through them in order).
        self.hand: list[Segment] = []
        #: A stealer changed, or is changing, what the task holds: the task
        #: calls :meth:`settle` after its call.
        self.moving = False
        #: Messages a stealer took off the front of ``seg`` (finished on the
        #: hot path, so it completed them), for :meth:`settle`.
        self.cut = 0
        #: The call whose waiting work was already moved (``_pull.lane_steal``).
        self.stolen_for: Call | None = None

    def stamp(self) -> None:
        """Record when each put happened (for the lane-wait metric)."""
        self._stamps = []

    @property
    def stamping(self) -> bool:
        """Whether puts are time-stamped (metrics on)."""
        return self._stamps is not None

    def put(self, segments: list[Segment], count: int, capacity: int = 0) -> bool:
        """Append segments holding ``count`` messages.  Never blocks beyond
        the lock.  With ``capacity``: return whether the lane is now above
        it, and if so mark it ``blocked`` (its task wakes the pull thread
        once it took the backlog).  Raises RuntimeError once closed."""
        return bool(put_all([self], [segments], [count], capacity))

    def settle(self) -> int:
        """(the lane's task, after a call, when ``moving`` is set) Wait for
        the stealer to finish; return how many messages it took off the
        front of ``seg`` (the task's index into ``seg`` moves back by that
        many)."""
        with self._lock:
            cut = self.cut
            self.cut = 0
            self.moving = False
            self.stolen_for = None
        return cut

    def while_in_call(self, call: Call, change: Callable[[list[Segment]], list[Segment]]) -> bool:
        """(a stealer) If the task is still in ``call``, keep it there (it
        waits in :meth:`settle` when the call returns) and, under the lane's
        lock, replace what is queued with ``change(queued)``; ``change`` may
        also change ``hand``, ``seg``, ``done`` and ``cut``.  Return whether
        the task was kept."""
        with self._lock:
            if self.call is not call:
                return False
            if not self.moving:
                self.moving = True
                if self.call is not call:  # it returned meanwhile: it settles, or goes on
                    self.moving = False
                    return False
            segments = self._segments = change(self._segments)
            self.depth = sum([len(ms) for _, ms in segments])
            return True

    def put_due(self, keys: list[LaneWork]) -> None:
        """Hand the task parked keys whose retry is due, or ``PURGE`` (pull thread)."""
        with self._lock:
            if self._closed:
                return  # shutting down: parked work is left unfinished
            self._due += keys
            waiting = self._waiting
            self._waiting = False
        if waiting:
            self._notify()

    def _notify(self) -> None:
        """Wake the task, which said it is waiting (once per wait)."""
        self._signal.release()

    def take(self) -> tuple[list[Segment], list[LaneWork]] | None:
        """Block until something is queued; take all of it: ``(segments,
        due_keys)``.  ``None`` once the lane is closed and empty (the task
        should exit)."""
        while True:
            with self._lock:
                if self._segments or self._due:
                    segments, due, wake = self._grab()
                    break
                if self._closed:
                    return None
                self._waiting = True
            self._signal.acquire()  # blocks until a put or close releases it
        if wake:
            self._wake()
        return segments, due

    def _grab(self, more: bool = False) -> tuple[list[Segment], list[LaneWork], bool]:
        """(lock held, something queued) Take everything; also say whether
        a put had overfilled the lane, so the taker wakes the pull thread
        (after releasing the lock).  ``more``: a second take before the
        first was started on (the put stamps add to the first's)."""
        segments = self._segments
        self._segments = []
        due = self._due
        if due:
            self._due = []
        else:
            due = _NO_DUE  # not the lane's own list: a later put_due must not show in it
        self.depth = 0
        if self._stamps is not None:
            if more:
                self.taken += self._stamps
            else:
                self.taken = self._stamps
            self._stamps = []
        wake = self.blocked
        self.blocked = False
        return segments, due, wake

    def drain(self) -> list[Segment]:
        """Remove and return everything queued (used when aborting)."""
        with self._lock:
            segments = self._segments
            self._segments = []
            self._due = []
            self.depth = 0
            return segments

    def close(self) -> None:
        """No more puts; the task exits once it took what is queued."""
        with self._lock:
            self._closed = True
            waiting = self._waiting
            self._waiting = False
        if waiting:
            self._notify()


def put_all(lanes: list[Lane], segments: list[list[Segment] | None], counts: list[int], capacity: int) -> list[int]:
    """A dispatch's puts (pull thread): ``segments[i]`` (``None``: nothing)
    holding ``counts[i]`` messages into ``lanes[i]``, as :meth:`Lane.put`
    would, in one frame (with a thousand lanes a dispatch puts into hundreds
    of them, most with one message).  Returns the lanes left over
    ``capacity`` (each marked ``blocked``)."""
    over: list[int] = []
    now = -1.0
    for i, segs in enumerate(segments):
        if segs is None:
            continue
        lane = lanes[i]
        with lane._lock:
            if lane._closed:
                raise RuntimeError(f"lane {lane.index} is closed")
            lane._segments += segs
            depth = lane.depth = lane.depth + counts[i]
            stamps = lane._stamps
            if stamps is not None:
                if now < 0:
                    now = clock()
                stamps.append((now, counts[i]))
            if 0 < capacity < depth:
                lane.blocked = True
                over.append(i)
            waiting = lane._waiting
            lane._waiting = False
        if waiting:
            lane._notify()
    return over


class AsyncLane(Lane):
    """A lane drained by a coroutine on an event loop (the asyncio executor),
    which runs only while the lane has work: an idle lane has no task, no
    coroutine, no future.

    The pull side's puts are :class:`Lane`'s; only waking differs: a put to
    a lane without a task (``_waiting``, under ``_lock``) records it in
    ``waker``, and :meth:`LoopWaker.flush`, once per dispatch, starts a task
    for each (at once on the loop's thread, else with one
    ``call_soon_threadsafe``).  The task takes until the lane is empty
    (:meth:`take_nowait` returns ``None`` and marks it idle under the lock,
    so a later put starts the next task) and ends.
    """

    __slots__ = ("waker",)

    def __init__(self, index: int, *, wake: Callable[[], None], waker: LoopWaker) -> None:
        super().__init__(index, wake)
        self.waker = waker
        self._waiting = True  # no task yet: the first put starts one

    def _notify(self) -> None:
        self.waker.add(self)  # its task starts at the next flush

    def take_nowait(self) -> tuple[list[Segment], list[LaneWork]] | None:
        """(loop thread) Take everything queued: ``(segments, due_keys)``;
        ``None`` when nothing is: the lane is idle now, and its task should
        end (the next put starts another).  No coroutine per take: a busy
        lane (the common case) only takes the lock."""
        with self._lock:
            if not self._segments and not self._due:
                self._waiting = True
                return None
            segments, due, wake = self._grab()
        if wake:
            self._wake()
        return segments, due

    def close(self) -> None:
        """No more puts; a running task ends once it took what is queued
        (an idle lane has none to wake)."""
        with self._lock:
            self._closed = True

    def take_queued(self) -> tuple[list[Segment], list[LaneWork]] | None:
        """(loop thread) What came since the last take, added to it (the put
        stamps too): ``None`` when nothing did; the lane stays busy."""
        with self._lock:
            if not self._segments and not self._due:
                return None
            segments, due, wake = self._grab(more=True)
        if wake:
            self._wake()
        return segments, due


class LoopWaker:
    """Collects the async lanes a dispatch gave work to while they had no
    task, and starts their tasks per :meth:`flush` (``start``, set by the
    executor): at once when the dispatch ran on the loop's own thread (the
    pull task), else with one ``call_soon_threadsafe`` (a hand-off into the
    loop from its helper thread: one call per dispatch, not per lane or
    message)."""

    __slots__ = ("_lock", "_pending", "loop", "start", "stopping", "thread")

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        #: The loop's thread (``threading.get_ident``), set with ``loop``.
        self.thread = 0
        #: Starts the tasks of the lanes given (on the loop's thread).
        self.start: Callable[[list[AsyncLane]], None] = _no_start
        #: Set on the loop when the consumer stops (lanes waiting for their
        #: ``max_rate`` turn stop waiting); made by the executor's start.
        self.stopping: asyncio.Event | None = None
        self._lock = threading.Lock()
        self._pending: list[AsyncLane] = []

    def add(self, lane: AsyncLane) -> None:
        with self._lock:
            self._pending.append(lane)

    def flush(self) -> None:
        with self._lock:
            lanes = self._pending
            if not lanes:
                return
            self._pending = []
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        if threading.get_ident() == self.thread:
            self.start(lanes)
            return
        try:
            loop.call_soon_threadsafe(self.start, lanes)
        except RuntimeError:  # the loop closed meanwhile: nobody runs them any more
            pass


def _no_start(lanes: list[AsyncLane]) -> None:
    """A waker's ``start`` before its executor set one: nothing runs."""
