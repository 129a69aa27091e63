"""Pure-Python twin of the per-queue offset tracker (see ``_kernels/offsets.py``).

Offsets are added in increasing order (gaps allowed: offsets a filter skipped
are never in flight), completed in any order.  ``_pending`` holds the added
offsets in order, ``_inflight`` the ones not finished.  The head of
``_pending`` moves past finished offsets as they reach it, so each offset is
appended, completed and popped once: O(1) amortised.

Late offsets: a call may start below the high-water mark ``_next`` (a
message-grain source redelivers to this member a message another member did
not finish, below what this member already polled).  Its offsets must still
increase within the call and none may be in flight; the slow path
(``_add_late``) adds them to ``_inflight`` and rebuilds ``_pending`` sorted
from it: O(in flight log in flight), once per late call.  A call starting at
or above ``_next`` costs what it did before (its first offset's comparison
with ``_next`` is the one the ordering check makes anyway).

Both twins validate a whole call before changing anything: a ``ValueError``
leaves the tracker as it was.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["MAX_OFFSET", "OffsetTracker"]

#: Offsets are Java longs (RocketMQ, Kafka): 0 <= offset <= MAX_OFFSET.
MAX_OFFSET = (1 << 63) - 2


def _check(offset: int, what: str = "offset") -> None:
    if not 0 <= offset <= MAX_OFFSET:
        raise OverflowError(f"{what} {offset} outside [0, {MAX_OFFSET}]")


class OffsetTracker:
    """In-flight offsets of one queue and the lowest one not finished."""

    __slots__ = ("_pending", "_inflight", "_next")

    def __init__(self, next_offset: int = 0) -> None:
        if next_offset < 0:
            raise ValueError(f"next_offset must be >= 0, got {next_offset}")
        if next_offset > MAX_OFFSET + 1:
            raise OverflowError(f"next_offset {next_offset} above {MAX_OFFSET + 1}")
        self._pending: deque[int] = deque()
        self._inflight: set[int] = set()
        #: One past the highest offset added or skipped over.
        self._next = next_offset

    # -- adding ----------------------------------------------------------------

    def add(self, offset: int) -> None:
        """Track ``offset`` as in flight; it must not be in flight already.
        Below :attr:`next_offset` it is a late offset (see the module
        docstring)."""
        if offset < self._next:
            self._add_late((offset,), None)
            return
        _check(offset)
        self._pending.append(offset)
        self._inflight.add(offset)
        self._next = offset + 1

    def add_many(self, offsets: Sequence[int], next_offset: int | None = None) -> None:
        """Track strictly increasing ``offsets``, none in flight already (the
        first may lie below :attr:`next_offset`: late offsets); then move the
        high-water mark to ``next_offset`` if that is higher (skipped
        offsets)."""
        if next_offset is not None:
            next_offset = operator.index(next_offset)
            if next_offset > MAX_OFFSET + 1:
                raise OverflowError(f"next_offset {next_offset} above {MAX_OFFSET + 1}")
        if offsets:
            prev = self._next - 1
            for off in offsets:
                if off <= prev:
                    if prev < self._next:  # the first offset: a late call
                        self._add_late(offsets, next_offset)
                        return
                    raise ValueError(f"offset {off} added after {prev}: offsets must increase")
                prev = off
            _check(prev)
            self._pending.extend(offsets)
            self._inflight.update(offsets)
            self._next = prev + 1
        if next_offset is not None and next_offset > self._next:
            self._next = next_offset

    def add_range(self, start: int, stop: int) -> None:
        """Track ``range(start, stop)``, none of it in flight already."""
        if stop <= start:
            return
        if start < self._next:  # late: the slow path, one offset at a time
            if start < 0:
                raise ValueError(f"offset {start} is negative")
            _check(stop - 1)
            self._add_late(range(start, stop), None)
            return
        _check(stop - 1)
        self.add_many(range(start, stop))

    def add_batch(self, messages: Sequence[Any], next_offset: int | None = None) -> int:
        """Track the ``queue_offset`` of each message (increasing, none in
        flight already; late ones first), move the high-water mark to
        ``next_offset``; return the sum of ``len(body)``."""
        self.add_many([m.queue_offset for m in messages], next_offset)
        return sum([len(m.body) for m in messages])

    def _add_late(self, offsets: Sequence[int], next_offset: int | None) -> None:
        # The slow path of a call whose first offset is below ``_next``
        # (``next_offset`` already checked).  Validate everything first.
        nxt = self._next
        inflight = self._inflight
        prev = -1
        for off in offsets:
            if off <= prev:
                if off < 0:
                    raise ValueError(f"offset {off} is negative")
                raise ValueError(f"offset {off} added after {prev}: offsets must increase")
            if off < nxt and off in inflight:
                raise ValueError(f"offset {off} is already in flight")
            prev = off
        _check(prev)
        inflight.update(offsets)
        self._pending = deque(sorted(inflight))
        if prev >= nxt:
            self._next = prev + 1
        if next_offset is not None and next_offset > self._next:
            self._next = next_offset

    # -- completing ------------------------------------------------------------

    def complete(self, offset: int) -> None:
        """Mark the in-flight ``offset`` finished."""
        if offset not in self._inflight:
            raise ValueError(f"offset {offset} is not in flight")
        self._inflight.discard(offset)
        self._advance()

    def complete_many(self, offsets: Iterable[int]) -> None:
        """Mark several distinct in-flight offsets finished."""
        offs = offsets if isinstance(offsets, (list, tuple)) else list(offsets)
        inflight = self._inflight
        if len(offs) == 1:
            self.complete(offs[0])
            return
        unique = set(offs)
        if len(unique) != len(offs) or not unique <= inflight:
            seen: set[int] = set()
            for off in offs:  # report the first bad offset, as the compiled twin does
                if off not in inflight:
                    raise ValueError(f"offset {off} is not in flight")
                if off in seen:
                    raise ValueError(f"offset {off} completed twice")
                seen.add(off)
        inflight.difference_update(unique)
        self._advance()

    def complete_batch(self, messages: Sequence[Any]) -> int:
        """Mark the messages' offsets finished; return the sum of their
        ``len(body)``."""
        self.complete_many([m.queue_offset for m in messages])
        return sum([len(m.body) for m in messages])

    def _advance(self) -> None:
        pending = self._pending
        inflight = self._inflight
        if not inflight:
            pending.clear()
            return
        while pending[0] not in inflight:
            pending.popleft()

    # -- reading ---------------------------------------------------------------

    def lowest_unfinished(self) -> int:
        """The committable offset: the lowest in-flight offset, or one past
        the highest added or skipped offset when nothing is in flight.  A
        late offset can move it down."""
        return self._pending[0] if self._inflight else self._next

    def unfinished(self) -> list[int]:
        """The in-flight offsets (added, not finished), in increasing order."""
        return sorted(self._inflight)

    @property
    def in_flight(self) -> int:
        """Offsets added and not finished."""
        return len(self._inflight)

    @property
    def span(self) -> int:
        """One past the highest added or skipped offset, minus the lowest
        unfinished (0 when nothing is in flight)."""
        return self._next - self._pending[0] if self._inflight else 0

    @property
    def next_offset(self) -> int:
        """One past the highest offset added or skipped."""
        return self._next
