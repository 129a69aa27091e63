"""A Kafka member's fetcher: the client that reads the member's partitions.

A member has two clients (``consumer.py`` says why): the group client, which
joins the group, and this one, which reads the partitions the group gave
the member by manual assignment.  It joins no group, commits nothing and
runs no rebalance callback, so reading it never runs one: the event loop's
thread may read it (``KafkaPullConsumer.poll_nowait``).  Its client is
``fetch_client``'s: librdkafka's C API directly when the compiled twin is
built, else confluent-kafka's ``Consumer``.

What it fetches is filed per partition, each record decoded into its
message as it is filed, and handed out by :func:`~.reading.take_batches`.
Pause and resume are per partition; a resume is followed by a seek to the
end of the partition's file, which restarts librdkafka's fetcher at once
(it would otherwise wait for its next idle wake-up, about a second: 0.95 s
measured on the mock cluster).  A partition given up while paused is
resumed first: librdkafka keeps the pause with the partition, so one
assigned back later would never be fetched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException

from ..._types import MessageExt, PollBatch
from .._common import GC_PAUSE_MIN, gc_paused
from .._owned import OwnedQueues
from .codec import RecordFormat
from .reading import PartitionState, take_batches

__all__ = ["FILE_LIMIT", "METADATA_TIMEOUT", "Fetcher"]

logger = logging.getLogger(__name__)

#: Records filed for unpaused partitions beyond which a read fetches no more.
FILE_LIMIT = 4096
#: Longest wait (seconds) for a topic's metadata before its first assignment,
#: or for a partition's watermarks.
METADATA_TIMEOUT = 10.0


class Fetcher:
    """Reads ``owned``'s partitions with ``client`` (a ``fetch_client``:
    see the module docstring).  ``by_name`` (the owned partitions by Kafka name, kept by
    the rebalance callbacks) is where records are filed; a malformed record
    is dead-lettered with ``store_malformed(record, reason)``.  Used by the
    member's owning thread only (as the member is)."""

    __slots__ = ("_by_name", "_client", "_fmt", "_owned", "_owner", "_rr", "_store_malformed", "_topics")

    def __init__(
        self,
        client: Any,
        owned: OwnedQueues[PartitionState],
        by_name: dict[tuple[str, int], PartitionState],
        fmt: RecordFormat,
        store_malformed: Callable[[Any, str], BaseException | None],
    ) -> None:
        self._client = client
        self._owned = owned
        self._by_name = by_name
        self._fmt = fmt
        self._store_malformed = store_malformed
        self._owner = owned.who
        self._rr = 0
        #: The topics whose metadata the client has.
        self._topics: set[str] = set()

    # -- reading -----------------------------------------------------------------------

    def ready(self) -> int:
        """Records filed for the unpaused partitions."""
        return sum([len(st.file) for st in self._owned.active])

    def read(self, max_per_queue: int, wait: float) -> int:
        """Fetch what librdkafka holds for the unpaused partitions (up to
        ``max_per_queue`` each, at most :data:`FILE_LIMIT`), waiting up to
        ``wait`` seconds for a first record, and file it; return how many
        records came."""
        active = self._owned.active
        if not active:
            return 0
        count = min(FILE_LIMIT, max_per_queue * len(active))
        with gc_paused(not wait and count >= GC_PAUSE_MIN):  # every object made here lives on, or goes at once
            return int(self._client.read(self._by_name, count, wait, self._fmt, self._owner))

    def batches(self, max_per_queue: int, store: bool = True) -> list[PollBatch]:
        """At most ``max_per_queue`` messages of each unpaused partition,
        the partitions in turn (round robin across calls).  ``store``
        False (a read that must not wait for the broker): a malformed
        record is left filed, not dead-lettered (see :meth:`malformed`)."""
        active = self._owned.active
        n = len(active)
        if not n:
            return []
        start = self._rr % n
        self._rr = start + 1
        order = active[start:] + active[:start]
        return take_batches(order, max_per_queue, self._fmt, self._store_malformed if store else None, self._owner)

    def malformed(self) -> bool:
        """Whether an unpaused partition's next record is a malformed one
        left filed (a read with ``store`` True dead-letters it)."""
        return any([st.file and type(st.file[0]) is not MessageExt for st in self._owned.active])

    # -- the assignment ----------------------------------------------------------------

    def assign(self, partitions: list[tuple[str, int, int]]) -> None:
        """Read these ``(topic, partition, offset)``s from their offsets.  A
        topic new to the client has its metadata asked for first: librdkafka
        would otherwise start fetching it only on a later metadata refresh
        (0.9 s measured on the mock cluster for a client idle 0.1 s before
        its first assignment)."""
        known = self._topics
        for name in sorted({t for t, _, _ in partitions} - known):
            try:
                self._client.load_metadata(name, METADATA_TIMEOUT)
            except KafkaException as e:  # it starts on the next refresh
                logger.debug("%r: metadata of %r not read: %s", self._owner, name, e)
            else:
                known.add(name)
        self._client.assign(partitions)

    def give_up(self, states: list[PartitionState]) -> None:
        """Stop reading these partitions (resumed first where paused)."""
        if not states:
            return
        paused = [(st.name, st.mq.queue_id) for st in states if st.paused]
        try:
            if paused:
                self._client.resume(paused)
            self._client.unassign([(st.name, st.mq.queue_id) for st in states])
        except KafkaException as e:  # a partition the client no longer knows
            logger.debug("%r: giving up %s in the fetcher failed: %s", self._owner, [st.mq for st in states], e)

    def pause(self, states: list[PartitionState]) -> None:
        """Stop fetching these partitions (their filed records are kept)."""
        if states:
            self._client.pause([(st.name, st.mq.queue_id) for st in states])

    def resume(self, states: list[PartitionState]) -> None:
        """Fetch these partitions again, at once (a seek to the end of each
        file restarts librdkafka's fetcher)."""
        if not states:
            return
        self._client.resume([(st.name, st.mq.queue_id) for st in states])
        for st in states:
            try:
                self._client.seek(st.name, st.mq.queue_id, st.fetched)
            except KafkaException as e:  # not fetching yet: it starts on its own
                logger.debug("%r: seek after resume of %s failed: %s", self._owner, st.mq, e)

    def seek(self, st: PartitionState, offset: int) -> None:
        """Read ``st``'s partition from ``offset`` clamped to its stored
        range; what was filed goes."""
        lo, hi = self._client.watermarks(st.name, st.mq.queue_id, METADATA_TIMEOUT)
        pos = min(max(int(offset), lo), hi)
        self._client.seek(st.name, st.mq.queue_id, pos)
        st.file.clear()
        st.pos = st.fetched = pos

    def high_watermark(self, topic: str, partition: int) -> int | None:
        """The end of a partition as the fetcher last saw it (no request);
        ``None`` before it fetched it."""
        try:
            hi = self._client.cached_high(topic, partition)
        except (KafkaException, RuntimeError, ValueError):
            return None
        return None if hi is None else int(hi)

    def close(self) -> None:
        """Let go of the client."""
        try:
            self._client.close()
        except (KafkaException, RuntimeError) as e:
            logger.debug("%r: closing the fetcher failed: %s", self._owner, e)
