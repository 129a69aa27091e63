"""The pull loop: the one thread that talks to the source.

Each turn: ``poll`` (the source runs the rebalance callbacks inside it, see
``_pull.assignment``), then

* the **intake** (``_pull.intake``): hand the lanes what changed since the
  last poll (``_pull.poll_sync``: fences, key pauses, steals), track each
  batch in its queue's ProcessQueue, keep polling without waiting while
  more is ready (up to ``DISPATCH_BUDGET``; the very first dispatch goes
  out with the first poll) and route what was gathered to the lanes with
  one put per lane (``_pull.dispatch``);
* the **upkeep** (``_pull.upkeep``): fire the timer's due work, trim the
  pacing memory, store handed-off failures, apply flow control, commit
  when due (``_pull.commit_schedule``: every ``commit_interval``, and at
  the first quiet moment of a spell of work) and, in QUEUE_ORDERLY, renew
  the broker locks (``_pull.broker_locks``).

The poll's timeout is shortened to the timer's earliest entry, so a parked
key is never retried late by a waiting poll.  A poll that fails is
reported once per episode and retried after ``POLL_ERROR_BACKOFF``.

It never blocks indefinitely: a full lane pauses the queues that feed it
instead of blocking a put, and waiting for a revoked queue to drain is
bounded by ``revoke_timeout``; so heartbeats and lock renewals keep flowing
while the consumer is saturated.  When it leaves the loop (shutdown, or the
source closed) it runs the consumer's shutdown sequence.

Two drivers run the same turn (:meth:`PullLoop.turn`, a generator that
yields each call that may block: storing failures, commits, lock renewals;
``_pull.turn``):

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
from collections.abc import Callable
from functools import partial

from .._clock import Clock
from .._config import ConsumerConfig
from .._errors import SourceClosedError
from .._state.shared import Episode, FailureLatch
from .._state.timer import RetryTimer
from .._types import PollBatch
from ..sources.contract import PullSource
from .intake import Intake
from .turn import RunBlocking, Turn
from .upkeep import Upkeep

__all__ = ["POLL_ERROR_BACKOFF", "PullLoop"]

logger = logging.getLogger(__name__)

#: Seconds the pull thread backs off after a failed poll.
POLL_ERROR_BACKOFF = 1.0


class PullLoop:
    """The pull side's work (see the module docstring)."""

    def __init__(
        self,
        config: ConsumerConfig,
        *,
        source: PullSource,
        clock: Clock,
        timer: RetryTimer,
        intake: Intake,
        upkeep: Upkeep,
        latch: FailureLatch,
        stopping: threading.Event,
    ) -> None:
        self._config = config
        self._source = source
        self._clock = clock
        #: Its earliest entry bounds a waiting poll's timeout.
        self._timer = timer
        #: Poll -> track -> route.
        self._intake = intake
        #: The timed work after routing: timer, failures, flow, commit, locks.
        self._upkeep = upkeep
        #: The pull side's own failure stops the consumer.
        self._latch = latch
        self._stopping = stopping
        self._poll_episode = Episode("poll")

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
        self._upkeep.start(self._clock.monotonic())

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
        wait, for gathering): the intake, then the upkeep.  Yields each call
        that may block."""
        self._poll_episode.ok(self._config.group)
        self._intake.turn(batches, more)
        yield from self._upkeep.turn(self._clock.monotonic(), due, bool(batches))
