"""What a poll of the Redis source reads: each owned queue's stream and
read position, and turning one pipelined read into batches (a read stops
before a jump of offsets the runtime must not see yet: :mod:`.gaps`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..._types import MessageExt, MessageQueue, OffsetAndMetadata, PollBatch
from .codec import decode, offset_of
from .gaps import GAP_LIMIT, take_within

__all__ = ["SCAN_EXTRA", "QueueReader", "raise_floors", "read_into", "readers"]

logger = logging.getLogger(__name__)

#: With a tag filter, one poll scans at most this many messages per queue
#: beyond ``4 * max_per_queue`` (as the embedded broker).
SCAN_EXTRA = 256


class QueueReader:
    """An owned queue, as its owner sees it: the stream and the read
    position; ``floor``, the runtime's last commit (or the start): below
    it the runtime has nothing unfinished; ``held``: a read stopped before
    a jump of offsets, and the queue is not read again until the runtime
    committed up to the read position (:mod:`.gaps`).

    A read starts just after the id of the last entry read (``after``),
    not at the next offset's id: an entry added later with that entry's
    millisecond and a higher sequence part (``<ms>-N``, a raw ``XADD``: see
    :mod:`.codec`) sorts between the two, and is read (and dead-lettered)
    instead of passed over."""

    __slots__ = ("after", "floor", "held", "log_key", "mq", "paused", "pos", "tags")

    def __init__(self, mq: MessageQueue, log_key: str, pos: int, tags: frozenset[str] | None) -> None:
        self.mq = mq
        self.log_key = log_key
        self.pos = pos
        #: The id of the last entry read (``None``: none since ``pos`` was
        #: set; the next read starts at ``pos``'s own id).
        self.after: str | None = None
        self.floor = pos
        self.held = False
        self.paused = False
        self.tags = tags

    def restart(self, pos: int) -> None:
        """Read from ``pos`` on (a seek: the runtime starts afresh there)."""
        self.pos = self.floor = pos
        self.after = None
        self.held = False

    def start(self) -> str:
        """Where the next ``XRANGE`` starts: just after the last entry read
        (an exclusive start), else at the id of offset ``pos``."""
        return f"({self.after}" if self.after is not None else f"{self.pos + 1}-0"

    def waiting(self) -> bool:
        """Whether the queue waits at a jump of offsets for the runtime's
        commit (not read meanwhile)."""
        if self.held and self.floor >= self.pos:
            self.held = False
        return self.held

    def deliverable(self, entries: Sequence[Any]) -> int:
        """How many of a read's ``entries`` to deliver: all, unless the
        offsets jump by more than :data:`~.gaps.GAP_LIMIT` from what the
        runtime may have unfinished (then the read stops there and the
        queue is held)."""
        low = self.floor if self.floor < self.pos else None
        first = offset_of(entries[0][0])
        if offset_of(entries[-1][0]) - (first if low is None else min(low, first)) <= GAP_LIMIT:
            return len(entries)
        offsets = [offset_of(e[0]) for e in entries]
        n = take_within(offsets, low, None)
        self.held = True
        logger.info(
            "queue %s: the offsets jump from %d to %d (an entry lite_push did not write?); those from %d on "
            "wait until the runtime has finished the ones below",
            self.mq,
            offsets[n - 1] if n else self.pos - 1,
            offsets[n],
            offsets[n],
        )
        return n


def raise_floors(states: Mapping[MessageQueue, QueueReader], entries: Mapping[MessageQueue, OffsetAndMetadata]) -> None:
    """The runtime committed ``entries``: it has nothing unfinished below
    them, so each queue's ``floor`` rises to its commit."""
    for q, om in entries.items():
        st = states.get(q)
        if st is not None and om.offset > st.floor:
            st.floor = om.offset


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
    found: list[tuple[QueueReader, list[MessageExt], int, str]] = []
    for st, entries in zip(order, replies, strict=True):
        if not entries or states.get(st.mq) is not st or st.paused:
            continue
        keep = st.deliverable(entries)
        if keep < len(entries):
            if not keep:
                continue
            entries = entries[:keep]
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
        found.append((st, msgs, nxt, _last_below(entries, nxt)))
    if bad:
        store_malformed(bad)
    for st, msgs, nxt, last in found:
        st.pos = nxt
        st.after = last
        out.append(PollBatch(st.mq, msgs, nxt))


def _last_below(entries: Sequence[Any], nxt: int) -> str:
    """The id of the last of ``entries`` (in id order) below offset
    ``nxt``: where the read ended."""
    for eid, _ in reversed(entries):
        if offset_of(eid) < nxt:
            return eid.decode() if isinstance(eid, bytes) else str(eid)
    raise ValueError(f"no entry below offset {nxt}")
