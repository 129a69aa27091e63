"""The source contract: what the runtime needs from a message log.

A source behaves like RocketMQ's ``DefaultLitePullConsumer`` or Kafka's
``KafkaConsumer``: the group's queues are spread over its members by an
allocation strategy, the member polls batches from the queues it owns, pauses
and resumes queues for flow control, and commits the next offset to consume.

Threading: a source is owned by one thread (lite_push's pull thread).  Only
:meth:`PullSource.wakeup` may be called from another thread.  Rebalance
callbacks run inside :meth:`PullSource.poll`, on the owning thread, so the
owner may commit from ``on_revoked`` before the queue is released to another
member.  Inside ``on_revoked`` the revoked queues are still owned
(``position``, ``seek`` and ``commit`` work on them); inside ``on_assigned``
the new queues are owned and ``position`` tells where they start.

Liveness: a member that does not poll for longer than the source's session
timeout may be evicted; its queues then move without its ``on_revoked``
running first, and its later commits of them are ignored.  Callbacks must
therefore return well within the session timeout (lite_push bounds its
``on_revoked`` by ``revoke_timeout``).
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Collection, Mapping

from .._types import MessageQueue, OffsetAndMetadata, PollBatch

__all__ = ["ConsumeFromWhere", "PullSource", "RebalanceListener"]


class ConsumeFromWhere(enum.Enum):
    """Where a group that has no committed offset for a queue starts."""

    #: The end of the queue at the moment the group first owns it.
    LAST_OFFSET = "LAST_OFFSET"
    #: The first message still stored.
    FIRST_OFFSET = "FIRST_OFFSET"
    #: The first message stored at or after ``consume_timestamp`` (ms).
    TIMESTAMP = "TIMESTAMP"


class RebalanceListener:
    """Told when the queues a member owns change.  Both methods run inside
    :meth:`PullSource.poll` on the owning thread.  The default does nothing."""

    def on_revoked(self, queues: Collection[MessageQueue]) -> None:
        """These queues are about to go to another member.  When this returns,
        the source releases them: commit their final offsets here."""

    def on_assigned(self, queues: Collection[MessageQueue]) -> None:
        """These queues now belong to this member; polls (this one included)
        read them from their committed offset, or from the group's start
        position when it has none."""


class PullSource(abc.ABC):
    """A member of a consumer group on a partitioned log."""

    @abc.abstractmethod
    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume ``topic``.  ``expression`` filters by tag: ``"*"`` (all) or
        ``"TagA || TagB"``.  Filtered messages are skipped by the source; they
        still advance :attr:`PollBatch.next_offset`.  Raises
        ``UnknownTopicError`` for a topic the source does not have and
        ``ValueError`` for a malformed expression."""

    @abc.abstractmethod
    def set_rebalance_listener(self, listener: RebalanceListener | None) -> None:
        """Install the listener told of assignment changes (replaces any)."""

    @abc.abstractmethod
    def poll(self, timeout: float, max_per_queue: int = 32) -> list[PollBatch]:
        """Return the next messages of the owned, unpaused queues.

        At most ``max_per_queue`` messages per queue and at most one batch per
        queue per call; batches of one queue are contiguous across calls (each
        starts at the previous ``next_offset`` unless :meth:`seek` moved it).
        Blocks up to ``timeout`` seconds when nothing is ready; returns ``[]``
        on timeout or after :meth:`wakeup`.  Never blocks longer than
        ``timeout``.  Runs the rebalance listener first when the assignment
        changed.  Raises ``SourceClosedError`` after :meth:`close`."""

    @abc.abstractmethod
    def assignment(self) -> frozenset[MessageQueue]:
        """The queues this member owns now."""

    @abc.abstractmethod
    def pause(self, queues: Collection[MessageQueue]) -> None:
        """Stop returning messages of these queues from :meth:`poll` until they
        are resumed.  The read position is kept.  Queues not owned are
        ignored."""

    @abc.abstractmethod
    def resume(self, queues: Collection[MessageQueue]) -> None:
        """Undo :meth:`pause`.  Queues not paused are ignored."""

    @abc.abstractmethod
    def paused(self) -> frozenset[MessageQueue]:
        """The owned queues that are paused now."""

    @abc.abstractmethod
    def seek(self, queue: MessageQueue, offset: int) -> None:
        """Make the next poll of ``queue`` start at ``offset`` (clamped to the
        stored range).  Raises ``NotSubscribedError`` if not owned."""

    @abc.abstractmethod
    def position(self, queue: MessageQueue) -> int:
        """The offset the next poll of ``queue`` starts at.  Raises
        ``NotSubscribedError`` if not owned."""

    @abc.abstractmethod
    def commit(self, offsets: Mapping[MessageQueue, OffsetAndMetadata | int]) -> None:
        """Store, for the group, the next offset to consume of each queue
        (everything below it is done).  A plain ``int`` means no metadata.
        Commits for queues not owned are ignored (a late commit of a revoked
        queue must not move the new owner back)."""

    @abc.abstractmethod
    def committed(self, queue: MessageQueue) -> OffsetAndMetadata | None:
        """The group's committed position of ``queue``, or ``None``."""

    @abc.abstractmethod
    def lock(self, queues: Collection[MessageQueue], lease: float) -> frozenset[MessageQueue]:
        """Take or renew the group's broker-side lock of each queue for this
        member, for ``lease`` seconds (RocketMQ's ``lockBatchMQ``); return
        the queues it now holds.  A queue locked by another member whose
        lease has not run out is not granted.  Orderly consumers process a
        queue only while they hold its lock."""

    @abc.abstractmethod
    def unlock(self, queues: Collection[MessageQueue]) -> None:
        """Release this member's locks of these queues (others' are kept)."""

    @abc.abstractmethod
    def wakeup(self) -> None:
        """Make a blocked or the next :meth:`poll` return at once.  The only
        method that may be called from any thread."""

    @abc.abstractmethod
    def close(self) -> None:
        """Leave the group: release the owned queues (without committing;
        commit first) so the other members take them.  Idempotent."""
