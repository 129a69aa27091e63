"""ProcessQueue: the in-flight state of one assigned MessageQueue.

The pull thread adds each polled batch; lane threads complete (or, for a
revoked queue, skip) what they took.  ``_lock`` guards the tracker and the
counters; it is taken once per batch or lane segment, never per message.
``_idle`` (a condition on that lock) wakes the pull thread waiting for a
revoked queue to drain.

The queue's other state is written through its methods only, each by one
thread: the pull thread pauses and resumes it (``pause``/``mark_resumed``),
records which lanes it overfilled (``block_lane``/``unblock_lanes``), drops it
on revoke (``drop``), records commits (``committed``/``commit_current``) and
renews its fence (``owned_until``, a plain attribute: lanes read it before
every listener call); any thread may read it through the read-only
properties.

A batch may start below ``next_offset``: a message-grain source redelivers
to this member messages another member did not finish (late offsets, see
``_kernels.offsets``).  They are tracked like the others, ``next_offset`` stays the
highest polled, and the commit point can move down until they finish; the
committer commits it all the same.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from .._kernels.offsets import OffsetTracker
from .._types import MessageExt, MessageQueue
from .offset_map import FinishedOffsets, encode, estimate_size

__all__ = ["ProcessQueue"]


class ProcessQueue:
    """Unfinished messages of one queue, their offsets and their size."""

    __slots__ = (
        "queue",
        "first_offset",
        "keyless_lane",
        "finished",
        "owned_until",
        "dropped",
        "_paused",
        "_lane_blocked",
        "_last_committed",
        "_last_map",
        "_last_commit_time",
        "_tracker",
        "_lock",
        "_idle",
        "_count",
        "_bytes",
        "_count_low",
        "_bytes_low",
        "_span_low",
        "_map_low",
        "_wake",
        "_wake_sent",
    )

    def __init__(
        self,
        queue: MessageQueue,
        *,
        next_offset: int,
        keyless_lane: int,
        resume_at: tuple[int, int, int, int],
        wake: Callable[[], None],
        finished: FinishedOffsets | None = None,
    ) -> None:
        self.queue = queue
        #: The offset this member started the queue from.
        self.first_offset = next_offset
        #: Lane of messages with no key: one per queue keeps queue order.
        self.keyless_lane = keyless_lane
        #: Fencing: until when (the consumer's clock, ``monotonic``) this
        #: member's ownership of the queue is certain, less the margin.
        #: Written by the pull thread after each poll (from
        #: ``PullSource.owned_for``); a lane starts no listener call for the
        #: queue at or past it.  Infinite for a source without sessions.
        self.owned_until = float("inf")
        #: Set when the queue is revoked (pull thread, :meth:`drop`): lanes
        #: skip its remaining messages.  A plain attribute: lanes read it
        #: before each segment.
        self.dropped = False
        self._paused = False
        self._lane_blocked: frozenset[int] = frozenset()
        self._last_committed = next_offset
        self._last_map = ""
        self._last_commit_time: float | None = None
        #: The offset map of the last commit (offsets above it already
        #: finished by an earlier owner): polled messages it names are not
        #: processed again.  Dropped once polling passed its end.
        self.finished = finished
        self._tracker = OffsetTracker(next_offset)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._count = 0
        self._bytes = 0
        # Low-water marks (messages, bytes, span, offset-map bytes): a paused
        # queue may resume once it is at or under all four.
        self._count_low, self._bytes_low, self._span_low, self._map_low = resume_at
        self._wake = wake
        self._wake_sent = False

    # -- state the pull thread writes, anyone reads -------------------------------

    def drop(self) -> None:
        """The queue was revoked (pull thread): lanes skip what is left of it
        (its fence closes too, so a lane stops before its next message)."""
        self.dropped = True
        self.owned_until = -float("inf")

    def stop_calls(self) -> None:
        """The consumer is stopping (pull thread): its fence closes, so a
        lane stops before its next message of this queue, and what it holds
        of it is let go, unfinished (the consumer's abort is set first)."""
        self.owned_until = -float("inf")

    @property
    def paused(self) -> bool:
        """Whether the source has this queue paused."""
        return self._paused

    def pause(self) -> None:
        """The pull thread paused the queue at the source."""
        self._paused = True

    def mark_resumed(self) -> None:
        """The pull thread resumed the queue (re-arms the wake-up)."""
        self._paused = False
        self._wake_sent = False

    @property
    def lane_blocked(self) -> frozenset[int]:
        """Lanes that were over capacity when this queue last fed them."""
        return self._lane_blocked

    def block_lane(self, lane: int) -> None:
        """A put of this queue's messages left lane ``lane`` over capacity."""
        self._lane_blocked = self._lane_blocked | {lane}

    def unblock_lanes(self, still_blocked: Callable[[int], bool]) -> bool:
        """Forget the lanes no longer over their low-water mark; return
        whether any is still blocked."""
        if self._lane_blocked:
            self._lane_blocked = frozenset(i for i in self._lane_blocked if still_blocked(i))
        return bool(self._lane_blocked)

    @property
    def last_committed(self) -> int:
        """The offset last committed for this queue by this consumer (lower
        than an earlier one when late offsets came in between)."""
        return self._last_committed

    @property
    def last_map(self) -> str:
        """The offset map sent with that commit."""
        return self._last_map

    @property
    def last_commit_time(self) -> float | None:
        """When (``time.time()``) the committed offset was last known to be
        current: a commit, or a commit skipped as unchanged; None before."""
        return self._last_commit_time

    def committed(self, offset: int, offset_map: str, now: float) -> None:
        """The source stored ``offset`` with ``offset_map`` at ``now``."""
        self._last_committed = offset
        self._last_map = offset_map
        self._last_commit_time = now

    def commit_current(self, now: float) -> None:
        """A commit found nothing new: the committed offset is current."""
        self._last_commit_time = now

    # -- tracking --------------------------------------------------------------------

    def drop_finished(self, messages: list[MessageExt], next_offset: int) -> list[MessageExt]:
        """The polled ``messages`` minus those the offset map says an earlier
        owner finished (pull thread, before :meth:`add_batch`)."""
        fin = self.finished
        if fin is None:
            return messages
        kept = [m for m in messages if m.queue_offset not in fin]
        if next_offset >= fin.end:
            self.finished = None
        return kept

    def add_batch(self, messages: list[MessageExt], next_offset: int) -> tuple[int, int, int, int]:
        """Track a polled batch (pull thread), late offsets included; return
        ``snapshot()`` after it."""
        with self._lock:
            self._bytes += self._tracker.add_batch(messages, next_offset)
            self._count += len(messages)
            t = self._tracker
            span = t.span
            return self._count, self._bytes, span, estimate_size(span, t.in_flight)

    @property
    def holding(self) -> int:
        """Messages polled and not finished or skipped yet: queued in a lane,
        in a listener call, parked, or waiting for their failure to be
        stored (any thread; read without the lock)."""
        return self._count

    @property
    def unfinished(self) -> int:
        """Messages polled and not finished (skipped ones included: they
        come back to the next owner)."""
        with self._lock:
            return self._tracker.in_flight

    @property
    def next_offset(self) -> int:
        """One past the highest offset polled or passed over (pull thread); a
        late batch does not lower it."""
        return self._tracker.next_offset

    def complete(self, messages: list[MessageExt]) -> None:
        """Mark messages finished (lane thread)."""
        with self._lock:
            size = self._tracker.complete_batch(messages)
            wake = self._release(len(messages), size)
        if wake:
            self._wake()

    def skip(self, messages: list[MessageExt]) -> None:
        """Forget messages that will not be processed here (the queue was
        revoked or the consumer is stopping): they stay unfinished, so the
        committed offset stays below them and the next owner replays them."""
        size = sum([len(m.body) for m in messages])
        with self._lock:
            wake = self._release(len(messages), size)
        if wake:
            self._wake()

    def _release(self, count: int, size: int) -> bool:
        # Caller holds the lock.  Returns whether to wake the pull thread; the
        # caller does so after releasing the lock (the wake-up takes the
        # source's lock, which must never be taken under ours).
        self._count -= count
        self._bytes -= size
        if self._count == 0:
            self._idle.notify_all()
        if self._paused and not self._wake_sent and self._below_low_water():
            self._wake_sent = True
            return True
        return False

    def _below_low_water(self) -> bool:
        # Caller holds the lock.
        span = self._tracker.span
        return (
            self._count <= self._count_low
            and self._bytes <= self._bytes_low
            and span <= self._span_low
            and estimate_size(span, self._tracker.in_flight) <= self._map_low
        )

    def check_resume(self) -> bool:
        """For a paused queue (pull thread): whether its messages, bytes and
        span are all at or under their low-water marks.  If not, re-arm the
        wake-up, so the lane that brings them there wakes the pull thread at
        once instead of leaving it to its poll timeout."""
        with self._lock:
            if self._below_low_water():
                return True
            self._wake_sent = False
            return False

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no message of this queue waits in a lane or runs in
        the listener; return whether that happened within ``timeout``."""
        with self._idle:
            return self._idle.wait_for(lambda: self._count == 0, timeout)

    def commit_point(self) -> tuple[int, str]:
        """``(offset, offset_map)``: the lowest offset not finished, and the
        encoded map of the finished offsets above it ("" when there are
        none), read together under the lock."""
        with self._lock:
            t = self._tracker
            low = t.lowest_unfinished()
            if not t.in_flight:
                return low, ""
            unfinished = t.unfinished()
            end = t.next_offset
        return low, encode(low, end, unfinished)

    def snapshot(self) -> tuple[int, int, int, int]:
        """``(messages, bytes, span, map_bytes)`` not finished, read under
        the lock; ``map_bytes`` bounds the size of the encoded offset map."""
        with self._lock:
            t = self._tracker
            span = t.span
            return self._count, self._bytes, span, estimate_size(span, t.in_flight)
