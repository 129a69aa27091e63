"""What a message-grain member was delivered and has not handed to the
runtime yet (:mod:`.message_grain`).

A DISPATCH delivers as it runs: what it delivered is the member's on the
server, so it must reach the member's listener before any commit
acknowledges it.  :class:`ReadyBatches` keeps it per queue until the
runtime takes it (a poll that fails after its dispatches hands it over next
time), holds a queue's messages past a jump of offsets back (:mod:`.gaps`),
and keeps the malformed entries whose dead letter could not be stored yet,
to store them at the next poll."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping

from ..._types import MessageExt, MessageQueue, PollBatch
from .grain_share import Bad, Share
from .reading import QueueReader

__all__ = ["ReadyBatches"]

logger = logging.getLogger(__name__)


class ReadyBatches:
    """The member's batches collected and not handed over (``who``: the
    member, for the log)."""

    __slots__ = ("_ready", "_unstored", "stalled", "_who")

    def __init__(self, who: object) -> None:
        self._who = who
        self._ready: dict[MessageQueue, PollBatch] = {}
        #: Queues whose ready messages wait past a jump of offsets (not
        #: dispatched meanwhile, their sessions renewed as paused ones).
        self.stalled: set[MessageQueue] = set()
        #: Malformed entries delivered whose dead letter could not be stored
        #: yet (tried again at the next poll).
        self._unstored: list[Bad] = []

    def waiting(self, queue: MessageQueue) -> set[int]:
        """The offsets of ``queue`` not handed to the runtime yet: not its
        to acknowledge."""
        batch = self._ready.get(queue)
        return set() if batch is None else {m.queue_offset for m in batch.messages}

    def drop(self, queue: MessageQueue) -> None:
        """Forget ``queue``'s (its session lapsed: the others have them)."""
        self._ready.pop(queue, None)

    def put(
        self,
        got: Mapping[MessageQueue, tuple[list[MessageExt], list[Bad]]],
        states: Mapping[MessageQueue, QueueReader],
        shares: Mapping[MessageQueue, Share],
        merged: Collection[MessageQueue],
        store_malformed: Callable[[list[Bad]], None],
    ) -> None:
        """Ready ``got``'s messages (per queue, those of several DISPATCHes
        when in ``merged``) and dead-letter its malformed entries (with
        those not stored before); a malformed entry's offset counts as
        delivered once stored."""
        bad, self._unstored = self._unstored, []
        for q, (msgs, qbad) in got.items():
            st = states[q]
            bad += qbad
            last = max(msgs[-1].queue_offset if msgs else -1, max((b[0].queue_offset for b in qbad), default=-1))
            st.pos = max(st.pos, last + 1)
            before = self._ready.get(q)
            if before is not None:  # a failed poll's batch, not handed over yet
                msgs = before.messages + msgs
            if (before is not None or q in merged) and len(msgs) > 1:
                msgs.sort(key=lambda m: m.queue_offset)  # one DISPATCH's are in order, not several's
            self._ready[q] = PollBatch(q, msgs, st.pos)
        if not bad:
            return
        try:
            store_malformed(bad)
        except Exception as e:  # the good batches must reach the runtime: they are delivered
            logger.warning("%r: dead-lettering %d malformed entries failed (%s); tried again", self._who, len(bad), e)
            self._unstored = bad
            return
        for m, _ in bad:
            share = shares.get(m.queue)
            if share is not None and m.queue_offset in share.unstored:
                share.unstored.discard(m.queue_offset)
                share.bad.add(m.queue_offset)

    def take(self, shares: Mapping[MessageQueue, Share]) -> list[PollBatch]:
        """The batches ready, but a queue's messages past a jump of offsets,
        which stay until the runtime acknowledged those it has below it."""
        ready, self._ready = self._ready, {}
        self.stalled.clear()
        out = []
        for q, batch in ready.items():
            share = shares.get(q)
            msgs = batch.messages
            n = len(msgs) if share is None else share.deliverable(msgs)
            if n == len(msgs):
                out.append(batch)
                continue
            self._ready[q] = PollBatch(q, msgs[n:], batch.next_offset)
            self.stalled.add(q)
            if n:
                out.append(PollBatch(q, msgs[:n], msgs[n].queue_offset))
        return out
