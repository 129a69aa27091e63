"""The pull loop: the one thread that talks to the source.

Each turn: ``poll`` (the source runs the rebalance callbacks inside it, see
``_pull.assignment``), **track** each batch in its queue's ProcessQueue (offsets
in flight; the committed offset map's finished offsets dropped), keep
polling without waiting while more is ready (up to ``DISPATCH_BUDGET``; the
very first dispatch goes out with the first poll),
**route** what was gathered to the lanes with one put per lane
(``_pull.dispatch``; after each poll, and so before it routes what the poll
returned, the lanes are handed the keys the application paused or resumed
since: ``_pull.key_pauses``), then fire the timer's due work (``_state.timer``: parked keys
back to their lanes, local retries, held send-backs; and trim the memory
of ``key_min_interval``), store handed-off failures (``_pull.failure_sender``),
apply flow control (``_pull.flow_control``), commit every ``commit_interval``
(``_pull.committer``) and, in QUEUE_ORDERLY, renew the broker locks.

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

Two drivers run the same turn (:meth:`PullLoop.turn`, a generator that
yields each call that may block: storing failures, commits, lock renewals):

* :meth:`PullLoop.run`, the **pull thread** (thread executor): it polls with
  a timeout and makes the blocking calls itself.
* :meth:`PullLoop.run_on_loop`, a **task on the event loop** (asyncio
  executor): the source is read on the loop's own thread
  (``PullSource.poll_nowait``), so a message crosses no thread between the
  source and its listener call.  What may block runs on a helper thread
  (``blocking``: one call per hand-off, per batch or per turn, never per
  message) while the task awaits it, so the loop keeps running the lanes:
  a poll that waits because nothing is ready, a poll the source says must be
  a blocking one (a rebalance is due: its listener waits for the revoked
  queues' listener calls, which run on this very loop), and the turn's
  blocking calls.  The task and the helper never run pull-side code at
  once: the task waits for each call it hands over.  After each read that
  had messages, and before it yields to the lanes after a turn that had
  messages, the task asks the source to send its next read now
  (``PullSource.prefetch``; Redis: the pipelined read on a connection of
  its own), so the server builds that reply while the task tracks and
  routes, and while the lanes run; the next ``poll_nowait`` takes it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from functools import partial
from typing import Protocol, TypeVar

from .._clock import Clock
from .._config import ConsumerConfig
from .._errors import SourceClosedError
from .._lanes.rate_limit import KeyPacer
from .._state.process_queue import ProcessQueue
from .._state.shared import Episode, FailureLatch, QueueCounters
from .._state.timer import RetryTimer
from .._types import MessageQueue, PollBatch
from ..sources.contract import Balance, PullSource
from .assignment import Assignment
from .committer import Committer
from .dispatch import Dispatcher
from .failure_sender import FailureSender
from .flow_control import FlowControl
from .key_pauses import KeyPauseSync
from .lane_steal import LaneStealer

__all__ = [
    "DISPATCH_BUDGET",
    "LOCK_RETRY_INTERVAL",
    "POLL_ERROR_BACKOFF",
    "Blocking",
    "PullLoop",
    "RunBlocking",
    "Turn",
]

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
#: Seconds between attempts to lock queues another member still holds
#: (QUEUE_ORDERLY).
LOCK_RETRY_INTERVAL = 1.0
#: Seconds the pull thread backs off after a failed poll.
POLL_ERROR_BACKOFF = 1.0

#: A call of the pull side that may block (a commit, storing failures, a
#: lock renewal, a back-off): made inline by the pull thread, on the helper
#: thread by the task on the event loop.
Blocking = Callable[[], object]
#: One turn after a poll: yields each :data:`Blocking` call and is sent back
#: what it returned.
Turn = Generator[Blocking, object, None]
T = TypeVar("T")


class RunBlocking(Protocol):
    """The task's way to run a call that may block on its helper thread."""

    def __call__(self, call: Callable[[], T], /) -> Awaitable[T]: ...


