"""The pull loop: the one thread that talks to the source.

Each turn: ``poll`` (the source runs the rebalance callbacks inside it, see
``_assignment``), **track** each batch in its queue's ProcessQueue (offsets
in flight; the committed offset map's finished offsets dropped), keep
polling without waiting while more is ready (up to ``DISPATCH_BUDGET``; the
very first dispatch goes out with the first poll),
**route** what was gathered to the lanes with one put per lane
(``_dispatch``; after each poll, and so before it routes what the poll
returned, the lanes are handed the keys the application paused or resumed
since: ``_key_pauses``), then fire the timer's due work (``_timer``: parked keys
back to their lanes, local retries, held send-backs; and trim the memory
of ``key_min_interval``), store handed-off failures (``_failure_sender``),
apply flow control (``_flow_control``), commit every ``commit_interval``
(``_committer``) and, in QUEUE_ORDERLY, renew the broker locks.

Commits come every ``commit_interval``, and once more at the first quiet
moment of a spell of work: when something was routed since, a poll found
nothing more and no owned queue holds a message any more (caught up, not a
lull between two polls of a backlog), the pull thread commits at once, so the
committed offsets (``stats().committed``) and the lag show finished work
without waiting for the interval (a backlog consumed in one second is not
shown as the whole backlog for the next four).  That early commit is armed
at the start and again by each periodic commit that found nothing to move,
so a trickle of messages, each quiet moment after the other, still commits
about once per interval.  Either way a commit point is the lowest
unfinished offset: it never passes a message still held.

The poll's timeout is shortened to the timer's earliest entry, so a parked
key is never retried late by a waiting poll.  A gathering poll (``poll(0)``
while more is ready) that fails ends the gathering without a word: the next
regular poll meets the same error and reports it once per episode.

It never blocks indefinitely: a full lane pauses the queues that feed it
instead of blocking a put, and waiting for a revoked queue to drain is
bounded by ``revoke_timeout``; so heartbeats and lock renewals keep flowing
while the consumer is saturated.  When it leaves the loop (shutdown, or the
source closed) it runs the consumer's shutdown sequence.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ._assignment import Assignment
from ._clock import Clock
from ._committer import Committer
from ._config import ConsumerConfig
from ._dispatch import Dispatcher
from ._errors import SourceClosedError
from ._failure_sender import FailureSender
from ._flow_control import FlowControl
from ._key_pauses import KeyPauseSync
from ._lane_steal import LaneStealer
from ._process_queue import ProcessQueue
from ._rate_limit import KeyPacer
from ._shared import Episode, FailureLatch, QueueCounters
from ._timer import RetryTimer
from ._types import MessageQueue, PollBatch
from .sources._base import Balance, PullSource

__all__ = ["DISPATCH_BUDGET", "LOCK_RETRY_INTERVAL", "POLL_ERROR_BACKOFF", "PullLoop"]

logger = logging.getLogger(__name__)

#: After a poll returned messages, the pull thread polls again without
#: waiting, while more is ready, until it holds this many messages; then it
#: routes them all with one put per lane.
DISPATCH_BUDGET = 1024
#: Seconds between attempts to lock queues another member still holds
#: (QUEUE_ORDERLY).
LOCK_RETRY_INTERVAL = 1.0
#: Seconds the pull thread backs off after a failed poll.
POLL_ERROR_BACKOFF = 1.0


class PullLoop:
    """The pull thread's work (see the module docstring)."""

    def __init__(
        self,
        config: ConsumerConfig,
        source: PullSource,
        clock: Clock,
        owned: dict[MessageQueue, ProcessQueue],
        *,
        assignment: Assignment,
        dispatcher: Dispatcher,
        flow: FlowControl,
        committer: Committer,
        sender: FailureSender,
        timer: RetryTimer,
        queue_counters: dict[MessageQueue, QueueCounters],
        latch: FailureLatch,
        stopping: threading.Event,
        pacer: KeyPacer | None = None,
        renews_locks: bool = False,
        stealer: LaneStealer | None = None,
        key_pauses: KeyPauseSync | None = None,
    ) -> None:
        self._config = config
        self._source = source
        self._clock = clock
        #: The owned queues (assignment writes them, inside ``poll``).
        self._owned = owned
        self._assignment = assignment
        self._dispatcher = dispatcher
        self._flow = flow
        self._committer = committer
        self._sender = sender
        self._timer = timer
        #: Per queue: polled, filtered, pauses (a defaultdict: one per queue seen).
        self._queue_counters = queue_counters
        self._latch = latch
        self._stopping = stopping
        #: ``key_min_interval``: the pull thread trims its memory.
        self._pacer = pacer
        #: QUEUE_ORDERLY: renew the broker locks every ``lock_renew_interval``.
        self._renews_locks = renews_locks
        #: Moves keys off lanes stuck in a listener call (``None``: never).
        self._stealer = stealer
        #: Hands the lanes the keys the application paused or resumed
        #: (``None``: QUEUE_ORDERLY, which has no lanes).
        self._key_pauses = key_pauses
        #: Whether a gap between a queue's batches is offsets the source's tag
        #: filter passed over (counted as filtered).  A source that balances
        #: by message leaves gaps that other members took: not counted.
        self._counts_gaps = source.balance is not Balance.MESSAGE
        self._poll_episode = Episode("poll")
        self._dispatched = False  # whether anything was routed yet
        #: Whether the next quiet moment after work commits at once (armed at
        #: the start and by a periodic commit that had nothing to move).
        self._early_commit = True
        #: Whether anything was routed since the last early commit.
        self._worked = False

    def run(self, finish: Callable[[bool], None]) -> None:
        """Poll until ``stopping`` is set (or the source closed), then call
        ``finish(crashed)`` (the consumer's shutdown sequence)."""
        cfg = self._config
        source = self._source
        clock = self._clock
        timer = self._timer
        assignment = self._assignment
        next_commit = clock.monotonic() + cfg.commit_interval
        next_lock = clock.monotonic() + cfg.lock_renew_interval
        next_relock = clock.monotonic() + LOCK_RETRY_INTERVAL
        crashed = False
        try:
            while not self._stopping.is_set():
                timeout = cfg.poll_timeout
                due = timer.next_due()
                if due is not None:  # never sleep past a parked key's retry
                    timeout = min(timeout, max(0.0, due - clock.monotonic()))
                try:
                    batches = source.poll(timeout, cfg.pull_batch_size)
                except SourceClosedError:
                    logger.error("source closed under consumer %r; stopping", cfg.group)
                    break
                except Exception:
                    self._poll_episode.failed(cfg.group)  # logged once per episode, not per poll
                    clock.wait(self._stopping, POLL_ERROR_BACKOFF)
                    continue
                self._poll_episode.ok(cfg.group)
                assignment.renew_fences()
                if self._key_pauses is not None:  # after each poll: the lanes hold a key paused before it returned
                    self._key_pauses.apply()
                if self._stealer is not None and self._stealer.pending:
                    self._stealer.run()  # keys waiting behind a stuck call move to other lanes
                if batches:
                    self._gather(batches)
                now = clock.monotonic()
                if due is not None and due <= now:
                    self._fire_timers(now)
                if self._pacer is not None:
                    self._pacer.rotate(now)  # forget keys started longer ago than the interval
                if self._sender.pending:
                    self._sender.send(now)
                self._flow.apply()
                if now >= next_commit:
                    if not self._committer.commit_all():
                        self._early_commit = True  # nothing moved: the next spell of work commits when it is done
                    next_commit = now + cfg.commit_interval
                elif not batches and self._early_commit and self._worked and self._committer.quiet():
                    self._committer.commit_all()  # the first quiet moment: show the finished work now
                    self._early_commit = self._worked = False
                    next_commit = now + cfg.commit_interval
                if self._renews_locks:
                    if now >= next_lock:
                        assignment.renew_locks()
                        next_lock = now + cfg.lock_renew_interval
                    elif now >= next_relock:
                        assignment.retry_locks()
                        next_relock = now + LOCK_RETRY_INTERVAL
        except BaseException as e:
            crashed = True
            logger.exception("pull thread of consumer %r died; shutting down", cfg.group)
            self._latch.fail(e)
            if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit: not ours to swallow
                raise
        finally:
            finish(crashed)

    # -- poll -> track -> route ------------------------------------------------------

    def _gather(self, batches: list[PollBatch]) -> None:
        """Track a poll's batches, keep polling without waiting while more is
        ready (up to ``DISPATCH_BUDGET`` messages, and never past
        ``lane_capacity``, so one dispatch cannot overfill a lane by more than
        a capacity and a poll), then route it all at once: one put per lane
        per dispatch, so lanes wake once per dispatch rather than once per
        poll."""
        cfg = self._config
        first = not self._dispatched
        self._worked = True
        total = self._track(batches)
        # The first dispatch goes out with the first poll: at a start every
        # lane waits, and a full budget's polls would keep them waiting.
        budget = 0 if first else min(DISPATCH_BUDGET, cfg.lane_capacity)
        while total < budget:
            try:
                more = self._source.poll(0.0, cfg.pull_batch_size)
            except Exception:
                break  # the next regular poll reports it
            if not more:
                break
            self._assignment.renew_fences()  # the poll may have assigned queues
            if self._key_pauses is not None:
                self._key_pauses.apply()
            total += self._track(more)
        self._dispatcher.route_pending()
        self._dispatched = True
        # Give the GIL up once: the lanes just woken (the event loop, lane
        # threads) start their calls now instead of after a whole switch
        # interval (5 ms) of this thread decoding the next polls.
        time.sleep(0)

    def _track(self, batches: list[PollBatch]) -> int:
        """Add polled batches to their ProcessQueues and gather them for the
        next dispatch; pause at once every queue that crossed a threshold,
        so gathering more polls never overshoots one by more than a batch."""
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

    # -- the timer -------------------------------------------------------------------

    def _fire_timers(self, now: float) -> None:
        """Hand due parked keys to their lanes (one put per lane),
        re-dispatch due local retries and store due held send-backs."""
        fired = self._timer.fire(now)
        dispatcher = self._dispatcher
        if fired.per_lane:
            dispatcher.put_due(fired.per_lane)
        if fired.local:
            dispatcher.retry_locally(fired.local)
        if fired.held:
            self._sender.send_held(fired.held, now)
        dispatcher.flush()
