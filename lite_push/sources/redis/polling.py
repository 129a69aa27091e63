"""One poll of the Redis source: a single pipelined round trip.

It carries what the member's model watches (a CLUSTERING member's group
version), the move of the group's due retries, and a read of each owned,
unpaused queue (its stream from the read position; with message balance,
its DISPATCH), and turns the replies into batches (:mod:`.reading`, or the
message-grain member's :meth:`~.message_grain.MessageGrain.collect`).
:class:`PollRead` is called by ``poll`` (which may wait and rebalances) and
by ``poll_nowait`` (the event loop's read, which leaves a rebalance due to
``poll``).
"""

from __future__ import annotations

from collections.abc import Callable

from ..._types import MessageExt, PollBatch
from .._common import GC_PAUSE_MIN, gc_paused
from .._member_model import MemberModel
from .._owned import OwnedQueues
from .connection import Connection
from .message_grain import MessageGrain
from .reading import SCAN_EXTRA, QueueReader, read_into
from .retries import Retries

__all__ = ["MIN_WAIT", "WAIT_SLICE", "PollRead"]

#: Longest sleep of a waiting poll between two reads (seconds); pub/sub
#: notifications usually end it sooner.
WAIT_SLICE = 0.25
#: Shortest such sleep.
MIN_WAIT = 0.001


class PollRead:
    """The pipelined read of one member (see the module docstring); the
    queues take turns being read first (round robin across polls)."""

    __slots__ = ("_check_open", "_conn", "_grain", "_group", "_model", "_owned", "_retries", "_rr", "_store_malformed")

    def __init__(
        self,
        conn: Connection,
        retries: Retries,
        owned: OwnedQueues[QueueReader],
        model: MemberModel,
        grain: MessageGrain | None,
        *,
        group: str,
        store_malformed: Callable[[list[tuple[MessageExt, str]]], None],
        check_open: Callable[[], None],
    ) -> None:
        self._conn = conn
        self._retries = retries
        self._owned = owned
        self._model = model
        #: The model when the member balances by message (``None`` otherwise).
        self._grain = grain
        self._group = group
        #: Dead-letters an entry the read cannot decode.
        self._store_malformed = store_malformed
        self._check_open = check_open
        self._rr = 0

    def __call__(self, max_per_queue: int, rebalance: bool = True) -> tuple[list[PollBatch] | None, float]:
        """One read: ``(batches, wait_hint)`` (how long a waiting poll may
        sleep before the next due retry); ``(None, 0)`` when the owned queues
        changed (or, ``rebalance`` False, are due to: then nothing was
        changed and, without message balance, nothing read is kept)."""
        model = self._model
        pipe = self._conn.pipeline(reader=True)
        watched = model.watch(pipe)
        self._retries.move_due(pipe, self._group)
        active = self._owned.active
        n = len(active)
        if n:
            start = self._rr % n
            self._rr = start + 1
            order = active[start:] + active[:start]
        else:
            order = []
        grain = self._grain
        if grain is not None:
            order = [st for st in order if st.mq not in grain.held]
            grain.queue_reads(pipe, order, max_per_queue)
        else:
            order = [st for st in order if not st.waiting()]
            for st in order:
                count = max_per_queue if st.tags is None else 4 * max_per_queue + SCAN_EXTRA
                pipe.xrange(st.log_key, st.start(), "+", count=count)
        # Parsing and decoding a big read only creates live objects: the
        # cyclic GC is paused meanwhile (else it runs a collection every
        # few hundred entries and costs a third of the read).
        pause = n * max_per_queue >= GC_PAUSE_MIN
        with gc_paused(pause):
            res = pipe.execute()
        due = self._retries.next_due_in(res[watched])
        wait_hint = WAIT_SLICE if due is None else max(MIN_WAIT, due)
        out: list[PollBatch] = []
        if grain is not None:
            # What a dispatch delivered is this member's on the server: it is
            # kept for the runtime whatever the refresh changes or raises.
            with gc_paused(pause):
                grain.collect(order, res[watched + 1 :], self._store_malformed)
            changed = model.refresh(res[:watched], rebalance)
            out = grain.take_ready()
            if changed:
                self._check_open()
                return out or None, 0.0
            return out, wait_hint
        if model.refresh(res[:watched], rebalance):  # the owned queues changed: what was read is dropped
            self._check_open()
            return None, 0.0
        with gc_paused(pause):
            read_into(
                out, order, res[watched + 1 :], max_per_queue, self._conn.namespace, self._owned.states,
                self._store_malformed,
            )  # fmt: skip
        return out, wait_hint