class PullLoop:
    """The pull side's work (see the module docstring)."""

    def __init__(
        self,
        config: ConsumerConfig,
        *,
        source: PullSource,
        clock: Clock,
        owned: dict[MessageQueue, ProcessQueue],
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
        #: When the next periodic commit, lock renewal and retry of the
        #: queues not locked yet are due (set when the loop starts).
        self._next_commit = self._next_lock = self._next_relock = 0.0

    # -- the drivers -------------------------------------------------------------------

    def run(self, finish: Callable[[bool], None]) -> None:
        """(the pull thread) Poll until ``stopping`` is set (or the source
        closed), then call ``finish(crashed)`` (the consumer's shutdown
        sequence)."""
        source = self._source
        size = self._config.poll_size
        more = partial(source.poll, 0.0, size)
        crashed = False
        try:
            self._begin()
            while not self._stopping.is_set():
                due = self._timer.next_due()
                try:
                    batches = source.poll(self._timeout(due), size)
                except SourceClosedError:
                    self._closed()
                    break
                except Exception:
                    self._poll_failed()
                    self._clock.wait(self._stopping, POLL_ERROR_BACKOFF)
                    continue
                turn = self.turn(batches, due, more)
                try:
                    call = next(turn)
                    while True:  # this thread may block: each call inline
                        call = turn.send(call())
                except StopIteration:
                    pass
                if batches:
                    # Give the GIL up once: the lanes just woken (the event
                    # loop, lane threads) start their calls now instead of
                    # after a whole switch interval (5 ms) of this thread
                    # decoding the next polls.
                    time.sleep(0)
        except BaseException as e:
            crashed = True
            self._died(e)
            if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit: not ours to swallow
                raise
        finally:
            finish(crashed)

    async def run_on_loop(self, finish: Callable[[bool], None], blocking: RunBlocking) -> None:
        """(a task on the event loop) Poll until ``stopping`` is set (or the
        source closed), reading on the loop's thread while messages are
        ready and waiting on the helper thread (``blocking``) when none are;
        then run ``finish(crashed)`` there."""
        source = self._source
        size = self._config.poll_size
        nowait = source.poll_nowait
        prefetch = source.prefetch

        def read() -> list[PollBatch] | None:
            got = nowait(size)
            if got:
                prefetch(size)  # the next read goes out while this one is tracked and routed, and the lanes run
            return got

        def more() -> list[PollBatch]:
            return read() or []  # None: the next turn's poll is a blocking one

        crashed = False
        cancelled = False
        wait = False
        try:
            self._begin()
            while not self._stopping.is_set():
                due = self._timer.next_due()
                try:
                    batches = None if wait else read()
                    if batches is None:
                        # Nothing was ready last turn, or the source says this
                        # poll may block (a rebalance is due): on the helper.
                        batches = await blocking(partial(source.poll, self._timeout(due) if wait else 0.0, size))
                except SourceClosedError:
                    self._closed()
                    break
                except Exception:
                    self._poll_failed()
                    await blocking(partial(self._clock.wait, self._stopping, POLL_ERROR_BACKOFF))
                    wait = False
                    continue
                turn = self.turn(batches, due, more)
                try:
                    call = next(turn)
                    while True:
                        call = turn.send(await blocking(call))
                except StopIteration:
                    pass
                wait = not batches
                if not wait:
                    prefetch(size)  # unless one is out already (the last read's): the lanes run meanwhile
                    await asyncio.sleep(0)  # the lanes this turn fed run now
        except asyncio.CancelledError:
            # The loop is going away (its tasks cancelled) without shutdown():
            # stop, and let the helper run the shutdown sequence on its own.
            cancelled = True
            self._stopping.set()
            raise
        except BaseException as e:
            crashed = True
            self._died(e)
            if not isinstance(e, Exception):
                raise
        finally:
            if cancelled:
                blocking(partial(finish, True))  # runs on its own: nobody waits for it now
            else:
                await blocking(partial(finish, crashed))

    def _begin(self) -> None:
        """Time the first commit and lock renewals from the start."""
        now = self._clock.monotonic()
        self._next_commit = now + self._config.commit_interval
        self._next_lock = now + self._config.lock_renew_interval
        self._next_relock = now + LOCK_RETRY_INTERVAL

    def _timeout(self, due: float | None) -> float:
        """A waiting poll's timeout: ``poll_timeout``, never past the
        timer's earliest entry (a parked key is never retried late)."""
        timeout = self._config.poll_timeout
        if due is not None:
            timeout = min(timeout, max(0.0, due - self._clock.monotonic()))
        return timeout

    def _closed(self) -> None:
        logger.error("source closed under consumer %r; stopping", self._config.group)

    def _poll_failed(self) -> None:
        self._poll_episode.failed(self._config.group)  # logged once per episode, not per poll

    def _died(self, e: BaseException) -> None:
        logger.exception("pull thread of consumer %r died; shutting down", self._config.group)
        self._latch.fail(e)

    # -- a turn ------------------------------------------------------------------------

    def turn(self, batches: list[PollBatch], due: float | None, more: Callable[[], list[PollBatch]]) -> Turn:
        """Everything after a poll that returned ``batches`` (``due``: the
        timer's earliest entry before it; ``more``: a poll that does not
        wait, for gathering): route, fire timers, store failures, flow
        control, commit, renew locks.  Yields each call that may block."""
        cfg = self._config
        clock = self._clock
        assignment = self._assignment
        self._poll_episode.ok(cfg.group)
        assignment.renew_fences()
        if self._key_pauses is not None:  # after each poll: the lanes hold a key paused before it returned
            self._key_pauses.apply()
        if self._stealer is not None and self._stealer.pending:
            self._stealer.run()  # keys waiting behind a stuck call move to other lanes
        if batches:
            self._gather(batches, more)
        now = clock.monotonic()
        if due is not None and due <= now:
            yield from self._fire_timers(now)
        if self._pacer is not None:
            self._pacer.rotate(now)  # forget keys started longer ago than the interval
        if self._sender.pending:
            yield partial(self._sender.send, now)
        self._flow.apply()
        if now >= self._next_commit:
            if not (yield self._committer.commit_all):
                self._early_commit = True  # nothing moved: the next spell of work commits when it is done
            self._next_commit = now + cfg.commit_interval
        elif not batches and self._early_commit and self._worked and self._committer.quiet():
            yield self._committer.commit_all  # the first quiet moment: show the finished work now
            self._early_commit = self._worked = False
            self._next_commit = now + cfg.commit_interval
        if self._renews_locks:
            if now >= self._next_lock:
                yield assignment.renew_locks
                self._next_lock = now + cfg.lock_renew_interval
            elif now >= self._next_relock:
                yield assignment.retry_locks
                self._next_relock = now + LOCK_RETRY_INTERVAL

    # -- poll -> track -> route ------------------------------------------------------

    def _gather(self, batches: list[PollBatch], more: Callable[[], list[PollBatch]]) -> None:
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
            if all(pq.paused for pq in self._owned.values()):
                break  # nothing a poll could read (by message, a round trip for nothing)
            try:
                got = more()
            except Exception:
                break  # the next regular poll reports it
            if not got:
                break
            self._assignment.renew_fences()  # the poll may have assigned queues
            if self._key_pauses is not None:
                self._key_pauses.apply()
            total += self._track(got)
        self._dispatcher.route_pending()
        self._dispatched = True

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

    def _fire_timers(self, now: float) -> Turn:
        """Hand due parked keys to their lanes (one put per lane),
        re-dispatch due local retries and store due held send-backs (a
        call that may block, yielded)."""
        fired = self._timer.fire(now)
        dispatcher = self._dispatcher
        if fired.per_lane:
            dispatcher.put_due(fired.per_lane)
        if fired.local:
            dispatcher.retry_locally(fired.local)
        dispatcher.flush()
        if fired.delayed:
            yield partial(self._sender.send_delayed, fired.delayed, now)
