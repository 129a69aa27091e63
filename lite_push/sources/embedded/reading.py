"""What a poll of the embedded broker reads: each owned queue's read
position, and one pass over the unpaused queues.

A reader belongs to its consumer's thread.  It slices the broker's message
list without the lock: ``len()`` and slicing of a list are atomic, and the
lists only grow.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..._types import MessageExt, MessageQueue, PollBatch

__all__ = ["SCAN_EXTRA", "QueueReader", "readers", "scan"]

#: With a tag filter, one poll scans at most this many messages per queue
#: beyond ``4 * max_per_queue`` (so a queue of filtered-out messages cannot
#: make a poll long).
SCAN_EXTRA = 256


class QueueReader:
    """An owned queue, as its owner sees it (owner thread only)."""

    __slots__ = ("mq", "log", "pos", "paused", "tags")

    def __init__(self, mq: MessageQueue, log: list[MessageExt], pos: int, tags: frozenset[str] | None) -> None:
        self.mq = mq
        self.log = log  # the broker's list for this queue; it only grows
        self.pos = pos
        self.paused = False
        self.tags = tags


def readers(
    log_of: Callable[[MessageQueue], list[MessageExt]], filters: Mapping[str, frozenset[str] | None]
) -> Callable[[MessageQueue, int], QueueReader]:
    """How a member makes the reader of a queue it takes, at a position:
    on the queue's list (``log_of``), with its topic's tag filter as
    ``filters`` says when the queue is taken."""
    return lambda q, pos: QueueReader(q, log_of(q), pos, filters.get(q.topic))


def scan(
    active: list[QueueReader], start: int, max_per_queue: int, unreadable: Mapping[MessageQueue, frozenset[int]]
) -> list[PollBatch]:
    """One batch per queue of ``active`` that has unread messages, starting
    at index ``start`` (round robin across polls): up to ``max_per_queue``
    messages each, those of the queue's tags when it has a filter.  The
    placeholders of ``unreadable`` records are passed over (like filtered
    messages, ``next_offset`` moves past them)."""
    n = len(active)
    out: list[PollBatch] = []
    for i in range(n):
        st = active[(start + i) % n]
        log = st.log
        pos = st.pos
        end = len(log)
        if pos >= end:
            continue
        if st.tags is None:
            stop = pos + max_per_queue
            if stop > end:
                stop = end
            batch = log[pos:stop]
            if unreadable and st.mq in unreadable:
                holes = unreadable[st.mq]
                batch = [m for m in batch if m.queue_offset not in holes]
            out.append(PollBatch(st.mq, batch, stop))
            st.pos = stop
        else:
            tags = st.tags
            limit = pos + 4 * max_per_queue + SCAN_EXTRA
            if limit > end:
                limit = end
            picked: list[MessageExt] = []
            j = pos
            while j < limit:
                m = log[j]
                j += 1
                if m.tags in tags and not (unreadable and m.queue_offset in unreadable.get(st.mq, ())):
                    picked.append(m)
                    if len(picked) >= max_per_queue:
                        break
            out.append(PollBatch(st.mq, picked, j))
            st.pos = j
    return out
