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

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from redis.exceptions import NoScriptError

from ..._types import MessageExt, PollBatch
from .._common import GC_PAUSE_MIN, gc_paused
from .._member_model import MemberModel
from .._owned import OwnedQueues
from .connection import Connection
from .message_grain import MessageGrain
from .read_ahead import ReadAhead
from .reading import SCAN_EXTRA, QueueReader, read_into
from .retries import Retries

__all__ = ["MIN_WAIT", "WAIT_SLICE", "PollRead"]

logger = logging.getLogger(__name__)

#: Longest sleep of a waiting poll between two reads (seconds); pub/sub
#: notifications usually end it sooner.
WAIT_SLICE = 0.25
#: Shortest such sleep.
MIN_WAIT = 0.001


class PollRead:
    """The pipelined read of one member (see the module docstring); the
    queues take turns being read first (round robin across polls)."""

    __slots__ = (
        "_ahead",
        "_check_open",
        "_conn",
        "_grain",
        "_group",
        "_model",
        "_owned",
        "_retries",
        "_rr",
        "_store_malformed",
    )

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
        self._ahead = ReadAhead()

    def __call__(self, max_per_queue: int, rebalance: bool = True) -> tuple[list[PollBatch] | None, float]:
        """One read: ``(batches, wait_hint)`` (how long a waiting poll may
        sleep before the next due retry or heartbeat); ``(None, 0)`` when
        the owned queues changed (or, ``rebalance`` False, are due to: then
        nothing was changed and, without message balance, nothing read is
        kept).

        The read's scripts (MOVE_DUE; by message, the DISPATCHes) go as
        bare EVALSHAs, so a read is one round trip (redis-py would ask
        SCRIPT EXISTS first on every read); a server without the scripts
        (restarted, flushed) is told it and the read runs again: nothing of
        a read that met NOSCRIPT was applied, here or on the server (a
        DISPATCH delivers as it runs: should the scripts have been flushed
        between two of them, the member asks what it was delivered, RESYNC).

        With ``rebalance`` False, a read sent ahead (:meth:`send_ahead`) is
        taken: each queue's reply if the queue is still owned, unpaused, not
        held and read from the same position (the others are read again
        later), if ``max_per_queue`` is the same and at least one queue's
        reply fits.  Else it is dropped and the read made now."""
        if self._ahead.pending:
            if not rebalance:
                got = self._take_ahead(max_per_queue)
                if got is not None:
                    return got
            else:
                self._ahead.drop()
        try:
            return self._read(max_per_queue, rebalance, loaded=True)
        except NoScriptError:
            logger.info("redis-server had lost lite_push's scripts; loading them")
            self._conn.load_scripts()
            if self._grain is not None:  # none of its scripts ran; should one have, RESYNC finds it
                self._grain.replies_lost()
            return self._read(max_per_queue, rebalance, loaded=True)

    @property
    def ahead(self) -> bool:
        """Whether a read sent ahead waits for its reply to be taken."""
        return self._ahead.pending

    def send_ahead(self, max_per_queue: int) -> None:
        """Send the next read now (by queue, on a single Redis server), for
        the next call with ``rebalance`` False to take: redis-server builds
        the reply while the caller does other work.  Nothing is sent by
        message, on a cluster, with nothing to read, or with a read out."""
        if self._ahead.pending or self._grain is not None or not self._conn.pipelines:
            return
        pipe, watched, order, pause = self._build(max_per_queue, loaded=True)
        if not order:
            pipe.reset()
            return
        self._ahead.send(pipe, _Sent(watched, order, [st.start() for st in order], max_per_queue, pause))

    def drop_ahead(self) -> None:
        """Forget a read sent ahead (closing: its connection is closed)."""
        self._ahead.drop()

    def _take_ahead(self, max_per_queue: int) -> tuple[list[PollBatch] | None, float] | None:
        """The read sent ahead, applied; ``None`` when it no longer fits
        (or met NOSCRIPT): the caller reads again."""
        sent: _Sent = self._ahead.note
        with gc_paused(sent.pause):
            res = self._ahead.receive()
        for r in res:
            if isinstance(r, NoScriptError):
                return None
            if isinstance(r, Exception):
                raise r
        if sent.max_per_queue != max_per_queue:
            return None
        # A queue's reply is used only if the queue is still owned (the same
        # reader), unpaused, not held, and still reads from where the reply
        # started; another queue's reply is dropped (its position unmoved,
        # the next read gets it again).
        states, watched = self._owned.states, sent.watched
        fit = [
            i
            for i, (st, pos) in enumerate(zip(sent.order, sent.starts, strict=True))
            if states.get(st.mq) is st and not st.paused and not st.waiting() and st.start() == pos
        ]
        if not fit:
            return None
        order = sent.order
        if len(fit) < len(order):
            order = [order[i] for i in fit]
            res = res[: watched + 1] + [res[watched + 1 + i] for i in fit]
        return self._apply(res, watched, order, max_per_queue, False, sent.pause)

    def _build(self, max_per_queue: int, loaded: bool) -> tuple[Any, int, list[QueueReader], bool]:
        """A read's pipeline: ``(pipe, watched, order, pause)``."""
        pipe = self._conn.pipeline(reader=True)
        watched = self._model.watch(pipe)
        self._retries.move_due(pipe, self._group, loaded=loaded)
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
            order = [st for st in order if st.mq not in grain.stalled]
            grain.queue_reads(pipe, order, max_per_queue, loaded=loaded)
        else:
            order = [st for st in order if not st.waiting()]
            for st in order:
                count = max_per_queue if st.tags is None else 4 * max_per_queue + SCAN_EXTRA
                pipe.xrange(st.log_key, st.start(), "+", count=count)
        # Parsing and decoding a big read only creates live objects: the
        # cyclic GC is paused meanwhile (else it runs a collection every
        # few hundred entries and costs a third of the read).
        return pipe, watched, order, n * max_per_queue >= GC_PAUSE_MIN

    def _read(self, max_per_queue: int, rebalance: bool, loaded: bool) -> tuple[list[PollBatch] | None, float]:
        pipe, watched, order, pause = self._build(max_per_queue, loaded)
        with gc_paused(pause):
            res = pipe.execute()
        return self._apply(res, watched, order, max_per_queue, rebalance, pause)

    def _apply(
        self, res: list[Any], watched: int, order: list[QueueReader], max_per_queue: int, rebalance: bool, pause: bool
    ) -> tuple[list[PollBatch] | None, float]:
        """Turn a read's replies into batches (see :meth:`__call__`)."""
        model = self._model
        due = self._retries.next_due_in(res[watched])
        out: list[PollBatch] = []
        grain = self._grain
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
            return out, self._wait_hint(due)
        if model.refresh(res[:watched], rebalance):  # the owned queues changed: what was read is dropped
            self._check_open()
            return None, 0.0
        with gc_paused(pause):
            read_into(
                out,
                order,
                res[watched + 1 :],
                max_per_queue,
                self._conn.namespace,
                self._owned.states,
                self._store_malformed,
            )
        return out, self._wait_hint(due)

    def _wait_hint(self, due: float | None) -> float:
        """How long a waiting poll may sleep (after the read's refresh): a
        wait slice, and never past the next due retry (``due`` seconds
        away) or the member's next heartbeat."""
        hint = WAIT_SLICE if due is None else max(MIN_WAIT, due)
        renew = self._model.renew_in()
        return hint if renew is None else min(hint, max(MIN_WAIT, renew))


class _Sent(NamedTuple):
    """What a read sent ahead was built from."""

    watched: int
    order: list[QueueReader]
    #: Where each queue's read started (``QueueReader.start()``).
    starts: list[str]
    max_per_queue: int
    pause: bool
