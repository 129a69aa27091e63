"""CLUSTERING on the embedded broker: a member's share of its group's queues.

The member's side of the hand-off described in :mod:`.groups`: it joins
the group when it subscribes; each poll stamps its heartbeat, evicts the
members silent for longer than their session timeout and, when the group's
version moved, brings the owned queues to the member's target
(:meth:`Clustering.refresh`: ``on_revoked`` before a queue is released,
``on_assigned`` after free ones are taken).  Commits, committed offsets
and queue locks are the group's, kept by the coordinator under the broker's
one lock; retries wait in the broker's schedule.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from ..._types import MessageExt, MessageQueue, OffsetAndMetadata
from .._common import BrokerClock
from .._member_model import MemberModel
from .._owned import OwnedQueues
from ..contract import MessageModel
from .groups import Group, GroupCoordinator, Member
from .reading import QueueReader
from .schedule import Schedule

__all__ = ["Clustering"]

logger = logging.getLogger(__name__)


class Clustering(MemberModel):
    """CLUSTERING for ``member`` of ``group``.  ``reader(queue, position)``
    makes an owned queue's state; ``wait_slice`` is how often a waiting
    poll confirms the membership (fencing).  A durable broker's coordinator
    (``groups.durable``) writes commits to offsets.json."""

    message_model = MessageModel.CLUSTERING

    def __init__(
        self,
        owned: OwnedQueues[QueueReader],
        groups: GroupCoordinator,
        schedule: Schedule,
        group: Group,
        member: Member,
        clock: BrokerClock,
        reader: Callable[[MessageQueue, int], QueueReader],
        wait_slice: float,
    ) -> None:
        self._owned = owned
        self._groups = groups
        self._schedule = schedule
        self._lock = groups.lock
        self._group = group
        self._member = member
        self._clock = clock
        self._reader = reader
        self._wait_slice = wait_slice
        self._subscribed = False
        self._seen_version = -1
        #: Fencing: when a heartbeat last found this member in its group
        #: (the broker clock); its queues are its own until then + timeout.
        self._confirmed = -math.inf

    @property
    def session_timeout(self) -> float:
        return self._member.session_timeout

    def owned_for(self) -> dict[MessageQueue, float]:
        left = self._confirmed + self._member.session_timeout - self._clock.monotonic()
        return dict.fromkeys(self._owned.states, left)

    def subscribe(self, topic: str) -> None:
        """(lock held) Join the group on ``topic`` too."""
        self._member.topics.add(topic)
        self._subscribed = True
        self._groups.join(self._group, self._member)

    def stale(self) -> bool:
        return self._group.version != self._seen_version or self._member.expired

    def refresh(self, replies: Sequence[Any] = (), rebalance: bool = True) -> bool:
        """A poll's turn: stamp the heartbeat, evict the silent, rebalance
        when the group changed, confirm the membership (at most once a wait
        slice unless it changed); return whether it rebalanced (with
        ``rebalance`` False: whether a rebalance is due, left undone)."""
        if not self._subscribed:
            return False
        groups, group, member = self._groups, self._group, self._member
        now = self._clock.monotonic()
        member.last_seen = now
        if now >= group.next_check:
            groups.check_expiry(group, member, now)
        changed = self.stale()
        if changed:
            if not rebalance:
                return True  # left to a poll() that may wait for the listener calls of revoked queues
            self._rebalance()
        if (changed or now - self._confirmed >= self._wait_slice) and groups.confirm(group, member, now):
            self._confirmed = now
        return changed

    def _rebalance(self) -> None:
        """Bring the owned set to the target: release what left the target
        (after ``on_revoked``), take what is free (then ``on_assigned``)."""
        groups, group, member, owned = self._groups, self._group, self._member, self._owned
        cid = member.cid
        while True:
            with self._lock:
                if owned.closed:
                    return
                version = group.version
                if member.expired:
                    # Evicted for silence: its queues are already released.
                    # Rejoin; the local state goes through on_revoked below.
                    groups.rejoin(group, member)
                    continue
                lost, drop = groups.to_give_up(group, cid, owned.states, member.target)
                if not lost and not drop:
                    taken = groups.take_free(group, member, owned.states)
                    owned.add(self._reader(q, pos) for q, pos in taken)
                    self._seen_version = version
                    break
            revoked = sorted(lost + drop)
            if lost:
                logger.warning("group %r: %r lost %s to the broker", group.name, cid, [str(q) for q in lost])
            owned.notify("on_revoked", revoked)
            with self._lock:
                groups.release(group, cid, drop)
                owned.drop(revoked)
        if taken:
            owned.notify("on_assigned", [q for q, _ in taken])

    def commit(self, entries: Mapping[MessageQueue, OffsetAndMetadata]) -> None:
        """Store the offsets of the queues this member owns per the broker
        (one that lost a queue, even before it noticed, cannot commit it)."""
        groups = self._groups
        with self._lock:
            self._owned.check_open()
            stored = groups.commit(self._group, self._member.cid, entries)
            if not stored or not groups.durable:
                return
            snapshot, version = groups.offsets_snapshot()
        groups.save_offsets(snapshot, version)

    def committed(self, queue: MessageQueue) -> OffsetAndMetadata | None:
        with self._lock:
            return self._group.committed.get(queue)

    def lock(self, queues: Collection[MessageQueue], lease: float) -> frozenset[MessageQueue]:
        with self._lock:
            self._owned.check_open()
            return self._groups.lock_queues(self._group, self._member.cid, queues, lease)

    def unlock(self, queues: Collection[MessageQueue]) -> None:
        with self._lock:
            self._groups.unlock_queues(self._group, self._member.cid, queues)

    def send_back(self, items: Sequence[tuple[MessageExt, int]]) -> list[BaseException | None]:
        return self._schedule.send_back(self._group.name, items)

    def close(self) -> None:
        pass  # the consumer leaves the group (as every member of its broker)
