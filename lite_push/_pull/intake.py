"""Poll -> track -> route: what the pull side does with what it polled.

A poll's batches are **tracked**, each in its queue's ProcessQueue
(offsets in flight; offsets the committed offset map says finished are
dropped), and gathered for the next dispatch; the pull side keeps polling
without waiting while more is ready, up to ``DISPATCH_BUDGET`` messages
(the very first dispatch goes out with the first poll), then **routes**
all of it with one put per lane (``_pull.dispatch``).  After every poll,
before what it returned is routed, the lanes are handed what changed
since (``_pull.poll_sync``: fences, key pauses; steals once a turn).

A queue that crosses a flow-control threshold while it is tracked is
paused at once (``_pull.flow_control``), so gathering more polls never
overshoots one by more than a batch.  A gathering poll that fails ends
the gathering without a word: the next regular poll meets the same error
and reports it.  Pull side only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .._config import ConsumerConfig
from .._state.process_queue import ProcessQueue
from .._state.shared import QueueCounters
from .._types import MessageQueue, PollBatch
from ..sources.contract import Balance, PullSource
from .dispatch import Dispatcher
from .flow_control import FlowControl
from .poll_sync import PollSync

__all__ = ["DISPATCH_BUDGET", "Intake"]

logger = logging.getLogger(__name__)

#: After a poll returned messages, the pull side polls again without
#: waiting, while more is ready, until it holds this many messages (or
#: ``lane_capacity``, if fewer); then it routes them all with one put per
#: lane.  A lane's run of one queue's messages from one dispatch is one
#: segment, and a segment's costs (a put, a completion, a release to the
#: router) are the same for one message or eight: with a thousand keys
#: over as many lanes a key has about one message per thousand routed, so
#: the larger the dispatch the fewer segments per message.  Measured on the
#: embedded broker, 1,000 keys, 1 ms listeners, everything on the event
#: loop: 1,024 gave 0.40 segments per message and 7.3-10.3 us of CPU per
#: message, 4,096 0.17-0.19 and 5.5-6.2 (RESULTS.md, issue 40).
DISPATCH_BUDGET = 4096


class Intake:
    """Tracks what the pull side polled and routes it (see the module
    docstring)."""

    def __init__(
        self,
        config: ConsumerConfig,
        *,
        source: PullSource,
        owned: dict[MessageQueue, ProcessQueue],
        dispatcher: Dispatcher,
        flow: FlowControl,
        queue_counters: dict[MessageQueue, QueueCounters],
        sync: PollSync,
    ) -> None:
        #: A dispatch gathers at most ``min(DISPATCH_BUDGET, lane_capacity)``.
        self._budget = min(DISPATCH_BUDGET, config.lane_capacity)
        #: Pauses the queues that crossed a threshold.
        self._source = source
        #: The owned queues (assignment writes them, inside ``poll``).
        self._owned = owned
        self._dispatcher = dispatcher
        #: Says whether a queue crossed a threshold.
        self._flow = flow
        #: Per queue: polled, filtered, pauses (a defaultdict: one per queue seen).
        self._queue_counters = queue_counters
        self._sync = sync
        #: Whether a gap between a queue's batches is offsets the source's tag
        #: filter passed over (counted as filtered).  A source that balances
        #: by message leaves gaps that other members took: not counted.
        self._counts_gaps = source.balance is not Balance.MESSAGE
        self._dispatched = False  # whether anything was routed yet

    def turn(self, batches: list[PollBatch], more: Callable[[], list[PollBatch]]) -> None:
        """A turn's poll returned ``batches`` (``more``: a poll that does
        not wait, for gathering): hand the lanes what changed, then track
        and route what was polled."""
        self._sync.turn()
        if batches:
            self._gather(batches, more)

    def _gather(self, batches: list[PollBatch], more: Callable[[], list[PollBatch]]) -> None:
        """Track a poll's batches, keep polling without waiting while more is
        ready (up to the budget, so one dispatch cannot overfill a lane by
        more than a capacity and a poll), then route it all at once: one put
        per lane per dispatch, so lanes wake once per dispatch rather than
        once per poll."""
        total = self._track(batches)
        # The first dispatch goes out with the first poll: at a start every
        # lane waits, and a full budget's polls would keep them waiting.
        budget = self._budget if self._dispatched else 0
        while total < budget:
            if all(pq.paused for pq in self._owned.values()):
                break  # nothing a poll could read (by message, a round trip for nothing)
            try:
                got = more()
            except Exception:
                break  # the next regular poll reports it
            if not got:
                break
            self._sync.polled()  # the poll may have assigned queues
            total += self._track(got)
        self._dispatcher.route_pending()
        self._dispatched = True

    def _track(self, batches: list[PollBatch]) -> int:
        """Add polled batches to their ProcessQueues and gather them for the
        next dispatch; pause at once every queue that crossed a threshold."""
        owned = self._owned
        add = self._dispatcher.add
        counters = self._queue_counters
        over_threshold = self._flow.over_threshold
        counts_gaps = self._counts_gaps
        to_pause: list[MessageQueue] = []
        total = 0
        for batch in batches:
            pq = owned.get(batch.queue)
            if pq is None:
                logger.warning("poll returned messages of %s, which is not assigned; ignored", batch.queue)
                continue
            msgs = batch.messages
            st = counters[batch.queue]
            st.polled += len(msgs)
            if counts_gaps:
                nxt = pq.next_offset
                skipped = batch.next_offset - nxt - len(msgs)  # offsets the tag filter passed over
                if msgs and msgs[0].queue_offset < nxt:
                    # Late messages (below what this queue polled) skip nothing.
                    skipped += sum([1 for m in msgs if m.queue_offset < nxt])
                if skipped > 0:
                    st.filtered += skipped
            if pq.finished is not None:
                msgs = pq.drop_finished(msgs, batch.next_offset)
            count, size, span, map_bytes = pq.add_batch(msgs, batch.next_offset)
            if msgs:
                add(pq, msgs)
                total += len(msgs)
            if not pq.paused and over_threshold(count, size, span, map_bytes):
                pq.pause()
                to_pause.append(batch.queue)
                st.pauses += 1
        if to_pause:
            self._source.pause(to_pause)
        return total
