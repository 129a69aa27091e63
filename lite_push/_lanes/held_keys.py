"""Held keys: dead letters that keep a key's order (``dead_letter_order="key"``).

By default (``"message"``) a dead-lettered message lets its key move on: the
key's later messages run, so a dead letter resent later lands after newer
messages of its key.  With ``"key"`` (KEY_ORDERLY only), once a message of
key ``K`` from queue ``q`` is dead-lettered, ``K`` is *held* in ``q``: each
later message of ``K`` from ``q`` that reaches a lane is not given to the
listener but dead-lettered too, in offset order, marked as held behind the
first (:data:`~lite_push.sources.contract.HELD_BEHIND`); other keys, and ``K``
in other queues, run as usual.  Offsets are per queue, so order is too.

``lite_push.dlq.resend_key`` releases ``K``: it sends ``K``'s open held
letters back to their queue in ``K``'s order, each copy naming the place
it stands for (:data:`~lite_push.sources.contract.RESENT_OF`), then writes a
release record.  The hold is the ordered places of ``K``'s open letters in
``q`` (``dlq._held_log`` says what a place is): a copy of the first place runs
(and takes it off); once none is left, ``K`` is released in ``q`` and its
later messages run.  Anything else of ``K`` waits behind: a message that
arrived between the tool's read and the copies (it is later than the
letters), and a copy of a later place while an earlier one failed again
(that copy was dead-lettered again, keeping its place at the front), each
dead-lettered with its place, so ``K`` stays held until they are resent
too.  A copy of a place before the first (one resent twice) runs.

**Surviving a restart or a rebalance.**  The dead-letter topic is the
record (``dlq._held_log``).  When the consumer gains queues it reads what the
topic holds beyond what it read before and holds, in each gained queue,
the keys with open letters from it; and, where a release's copies were not
all consumed yet (the queue starts at or below the last copy's offset), the
key stays held in that queue until its messages pass the last copy, so a
message older than the copies still waits behind them.  A revoked queue's
held keys are forgotten: its next owner reads them back.  A key's state in
a queue is changed only by the lane that has the key (a key is on one lane
at a time) and by the pull thread when queues come and go.

**Cost.**  :attr:`HeldKeys.keys` is replaced whole under the lock, never
changed in place, so lanes read it without one: while no key is held it is
empty and a lane's only cost is one truth test per segment.  While some key
is held, segments go the slow way and each message costs a look-up of its
key; a message of a held key takes the lock once.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import replace

from .._state.process_queue import ProcessQueue
from .._state.shared import KeyOf
from .._types import MessageExt, MessageQueue
from ..dlq._held_log import HeldLog, QueueId, logical_origin
from ..sources.contract import HELD_BEHIND, HELD_KEY, RESENT_OF, DeadLetterReader

__all__ = ["HELD_KEYS_SHOWN", "NOTHING_HELD", "HeldKeys", "QueueHold"]

logger = logging.getLogger(__name__)

#: Most held keys ``stats()`` names.
HELD_KEYS_SHOWN = 20


class QueueHold:
    """One key held in one queue: the offsets (logical origins) of its open
    held letters there, in order, and (read back after a release) the
    offset of the last copy still to come."""

    __slots__ = ("_members", "_order", "awaiting")

    def __init__(self) -> None:
        self._order: deque[int] = deque()  # ascending; taken from the front
        self._members: set[int] = set()
        self.awaiting: int | None = None

    def __bool__(self) -> bool:
        return bool(self._order) or self.awaiting is not None

    @property
    def first(self) -> int | None:
        """The first held place's offset (``None``: none)."""
        return self._order[0] if self._order else None

    def add(self, offset: int) -> None:
        """Hold the place at ``offset`` (in order; once)."""
        if offset in self._members:
            return
        self._members.add(offset)
        order = self._order
        if not order or offset > order[-1]:
            order.append(offset)  # the usual case: later than all
        else:
            order.insert(bisect.bisect(order, offset), offset)

    def take_first(self) -> None:
        """The first held place came back (its copy runs)."""
        self._members.discard(self._order.popleft())


#: Key -> queue -> its hold there.
Holds = dict[str, dict[QueueId, QueueHold]]


