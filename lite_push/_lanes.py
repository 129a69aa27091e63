"""Lanes: bounded FIFOs of work, each drained by exactly one task.

The pull thread puts one list of *segments* per lane per poll (a segment is
the run of one queue's messages routed to that lane), so a hand-off costs one
lock per lane per poll, not per message.  The lane's task takes everything
queued at once.  Messages of one key always go to the same lane, and one task
drains it, so they never run concurrently and run in arrival order.

"Bounded" is enforced by flow control, not by blocking the producer: the pull
thread never waits on a lane.  When a put leaves a lane above its capacity the
pull thread pauses the queues that fed it; the lane's task wakes the pull
thread when it has taken the backlog, and the queues resume.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from ._process_queue import ProcessQueue
from ._types import MessageExt

__all__ = ["Lane", "Segment"]

#: The messages of one queue routed to one lane by one poll.
Segment = tuple[ProcessQueue, list[MessageExt]]


class Lane:
    """A FIFO of segments with a message count, for one consumer task.

    ``_cond`` guards ``_segments``, ``depth`` and ``_closed``; producers
    notify it, the single consumer task waits on it (no sleep polling).
    """

    __slots__ = ("index", "depth", "blocked", "_cond", "_segments", "_closed", "_wake")

    def __init__(self, index: int, wake: Callable[[], None]) -> None:
        self.index = index
        #: Messages queued and not yet taken.
        self.depth = 0
        #: Set by the pull thread when a put overfilled the lane; the task
        #: clears it and wakes the pull thread once it took the backlog.
        self.blocked = False
        self._cond = threading.Condition(threading.Lock())
        self._segments: deque[Segment] = deque()
        self._closed = False
        self._wake = wake

    def put(self, segments: list[Segment], count: int) -> int:
        """Append segments holding ``count`` messages; return the new depth.
        Never blocks beyond the lock.  Raises RuntimeError once closed."""
        with self._cond:
            if self._closed:
                raise RuntimeError(f"lane {self.index} is closed")
            self._segments.extend(segments)
            self.depth += count
            depth = self.depth
            self._cond.notify()
        return depth

    def take(self) -> list[Segment] | None:
        """Block until something is queued; take all of it.  ``None`` once the
        lane is closed and empty (the task should exit)."""
        with self._cond:
            while not self._segments:
                if self._closed:
                    return None
                self._cond.wait()
            segments = list(self._segments)
            self._segments.clear()
            self.depth = 0
            wake = self.blocked
            self.blocked = False
        if wake:
            self._wake()
        return segments

    def drain(self) -> list[Segment]:
        """Remove and return everything queued (used when aborting)."""
        with self._cond:
            segments = list(self._segments)
            self._segments.clear()
            self.depth = 0
            return segments

    def close(self) -> None:
        """No more puts; the task exits once it took what is queued."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
