"""Selects the offset tracker: compiled twin when built, else pure Python.
``LITE_PUSH_NO_EXTENSIONS=1`` forces pure Python; ``OFFSETS_IMPL`` tells.

``OffsetTracker`` holds one queue's in-flight offsets (added, not completed)
and gives the committable offset, the lowest of them.  Offsets are added in
increasing order within a call, and usually above every offset added before
(the high-water mark ``next_offset``).  A call may also start below it: *late
offsets*.  A message-grain source (one that acknowledges each message rather
than a queue position, as the Redis message-grain source does) redelivers to
this member a message another member failed to finish, and its offset may lie
below what this member has already polled.  Any offset not in flight (never added, or added and completed) may
be added late; one still in flight is a ``ValueError``.  A late offset can
move ``lowest_unfinished()`` down, so the queue's commit point too.  Both
twins take a call starting at or above ``next_offset`` on their fast path,
at the old cost, and late calls on a slower one.
"""

from __future__ import annotations

from .router import NO_EXTENSIONS

__all__ = ["OFFSETS_IMPL", "OffsetTracker"]

if NO_EXTENSIONS:
    from .offsets_py import OffsetTracker

    OFFSETS_IMPL = "python"
else:
    try:
        from .offsets_c import OffsetTracker  # type: ignore[no-redef,import-not-found]

        OFFSETS_IMPL = "cython"
    except ImportError:
        from .offsets_py import OffsetTracker

        OFFSETS_IMPL = "python"