class HeldKeys:
    """The keys one consumer holds (see the module docstring): written by
    the lanes (:meth:`letter`, :meth:`behind`) and the pull thread
    (:meth:`gained`, :meth:`revoked`), read by ``stats()``.  ``reader``
    reads the group's dead-letter topic (``None``: nothing is read back)."""

    __slots__ = ("_group", "_key_of", "_lock", "_log", "_reader", "keys")

    def __init__(self, group: str, *, key_of: KeyOf | None = None, reader: DeadLetterReader | None = None) -> None:
        self._group = group
        self._key_of = key_of
        self._reader = reader
        #: Guards changes of :attr:`keys` and of the holds in it.
        self._lock = threading.Lock()
        #: What the dead-letter topic held when last read (pull thread).
        self._log = HeldLog()
        #: Key -> queue -> hold.  Replaced whole, never changed in place (a
        #: hold's contents are, under the lock): lanes read it without one.
        self.keys: Holds = {}

    def _key(self, msg: MessageExt) -> str | None:
        return (msg.keys if self._key_of is None else self._key_of(msg)) or None

    def _hold(self, keys: Holds, key: str, queue: QueueId) -> QueueHold:
        """``key``'s hold in ``queue`` in ``keys`` (a copy of :attr:`keys`
        being built), made if missing."""
        per = keys.get(key)
        per = keys[key] = {} if per is None else dict(per)
        hold = per.get(queue)
        if hold is None:
            hold = per[queue] = QueueHold()
        return hold

    def _release(self, key: str, queue: QueueId) -> None:
        """``key`` is no longer held in ``queue`` (under the lock)."""
        keys = dict(self.keys)
        per = {q: h for q, h in keys[key].items() if q != queue}
        if per:
            keys[key] = per
        else:
            del keys[key]
        self.keys = keys

    # -- the lanes -------------------------------------------------------------

    def letter(self, pq: ProcessQueue, msg: MessageExt) -> MessageExt:
        """``msg`` failed for good and goes to the dead-letter topic: its key
        is held in its queue from now on, at ``msg``'s place.  Returns the
        dead letter to store (``msg`` marked with :data:`HELD_KEY`; a keyless
        one as it is: it holds nothing)."""
        key = self._key(msg)
        if key is None:
            return msg
        queue = (pq.queue.topic, pq.queue.queue_id)
        place = logical_origin(msg)
        with self._lock:
            per = self.keys.get(key)
            hold = None if per is None else per.get(queue)
            if hold is None:
                keys = dict(self.keys)
                hold = self._hold(keys, key, queue)
                self.keys = keys
            hold.add(place[2])
        return replace(msg, properties={**msg.properties, HELD_KEY: key})

    def behind(self, pq: ProcessQueue, msg: MessageExt) -> tuple[MessageExt, str] | None:
        """If ``msg``'s key is held in its queue and ``msg`` must wait behind
        it: the dead letter to store instead of running it (marked with
        :data:`HELD_KEY` and :data:`HELD_BEHIND`) and the reason.  ``None``:
        run it (its key is not held there, it is the copy of the first held
        place, or it is the last thing its key waited for)."""
        key = self._key(msg)
        if key is None or key not in self.keys:
            return None
        queue = (pq.queue.topic, pq.queue.queue_id)
        with self._lock:
            per = self.keys.get(key)
            hold = None if per is None else per.get(queue)
            if hold is None:
                return None
            if hold.awaiting is not None and msg.queue_offset >= hold.awaiting:
                hold.awaiting = None  # the resent copies are behind us
            first = hold.first
            place = logical_origin(msg)
            copy = RESENT_OF in msg.properties and place[:2] == queue
            if copy and (first is None or place[2] <= first):
                if place[2] == first:
                    hold.take_first()  # it comes back, in its turn
            elif hold:
                hold.add(place[2])
                ahead = f"{queue[0]}/{queue[1]}/{hold.first}"
                marked = replace(msg, properties={**msg.properties, HELD_KEY: key, HELD_BEHIND: ahead})
                return marked, f"key {key!r} is held behind the dead letter of {ahead}"
            if not hold:
                self._release(key, queue)
                logger.info("consumer %r: key %r released in %s", self._group, key, pq.queue)
            return None

    # -- the pull thread -------------------------------------------------------

    def gained(self, positions: Mapping[MessageQueue, int]) -> None:
        """The consumer gained these queues, each starting at its position:
        read what the dead-letter topic holds beyond what was read before,
        and hold in each gained queue what it holds there.  A read that
        fails is logged and holds what was read before."""
        reader = self._reader
        if reader is None or not positions:
            return
        log = self._log
        t0 = time.monotonic()
        try:
            n = log.read(reader, self._group)
        except Exception:
            logger.exception(
                "consumer %r: reading its dead-letter topic failed; keys it holds from before may run out of "
                "order in %s",
                self._group,
                sorted(map(str, positions)),
            )
        else:
            if n:
                logger.info(
                    "consumer %r: read %d dead-letter record(s) in %.3f s; %d key(s) hold letters",
                    self._group,
                    n,
                    time.monotonic() - t0,
                    len(log.open),
                )
        at = {(q.topic, q.queue_id): p for q, p in positions.items()}
        with self._lock:
            keys = dict(self.keys)
            for key, letters in log.open.items():
                for x in sorted(letters.values(), key=lambda x: x.place):
                    if x.queue in at:
                        self._hold(keys, key, x.queue).add(x.place[2])
            for key, copies in log.copies.items():
                for queue, last in copies.items():
                    if queue in at and at[queue] <= last:
                        self._hold(keys, key, queue).awaiting = last
            self.keys = keys

    def revoked(self, queues: Collection[MessageQueue]) -> None:
        """The consumer gave these queues up: forget their held keys (their
        next owner reads them back)."""
        gone = {(q.topic, q.queue_id) for q in queues}
        with self._lock:
            if not any(q in gone for per in self.keys.values() for q in per):
                return
            keys: Holds = {}
            for key, per in self.keys.items():
                rest = {q: h for q, h in per.items() if q not in gone}
                if rest:
                    keys[key] = rest
            self.keys = keys

    # -- readers ---------------------------------------------------------------

    def shown(self, limit: int = HELD_KEYS_SHOWN) -> tuple[int, tuple[str, ...]]:
        """How many keys are held now, and the first ``limit`` of them,
        sorted (any thread)."""
        keys = self.keys
        return len(keys), tuple(sorted(keys)[:limit])


#: Holds nothing and is never written: the lanes' view when
#: ``dead_letter_order`` is ``"message"``.
NOTHING_HELD = HeldKeys("")
