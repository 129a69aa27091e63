"""The consumer's one timer, and the kinds of work it holds.

No thread sleeps per parked key or per delayed message: everything that
must happen later goes on one :class:`RetryTimer`, and the pull thread pops
what is due on the consumer's injectable clock (it never polls past the
earliest entry).  Each kind of timed work is a small class that says
itself where it goes when it is due (:meth:`TimedWork.sort_into`), so the
pull thread dispatches without asking what a token is:

* :class:`DueKey`: a key parked in a lane (a failed call waiting
  ``suspend_ms``, or a key paced to ``key_min_interval``) whose time came;
  it goes back to its lane.
* :class:`LocalRetry`: a message the pull thread runs again itself (a
  send-back the source refused, or a BROADCASTING member's failure, which
  has no retry topic).
* :class:`DelayedSendBack`: a send-back delayed for its level because the
  source stores copies at once (Kafka); it is stored when due.

A lane receives :class:`LaneWork`: a due key, or :data:`PURGE` (skip the
parked messages of revoked queues), which is not timed: assignment hands it
to every lane at a revoke; or a change of the keys the application paused
(``_pull.key_pauses.KeyPauseChange``), handed to every lane by the pull thread.
Each runs itself against the lane's :class:`KeyRetrier`
(:meth:`LaneWork.steps`).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Hashable
from typing import Protocol

from .._lanes.failures import SendItem
from .._lanes.steps import Steps, no_steps
from .._types import MessageExt
from .process_queue import ProcessQueue

__all__ = [
    "PURGE",
    "DueKey",
    "Fired",
    "DelayedSendBack",
    "KeyRetrier",
    "LaneWork",
    "LocalRetry",
    "Purge",
    "RetryTimer",
    "TimedWork",
]


class KeyRetrier(Protocol):
    """What a lane does with the work handed to it (its lane worker)."""

    def retry_due(self, key: Hashable, gen: int) -> Steps:
        """The calls that retry parked ``key``, if ``gen`` is still its park."""

    def purge(self) -> None:
        """Skip the parked messages of revoked queues."""

    def apply_pauses(
        self, paused: frozenset[Hashable], added: frozenset[Hashable], removed: frozenset[Hashable]
    ) -> Steps:
        """The keys the application paused changed (``_pull.key_pauses``): the
        calls that run what waited for the resumed ones."""


class LaneWork(ABC):
    """Work handed to a lane besides messages (:meth:`Lane.put_due`)."""

    __slots__ = ()

    @abstractmethod
    def steps(self, lane: KeyRetrier) -> Steps:
        """The listener calls this work makes on ``lane``."""


class Fired:
    """What one firing of the timer hands on, sorted by who does it."""

    __slots__ = ("delayed", "local", "per_lane")

    def __init__(self) -> None:
        #: Lane index -> its due keys (one put per lane).
        self.per_lane: dict[int, list[LaneWork]] = {}
        #: Messages the pull thread runs again (local retries).
        self.local: list[LocalRetry] = []
        #: Send-backs to store now.
        self.delayed: list[SendItem] = []


class TimedWork(ABC):
    """An entry of the timer (see the module docstring)."""

    __slots__ = ()

    @abstractmethod
    def sort_into(self, fired: Fired) -> None:
        """Hand this due work to whoever does it."""

    def waiting_message(self) -> tuple[ProcessQueue, MessageExt] | None:
        """The pull thread's work for one queue's message: that queue and
        message (a revoke skips it, uncommitted); ``None`` for a lane's."""
        return None


class DueKey(TimedWork, LaneWork):
    """Parked ``key`` in lane ``lane`` may run again (its park ``gen``:
    an entry of an earlier park of the same key is stale)."""

    __slots__ = ("gen", "key", "lane")

    def __init__(self, lane: int, key: Hashable, gen: int) -> None:
        self.lane = lane
        self.key = key
        self.gen = gen

    def sort_into(self, fired: Fired) -> None:
        fired.per_lane.setdefault(self.lane, []).append(self)

    def steps(self, lane: KeyRetrier) -> Steps:
        return lane.retry_due(self.key, self.gen)


class Purge(LaneWork):
    """Skip the parked messages of revoked queues (use :data:`PURGE`)."""

    __slots__ = ()

    def steps(self, lane: KeyRetrier) -> Steps:
        lane.purge()
        return no_steps()


#: The one :class:`Purge`.
PURGE = Purge()


class LocalRetry(TimedWork):
    """Run ``message`` of ``pq`` again on this member (its offset stays
    unfinished meanwhile)."""

    __slots__ = ("message", "pq")

    def __init__(self, pq: ProcessQueue, message: MessageExt) -> None:
        self.pq = pq
        self.message = message

    def sort_into(self, fired: Fired) -> None:
        fired.local.append(self)

    def waiting_message(self) -> tuple[ProcessQueue, MessageExt]:
        return self.pq, self.message


class DelayedSendBack(TimedWork):
    """Store ``item`` in the retry topic when due (a source without delayed
    delivery); its offset stays unfinished meanwhile."""

    __slots__ = ("item",)

    def __init__(self, item: SendItem) -> None:
        self.item = item

    def sort_into(self, fired: Fired) -> None:
        fired.delayed.append(self.item)

    def waiting_message(self) -> tuple[ProcessQueue, MessageExt]:
        return self.item.pq, self.item.message


class RetryTimer:
    """A heap of ``(due, seq, work)``; thread-safe (``_lock`` guards the
    heap, taken once per add and once per firing).  ``wake`` is called when
    an add makes an entry the earliest: the pull thread may be waiting past
    it in a poll."""

    __slots__ = ("_heap", "_lock", "_seq", "_wake")

    def __init__(self, wake: Callable[[], None]) -> None:
        self._lock = threading.Lock()
        self._heap: list[tuple[float, int, TimedWork]] = []
        self._seq = itertools.count()
        self._wake = wake

    def add(self, due: float, work: TimedWork) -> None:
        """Do ``work`` at ``due`` (the consumer clock's monotonic seconds)."""
        entry = (due, next(self._seq), work)
        with self._lock:
            heapq.heappush(self._heap, entry)
            first = self._heap[0] is entry
        if first:
            self._wake()

    def fire(self, now: float) -> Fired:
        """Remove the entries due at ``now`` and sort them (pull thread)."""
        fired = Fired()
        with self._lock:
            heap = self._heap
            while heap and heap[0][0] <= now:
                heapq.heappop(heap)[2].sort_into(fired)
        return fired

    def take_waiting(self, pqs: Collection[ProcessQueue]) -> list[tuple[ProcessQueue, MessageExt]]:
        """Remove the pull thread's work for messages of ``pqs``, due or not
        (queues being revoked), and return those messages."""
        taken: list[tuple[ProcessQueue, MessageExt]] = []
        keep: list[tuple[float, int, TimedWork]] = []
        with self._lock:
            for entry in self._heap:
                waiting = entry[2].waiting_message()
                if waiting is not None and waiting[0] in pqs:
                    taken.append(waiting)
                else:
                    keep.append(entry)
            if taken:
                heapq.heapify(keep)
                self._heap = keep
        return taken

    def next_due(self) -> float | None:
        """The earliest due time, or None when nothing is waiting."""
        with self._lock:
            return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._heap)
