"""A Kafka member's partitions as its group assigns them: confluent-kafka's
rebalance callbacks, which run inside ``consume`` of the member's group
client, on the thread that serves it (never the event loop's: see
``consumer.py``).

A member has two clients: the *group client* joins the group (it runs
these callbacks, heartbeats, commits) and never fetches: its partitions
are assigned at their end and paused at once; the *fetcher* reads them by
manual assignment.  On assignment the start of each new partition is its
committed offset, else where ``consume_from`` says (as Kafka's
``auto.offset.reset``: nothing is committed until the runtime commits); the
fetcher is assigned the partitions there; then ``on_assigned``.  On
revocation ``on_revoked`` runs first, while the partitions are still owned:
lite_push drains their listener calls (up to ``revoke_timeout``) and
commits, and only then are they taken from the fetcher and does the callback
return, so librdkafka gives them up.  Partitions *lost* (the session
expired) are dropped at once and their commits are ignored; ``on_revoked``
is told so the runtime drops them.  A partition the fetcher gives up while
paused is resumed first: librdkafka keeps the pause with the partition, so
one assigned back later would never be fetched.

Every callback applies the change to the group client itself
(``incremental_assign`` / ``incremental_unassign``), also while the member
closes, when it leaves everything else as it is.  A callback that did not
would leave it to confluent-kafka, which first asks librdkafka for the
rebalance protocol; called from the revoke that ``Consumer.close()`` runs,
that call can block for ever, holding the GIL (librdkafka issue #4041), and
the whole process with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition

from ..._types import MessageQueue
from .._owned import OwnedQueues
from ..contract import ConsumeFromWhere
from .codec import lite_topic
from .fetcher import Fetcher
from .ownership import Ownership
from .reading import PartitionState, start_positions, tags_for

__all__ = ["Partitions"]

logger = logging.getLogger(__name__)


class Partitions:
    """The rebalance callbacks of one member (``on_assign``, ``on_revoke``,
    ``on_lost``: for the group client's ``Consumer.subscribe``), which keep
    its ``owned`` queues, its partitions by Kafka name (``by_name``) and
    the ``fetcher``'s assignment.  ``filters`` (Kafka name or pattern ->
    tag filter) is read when a partition is taken; an assignment renews
    ``ownership``."""

    __slots__ = (
        "_owned",
        "_fetcher",
        "_filters",
        "_broker_name",
        "_ownership",
        "_consume_from",
        "_consume_timestamp",
        "by_name",
        "revoking",
        "closing",
    )

    def __init__(
        self,
        owned: OwnedQueues[PartitionState],
        by_name: dict[tuple[str, int], PartitionState],
        fetcher: Fetcher,
        filters: dict[str, frozenset[str] | None],
        broker_name: str,
        ownership: Ownership,
        consume_from: ConsumeFromWhere,
        consume_timestamp: int | None,
    ) -> None:
        self._owned = owned
        #: The client that reads the partitions (manual assignment).
        self._fetcher = fetcher
        self._filters = filters
        self._broker_name = broker_name
        self._ownership = ownership
        self._consume_from = consume_from
        self._consume_timestamp = consume_timestamp
        #: The owned partitions by (Kafka topic name, partition).
        self.by_name = by_name
        #: Inside the revoke callback: a commit there waits out a rebalance.
        self.revoking = False
        #: The member is closing: the callbacks leave everything as it is.
        self.closing = False

    def on_assign(self, kc: Consumer, partitions: list[TopicPartition]) -> None:
        if self.closing or not partitions:
            self._settle(
                kc.incremental_assign, [TopicPartition(tp.topic, tp.partition, OFFSET_END) for tp in partitions]
            )
            return
        owned = self._owned
        committed = kc.committed([TopicPartition(tp.topic, tp.partition) for tp in partitions], timeout=10.0)
        starts = start_positions(kc, committed, self._consume_from, self._consume_timestamp, owned.group)
        assign = []
        new: list[PartitionState] = []
        for tp in committed:
            pos = starts[(tp.topic, tp.partition)]
            mq = MessageQueue(lite_topic(tp.topic), self._broker_name, tp.partition)
            st = PartitionState(mq, tp.topic, pos, tags_for(self._filters, tp.topic))
            self.by_name[(tp.topic, tp.partition)] = st
            assign.append(TopicPartition(tp.topic, tp.partition, pos))
            new.append(st)
        added = owned.add(new)
        # The group client holds the partitions without reading them: at
        # their end, paused (its pause stays with a partition it gets back).
        kc.incremental_assign([TopicPartition(tp.topic, tp.partition, OFFSET_END) for tp in assign])
        kc.pause([TopicPartition(tp.topic, tp.partition) for tp in assign])
        self._fetcher.assign([(tp.topic, tp.partition, tp.offset) for tp in assign])
        self._ownership.assigned()
        owned.notify("on_assigned", sorted(added))

    def _drop(self, partitions: list[TopicPartition]) -> list[MessageQueue]:
        gone = [st for tp in partitions if (st := self.by_name.pop((tp.topic, tp.partition), None)) is not None]
        self._fetcher.give_up(gone)
        mqs = [st.mq for st in gone]
        self._owned.drop(mqs)
        return sorted(mqs)

    def on_revoke(self, kc: Consumer, partitions: list[TopicPartition]) -> None:
        if self.closing:
            self._settle(kc.incremental_unassign, partitions)
            return
        by_name = self.by_name
        queues = sorted(st.mq for tp in partitions if (st := by_name.get((tp.topic, tp.partition))) is not None)
        if queues:
            self.revoking = True
            try:
                self._owned.notify("on_revoked", queues)  # drains and commits while still owned
            finally:
                self.revoking = False
        self._drop(partitions)
        self._settle(kc.incremental_unassign, partitions)

    def on_lost(self, kc: Consumer, partitions: list[TopicPartition]) -> None:
        gone = self._drop(partitions)  # first: their commits are now ignored
        if gone and not self.closing:
            owned = self._owned
            logger.warning(
                "group %r: %r lost %s (its session expired)", owned.group, owned.client_id, [str(q) for q in gone]
            )
            owned.notify("on_revoked", gone)
        self._settle(kc.incremental_unassign, partitions)

    def _settle(self, change: Callable[[list[TopicPartition]], None], partitions: list[TopicPartition]) -> None:
        """Apply a rebalance's ``change`` to the group client (see the module
        docstring); a failure is logged (closing: at debug level)."""
        try:
            change(partitions)
        except (KafkaException, RuntimeError) as e:
            level = logging.DEBUG if self.closing else logging.WARNING
            logger.log(
                level,
                "group %r: applying a rebalance to %d partition(s) failed: %s",
                self._owned.group,
                len(partitions),
                e,
            )
