"""A turn's upkeep: the pull side's timed work after routing.

In order, each turn:

1. **the timer** (``_state.timer``), when its earliest entry is due: parked
   keys back to their lanes (one put per lane), local retries dispatched
   again, delayed send-backs stored (a call that may block);
2. **pacing** (``key_min_interval``): the memory of when keys started is
   trimmed;
3. **failures** the lanes handed off are stored (``_pull.failure_sender``;
   may block);
4. **flow control** (``_pull.flow_control``): paused queues resume once
   below the low-water marks and their lanes have room;
5. **the commit**, when due (``_pull.commit_schedule``; may block);
6. in QUEUE_ORDERLY, **the broker locks**' renewal or retry, when due
   (``_pull.broker_locks``; may block).

Each call that may block is yielded (``_pull.turn``).  Pull side only.
"""

from __future__ import annotations

from functools import partial

from .._lanes.rate_limit import KeyPacer
from .._state.timer import RetryTimer
from .broker_locks import BrokerLocks
from .commit_schedule import CommitSchedule
from .dispatch import Dispatcher
from .failure_sender import FailureSender
from .flow_control import FlowControl
from .turn import Turn

__all__ = ["Upkeep"]


class Upkeep:
    """The timed work of the pull side's turns (see the module docstring)."""

    __slots__ = ("_commits", "_dispatcher", "_flow", "_locks", "_pacer", "_sender", "_timer")

    def __init__(
        self,
        timer: RetryTimer,
        *,
        dispatcher: Dispatcher,
        sender: FailureSender,
        flow: FlowControl,
        commits: CommitSchedule,
        pacer: KeyPacer | None = None,
        locks: BrokerLocks | None = None,
    ) -> None:
        self._timer = timer
        #: Puts due keys into their lanes; dispatches local retries again.
        self._dispatcher = dispatcher
        #: Stores handed-off failures and delayed send-backs.
        self._sender = sender
        self._flow = flow
        self._commits = commits
        #: ``key_min_interval``: the pull side trims its memory (``None``: off).
        self._pacer = pacer
        #: QUEUE_ORDERLY's broker locks (``None`` in the other modes).
        self._locks = locks

    def start(self, now: float) -> None:
        """Time the first commit and lock renewals from ``now``."""
        self._commits.start(now)
        if self._locks is not None:
            self._locks.start(now)

    def turn(self, now: float, due: float | None, polled: bool) -> Turn:
        """A turn's upkeep at ``now`` (``due``: the timer's earliest entry
        before the poll; ``polled``: the poll returned messages)."""
        if due is not None and due <= now:
            yield from self._fire_timers(now)
        if self._pacer is not None:
            self._pacer.rotate(now)  # forget keys started longer ago than the interval
        if self._sender.pending:
            yield partial(self._sender.send, now)
        self._flow.apply()
        yield from self._commits.turn(now, polled)
        if self._locks is not None:
            yield from self._locks.turn(now)

    def _fire_timers(self, now: float) -> Turn:
        """Hand due parked keys to their lanes (one put per lane),
        re-dispatch due local retries and store due delayed send-backs (a
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
