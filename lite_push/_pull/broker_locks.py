"""QUEUE_ORDERLY's broker locks: lock 1 of RocketMQ's three.

The baseline consumes a queue only while this member holds the queue's
lock at the broker (``PullSource.lock``, a lease of ``lock_lease``).  A
queue gained is locked before it is consumed; every
``lock_renew_interval`` every lease is renewed (RocketMQ's ``lockAll``),
and the queues another member still holds are tried again every
``LOCK_RETRY_INTERVAL``.  A queue revoked is unlocked only once it is
drained and committed, so the next owner starts where this one stopped; an
unlock that fails leaves the lease to run out.  A renewal that fails stops
nothing at once: consumption stops when the leases run out.  Pull side
only.
"""

from __future__ import annotations

import logging

from .._clock import Clock
from .._config import ConsumerConfig
from .._exec.queue_orderly import QueueOrderlyService
from .._state.process_queue import ProcessQueue
from .._state.shared import Counters, Episode
from .._types import MessageQueue
from ..sources.contract import PullSource
from .turn import Turn

__all__ = ["LOCK_RETRY_INTERVAL", "BrokerLocks"]

logger = logging.getLogger(__name__)

#: Seconds between attempts to lock queues another member still holds.
LOCK_RETRY_INTERVAL = 1.0


class BrokerLocks:
    """The broker locks of one QUEUE_ORDERLY consumer (see the module
    docstring)."""

    def __init__(
        self,
        config: ConsumerConfig,
        *,
        source: PullSource,
        clock: Clock,
        owned: dict[MessageQueue, ProcessQueue],
        orderly: QueueOrderlyService,
        counters: Counters,
    ) -> None:
        self._config = config
        self._source = source
        #: Leases are on the consumer's clock.
        self._clock = clock
        #: The owned queues: every lease is renewed.
        self._owned = owned
        #: The consume pool: consumes a queue only while its lease lasts.
        self._orderly = orderly
        #: ``lock_ok`` and ``lock_failed`` are written here.
        self._counters = counters
        self._episode = Episode("lock")
        #: When the next renewal, and the next retry of the queues not
        #: locked yet, are due (set by :meth:`start`).
        self._next_renewal = self._next_retry = 0.0

    def gained(self, pqs: list[ProcessQueue]) -> None:
        """Queues assigned: hand them to the consume pool and lock them
        (consumed only while locked)."""
        for pq in pqs:
            self._orderly.add_queue(pq)
        self.lock(pqs)

    def released(self, pqs: list[ProcessQueue]) -> None:
        """Queues revoked, drained and committed: only now may the next
        owner lock them."""
        for pq in pqs:
            self._orderly.remove_queue(pq)
        try:
            self._source.unlock([pq.queue for pq in pqs])
        except Exception:  # the lease then runs out on its own
            logger.warning(
                "consumer %r: unlocking %d revoked queue(s) failed; their locks expire with the lease",
                self._config.group,
                len(pqs),
                exc_info=True,
            )

    def lock(self, pqs: list[ProcessQueue]) -> None:
        """Take or renew the broker lock of these queues."""
        if not pqs:
            return
        group = self._config.group
        lease = self._config.lock_lease
        try:
            held = self._source.lock([pq.queue for pq in pqs], lease)
        except Exception:
            # consumption stops when the leases run out (set_locked below)
            self._episode.failed(group, f" ({len(pqs)} queue(s))")
            self._counters.lock_failed += 1
            return
        self._episode.ok(group)
        self._counters.lock_ok += 1
        until = self._clock.monotonic() + lease
        for pq in pqs:
            self._orderly.set_locked(pq, until if pq.queue in held else 0.0)
        missed = [str(pq.queue) for pq in pqs if pq.queue not in held]
        if missed:
            logger.info("consumer %r: queues locked by another member, retrying: %s", group, missed)

    def renew(self) -> None:
        """Renew every lease (RocketMQ's lockAll)."""
        self.lock(list(self._owned.values()))

    def retry(self) -> None:
        """Try again the queues not locked yet."""
        self.lock(self._orderly.unlocked())

    def start(self, now: float) -> None:
        """Time the first renewal and retry from ``now``."""
        self._next_renewal = now + self._config.lock_renew_interval
        self._next_retry = now + LOCK_RETRY_INTERVAL

    def turn(self, now: float) -> Turn:
        """A turn's renewal or retry, if one is due; yields it."""
        if now >= self._next_renewal:
            yield self.renew
            self._next_renewal = now + self._config.lock_renew_interval
        elif now >= self._next_retry:
            yield self.retry
            self._next_retry = now + LOCK_RETRY_INTERVAL
