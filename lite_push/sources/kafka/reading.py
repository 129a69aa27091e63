"""A Kafka member's reading: per-partition files of fetched records, the
batches a poll returns, and where a newly assigned partition starts.

``consume`` hands back records of many partitions at once, up to a count,
not per partition.  Each owned partition keeps a *file*: the records fetched
for it and not yet returned (more than ``max_per_queue`` came, or it is
paused).  A poll takes at most ``max_per_queue`` from each unpaused
partition's file, in turn, so a partition's batches stay contiguous.  A
record below the file's end was fetched again (librdkafka refetches after a
pause, a resume or a seek) and is dropped; Kafka's own gaps (compaction,
transaction markers) are passed over by ``next_offset``.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ..._kernels.kafka_decode import decode_plain
from ..._kernels.untrack import untrack_all
from ..._types import MessageExt, MessageQueue, PollBatch
from .._common import warn_skipped_start
from ..contract import ConsumeFromWhere
from .codec import MalformedRecord, RecordFormat, lite_topic

__all__ = ["PartitionState", "decode_rest", "file_records", "start_positions", "tags_for", "take_batches"]

logger = logging.getLogger(__name__)


class PartitionState:
    """One owned partition: where the next batch starts and what was
    fetched for it but not returned yet."""

    __slots__ = ("mq", "name", "pos", "fetched", "file", "paused", "tags")

    def __init__(self, mq: MessageQueue, name: str, pos: int, tags: frozenset[str] | None) -> None:
        self.mq = mq
        #: The Kafka topic name.
        self.name = name
        #: The offset the next batch starts at (``position``).
        self.pos = pos
        #: The offset after the last filed record.
        self.fetched = pos
        self.file: deque[Any] = deque()
        self.paused = False
        self.tags = tags


def tags_for(filters: dict[str, frozenset[str] | None], name: str) -> frozenset[str] | None:
    """The tag filter of Kafka topic ``name``: its own subscription's, else
    that of the first pattern (``^...``) it matches; None: no filter."""
    if name in filters:
        return filters[name]
    for pattern, tags in filters.items():
        if pattern.startswith("^") and re.search(pattern, name):
            return tags
    return None


def decode_rest(rec: Any, topic: str, fmt: RecordFormat) -> Any:
    """A record the fast path (``decode_plain``) left, decoded by the full
    decoder (its message, untracked by the cyclic GC), or the record itself
    when it is malformed (:func:`take_batches` dead-letters it)."""
    try:
        m = fmt.decode(rec, topic)
    except MalformedRecord:
        return rec
    untrack_all([m])
    return m


def file_records(
    by_name: dict[tuple[str, int], PartitionState], records: Iterable[Any], fmt: RecordFormat, owner: object
) -> None:
    """File what ``consume`` returned under its partitions; log (never
    raise) a record-level error unless it is fatal.  Each record is decoded
    into its message as it is filed (one without headers by
    ``decode_plain``, compiled when built; the rest by the full decoder,
    :func:`decode_rest`): the record object goes at once, and a message
    held in a file is untracked by the cyclic GC.  A malformed record is
    filed as it is, for :func:`take_batches` to dead-letter."""
    decode_key = fmt.decode_key
    broker_name = fmt.broker_name
    name: str | None = None
    part = -1
    st: PartitionState | None = None
    for rec in records:
        err = rec.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                continue
            if err.fatal():
                raise KafkaException(err)
            logger.warning("%r: %s", owner, err.str())
            continue
        topic = rec.topic()
        partition = rec.partition()
        if partition != part or topic != name:  # records come in runs of one partition
            name, part = topic, partition
            st = by_name.get((topic, partition))
        if st is None:  # revoked meanwhile
            continue
        off = rec.offset()
        if off < st.fetched:  # fetched again (after a pause or a seek)
            continue
        m = decode_plain(rec, st.mq.topic, decode_key, broker_name)
        st.file.append(decode_rest(rec, st.mq.topic, fmt) if m is None else m)
        st.fetched = off + 1


def _dead_letter(
    rec: Any, e: MalformedRecord, store_malformed: Callable[[Any, str], BaseException | None], owner: object
) -> bool:
    """Dead-letter a malformed record (logged); whether it was stored."""
    err = store_malformed(rec, str(e))
    if err is not None:
        logger.error(
            "%r: malformed record %s-%d@%d not dead-lettered (%s); retrying",
            owner,
            rec.topic(),
            rec.partition(),
            rec.offset(),
            err,
        )
        return False
    logger.warning("%r: record %s-%d@%d dead-lettered: %s", owner, rec.topic(), rec.partition(), rec.offset(), e)
    return True


def take_batches(
    order: Iterable[PartitionState],
    max_per_queue: int,
    fmt: RecordFormat,
    store_malformed: Callable[[Any, str], BaseException | None] | None,
    owner: object,
) -> list[PollBatch]:
    """At most ``max_per_queue`` messages of each partition's file (each
    decoded when filed, or a record the full decoder decodes now, in
    ``fmt``), tag-filtered, as one batch per partition that moved.  A
    malformed record is dead-lettered (``store_malformed(record, reason)``:
    the error, or None once stored) and passed over; if that fails, or
    without ``store_malformed`` (a read that must not wait for the store),
    the partition's batch stops before it (tried next poll)."""
    out: list[PollBatch] = []
    decode = fmt.decode
    for st in order:
        file = st.file
        if not file:
            continue
        messages: list[MessageExt] = []
        pos = st.pos
        tags = st.tags
        topic = st.mq.topic
        while file and len(messages) < max_per_queue:
            rec = file[0]
            # Most records were decoded when filed; the full decoder for the
            # rest (and to say why a record is malformed).
            if type(rec) is MessageExt:
                m = rec
            else:
                try:
                    m = decode(rec, topic)
                except MalformedRecord as e:
                    if store_malformed is None or not _dead_letter(rec, e, store_malformed, owner):
                        break  # tried again next poll
                    file.popleft()
                    pos = rec.offset() + 1
                    continue
            file.popleft()
            pos = m.queue_offset + 1
            if tags is None or m.tags in tags:
                messages.append(m)
        if pos != st.pos:
            st.pos = pos
            untrack_all(messages)  # held until finished: see lite_push._kernels.untrack_py
            out.append(PollBatch(st.mq, messages, pos))
    return out


