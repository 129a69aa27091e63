"""Stopping a consumer: what finishes, what is committed, what comes back.

What a stop does, on the pull thread once polling has stopped
(:meth:`Stopper.run`):

* **By default** (``drain_on_shutdown=False``), as a Kafka consumer's
  ``close()``: the listener calls running now finish (the lanes stop before
  their next message), the messages never started are let go, and what
  finished is committed.  What was let go stays uncommitted, so it is
  delivered again on the next start: at-least-once, nothing lost.
* **Draining** (``drain_on_shutdown=True``): the lanes first work through
  everything queued, retries included.

The timeout of ``shutdown(timeout)`` bounds that wait (for the calls in
flight, or for the whole backlog when draining).  Past it, or at
:meth:`Stopper.hurry` (a second Ctrl-C), nothing more is awaited: the calls
still running are given up (their messages stay uncommitted) after a short
grace (``ABORT_GRACE``).

:class:`LanesStop` stops the listener calls (the lanes, or the baseline's
pool) and waits for them; :class:`Stopper` keeps the deadline and does the
rest.  Then the failures the lanes handed off are stored, every owned queue's
lowest unfinished offset is committed, and the committed offsets are read
back from the source: the :class:`StopReport` says what the group now holds
and which queues will be delivered again from where, and never claims a
commit the source did not take (a Kafka coordinator in a rebalance refuses
commits, for one).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .._clock import Clock
from .._exec.async_executor import AsyncExecutor
from .._exec.queue_orderly import QueueOrderlyService
from .._exec.thread_executor import ThreadExecutor
from .._lanes.lanes import Lane
from .._pull.committer import Committer
from .._pull.failure_sender import FailureSender
from .._state.process_queue import ProcessQueue
from .._state.shared import ABORT_GRACE, error_line
from .._types import MessageQueue
from ..sources.contract import PullSource

__all__ = ["QueueStop", "StopReport", "Stopper"]

logger = logging.getLogger(__name__)

#: How often a stop looks whether it was hurried while it waits (seconds).
HURRY_CHECK = 0.05
#: Queues a summary names before it says "and N more".
NAMED_QUEUES = 4


@dataclass(frozen=True, slots=True)
class QueueStop:
    """One owned queue at the end of a stop."""

    queue: MessageQueue
    #: The lowest offset not finished: what the consumer committed.
    finished_to: int
    #: What the source holds for the group now (read back after the commit);
    #: ``None``: nothing, or it could not be read.
    committed: int | None
    #: One past the highest offset polled.
    polled_to: int
    #: The offset this member started the queue from.
    first_offset: int

    @property
    def taken(self) -> bool:
        """Whether the source holds the commit (at or past ``finished_to``;
        with nothing finished here, nothing was owed)."""
        if self.committed is None:
            return self.finished_to <= self.first_offset
        return self.committed >= self.finished_to

    @property
    def again_from(self) -> int | None:
        """The offset the next start delivers this queue from, when messages
        this consumer polled come back (``None``: nothing polled comes back)."""
        start = self.committed if self.committed is not None else self.first_offset
        return start if start < self.polled_to else None


@dataclass(frozen=True, slots=True)
class StopReport:
    """What a consumer's stop did (``consumer.stop_report``)."""

    #: Every listener call in flight finished in time (draining: everything
    #: queued was processed), and no stop was hurried.
    finished: bool
    #: Messages polled and not finished (never started, given up, or
    #: waiting for a retry): uncommitted, they come back on the next start.
    unfinished: int
    #: Listener calls given up at the deadline (their messages stay uncommitted).
    abandoned: int
    #: Each queue owned at the end, by name.
    queues: tuple[QueueStop, ...]
    #: Why the committed offsets could not be read back (``None``: they were).
    unread: str | None = None

    @property
    def committed(self) -> bool:
        """Whether the source holds the final commit of every owned queue."""
        return self.unread is None and all(q.taken for q in self.queues)

    @property
    def clean(self) -> bool:
        """Everything started finished and its commit was taken."""
        return self.finished and self.committed

    def summary(self) -> str:
        """One line: what was committed and what will be delivered again."""
        qs = self.queues
        if self.unread is not None:
            return f"the committed offsets could not be read back ({self.unread}); what is not committed comes back"
        refused = [q for q in qs if not q.taken]
        parts = []
        if not qs:
            parts.append("no queue owned at the end, nothing to commit")
        elif not refused:
            parts.append(f"offsets committed for {_count(len(qs), 'queue')}")
        else:
            parts.append(
                f"offsets NOT committed for {len(refused)} of {_count(len(qs), 'queue')} (the source refused or lost "
                f"the commit): {_named([_refused(q) for q in refused])}"
            )
        again = [q for q in qs if q.again_from is not None]
        if again:
            parts.append(f"the next start resumes {_named([f'{q.queue} at {q.again_from}' for q in again])}")
        if self.unfinished:
            parts.append(f"{_count(self.unfinished, 'message')} polled but not finished come back")
        if self.abandoned:
            parts.append(f"{_count(self.abandoned, 'listener call')} given up at the deadline")
        return "; ".join(parts)


def _refused(q: QueueStop) -> str:
    return f"{q.queue} holds {_at(q.committed)}, finished to {q.finished_to}"


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def _at(offset: int | None) -> str:
    return "nothing" if offset is None else str(offset)


def _named(items: list[str]) -> str:
    shown = ", ".join(items[:NAMED_QUEUES])
    more = len(items) - NAMED_QUEUES
    return shown + (f" and {more} more" if more > 0 else "")


