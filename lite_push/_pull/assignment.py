"""Assignment: the queues this member owns, gained and given up.

The source calls the rebalance listener from inside ``poll``, so all of this
runs on the pull thread.

* **Assigned**: a ProcessQueue per queue, starting at the source's position,
  with the offset map committed there (offsets an earlier owner finished
  above the committed one are skipped, not run again).  QUEUE_ORDERLY takes
  the broker lock of each (lock 1 of RocketMQ's three) before consuming it.
  With ``dead_letter_order="key"`` the keys the dead-letter topic holds in
  the new queues are read back first (``HeldKeys.gained``).
* **Revoked**: stop routing the queue, let its in-flight work finish
  (bounded by ``revoke_timeout``), commit, and only then return, so the
  source releases the queue (and, in QUEUE_ORDERLY, its lock) to the next
  owner with the commit in place.  Parked messages and unsent failures of
  the queue are left unfinished for the next owner, and its held keys are
  forgotten (the next owner reads them back).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from .._clock import Clock
from .._config import ConsumeMode, ConsumerConfig
from .._exec.queue_orderly import QueueOrderlyService
from .._kernels.router import lane_of
from .._lanes.held_keys import HeldKeys
from .._state.offset_map import FinishedOffsets, OffsetMapError, decode
from .._state.process_queue import ProcessQueue
from .._state.shared import Counters, Episode, per_queue
from .._state.timer import RetryTimer
from .._types import MessageQueue
from ..sources.contract import PullSource, RebalanceListener
from .committer import Committer
from .dispatch import Dispatcher
from .failure_sender import FailureSender
from .flow_control import low_water

#: Seconds between looks at what the lanes handed off while a revoke waits
#: for its queues' listener calls: a call that fails during the wait hands
#: its message to this thread, which must send (or skip) it for the queue
#: to drain.
REVOKE_SLICE = 0.05

#: An application's rebalance hook: called with the queues, sorted.
AppHook = Callable[[list[MessageQueue]], object]


@dataclass(frozen=True)
class AppHooks:
    """The application's rebalance hooks (the consumer's ``on_assigned`` and
    ``on_revoked``), each called after lite_push's own work."""

    on_assigned: AppHook | None = None
    on_revoked: AppHook | None = None


__all__ = ["Assignment"]

logger = logging.getLogger(__name__)


def coprime_near(lanes: int, queues: int) -> int:
    """The lane count nearest ``lanes`` (above first) coprime with ``queues``."""
    for d in range(lanes):
        for n in (lanes + d, lanes - d):
            if n >= 1 and math.gcd(n, queues) == 1:
                return n
    return 1