def start_positions(
    kc: Consumer,
    committed: list[TopicPartition],
    consume_from: ConsumeFromWhere,
    consume_timestamp: int | None,
    group: str,
) -> dict[tuple[str, int], int]:
    """Where each newly assigned partition starts: its committed offset,
    else where ``consume_from`` says (Kafka's ``auto.offset.reset``: nothing
    is committed until the runtime commits).  A new group starting at
    LAST_OFFSET says how many stored messages it skips."""
    starts = {(tp.topic, tp.partition): tp.offset for tp in committed if tp.offset >= 0}
    fresh = [tp for tp in committed if tp.offset < 0]
    if not fresh:
        return starts
    if consume_from is ConsumeFromWhere.TIMESTAMP:
        asked = [TopicPartition(tp.topic, tp.partition, consume_timestamp or 0) for tp in fresh]
        for tp in kc.offsets_for_times(asked, timeout=10.0):
            if tp.offset >= 0:
                starts[(tp.topic, tp.partition)] = tp.offset
            else:  # nothing stored at or after the time: the end
                starts[(tp.topic, tp.partition)] = kc.get_watermark_offsets(tp, timeout=10.0)[1]
        return starts
    skipped: dict[str, int] = {}
    for tp in fresh:
        lo, hi = kc.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=10.0)
        if consume_from is ConsumeFromWhere.FIRST_OFFSET:
            starts[(tp.topic, tp.partition)] = lo
        else:
            starts[(tp.topic, tp.partition)] = hi
            skipped[tp.topic] = skipped.get(tp.topic, 0) + (hi - lo)
    for name, n in skipped.items():
        if n:
            warn_skipped_start(group, lite_topic(name), n)
    return starts
