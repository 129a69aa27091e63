"""Pure-Python twin of the per-queue offset tracker (see ``_offsets.py``).

Offsets are added in increasing order (gaps allowed), completed in any order.
``_pending`` holds the added offsets in order; ``_done`` the completed ones
that are not yet at the head.  The head moves past completed offsets as they
reach it, so each offset is appended, marked and popped once: O(1) amortised.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

__all__ = ["OffsetTracker"]


class OffsetTracker:
    """In-flight offsets of one queue and the lowest one not finished."""

    __slots__ = ("_pending", "_done", "_next")

    def __init__(self, next_offset: int = 0) -> None:
        self._pending: deque[int] = deque()
        self._done: set[int] = set()
        #: One past the highest offset added or skipped over.
        self._next = next_offset

    def add(self, offset: int) -> None:
        """Track ``offset`` as in flight; it must be >= every offset added."""
        if offset < self._next:
            raise ValueError(f"offset {offset} added after {self._next - 1}: offsets must increase")
        self._pending.append(offset)
        self._next = offset + 1

    def add_many(self, offsets: list[int], next_offset: int | None = None) -> None:
        """Track increasing ``offsets``; then move the high-water mark to
        ``next_offset`` (offsets skipped by a filter are never in flight)."""
        if offsets:
            first = offsets[0]
            if first < self._next:
                raise ValueError(f"offset {first} added after {self._next - 1}: offsets must increase")
            self._pending.extend(offsets)
            self._next = offsets[-1] + 1
        if next_offset is not None and next_offset > self._next:
            self._next = next_offset

    def add_range(self, start: int, stop: int) -> None:
        """Track ``range(start, stop)``."""
        self.add_many(list(range(start, stop)))

    def complete(self, offset: int) -> None:
        """Mark ``offset`` (which must be in flight) finished."""
        self._done.add(offset)
        self._advance()

    def complete_many(self, offsets: Iterable[int]) -> None:
        """Mark several in-flight offsets finished."""
        self._done.update(offsets)
        self._advance()

    def _advance(self) -> None:
        pending = self._pending
        done = self._done
        while pending and pending[0] in done:
            done.discard(pending.popleft())

    def lowest_unfinished(self) -> int:
        """The committable offset: the lowest in-flight offset not finished,
        or one past the highest added offset when nothing is in flight."""
        return self._pending[0] if self._pending else self._next

    @property
    def in_flight(self) -> int:
        """Offsets added and not finished."""
        return len(self._pending) - len(self._done)

    @property
    def span(self) -> int:
        """Highest added offset + 1 minus the lowest unfinished (0 when idle)."""
        return self._next - self.lowest_unfinished() if self._pending else 0

    @property
    def next_offset(self) -> int:
        """One past the highest offset added or skipped."""
        return self._next
