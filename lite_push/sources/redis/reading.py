"""What a poll of the Redis source reads: each owned queue's stream and
read position, and turning one pipelined read into batches."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..._types import MessageExt, MessageQueue, PollBatch
from .codec import decode

__all__ = ["SCAN_EXTRA", "QueueReader", "read_into"]

#: With a tag filter, one poll scans at most this many messages per queue
#: beyond ``4 * max_per_queue`` (as the embedded broker).
SCAN_EXTRA = 256


class QueueReader:
    """An owned queue, as its owner sees it: the stream and the read position."""

    __slots__ = ("log_key", "mq", "paused", "pos", "tags")

    def __init__(self, mq: MessageQueue, log_key: str, pos: int, tags: frozenset[str] | None) -> None:
        self.mq = mq
        self.log_key = log_key
        self.pos = pos
        self.paused = False
        self.tags = tags


def read_into(
    out: list[PollBatch],
    order: list[QueueReader],
    replies: list[Any],
    max_per_queue: int,
    namespace: str,
    states: Mapping[MessageQueue, QueueReader],
) -> None:
    """Append to ``out`` a batch per queue of ``order`` whose XRANGE reply
    (``replies``, in the same order) has entries, moving its read position:
    up to ``max_per_queue`` messages, those of its tags when it has a
    filter.  A queue given up or paused since the read (no longer the same
    reader in ``states``) is skipped."""
    for st, entries in zip(order, replies, strict=True):
        if not entries or states.get(st.mq) is not st or st.paused:
            continue
        mq = st.mq
        if st.tags is None:
            msgs = decode(namespace, mq, entries)
            st.pos = msgs[-1].queue_offset + 1
            out.append(PollBatch(mq, msgs, st.pos))
        else:
            tags = st.tags
            picked: list[MessageExt] = []
            nxt_off = st.pos
            for m in decode(namespace, mq, entries):
                nxt_off = m.queue_offset + 1
                if m.tags in tags:
                    picked.append(m)
                    if len(picked) >= max_per_queue:
                        break
            st.pos = nxt_off
            out.append(PollBatch(mq, picked, nxt_off))