class LanesStop:
    """Stopping a consumer's listener calls: the lanes (or the baseline's
    pool) start no more calls, take no more work, and are waited for until
    a deadline.  Pull side, once polling has stopped (:meth:`abort` from any
    thread)."""

    def __init__(
        self,
        *,
        lanes: list[Lane],
        executor: ThreadExecutor | AsyncExecutor,
        orderly: QueueOrderlyService | None,
        abort: threading.Event,
        owned: dict[MessageQueue, ProcessQueue],
    ) -> None:
        self._lanes = lanes
        self._executor = executor
        self._orderly = orderly
        #: Set: the lanes skip what they have not started.
        self._abort = abort
        #: The owned queues, whose fences close so no call starts.
        self._owned = owned

    def abort(self) -> None:
        """Give up what runs: lanes skip what they have not started."""
        self._abort.set()

    def stop_calls(self) -> None:
        """Lanes start no more calls: each stops before its next message."""
        self._abort.set()
        for pq in list(self._owned.values()):
            pq.stop_calls()
        self._executor.stop_waits()

    def close(self, deadline: Callable[[], float]) -> None:
        """No more work comes: the lanes (and the baseline's pool, which
        waits for its calls until ``deadline()``) are closed."""
        if self._orderly is not None:
            self._orderly.close(deadline)
        for lane in self._lanes:
            lane.close()
        self._executor.flush()

    def let_go(self) -> None:
        """Take what the lanes still queue: it stays uncommitted."""
        for lane in self._lanes:
            for pq, msgs in lane.drain():
                pq.skip(msgs)

    def join(self, deadline: Callable[[], float]) -> bool:
        """Wait for the lanes' tasks until ``deadline()`` (which a hurry may
        bring forward); whether they all ended."""
        executor = self._executor
        while True:
            now = time.monotonic()
            if executor.join(min(deadline(), now + HURRY_CHECK)):
                return True
            if time.monotonic() >= deadline():
                return False

    def give_up(self) -> int:
        """The deadline passed: wait :data:`ABORT_GRACE` more for the tasks
        to notice, and count the listener calls still running."""
        abandoned = sum(1 for lane in self._lanes if lane.call is not None)
        self._executor.join(time.monotonic() + ABORT_GRACE, final=True)
        return abandoned


class Stopper:
    """A consumer's stop (see the module docstring).  :meth:`begin` and
    :meth:`hurry` may be called from any thread; :meth:`run` runs on the
    pull side once polling has stopped."""

    def __init__(
        self,
        *,
        group: str,
        drain: bool,
        clock: Clock,
        calls: LanesStop,
        owned: dict[MessageQueue, ProcessQueue],
        sender: FailureSender,
        committer: Committer,
        source: PullSource,
    ) -> None:
        self._group = group
        self._drain = drain
        self._clock = clock
        #: Stops the listener calls.
        self._calls = calls
        self._owned = owned
        self._sender = sender
        self._committer = committer
        self._source = source
        self._lock = threading.Lock()
        #: When the stop gives up waiting (``time.monotonic``; 0: not set).
        self._deadline = 0.0
        self._hurried = False
        #: Set by :meth:`run` at its end.
        self.report: StopReport | None = None

    @property
    def deadline(self) -> float:
        """When the stop gives up waiting (0.0 until :meth:`begin`)."""
        return self._deadline

    def begin(self, timeout: float) -> None:
        """The stop's deadline, ``timeout`` seconds from now (the first call
        sets it)."""
        with self._lock:
            if not self._deadline:
                self._deadline = time.monotonic() + max(0.0, timeout)

    def hurry(self) -> None:
        """Stop waiting now: commit what finished, give up what runs."""
        with self._lock:
            self._hurried = True
            self._deadline = time.monotonic()
        self._calls.abort()

    def run(self) -> StopReport:
        """The stop (pull side): let the calls in flight finish (draining:
        everything queued), commit, read the commits back."""
        self.begin(0.0)  # a crash with no shutdown() yet: the caller set one, else stop at once
        calls = self._calls
        if not self._drain:
            calls.stop_calls()
        calls.close(self._deadline_now)
        if not self._drain:
            calls.let_go()
        finished = calls.join(self._deadline_now)
        abandoned = 0
        if not finished:
            if self._drain:  # what the lanes still queue stays unstarted too
                calls.stop_calls()
                calls.let_go()
            abandoned = calls.give_up()
            if abandoned:
                logger.warning(
                    "consumer %r: %d listener call(s) still running when the stop gave up; their messages stay "
                    "uncommitted and are delivered again",
                    self._group,
                    abandoned,
                )
        if self._sender.pending:
            self._sender.send(self._clock.monotonic(), final=True)  # the outbox's times are the consumer's
        self._committer.commit_all()
        report = self.report = self._read_back(finished and not self._hurried, abandoned)
        return report

    def _deadline_now(self) -> float:
        """The deadline as it stands (a hurry brings it forward)."""
        return self._deadline

    def _read_back(self, finished: bool, abandoned: int) -> StopReport:
        pqs = sorted(self._owned.values(), key=lambda pq: pq.queue)
        unfinished = sum(pq.unfinished for pq in pqs)
        try:
            stored = self._source.committed_all([pq.queue for pq in pqs])
        except Exception as e:  # the source is down: say so rather than guess
            logger.debug("consumer %r: reading the committed offsets back failed", self._group, exc_info=True)
            return StopReport(finished, unfinished, abandoned, (), unread=error_line(e))
        queues = []
        for pq in pqs:
            held = stored.get(pq.queue)
            at = None if held is None else held.offset
            queues.append(QueueStop(pq.queue, pq.commit_point()[0], at, pq.next_offset, pq.first_offset))
        return StopReport(finished, unfinished, abandoned, tuple(queues))
