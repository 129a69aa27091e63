"""Offsets far apart in one queue, and how the Redis source hands them over.

A queue's offsets are consecutive while only lite_push writes its stream.
An entry another program added with a raw ``XADD key * ...`` has the time
in ms as its id, and every send after it continues above that id (the
SEND script's ``append_first``): the offsets jump by about 1.8e12.  The
runtime's offset tracker keeps (in its compiled twin) one flag per offset
between the lowest one it has unfinished and the highest one it was
handed, so it must never get offsets that far from those it still has in
flight.

So the source hands a queue's messages over a jump wider than
:data:`GAP_LIMIT` only when the runtime has nothing of that queue
unfinished below it: a read stops before the jump, and the queue's
messages above it wait until the runtime has finished what it was handed
(queue balance: its commit reached the read position; message balance:
every message handed over was acknowledged).  That is at most a commit
interval after the last of them finished, once per foreign entry.  A
jump the runtime sees with nothing in flight costs nothing: the tracker
starts afresh at the next offset.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["GAP_LIMIT", "take_within"]

#: The widest span of offsets (the lowest unfinished to the highest handed
#: over) the runtime is handed per queue: beyond the largest ``max_span``
#: flow control lets a queue reach with consecutive offsets (1 << 20 by
#: default), far below a foreign entry's jump (about 1.8e12).
GAP_LIMIT = 1 << 24


def take_within(offsets: Sequence[int], low: int | None, high: int | None) -> int:
    """How many of ``offsets`` (increasing) may be handed over now: the
    longest prefix that keeps every offset the runtime would then have
    unfinished within :data:`GAP_LIMIT` of each other.  ``low`` and
    ``high`` bound the offsets it may have unfinished already (``None``:
    it has none)."""
    n = len(offsets)
    if not n:
        return 0
    start = offsets[0] if low is None else min(low, offsets[0])
    top = offsets[0] if high is None else max(high, offsets[0])
    if max(top, offsets[-1]) - start <= GAP_LIMIT:
        return n
    for i, off in enumerate(offsets):
        if max(top, off) - start > GAP_LIMIT:
            return i
    return n
