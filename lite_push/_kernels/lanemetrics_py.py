"""Pure-Python twin of ``lite_push._kernels.lanemetrics_c``: one lane's
distributions (listener time, time in the lane, end-to-end latency).

A lane records into its own :class:`LaneMetrics` once per segment (and
once per take); the metrics collector reads :meth:`LaneMetrics.snapshot`
of every lane when Prometheus scrapes and merges them.  Each distribution
is a list of bucket counts with ``le`` semantics (bucket ``i`` counts the
values ``<= bounds[i]``, the last one is +Inf, a NaN counts in the first)
and the sum of the values.

The methods without ``_at`` read the clocks themselves: :func:`clock` (the
monotonic clock ``t0`` and the lane's put stamps are read with) and the
wall clock (for the end-to-end latency, against the messages' store
timestamps in milliseconds).  The ``_at`` methods take the readings as
arguments, so the two twins can be compared on the same input.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Sequence
from itertools import pairwise
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._types import MessageExt

__all__ = ["MAX_BOUNDS", "LaneMetrics", "clock"]

#: The most bucket bounds a distribution may have (the compiled twin's
#: fixed array size).
MAX_BOUNDS = 32

#: The monotonic clock of ``t0`` and of put stamps, in seconds.
clock = time.perf_counter
_wall = time.time

Dist = tuple[list[int], float]


def check_bounds(name: str, bounds: Sequence[float]) -> tuple[float, ...]:
    """``bounds`` as floats; ValueError naming ``name`` unless they are 1 to
    :data:`MAX_BOUNDS` finite, strictly increasing numbers."""
    try:
        bs = tuple(float(b) for b in bounds)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: bucket bounds must be numbers, got {bounds!r}") from None
    if not 1 <= len(bs) <= MAX_BOUNDS:
        raise ValueError(f"{name}: 1 to {MAX_BOUNDS} bucket bounds, got {len(bs)}")
    if any(b != b or b in (float("inf"), float("-inf")) for b in bs):
        raise ValueError(f"{name}: bucket bounds must be finite, got {bs!r}")
    if any(a >= b for a, b in pairwise(bs)):
        raise ValueError(f"{name}: bucket bounds must be strictly increasing, got {bs!r}")
    return bs


class _Hist:
    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float, n: int) -> None:
        self.counts[bisect_left(self.bounds, value)] += n
        self.total += value * n

    def copy(self) -> Dist:
        return list(self.counts), self.total


class LaneMetrics:
    """One lane's three distributions; written by the lane's task only."""

    __slots__ = ("_e2e", "_listener", "_wait")

    def __init__(
        self, listener_bounds: Sequence[float], wait_bounds: Sequence[float], e2e_bounds: Sequence[float]
    ) -> None:
        self._listener = _Hist(check_bounds("listener_bounds", listener_bounds))
        self._wait = _Hist(check_bounds("wait_bounds", wait_bounds))
        self._e2e = _Hist(check_bounds("e2e_bounds", e2e_bounds))

    def segment(self, t0: float, msgs: Sequence[MessageExt]) -> None:
        """A segment processed from ``t0`` (:func:`clock`) to now, all of
        it successfully: :meth:`call` then :meth:`completed`."""
        self.segment_at(t0, msgs, clock(), _wall())

    def segment_at(self, t0: float, msgs: Sequence[MessageExt], now: float, wall: float) -> None:
        """:meth:`segment` with the clocks read as ``now`` and ``wall``."""
        n = len(msgs)
        if not n:
            raise ValueError("a segment of no messages")
        self._listener.observe((now - t0) / n, n)
        self.completed_at(msgs[0], msgs[-1], n, wall)

    def call(self, t0: float, n: int) -> None:
        """One listener call on ``n`` messages that started at ``t0``: the
        call's time divided over its messages."""
        self.call_at(t0, n, clock())

    def call_at(self, t0: float, n: int, now: float) -> None:
        """:meth:`call` with the clock read as ``now``."""
        if n < 1:
            raise ValueError(f"a call on {n} messages")
        self._listener.observe((now - t0) / n, n)

    def completed(self, first: MessageExt, last: MessageExt, n: int) -> None:
        """``n`` messages from ``first`` to ``last`` finished now: the mean
        of their store timestamps stands for all (they were stored
        together).  Nothing when ``first`` has no store timestamp."""
        self.completed_at(first, last, n, _wall())

    def completed_at(self, first: MessageExt, last: MessageExt, n: int, wall: float) -> None:
        """:meth:`completed` with the wall clock read as ``wall``."""
        stored = first.store_timestamp
        if stored > 0:
            v = wall - (stored + last.store_timestamp) / 2000.0
            self._e2e.observe(v if v > 0.0 else 0.0, n)

    def waited(self, stamps: Sequence[tuple[float, int]]) -> None:
        """Puts of ``(clock() when put, messages)`` taken now."""
        self.waited_at(stamps, clock())

    def waited_at(self, stamps: Sequence[tuple[float, int]], now: float) -> None:
        """:meth:`waited` with the clock read as ``now``."""
        observe = self._wait.observe
        for at, n in stamps:
            observe(now - at, n)

    def snapshot(self) -> tuple[Dist, Dist, Dist]:
        """``(counts, sum)`` of the listener, wait and end-to-end
        distributions (copies)."""
        return self._listener.copy(), self._wait.copy(), self._e2e.copy()