class Assignment(RebalanceListener):
    """The rebalance listener of one consumer (pull thread)."""

    def __init__(
        self,
        config: ConsumerConfig,
        *,
        source: PullSource,
        clock: Clock,
        owned: dict[MessageQueue, ProcessQueue],
        lanes: int,
        counters: Counters,
        timer: RetryTimer,
        dispatcher: Dispatcher,
        committer: Committer,
        sender: FailureSender,
        orderly: QueueOrderlyService | None = None,
        hooks: AppHooks = AppHooks(),
        held: HeldKeys | None = None,
    ) -> None:
        self._config = config
        self._source = source
        #: Leases and fences are on the consumer's clock.
        self._clock = clock
        #: The owned queues: written here only.
        self._owned = owned
        #: How many lanes (a queue's keyless lane, the lane-reach warning).
        self._lanes = lanes
        #: ``rebalances``, ``lock_ok``, ``lock_failed`` are written here;
        #: ``parked`` is read (anything parked: purge at a revoke).
        self._counters = counters
        #: A revoked queue's local retries and held send-backs are taken off it.
        self._timer = timer
        #: Routes what was gathered before a revoke; purges parked keys.
        self._dispatcher = dispatcher
        self._committer = committer
        self._sender = sender
        self._orderly = orderly
        #: The application's own ``on_assigned`` and ``on_revoked``.
        self._hooks = hooks
        #: ``dead_letter_order="key"``: the keys held in the owned queues.
        self._held = held
        self._lock_episode = Episode("lock")

    # -- the source's callbacks ------------------------------------------------------

    def on_assigned(self, queues: Collection[MessageQueue]) -> None:
        queues = list(queues)
        cfg = self._config
        source = self._source
        n = self._lanes
        low = low_water(cfg)
        new = []
        if queues:
            self._counters.rebalances += 1
        for q in queues:
            position = source.position(q)
            pq = self._owned[q] = ProcessQueue(
                q,
                next_offset=position,
                keyless_lane=lane_of(str(q), n),
                resume_at=low,
                wake=source.wakeup,
                finished=self._finished_map(q, position),
            )
            new.append(pq)
        if self._held is not None:
            self._held.gained({pq.queue: pq.last_committed for pq in new})
        if self._orderly is not None:
            for pq in new:
                self._orderly.add_queue(pq)
            self.lock(new)  # lock 1: consumed only while held
        logger.info("consumer %r assigned %s", cfg.group, [str(q) for q in queues])
        if cfg.mode is ConsumeMode.KEY_ORDERLY and cfg.key_extractor is None and cfg.lane_placement == "java":
            self._check_lane_reach({q.topic for q in queues})
        if queues:
            self._call_hook("on_assigned", queues)

    def on_revoked(self, queues: Collection[MessageQueue]) -> None:
        # Stop routing the queues, let their in-flight work finish (bounded),
        # commit, and only then return: the source releases them after this.
        # Batches gathered but not yet routed go to the lanes first (this runs
        # inside a poll of the pull loop's gathering), so waiting for the
        # queues to drain ends.
        queues = list(queues)
        cfg = self._config
        owned = self._owned
        self._dispatcher.route_pending()
        pqs = [owned[q] for q in queues if q in owned]
        if pqs:
            self._counters.rebalances += 1
        for pq in pqs:
            pq.drop()
        if pqs and any(self._counters.parked):
            self._dispatcher.purge()  # parked messages of these queues are left to the next owner
        revoked = set(pqs)
        if pqs:
            self._release_held(revoked)
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
                    self._release_held(revoked)
        self._committer.commit(pqs)
        for pq in pqs:
            del owned[pq.queue]
        if self._held is not None and pqs:
            self._held.revoked([pq.queue for pq in pqs])
        if self._orderly is not None:
            for pq in pqs:
                self._orderly.remove_queue(pq)
            # Only now, drained and committed, may the next owner lock it.
            try:
                self._source.unlock([pq.queue for pq in pqs])
            except Exception:  # the lease then runs out on its own
                logger.warning(
                    "consumer %r: unlocking %d revoked queue(s) failed; their locks expire with the lease",
                    cfg.group,
                    len(pqs),
                    exc_info=True,
                )
        logger.info("consumer %r revoked %s", cfg.group, [str(q) for q in queues])
        if queues:
            self._call_hook("on_revoked", queues)

    def _release_held(self, revoked: set[ProcessQueue]) -> None:
        """What only this (pull) thread could release -- failures handed
        off, local retries on the timer, dead letters waiting to be stored
        again -- is sent, or left to the next owner, now: the wait for the
        revoked queues is for listener calls only."""
        if self._sender.pending:
            self._sender.send(self._clock.monotonic())
        self._sender.release(revoked)
        for pq, ms in per_queue(self._timer.take_waiting(revoked)).items():
            pq.skip(ms)

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

    # -- QUEUE_ORDERLY's broker locks ------------------------------------------------

    def lock(self, pqs: list[ProcessQueue]) -> None:
        """Take or renew the broker lock of these queues (QUEUE_ORDERLY)."""
        orderly = self._orderly
        if orderly is None or not pqs:
            return
        group = self._config.group
        lease = self._config.lock_lease
        try:
            held = self._source.lock([pq.queue for pq in pqs], lease)
        except Exception:
            # consumption stops when the leases run out (set_locked below)
            self._lock_episode.failed(group, f" ({len(pqs)} queue(s))")
            self._counters.lock_failed += 1
            return
        self._lock_episode.ok(group)
        self._counters.lock_ok += 1
        until = self._clock.monotonic() + lease
        for pq in pqs:
            orderly.set_locked(pq, until if pq.queue in held else 0.0)
        missed = [str(pq.queue) for pq in pqs if pq.queue not in held]
        if missed:
            logger.info("consumer %r: queues locked by another member, retrying: %s", group, missed)

    def renew_fences(self) -> None:
        """After a poll: move each owned queue's fence to where the source
        says its ownership stops being certain, less ``fence_margin``."""
        left = self._source.owned_for()
        if left:
            now = self._clock.monotonic() - self._config.fence_margin
            pqs = self._owned
            for q, seconds in left.items():
                pq = pqs.get(q)
                if pq is not None and not pq.dropped:
                    pq.owned_until = now + seconds

    def renew_locks(self) -> None:
        """Renew every lease (RocketMQ's lockAll)."""
        self.lock(list(self._owned.values()))

    def retry_locks(self) -> None:
        """Try again the queues not locked yet."""
        if self._orderly is not None:
            self.lock(self._orderly.unlocked())

    # -- helpers -----------------------------------------------------------------------

    def _check_lane_reach(self, topics: set[str]) -> None:
        """``lane_placement="java"``: warn when the owned queues' keys cannot
        reach every lane.  A producer's hash selector puts key k in queue
        ``h(k) mod Q`` and the lane is ``h(k) mod L`` with the same Java hash, so queue q's keys
        only reach the lanes ``l = q (mod gcd(L, Q))``: L/g lanes per queue.
        A member owning a few of the queues then leaves lanes idle unless L
        is coprime with Q."""
        lanes = self._lanes
        owned = self._owned
        for topic in sorted(topics):
            try:
                total = self._source.queue_count(topic)
            except Exception:  # only a hint
                continue
            if not total:
                continue
            g = math.gcd(lanes, total)
            classes = {q.queue_id % g for q in owned if q.topic == topic}
            reach = len(classes) * (lanes // g)
            if reach < lanes:
                logger.warning(
                    "consumer %r: the keys of its %d queue(s) of %r (of %d) can reach only %d of its %d lanes: "
                    "the producers' hash selector and the lane hash are the same Java hash and %d lanes share "
                    "the factor %d with %d queues; a lane count coprime with %d (e.g. %d) uses every lane",
                    self._config.group,
                    sum(1 for q in owned if q.topic == topic),
                    topic,
                    total,
                    reach,
                    lanes,
                    lanes,
                    g,
                    total,
                    total,
                    coprime_near(lanes, total),
                )

    def _finished_map(self, q: MessageQueue, position: int) -> FinishedOffsets | None:
        """The offset map committed with ``q``'s offset, when polling starts
        exactly there; a map that cannot be read is ignored (logged): every
        message above the offset is then processed again, never lost."""
        group = self._config.group
        try:
            committed = self._source.committed(q)
        except Exception:
            logger.exception("consumer %r: reading the committed offset of %s failed", group, q)
            return None
        if committed is None or not committed.metadata or committed.offset != position:
            return None
        try:
            finished = decode(committed.metadata, committed.offset)
        except OffsetMapError as exc:
            logger.warning(
                "consumer %r: ignoring the offset map committed for %s (%s); messages above offset %d "
                "will be processed again",
                group,
                q,
                exc,
                committed.offset,
            )
            return None
        if finished is not None:
            logger.info(
                "consumer %r: %s resumes at %d; %d finished offsets below %d will be skipped (offset map)",
                group,
                q,
                position,
                finished.finished_count(),
                finished.end,
            )
        return finished
