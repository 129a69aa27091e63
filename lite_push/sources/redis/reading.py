"""What a poll of the Redis source reads: each owned queue's stream and
read position, and turning one pipelined read into batches."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..._types import MessageExt, MessageQueue, PollBatch
from .codec import decode

__all__ = ["SCAN_EXTRA", "QueueReader", "read_into", "readers"]

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


def readers(
    log_key: Callable[[str, int, str], str], filters: Mapping[str, frozenset[str] | None]
) -> Callable[[MessageQueue, int], QueueReader]:
    """How a member makes the reader of a queue it takes, at a position: on
    the queue's stream (``log_key``: the connection's ``queue_key``), with
    its topic's tag filter as ``filters`` says when the queue is taken."""
    return lambda q, pos: QueueReader(q, log_key(q.topic, q.queue_id, "log"), pos, filters.get(q.topic))


def read_into(
    out: list[PollBatch],
    order: list[QueueReader],
    replies: list[Any],
    max_per_queue: int,
    namespace: str,
    states: Mapping[MessageQueue, QueueReader],
    store_malformed: Callable[[list[tuple[MessageExt, str]]], None],
) -> None:
    """Append to ``out`` a batch per queue of ``order`` whose XRANGE reply
    (``replies``, in the same order) has entries, moving its read position:
    up to ``max_per_queue`` messages, those of its tags when it has a
    filter.  A queue given up or paused since the read (no longer the same
    reader in ``states``) is skipped.  Entries that cannot be decoded are
    passed over (the position moves past them) once ``store_malformed``
    stored them; if it raises, nothing moves and ``out`` is unchanged."""
    bad: list[tuple[MessageExt, str]] = []
    found: list[tuple[QueueReader, list[MessageExt], int]] = []
    for st, entries in zip(order, replies, strict=True):
        if not entries or states.get(st.mq) is not st or st.paused:
            continue
        qbad: list[tuple[MessageExt, str]] = []
        msgs = decode(namespace, st.mq, entries, qbad)
        # the read ends at the last message or the last malformed entry
        nxt = max(qbad[-1][0].queue_offset if qbad else -1, msgs[-1].queue_offset if msgs else -1) + 1
        if st.tags is not None:
            tags = st.tags
            picked: list[MessageExt] = []
            for m in msgs:
                if m.tags in tags:
                    picked.append(m)
                    if len(picked) >= max_per_queue:
                        nxt = m.queue_offset + 1
                        break
            msgs = picked
        bad += [b for b in qbad if b[0].queue_offset < nxt]
        found.append((st, msgs, nxt))
    if bad:
        store_malformed(bad)
    for st, msgs, nxt in found:
        st.pos = nxt
        out.append(PollBatch(st.mq, msgs, nxt))
