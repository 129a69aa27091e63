"""Moving keys off a lane whose task is stuck in a listener call.

A lane runs its keys one call at a time, so a call that hangs (a downstream
that stopped answering for one account) would hold every other key queued
on the same lane behind it while other lanes idle.  The call watch
(``_exec.call_watch``) notices a call older than ``steal_after`` and asks the
pull thread, which owns the router, to *steal* from that lane
(:meth:`LaneStealer.request`, then :meth:`LaneStealer.run` on the pull
thread's next turn):

1. The lane's task is kept where it is: under the lane's lock the stealer
   sets ``lane.moving`` and checks that ``lane.call`` is still the stuck
   call (see ``_lanes.lanes``): the task, when the call returns, waits in
   ``Lane.settle`` until the stealer is done.
2. What stays: the keys of the call, the keys parked in the lane (their
   messages wait in the lane's ``ParkedKeys``: failed, paced or paused) and
   keyless messages (they keep their queue's order on its lane).
3. What moves: every other key's messages the task holds but has not
   started (the rest of the segment it is in, the segments after it) and
   every message queued in the lane, whole and in offset order.  What the
   task already finished in the segment it is in (not yet released to the
   router, which releases per segment) is completed and released first, so
   a key that ran there earlier moves too; the task is told through
   ``lane.cut`` / the emptied ``lane.done``.
4. The moved messages are released from the stuck lane and routed anew by
   the placement rule (:meth:`Dispatcher.reroute <lite_push._pull.dispatch.Dispatcher.reroute>`:
   the stealer decides what moves, the dispatcher where), with the stuck
   lane *stalled* in the router (no new key goes there) until its call ends.  A key is thus on one lane at a
   time throughout, and its messages run in offset order.

Only load placement moves keys (fixed placements pin a key to its lane).
Pull thread only, except :meth:`LaneStealer.request` (the call watch).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from .._lanes.lanes import Call, Lane, Segment
from .._state.process_queue import ProcessQueue
from .._state.shared import Counters, KeyOf
from .._tracing import stolen
from .._types import MessageExt
from .dispatch import Dispatcher

__all__ = ["LaneStealer"]

logger = logging.getLogger(__name__)

Item = tuple[ProcessQueue, MessageExt]


def _index_of(msgs: list[MessageExt], msg: MessageExt) -> int:
    """The position of ``msg`` itself (not an equal one) in ``msgs``; -1."""
    for i in range(len(msgs) - 1, -1, -1):
        if msgs[i] is msg:
            return i
    return -1


class LaneStealer:
    """Moves the keys queued behind a stuck call (see the module docstring)."""

    __slots__ = (
        "_counters",
        "_dispatcher",
        "_group",
        "_key_of",
        "_lanes",
        "_parked",
        "_requests",
        "_stalled",
        "_wake",
    )

    def __init__(
        self,
        lanes: list[Lane],
        *,
        dispatcher: Dispatcher,
        parked: list[dict[Hashable, Any]],
        counters: Counters,
        group: str,
        wake: Callable[[], None],
        key_of: KeyOf | None = None,
    ) -> None:
        self._lanes = lanes
        self._group = group
        #: Where moved messages go: the router's placement, the lanes' puts.
        self._dispatcher = dispatcher
        #: Each lane's parked keys (its ``ParkedKeys.keys``): read only while
        #: the lane's task is kept in its call.
        self._parked = parked
        self._counters = counters
        #: Cuts the pull thread's poll short.
        self._wake = wake
        self._key_of = key_of
        #: ``(lane, call)`` the call watch found stuck (any thread appends).
        self._requests: deque[tuple[int, Call]] = deque()
        #: Stalled lanes -> the call they are stuck in.
        self._stalled: dict[int, Call] = {}

    def request(self, lane: int, call: Call) -> None:
        """(the call watch) Lane ``lane`` has been in ``call`` too long:
        move what waits behind it on the pull thread's next turn."""
        self._requests.append((lane, call))
        self._wake()

    @property
    def pending(self) -> bool:
        """Whether :meth:`run` has anything to do."""
        return bool(self._requests) or bool(self._stalled)

    def stalled(self) -> frozenset[int]:
        """The lanes new keys avoid now (their call is stuck)."""
        return frozenset(self._stalled)

    def run(self) -> None:
        """(pull thread) Un-stall lanes whose call ended, then steal from
        the lanes the call watch asked about."""
        lanes = self._lanes
        for i, call in list(self._stalled.items()):
            if lanes[i].call is not call:
                del self._stalled[i]
                self._dispatcher.unstall(i)
        requests = self._requests
        while requests:
            i, call = requests.popleft()
            self.steal(i, call)

    def steal(self, index: int, call: Call) -> int:
        """(pull thread) If lane ``index`` is still in ``call``, move what
        waits behind it; return how many messages moved."""
        lane = self._lanes[index]
        dispatcher = self._dispatcher
        dispatcher.release_finished()  # every count current before anything moves
        finished: list[Segment] = []
        moved: list[Item] = []

        def change(queued: list[Segment]) -> list[Segment]:
            # The task is kept in ``call``: what it holds may change.
            stay = self._stay_keys(index, call)
            front: list[Segment] = []
            if lane.stolen_for is not call:
                lane.stolen_for = call
                self._from_hand(lane, call, stay, front, moved, finished)
            kept: list[Segment] = []
            self._split(queued, stay, kept, moved)
            for _, ms in finished:
                self._counters.consumed[index] += len(ms)  # the lane's counter: its task is kept in its call
            return front + kept

        if not lane.while_in_call(call, change):
            return 0
        for pq, ms in finished:
            pq.complete(ms)
            dispatcher.release(index, ms)
        if index not in self._stalled:
            self._stalled[index] = call
            dispatcher.stall(index)
        if moved:
            self._move(index, moved)
            stolen(call[0], len(moved))  # an event on the call's span, when traced
            self._counters.steals += 1
            self._counters.stolen += len(moved)
            logger.info(
                "consumer %r: lane %d is stuck in a listener call (key %r); %d message(s) of other keys moved "
                "to other lanes",
                self._group,
                index,
                self._key(call[0][0]),
                len(moved),
            )
        return len(moved)

    def _key(self, msg: MessageExt) -> Hashable:
        return msg.keys if self._key_of is None else self._key_of(msg)

    def _stay_keys(self, index: int, call: Call) -> set[Hashable]:
        """The keys that stay on the stuck lane: the call's and the parked."""
        stay: set[Hashable] = set(self._parked[index])
        for m in call[0]:
            key = self._key(m)
            if key:
                stay.add(key)
        return stay

    def _split(self, segments: list[Segment], stay: set[Hashable], kept: list[Segment], moved: list[Item]) -> None:
        """Split ``segments`` into what stays (appended to ``kept``, in
        order) and what moves (to ``moved``, in order)."""
        key_of = self._key
        for pq, msgs in segments:
            keep: list[MessageExt] = []
            for m in msgs:
                key = key_of(m)
                if not key or key in stay:
                    keep.append(m)
                else:
                    moved.append((pq, m))
            if keep:
                kept.append((pq, keep))

    def _from_hand(
        self,
        lane: Lane,
        call: Call,
        stay: set[Hashable],
        front: list[Segment],
        moved: list[Item],
        finished: list[Segment],
    ) -> None:
        """(the task kept in its call) Take what the task holds and has not started:
        the rest of its segment and the segments after it.  What stays
        goes to ``front`` (it runs before what is queued); what the task
        finished in its segment goes to ``finished``."""
        hand = lane.hand
        seg = lane.seg
        k = -1  # the segment the call is in (-1: a due key's call, before the take's segments)
        if seg is not None:
            k = next((i for i, (_, ms) in enumerate(hand) if ms is seg), -2)
            p = _index_of(seg, call[0][-1]) if k >= 0 else -1
            if p < 0:
                return  # not where the task is: leave what it holds alone
            pq = hand[k][0]
            tail = seg[p + 1 :]
            del seg[p + 1 :]
            self._split([(pq, tail)], stay, front, moved)
            done = lane.done
            if done is None:  # the hot path: everything before the call succeeded
                first = p + 1 - len(call[0])
                if first > 0:
                    finished.append((pq, seg[:first]))
                    del seg[:first]
                    lane.cut += first
            elif done:
                finished.append((pq, list(done)))
                done.clear()
        later = hand[k + 1 :]
        del hand[k + 1 :]
        self._split(later, stay, front, moved)

    def _move(self, index: int, moved: list[Item]) -> None:
        """Release ``moved`` from lane ``index`` and route it anew (the
        lane stalled), one put per lane."""
        groups: list[tuple[ProcessQueue, list[MessageExt], int]] = []
        for pq, m in moved:  # runs of one queue, in order
            if groups and groups[-1][0] is pq:
                groups[-1][1].append(m)
            else:
                groups.append((pq, [m], pq.keyless_lane))
        self._dispatcher.reroute(index, groups)
