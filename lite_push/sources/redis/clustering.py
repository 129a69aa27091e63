"""CLUSTERING on Redis: a member's share of its group's queues.

The member's side of the rebalance described in the package docstring.  A
poll reads the group's version in its pipelined read (:meth:`Clustering.watch`);
the rebalance runs (:meth:`Clustering.refresh`) when the version moved, a
wanted queue was still taken, a heartbeat is due (:meth:`~.membership.Membership.heartbeat_in`)
or the rebalance interval is up:
the owned queues that left the target, or were lost, go through
``on_revoked`` and are released; the free target queues are taken, each at
its start position, then ``on_assigned``.  A rebalance that fails half way
keeps the revoked queues' owner keys in ``_unreleased`` and releases them
on the next attempt (their ``on_revoked`` is not called twice).  Everything
about the group's keys is :class:`~.membership.Membership`'s.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from ..._types import MessageExt, MessageQueue, OffsetAndMetadata
from ...rebalance.allocate import AllocateStrategy
from .._member_model import MemberModel
from .._owned import OwnedQueues
from ..contract import Balance, MessageModel, retry_topic
from .connection import Connection
from .lost_data import LostData, went_back
from .membership import Membership
from .reading import QueueReader
from .retries import Retries
from .topics import TopicCatalog

__all__ = ["Clustering"]

logger = logging.getLogger(__name__)


class Clustering(MemberModel):
    """CLUSTERING for one member: ``membership`` is its session in the
    group, ``allocate`` shares each topic's queues out, ``reader(queue,
    position)`` makes an owned queue's state; ``rebalance_interval`` is
    the longest a member goes without looking at its target (and its
    heartbeat schedule is the membership's)."""

    message_model = MessageModel.CLUSTERING

    def __init__(
        self,
        owned: OwnedQueues[QueueReader],
        membership: Membership,
        conn: Connection,
        topics: TopicCatalog,
        retries: Retries,
        allocate: AllocateStrategy,
        reader: Callable[[MessageQueue, int], QueueReader],
        rebalance_interval: float,
    ) -> None:
        self._owned = owned
        self._members = membership
        self._topics = topics
        self._retries = retries
        self._allocate = allocate
        self._reader = reader
        self._rebalance_interval = rebalance_interval
        self._subscribed: list[str] = []
        self._seen_version: bytes | None = None
        #: A wanted queue is still another member's (or a topic is new):
        #: rebalance at the next read.
        self._pending = False
        # revoked after on_revoked, whose owner keys could not be deleted yet
        self._unreleased: set[MessageQueue] = set()
        self._last_rebalance = -math.inf
        #: Says so when the server lost the group's data (a FLUSHALL, ...).
        self._lost_data = LostData(conn, owned.group)
        self.channels = (membership.channel, conn.notify_channel(retry_topic(owned.group)))

    @property
    def session_timeout(self) -> float:
        return self._members.session_timeout

    def owned_for(self) -> dict[MessageQueue, float]:
        return self._members.owned_for(self._owned.states)

    def subscribe(self, topic: str) -> None:
        """Join the group on ``topic`` too (a heartbeat: it bumps the version);
        the first time, record the group's balance (``ConfigError`` if its
        live members balance by message)."""
        if not self._subscribed:
            self._members.claim_balance(Balance.QUEUE)
        self._subscribed.append(topic)
        self._members.heartbeat(sorted(self._owned.states), self._subscribed)
        self._seen_version = None

    def renew_in(self) -> float | None:
        """Seconds until the next heartbeat is due (once subscribed)."""
        return self._members.heartbeat_in() if self._subscribed else None

    def watch(self, pipe: Any) -> int:
        """The group's version, read with the poll (once subscribed)."""
        if not self._subscribed:
            return 0
        pipe.get(self._members.version_key)
        return 1

    def refresh(self, replies: Sequence[Any] = (), rebalance: bool = True) -> bool:
        """Rebalance when the group's version (``replies``) moved, a wanted
        queue was taken, or an interval is up; return whether the owned
        queues changed (with ``rebalance`` False: whether that is due; the
        heartbeat goes with the rebalance, so it waits for it too)."""
        if not replies:
            return False
        if (
            replies[0] != self._seen_version
            or self._pending
            or self._members.heartbeat_in() <= 0
            or time.monotonic() - self._last_rebalance >= self._rebalance_interval
        ):
            return self._rebalance(went_back(self._seen_version, replies[0])) if rebalance else True
        return False

    def _release(self) -> None:
        """Release the queues revoked (after their on_revoked); kept for the
        next rebalance if Redis fails."""
        if self._unreleased:
            qs = list(self._unreleased)
            self._members.release(qs)
            self._unreleased.difference_update(qs)

    def _rebalance(self, reset: bool = False) -> bool:
        """Bring the owned set to the target; return whether it changed.
        ``reset``: the group's version vanished or went back (its keys were
        reset: :mod:`.lost_data` says so)."""
        owned, members = self._owned, self._members
        self._release()  # what a failed rebalance left
        version, lost, by_topic = members.heartbeat(sorted(owned.states), self._subscribed)
        self._last_rebalance = time.monotonic()
        cid = owned.client_id
        target: set[MessageQueue] = set()
        for topic in self._subscribed:
            queues = self._topics.get(topic).queues
            cids = sorted(set(by_topic.get(topic, ())) | {cid})
            share = self._allocate(owned.group, cid, queues, cids)
            target.update(q for q in share if q.topic == topic)
        lost_set = set(lost)
        drop = [q for q in owned.states if q not in target and q not in lost_set]
        revoked = sorted(lost + drop)
        changed = False
        if (lost or reset) and self._lost_data.check(self._subscribed, group_reset=reset):
            pass  # the server lost the group's data: said, and the session is not to blame
        elif lost:
            logger.warning("group %r: %r lost %s (its session expired)", owned.group, cid, [str(q) for q in lost])
        if revoked:
            owned.notify("on_revoked", revoked)
            owned.drop(revoked)
            members.forget(revoked)
            self._unreleased.update(drop)
            changed = True
            self._release()
        new = sorted(q for q in target if q not in owned.states)
        taken: list[MessageQueue] = []
        if new:
            taken = members.acquire(new)
            # all positions first: if Redis fails here, nothing is half taken
            # (the owner keys are ours; the next attempt takes them again)
            positions = [members.start_position(q, self._topics) for q in taken]
            members.say_skipped()
            owned.add(self._reader(q, pos) for q, pos in zip(taken, positions, strict=True))
        self._pending = len(taken) < len(new)
        self._seen_version = version
        if taken:
            owned.notify("on_assigned", taken)
            changed = True
        return changed

    def commit(self, entries: Mapping[MessageQueue, OffsetAndMetadata]) -> None:
        """Store the offsets of the queues whose owner key holds this member."""
        stored = self._members.commit(entries)
        if stored < len(entries):
            logger.debug("%r: %d commit(s) ignored: not its queues", self._owned.who, len(entries) - stored)

    def committed(self, queue: MessageQueue) -> OffsetAndMetadata | None:
        return self._members.committed(queue)

    def lock(self, queues: Collection[MessageQueue], lease: float) -> frozenset[MessageQueue]:
        return self._members.lock(queues, lease)

    def unlock(self, queues: Collection[MessageQueue]) -> None:
        self._members.unlock(queues)

    def send_back(self, items: Sequence[tuple[MessageExt, int]]) -> list[BaseException | None]:
        """The copies wait in the group's schedule until due, then a poll
        moves them to ``%RETRY%<group>``."""
        return self._retries.store_retries(self._owned.group, items)

    def close(self) -> None:
        """Release the owned queues and the locks at once, and leave the
        group's registry if subscribed."""
        owned = (*self._owned.states, *self._unreleased)
        self._members.leave(owned, member=bool(self._subscribed))
