"""KafkaPullConsumer: a member of a Kafka consumer group, as a PullSource.

One ``confluent_kafka.Consumer`` per member, with the cooperative-sticky
assignor (a rebalance moves only the partitions that change owner), manual
commits, and the offset map in the commit metadata.

Polling: ``poll`` calls ``Consumer.consume`` in slices of at most
:data:`WAIT_SLICE` (confluent-kafka has no wakeup, so :meth:`wakeup` is seen
within a slice).  Records are filed per partition; a partition's file holds
what was fetched but not yet returned (more than ``max_per_queue`` came, or
the partition is paused), so batches of one partition stay contiguous.  A
record at an offset below the partition's file end is a re-fetch and is
dropped; Kafka's own gaps (compaction, transaction markers) are passed over
by ``next_offset``.  At most :data:`FILE_LIMIT` records wait in the files of
unpaused partitions before ``poll`` stops fetching more.

Pause and resume are per partition, in librdkafka too (the fetcher stops for
that partition only); a paused partition's filed records are kept.  A resume
is followed by a seek to the end of the partition's file, which restarts
librdkafka's fetcher at once (it would otherwise wait for its next idle
wake-up, about a second: 0.95 s measured on the mock cluster).

Rebalance (inside ``poll``, on the owning thread, through confluent-kafka's
callbacks): on assignment the start of each new partition is its committed
offset, else where ``consume_from`` says (as Kafka's ``auto.offset.reset``:
nothing is committed until the runtime commits); then ``on_assigned``.  On revocation
``on_revoked`` runs first, while the partitions are still owned: lite_push
drains their listener calls (up to ``revoke_timeout``) and commits, and only
then does the callback return and librdkafka give them up.  Partitions
*lost* (the session expired) are dropped at once and their commits are
ignored; ``on_revoked`` is told so the runtime drops them.

Fencing: librdkafka heartbeats from its own thread.  Every
:data:`STATS_INTERVAL` its statistics say how long ago the group coordinator
last answered (``rxidle``); ownership is certain until that answer's request
time (the answer less the round trip) plus ``session.timeout.ms``.

Locks: a partition has one owner in a Kafka group, so :meth:`lock` grants
the asked partitions this member owns (the assignment is the lock).
Retries: Kafka has no delayed delivery (``delayed_delivery`` is False): the
runtime holds a failed message for its delay level and only then calls
:meth:`send_back`, which produces the copy to the retry topic at once.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaException, TopicPartition

from ..._errors import ConfigError, SourceClosedError, UnknownTopicError
from ..._types import MessageExt, MessageQueue, OffsetAndMetadata, PollBatch
from .._base import ConsumeFromWhere, PullSource, RebalanceListener, is_retry_or_dlq_topic
from .._common import QueueStates, check_lease, commit_entries, parse_tag_expression
from .client_log import LIBRDKAFKA_LOGGER
from .codec import kafka_topic, lite_topic
from .commits import COMMIT_PATIENCE, commit_within, fit_metadata
from .ownership import STATS_INTERVAL, Ownership
from .reading import PartitionState, file_records, start_positions, tags_for, take_batches

if TYPE_CHECKING:
    from .broker import KafkaBroker

__all__ = ["FILE_LIMIT", "WAIT_SLICE", "KafkaPullConsumer"]

logger = logging.getLogger(__name__)

#: Longest single wait inside a poll (seconds): the wakeup latency.
WAIT_SLICE = 0.02
#: Pause after consume came back early with nothing (seconds).
EMPTY_BACKOFF = 0.002
#: librdkafka's ``reconnect.backoff.ms`` unless set (its default is 100).
RECONNECT_BACKOFF_MS = "10"
#: Records filed for unpaused partitions beyond which a poll fetches no more.
FILE_LIMIT = 4096
class KafkaPullConsumer(QueueStates[PartitionState], PullSource):
    """A member of a Kafka consumer group; see
    :class:`~lite_push.sources.PullSource` and the module docstring.  Owned
    by one thread; only :meth:`wakeup` and :meth:`end_offsets` may be
    called from others."""

    _broker: KafkaBroker  # type: ignore[assignment]

    def __init__(
        self,
        broker: KafkaBroker,
        group: str,
        *,
        consume_from: ConsumeFromWhere = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp: int | None = None,
        client_id: str | None = None,
    ) -> None:
        if not isinstance(group, str) or not group:
            raise ConfigError("group", f"must be a non-empty string, got {group!r}")
        if not isinstance(consume_from, ConsumeFromWhere):
            raise ConfigError("consume_from", f"must be a ConsumeFromWhere, got {consume_from!r}")
        if consume_from is ConsumeFromWhere.TIMESTAMP and type(consume_timestamp) is not int:
            raise ConfigError(
                "consume_timestamp", f"must be ms since the epoch with TIMESTAMP, got {consume_timestamp!r}"
            )
        if client_id is not None and (not isinstance(client_id, str) or not client_id):
            raise ConfigError("client_id", f"must be a non-empty string, got {client_id!r}")
        broker.check_open()
        self._broker = broker
        self._group = group
        self._cid = client_id or f"lite-push-{group}-{id(self):x}"
        self._consume_from = consume_from
        self._consume_timestamp = consume_timestamp
        self._store = None
        self._listener: RebalanceListener | None = None
        self._filters: dict[str, frozenset[str] | None] = {}  # Kafka name -> tag filter
        self._subscription_changed = False
        self._revoking = False  # inside the revoke callback: its commit waits out a rebalance
        self._states: dict[MessageQueue, PartitionState] = {}
        self._active: list[PartitionState] = []
        self._by_name: dict[tuple[str, int], PartitionState] = {}
        self._wakeup_flag = False
        self._event = threading.Event()  # ends a wait of a poll with nothing to fetch
        self._closed = False
        self._closing = False
        self._ownership = Ownership(broker.session_timeout)
        self._rr = 0
        timeout_ms = int(broker.session_timeout * 1000)
        settings = broker.client_settings(
            {
                "group.id": group,
                "client.id": self._cid,
                "partition.assignment.strategy": "cooperative-sticky",
                "enable.auto.commit": "false",
                "enable.auto.offset.store": "false",
                "auto.offset.reset": "earliest" if consume_from is ConsumeFromWhere.FIRST_OFFSET else "latest",
                "session.timeout.ms": str(timeout_ms),
                "heartbeat.interval.ms": str(max(100, timeout_ms // 10)),
                "statistics.interval.ms": str(int(STATS_INTERVAL * 1000)),
                "stats_cb": self._ownership.on_stats,
                "logger": LIBRDKAFKA_LOGGER,
            }
        )
        settings.setdefault("max.poll.interval.ms", str(max(timeout_ms + 1000, 300_000)))
        # librdkafka holds back new broker connections for half of this
        # (50 ms by default): at start that delays joining the group.
        settings.setdefault("reconnect.backoff.ms", RECONNECT_BACKOFF_MS)
        # Connect to every broker as soon as it is known, not when first
        # needed: joining waits for one (measured on the mock cluster: the
        # join took 4 ms, or 15 ms half of the time with sparse connections).
        settings.setdefault("enable.sparse.connections", "false")
        try:
            self._kc = Consumer(settings)
        except KafkaException as e:
            raise ConfigError("consumer_config", str(e.args[0].str() if e.args else e)) from None

    # -- identity -------------------------------------------------------------

    @property
    def group(self) -> str:
        return self._group

    @property
    def client_id(self) -> str:
        return self._cid

    @property
    def session_timeout(self) -> float:
        return self._broker.session_timeout

    @property
    def delayed_delivery(self) -> bool:
        return False

    @property
    def assignment_is_lock(self) -> bool:
        return True

    @property
    def metadata_limit(self) -> int:
        return self._broker.metadata_max_bytes

    @property
    def delay_levels(self) -> tuple[float, ...]:
        return self._broker.delay_levels

    def queue_count(self, topic: str) -> int | None:
        try:
            return self._broker.partition_count(topic)
        except (KafkaException, ValueError):
            return None

    def owned_for(self) -> dict[MessageQueue, float]:
        left = self._ownership.left()
        return {q: left for q in self._states}

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"<KafkaPullConsumer {self._group!r}/{self._cid!r}{' closed' if self._closed else ''}>"

    def _check_open(self) -> None:
        if self._closed:
            raise SourceClosedError(f"consumer {self._cid!r} of group {self._group!r} is closed")

    # -- subscription ---------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume ``topic``: a name, or a pattern starting with ``^`` (a
        regular expression over Kafka topic names)."""
        self._check_open()
        tags = parse_tag_expression(expression)
        if topic.startswith("^"):
            try:
                re.compile(topic)
            except re.error as e:
                raise ValueError(f"topic pattern {topic!r}: {e}") from None
            name = topic
        else:
            try:
                name = kafka_topic(topic)
            except ValueError:
                raise UnknownTopicError(topic) from None
            if self._broker.partition_count(topic, fresh=True, client=self._kc) is None:
                if not is_retry_or_dlq_topic(topic):
                    raise UnknownTopicError(topic)
                self._broker.ensure_topic(topic, 1)
        new = name not in self._filters
        self._filters[name] = tags
        for st in self._states.values():
            st.tags = tags_for(self._filters, st.name)
        # The subscription reaches librdkafka at the next poll, whole: topics
        # subscribed one after another (a topic, then the retry topic) make
        # one join, not a join and a rebalance.
        self._subscription_changed |= new

    def set_rebalance_listener(self, listener: RebalanceListener | None) -> None:
        self._check_open()
        self._listener = listener

    # -- polling --------------------------------------------------------------

    def poll(self, timeout: float, max_per_queue: int = 32) -> list[PollBatch]:
        self._check_open()
        if type(max_per_queue) is not int or max_per_queue < 1:
            raise ValueError(f"max_per_queue must be an int >= 1, got {max_per_queue!r}")
        deadline = time.monotonic() + max(0.0, timeout)
        if self._subscription_changed:
            self._subscription_changed = False
            self._kc.subscribe(
                list(self._filters), on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
            )
        while True:
            self._event.clear()
            if self._wakeup_flag:
                self._wakeup_flag = False
                return []
            ready = self._ready()
            if ready < FILE_LIMIT and self._filters:
                # With every owned partition paused, librdkafka's consume
                # returns at once: serve its callbacks, then wait here.
                idle = not self._active and bool(self._states)
                wait = 0.0 if ready or idle else max(0.0, min(WAIT_SLICE, deadline - time.monotonic()))
                count = min(FILE_LIMIT, max_per_queue * max(1, len(self._active)))
                began = time.monotonic()
                records = self._kc.consume(count, wait)
                self._check_open()
                if records:
                    self._file(records)
                elif wait and time.monotonic() - began < wait:
                    # an empty fetch answer woke consume early (a broker that
                    # does not hold fetches, like the mock cluster): back off
                    self._event.wait(EMPTY_BACKOFF)
                if idle and not self._active:
                    self._event.wait(max(0.0, min(WAIT_SLICE, deadline - time.monotonic())))
            elif not self._filters:
                self._event.wait(max(0.0, min(WAIT_SLICE, deadline - time.monotonic())))
            out = self._batches(max_per_queue)
            if out or time.monotonic() >= deadline:
                return out

    def _file(self, records: list[Any]) -> None:
        file_records(self._by_name, records, self)

    def _batches(self, max_per_queue: int) -> list[PollBatch]:
        active = self._active
        n = len(active)
        if not n:
            return []
        start = self._rr % n
        self._rr = start + 1
        return take_batches(active[start:] + active[:start], max_per_queue, self._broker, self._group, self)

    def _ready(self) -> int:
        return sum(len(st.file) for st in self._active)

    # -- rebalance (confluent-kafka callbacks, inside consume) ----------------

    def _on_assign(self, kc: Consumer, partitions: list[TopicPartition]) -> None:
        if self._closing or not partitions:
            return
        committed = kc.committed([TopicPartition(tp.topic, tp.partition) for tp in partitions], timeout=10.0)
        starts = start_positions(kc, committed, self._consume_from, self._consume_timestamp, self._group)
        assign = []
        new: list[MessageQueue] = []
        for tp in committed:
            pos = starts[(tp.topic, tp.partition)]
            mq = MessageQueue(lite_topic(tp.topic), self._broker.broker_name, tp.partition)
            st = PartitionState(mq, tp.topic, pos, tags_for(self._filters, tp.topic))
            self._states[mq] = st
            self._by_name[(tp.topic, tp.partition)] = st
            assign.append(TopicPartition(tp.topic, tp.partition, pos))
            new.append(mq)
        kc.incremental_assign(assign)
        self._ownership.assigned()
        self._rebuild_active()
        self._notify("on_assigned", sorted(new))

    def _drop(self, partitions: list[TopicPartition]) -> list[MessageQueue]:
        gone = []
        for tp in partitions:
            st = self._by_name.pop((tp.topic, tp.partition), None)
            if st is not None:
                del self._states[st.mq]
                gone.append(st.mq)
        self._rebuild_active()
        return sorted(gone)

    def _on_revoke(self, kc: Consumer, partitions: list[TopicPartition]) -> None:
        if self._closing:
            return
        queues = sorted(st.mq for tp in partitions if (st := self._by_name.get((tp.topic, tp.partition))) is not None)
        if queues:
            self._revoking = True
            try:
                self._notify("on_revoked", queues)  # drains and commits while still owned
            finally:
                self._revoking = False
        self._drop(partitions)

    def _on_lost(self, kc: Consumer, partitions: list[TopicPartition]) -> None:
        gone = self._drop(partitions)  # first: their commits are now ignored
        if gone and not self._closing:
            logger.warning("group %r: %r lost %s (its session expired)", self._group, self._cid, [str(q) for q in gone])
            self._notify("on_revoked", gone)

    # -- queue control ----------------------------------------------------------

    def pause(self, queues: Collection[MessageQueue]) -> None:
        tps = [TopicPartition(st.name, st.mq.queue_id) for q in queues
               if (st := self._states.get(q)) is not None and not st.paused]  # fmt: skip
        super().pause(queues)
        if tps:
            self._kc.pause(tps)

    def resume(self, queues: Collection[MessageQueue]) -> None:
        tps = [TopicPartition(st.name, st.mq.queue_id) for q in queues
               if (st := self._states.get(q)) is not None and st.paused]  # fmt: skip
        super().resume(queues)
        if tps:
            self._kc.resume(tps)
            # librdkafka restarts a resumed partition's fetcher only on its
            # next idle wake-up (about a second later); a seek to where the
            # file ends restarts it at once.
            for tp in tps:
                st = self._by_name[(tp.topic, tp.partition)]
                try:
                    self._kc.seek(TopicPartition(tp.topic, tp.partition, st.fetched))
                except KafkaException as e:  # not fetching yet: it starts on its own
                    logger.debug("%r: seek after resume of %s failed: %s", self, st.mq, e)

    def seek(self, queue: MessageQueue, offset: int) -> None:
        """Next poll of ``queue`` starts at ``offset`` clamped to the stored range."""
        self._check_open()
        st = self._owned(queue)
        lo, hi = self._kc.get_watermark_offsets(TopicPartition(st.name, queue.queue_id), timeout=10.0)
        pos = min(max(int(offset), lo), hi)
        self._kc.seek(TopicPartition(st.name, queue.queue_id, pos))
        st.file.clear()
        st.pos = st.fetched = pos

    def position(self, queue: MessageQueue) -> int:
        self._check_open()
        return self._owned(queue).pos

    def end_offsets(self, queues: Collection[MessageQueue]) -> dict[MessageQueue, int]:
        """The high watermark librdkafka last saw for each queue (no
        request); queues it has not fetched yet are left out."""
        out: dict[MessageQueue, int] = {}
        for q in queues:
            try:
                _, hi = self._kc.get_watermark_offsets(TopicPartition(kafka_topic(q.topic), q.queue_id), cached=True)
            except (KafkaException, RuntimeError, ValueError):
                continue
            if hi is not None and hi >= 0:
                out[q] = int(hi)
        return out

    # -- offsets --------------------------------------------------------------

    def commit(self, offsets: Mapping[MessageQueue, OffsetAndMetadata | int]) -> None:
        """Commit the owned partitions' offsets with their offset maps
        (a map over ``metadata_max_bytes`` is cut to the longest prefix that
        fits); partitions not owned (revoked, lost) are ignored."""
        self._check_open()
        limit = self._broker.metadata_max_bytes
        tps = []
        for q, om in commit_entries(offsets).items():
            st = self._states.get(q)
            if st is None:
                logger.debug("%r: commit of %s ignored: not its partition", self, q)
                continue
            tps.append(TopicPartition(st.name, q.queue_id, om.offset, metadata=fit_metadata(om, limit, q)))
        if tps:
            session = self._broker.session_timeout
            commit_within(self._kc, tps, session if self._revoking else min(session, COMMIT_PATIENCE), self)

    def committed(self, queue: MessageQueue) -> OffsetAndMetadata | None:
        self._check_open()
        (tp,) = self._kc.committed([TopicPartition(kafka_topic(queue.topic), queue.queue_id)], timeout=10.0)
        if tp.offset == OFFSET_INVALID or tp.offset < 0:
            return None
        return OffsetAndMetadata(tp.offset, tp.metadata or "")

    # -- locks: the assignment is the lock ----------------------------------------

    def lock(self, queues: Collection[MessageQueue], lease: float) -> frozenset[MessageQueue]:
        self._check_open()
        check_lease(lease)
        return frozenset(q for q in queues if q in self._states)

    def unlock(self, queues: Collection[MessageQueue]) -> None:
        self._check_open()

    # -- failures -------------------------------------------------------------

    def send_back(self, items: Sequence[tuple[MessageExt, int]]) -> list[BaseException | None]:
        """Produce each copy to the retry topic at once (the runtime has
        held it for its delay level already: ``delayed_delivery`` is False)."""
        self._check_open()
        return self._broker.copies.store_retries(self._group, items)

    def send_to_dlq(self, items: Sequence[tuple[MessageExt, str, str]]) -> list[BaseException | None]:
        self._check_open()
        return self._broker.copies.store_dead_letters(self._group, items)

    # -- lifecycle ------------------------------------------------------------

    def wakeup(self) -> None:
        self._wakeup_flag = True
        self._event.set()

    def close(self) -> None:
        """Leave the group: the partitions go to the other members at once
        (nothing is committed, no listener runs)."""
        if self._closed:
            return
        self._closing = True
        try:
            self._kc.close()
        except (KafkaException, RuntimeError) as e:
            logger.warning("%r: leaving the group failed (%s); its session will expire", self, e)
        self._closed = True
        self._states.clear()
        self._by_name.clear()
        self._active = []

    def __enter__(self) -> KafkaPullConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
