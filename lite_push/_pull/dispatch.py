"""The dispatcher: what the pull thread gathered goes to the lanes.

The pull loop tracks each polled batch and hands it here (:meth:`add`:
one group per queue, a queue's batches joined); :meth:`route_pending` then
routes everything gathered with one put per lane per dispatch:

* KEY_ORDERLY: the compiled ``KeyRouter`` first takes back what the lanes
  released since the last dispatch (load placement: a lane appends
  ``(lane, messages)`` it is done with to ``released``, a deque, once per
  segment), so a key with no work left may move to the least-loaded lane.
  With the asyncio executor's admission, new keys go only to the lanes it
  lets run (``lane_limit``) once the keys with work are as many as the
  lanes (:func:`placement_limit`); until then each key gets a lane of its
  own, so admission, which lets the lanes with the most work run first,
  reaches the busiest keys one by one instead of lanes shared by several.
* CONCURRENTLY: round robin.
* QUEUE_ORDERLY: the baseline's per-queue service takes the groups.

A put that leaves a lane over ``lane_capacity`` blocks the queues that fed
it (``ProcessQueue.block_lane``); flow control pauses them.  After the puts
``flush`` is the one call into the event loop for async lanes.  The
dispatcher also hands lanes their due keys and :data:`~lite_push._state.timer.PURGE`,
and re-dispatches the pull thread's local retries.  Pull thread only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import replace

from .._exec.queue_orderly import QueueOrderlyService
from .._kernels.router import KeyRouter
from .._lanes.lanes import Lane, Segment, put_all
from .._state.process_queue import ProcessQueue
from .._state.shared import per_queue
from .._state.timer import PURGE, LaneWork, LocalRetry
from .._types import MessageExt, MessageQueue

__all__ = ["Dispatcher", "placement_limit", "Group"]

#: A queue's messages gathered for one dispatch, and its keyless lane.
Group = tuple[ProcessQueue, list[MessageExt], int]


def placement_limit(admitted: int, keys_with_work: int, lanes: int) -> int:
    """How many lanes (``0 .. n - 1``) load placement puts new keys on, when
    admission lets ``admitted`` lanes run at once: all ``lanes`` while the
    keys with work are fewer than the lanes (a key alone on its lane runs
    as often as its lane is admitted, and admission admits the lanes with
    the most work first: a key that lags catches up), else only the
    admitted ones (keys must share lanes then, and a key placed on a lane
    that runs starts sooner than on one waiting for a slot).

    Measured (``benchmarks/RESULTS.md``, issue 31): 1,000 keys on 2,048
    lanes at 10 ms a message, placing on the admitted lanes only packed
    about three keys on each, so the busiest keys advanced at a third of
    their pace and the run ended with their tail; 10,000 keys on 1,024
    lanes (``sms-60k``) run faster packed."""
    return lanes if keys_with_work < lanes else admitted


class Dispatcher:
    """Routing for the pull thread (see the module docstring)."""

    __slots__ = (
        "_capacity",
        "_flush",
        "_index",
        "_lane_limit",
        "_lanes",
        "_orderly",
        "_owned",
        "_pending",
        "_released",
        "_router",
        "_rr",
    )

    def __init__(
        self,
        lanes: list[Lane],
        owned: dict[MessageQueue, ProcessQueue],
        *,
        lane_capacity: int,
        flush: Callable[[], None],
        router: KeyRouter | None = None,
        released: deque[tuple[int, list[MessageExt]]] | None = None,
        lane_limit: Callable[[], int | None] | None = None,
        orderly: QueueOrderlyService | None = None,
    ) -> None:
        self._lanes = lanes
        #: The owned queues (assignment writes): a local retry of a queue no
        #: longer here is skipped.
        self._owned = owned
        self._capacity = lane_capacity
        #: After a dispatch's puts (async lanes: one call into the loop).
        self._flush = flush
        #: KEY_ORDERLY's router; ``None``: round robin (or the baseline).
        self._router = router
        #: Load placement: what the lanes are done with (``None``: fixed lanes).
        self._released = released
        #: The asyncio executor's admission: how many lanes new keys may go to.
        self._lane_limit = lane_limit if router is not None and router.tracks_load else None
        self._orderly = orderly
        # Batches tracked and not yet routed to lanes: one group per queue.
        self._pending: list[Group] = []
        self._index: dict[ProcessQueue, int] = {}
        self._rr = 0  # CONCURRENTLY and local retries: the next lane of the round robin

    def add(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Gather ``msgs`` (tracked in ``pq``) for the next dispatch."""
        at = self._index.get(pq)
        if at is None:
            self._index[pq] = len(self._pending)
            # a copy we own, so later batches of the queue extend it
            # (linear, where concatenating would copy it each time)
            self._pending.append((pq, list(msgs), pq.keyless_lane))
        else:
            self._pending[at][1].extend(msgs)

    def route_pending(self) -> None:
        """Hand the gathered messages to the lanes: one put per lane."""
        groups = self._pending
        if not groups:
            return
        self._pending = []
        self._index.clear()
        if self._orderly is not None:
            self._orderly.dispatch(groups)
            return
        lanes = self._lanes
        router = self._router
        if router is not None:
            if self._released:  # what the lanes finished since the last dispatch
                router.release_from(self._released)
            if self._lane_limit is not None:
                limit = self._lane_limit()  # the lanes admission lets run (asyncio)
                if limit is not None:
                    router.limit = placement_limit(limit, router.placed_keys(), len(lanes))
            segments, counts = router.route(groups)
        else:
            segments, counts = self._round_robin(groups, len(lanes))
        self._put(segments, counts)

    def _put(self, segments: list[list[Segment] | None], counts: list[int]) -> None:
        """One put per lane (a full lane blocks its queues), then a flush."""
        for i in put_all(self._lanes, segments, counts, self._capacity):
            for pq, _ in segments[i] or ():
                pq.block_lane(i)
        self._flush()

    # -- moving keys off a stuck lane (the stealer decides what; here is where) ------

    def _placing(self) -> KeyRouter:
        router = self._router
        if router is None:
            raise RuntimeError("keys move between lanes only under KEY_ORDERLY's router")
        return router

    def release_finished(self) -> None:
        """Hand the router what the lanes finished: every count current
        before anything moves."""
        if self._released:
            self._placing().release_from(self._released)

    def release(self, index: int, msgs: list[MessageExt]) -> None:
        """Lane ``index`` is done with ``msgs``."""
        self._placing().release(index, msgs)

    def stall(self, index: int) -> None:
        """New keys avoid lane ``index`` (its call is stuck)."""
        self._placing().stall(index)

    def unstall(self, index: int) -> None:
        """Lane ``index``'s call ended: new keys may go there again."""
        self._placing().unstall(index)

    def reroute(self, index: int, groups: list[Group]) -> None:
        """``groups``, taken off lane ``index``: released from it and routed
        anew by the placement rule, one put per lane."""
        router = self._placing()
        router.release(index, [m for _, ms, _ in groups for m in ms])
        segments, counts = router.route(groups)
        self._put(segments, counts)

    def _round_robin(self, groups: list[Group], n: int) -> tuple[list[list[Segment] | None], list[int]]:
        """CONCURRENTLY: message ``j`` of the dispatch goes to lane
        ``(start + j) % n``; one segment per queue batch per lane."""
        segments: list[list[Segment] | None] = [None] * n
        counts = [0] * n
        start = self._rr
        for pq, msgs, _ in groups:
            k = len(msgs)
            for j in range(min(n, k)):
                i = (start + j) % n
                sub = msgs[j::n]
                segs = segments[i]
                if segs is None:
                    segs = segments[i] = []
                segs.append((pq, sub))
                counts[i] += len(sub)
            start = (start + k) % n
        self._rr = start
        return segments, counts

    def put_due(self, per_lane: dict[int, list[LaneWork]]) -> None:
        """Hand lanes their due keys (one put per lane)."""
        for i, work in per_lane.items():
            self._lanes[i].put_due(work)

    def purge(self) -> None:
        """Every lane skips its parked messages of revoked queues."""
        for lane in self._lanes:
            lane.put_due([PURGE])
        self._flush()

    def flush(self) -> None:
        """After puts made outside :meth:`route_pending`."""
        self._flush()

    def retry_locally(self, local: list[LocalRetry]) -> None:
        """CONCURRENTLY messages whose send-back failed (or a BROADCASTING
        member's failures): run them again here (their offsets are still
        unfinished), spread over the lanes; a revoked queue's are skipped."""
        lanes = self._lanes
        n = len(lanes)
        owned = self._owned
        gone = [r for r in local if r.pq.dropped or r.pq.queue not in owned]
        for pq, ms in per_queue([(r.pq, r.message) for r in gone]).items():
            pq.skip(ms)
        puts: dict[int, list[Segment]] = {}
        for r in local:
            pq, msg = r.pq, r.message
            if not (pq.dropped or pq.queue not in owned):
                self._rr = (self._rr + 1) % n
                puts.setdefault(self._rr, []).append((pq, [replace(msg, reconsume_times=msg.reconsume_times + 1)]))
        for i, segs in puts.items():
            lanes[i].put(segs, len(segs))
