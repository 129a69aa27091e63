"""Assignment: the queues this member owns, gained and given up.

The source calls the rebalance listener from inside ``poll``, so all of this
runs on the pull thread.

* **Assigned**: a ProcessQueue per queue, starting at the source's position,
  with the offset map committed there (``_pull.queue_opener``).  With
  ``dead_letter_order="key"`` the keys the dead-letter topic holds in the
  new queues are read back first (``HeldKeys.gained``).  QUEUE_ORDERLY takes
  the broker lock of each (lock 1 of RocketMQ's three, ``_pull.broker_locks``)
  before consuming it.
* **Revoked**: stop routing the queue, let its in-flight work finish
  (bounded by ``revoke_timeout``), commit (``_pull.revoke_drain``), and only
  then return, so the source releases the queue (and, in QUEUE_ORDERLY, its
  lock) to the next owner with the commit in place.  Parked messages and
  unsent failures of the queue are left unfinished for the next owner, and
  its held keys are forgotten (the next owner reads them back).

The application's hooks (``on_assigned``, ``on_revoked``) run after
lite_push's own work; what they raise is logged, never fatal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass

from .._config import ConsumerConfig
from .._lanes.held_keys import HeldKeys
from .._state.process_queue import ProcessQueue
from .._state.shared import Counters
from .._types import MessageQueue
from ..sources.contract import RebalanceListener
from .broker_locks import BrokerLocks
from .queue_opener import QueueOpener
from .revoke_drain import RevokeDrain

#: An application's rebalance hook: called with the queues, sorted.
AppHook = Callable[[list[MessageQueue]], object]


@dataclass(frozen=True)
class AppHooks:
    """The application's rebalance hooks (the consumer's ``on_assigned`` and
    ``on_revoked``), each called after lite_push's own work."""

    on_assigned: AppHook | None = None
    on_revoked: AppHook | None = None


__all__ = ["AppHook", "AppHooks", "Assignment"]

logger = logging.getLogger(__name__)


class Assignment(RebalanceListener):
    """The rebalance listener of one consumer (pull thread)."""

    def __init__(
        self,
        config: ConsumerConfig,
        *,
        owned: dict[MessageQueue, ProcessQueue],
        counters: Counters,
        opener: QueueOpener,
        drain: RevokeDrain,
        hooks: AppHooks = AppHooks(),
        held: HeldKeys | None = None,
        locks: BrokerLocks | None = None,
    ) -> None:
        self._config = config
        #: The owned queues: written here only.
        self._owned = owned
        #: ``rebalances`` is written here.
        self._counters = counters
        #: Makes a gained queue's ProcessQueue.
        self._opener = opener
        #: Drains and commits revoked queues.
        self._drain = drain
        #: The application's own ``on_assigned`` and ``on_revoked``.
        self._hooks = hooks
        #: ``dead_letter_order="key"``: the keys held in the owned queues.
        self._held = held
        #: QUEUE_ORDERLY's broker locks (``None`` in the other modes).
        self._locks = locks

    def on_assigned(self, queues: Collection[MessageQueue]) -> None:
        queues = list(queues)
        new = []
        if queues:
            self._counters.rebalances += 1
        for q in queues:
            pq = self._owned[q] = self._opener.open(q)
            new.append(pq)
        if self._held is not None:
            self._held.gained({pq.queue: pq.last_committed for pq in new})
        if self._locks is not None:
            self._locks.gained(new)  # lock 1: consumed only while held
        logger.info("consumer %r assigned %s", self._config.group, [str(q) for q in queues])
        self._opener.check_lane_reach({q.topic for q in queues}, self._owned)
        if queues:
            self._call_hook("on_assigned", queues)

    def on_revoked(self, queues: Collection[MessageQueue]) -> None:
        # Stop routing the queues, let their in-flight work finish (bounded),
        # commit, and only then return: the source releases them after this.
        queues = list(queues)
        owned = self._owned
        pqs = [owned[q] for q in queues if q in owned]
        if pqs:
            self._counters.rebalances += 1
        self._drain.drain(pqs)
        for pq in pqs:
            del owned[pq.queue]
        if self._held is not None and pqs:
            self._held.revoked([pq.queue for pq in pqs])
        if self._locks is not None:
            self._locks.released(pqs)  # only now, drained and committed, may the next owner lock them
        logger.info("consumer %r revoked %s", self._config.group, [str(q) for q in queues])
        if queues:
            self._call_hook("on_revoked", queues)

    def _call_hook(self, name: str, queues: list[MessageQueue]) -> None:
        """The application's hook ``name``, after lite_push's own work (for a
        revoke: drained and committed); what it raises is logged, never fatal."""
        hook: AppHook | None = getattr(self._hooks, name)
        if hook is None:
            return
        try:
            hook(sorted(queues))
        except Exception:
            logger.exception("consumer %r: the application's %s hook raised", self._config.group, name)
