"""A revoked queue's drain, before the source releases it.

Inside ``poll``, when queues are revoked (``_pull.assignment``):

1. what was gathered but not yet routed goes to the lanes (the revoke runs
   inside a gathering poll), so the wait below can end;
2. the queues are dropped: nothing more is routed to them, and a lane
   skips their messages instead of calling the listener; their parked keys
   are purged from the lanes (left to the next owner);
3. what only the pull side could release is sent, or left unfinished, now:
   failures handed off, local retries on the timer, dead letters waiting to
   be stored again;
4. their in-flight listener calls finish, waited for in slices of
   ``REVOKE_SLICE`` (a call that fails meanwhile hands its message to the
   pull side, which must send or skip it for the queue to drain), at most
   ``revoke_timeout`` in all;
5. the queues are committed, below anything still unfinished.

Pull side only.
"""

from __future__ import annotations

import logging
import time

from .._clock import Clock
from .._config import ConsumerConfig
from .._state.process_queue import ProcessQueue
from .._state.shared import Counters, per_queue
from .._state.timer import RetryTimer
from .committer import Committer
from .dispatch import Dispatcher
from .failure_sender import FailureSender

__all__ = ["REVOKE_SLICE", "RevokeDrain"]

logger = logging.getLogger(__name__)

#: Seconds between looks at what the lanes handed off while a revoke waits
#: for its queues' listener calls: a call that fails during the wait hands
#: its message to this thread, which must send (or skip) it for the queue
#: to drain.
REVOKE_SLICE = 0.05


class RevokeDrain:
    """Drains and commits revoked queues (see the module docstring)."""

    def __init__(
        self,
        config: ConsumerConfig,
        *,
        clock: Clock,
        counters: Counters,
        timer: RetryTimer,
        dispatcher: Dispatcher,
        committer: Committer,
        sender: FailureSender,
    ) -> None:
        self._config = config
        #: Failures are stored at the consumer clock's now.
        self._clock = clock
        #: ``parked`` is read: anything parked is purged.
        self._counters = counters
        #: A revoked queue's local retries and delayed send-backs are taken off it.
        self._timer = timer
        #: Routes what was gathered before a revoke; purges parked keys.
        self._dispatcher = dispatcher
        self._committer = committer
        self._sender = sender

    def drain(self, pqs: list[ProcessQueue]) -> None:
        """Drop ``pqs``, let their in-flight work finish (bounded), commit."""
        cfg = self._config
        self._dispatcher.route_pending()
        for pq in pqs:
            pq.drop()
        if pqs and any(self._counters.parked):
            self._dispatcher.purge()  # parked messages of these queues are left to the next owner
        revoked = set(pqs)
        if pqs:
            self._release_waiting(revoked)
        deadline = time.monotonic() + cfg.revoke_timeout
        for pq in pqs:
            while not pq.wait_idle(min(REVOKE_SLICE, max(0.0, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    logger.warning(
                        "consumer %r: %s revoked with work still running after %.1fs; committing below it and "
                        "releasing",
                        cfg.group,
                        pq.queue,
                        cfg.revoke_timeout,
                    )
                    break
                if self._sender.pending:  # a listener call failed meanwhile: its hand-off is ours to release
                    self._release_waiting(revoked)
        self._committer.commit(pqs)

    def _release_waiting(self, revoked: set[ProcessQueue]) -> None:
        """What only this (pull) thread could release -- failures handed
        off, local retries on the timer, dead letters waiting to be stored
        again -- is sent, or left to the next owner, now: the wait for the
        revoked queues is for listener calls only."""
        if self._sender.pending:
            self._sender.send(self._clock.monotonic())
        self._sender.release(revoked)
        for pq, ms in per_queue(self._timer.take_waiting(revoked)).items():
            pq.skip(ms)
