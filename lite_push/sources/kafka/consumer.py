"""KafkaPullConsumer: a member of a Kafka consumer group, as a PullSource.

Two ``confluent_kafka.Consumer`` clients per member:

* the **group client** joins the group (cooperative-sticky assignor, so a
  rebalance moves only the partitions that change owner), heartbeats,
  commits with the offset map in the commit metadata, and runs the
  rebalance callbacks (:class:`~.partitions.Partitions`); it never fetches:
  its partitions are assigned at their end and paused;
* the **fetcher** reads the member's partitions by manual assignment,
  set by those callbacks.  It joins no group and runs no callback.

Why two: librdkafka runs the rebalance callbacks inside ``consume``, on
whatever thread calls it, and ``on_revoked`` must wait for the revoked
partitions' listener calls.  With the asyncio executor those calls run on
the event loop, and the loop reads the source (:meth:`poll_nowait`): a
revoke served there would wait for the loop it blocks.  So the loop reads
only the fetcher, and the group client is served by :meth:`poll` alone,
which the runtime calls from a thread that may block (the pull thread, or
the pull task's helper thread); :meth:`poll_nowait` answers ``None`` every
:data:`GROUP_SERVICE_INTERVAL` so the runtime does so regularly (and when
the subscription changed).

Polling: ``poll`` calls the fetcher's ``consume`` in slices of at most
:data:`WAIT_SLICE` (confluent-kafka has no wakeup, so :meth:`wakeup` is seen
within a slice), serving the group client between slices.  Records are
filed per partition; a partition's file holds what was fetched but not yet
returned (more than ``max_per_queue`` came, or the partition is paused), so
batches of one partition stay contiguous.  A record at an offset below the
partition's file end is a re-fetch and is dropped; Kafka's own gaps
(compaction, transaction markers) are passed over by ``next_offset``.  At
most :data:`FILE_LIMIT` records wait in the files of unpaused partitions
before ``poll`` stops fetching more.

Pause and resume are per partition, in the fetcher (it stops fetching that
partition only); a paused partition's filed records are kept.  A resume is
followed by a seek to the end of the partition's file, which restarts
librdkafka's fetcher at once (it would otherwise wait for its next idle
wake-up, about a second: 0.95 s measured on the mock cluster).

Fencing: librdkafka heartbeats from its own thread.  Every
:data:`STATS_INTERVAL` the group client's statistics say how long ago the
group coordinator last answered (``rxidle``); ownership is certain until
that answer's request time (the answer less the round trip) plus
``session.timeout.ms``.

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
from functools import partial
from typing import Any, Protocol

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition

from ..._errors import ConfigError, UnknownTopicError
from ..._types import MessageExt, MessageQueue, OffsetAndMetadata, PollBatch
from .._common import (
    check_balance,
    check_lease,
    check_member_arguments,
    commit_entries,
    parse_tag_expression,
    start_position,
)
from .._owned import OwnedQueues, QueueControl
from ..contract import (
    Balance,
    ConsumeFrom,
    ConsumeFromWhere,
    DeadLetterReader,
    PullSource,
    RebalanceListener,
    is_retry_or_dlq_topic,
)
from .client_log import LIBRDKAFKA_LOG
from .codec import RecordFormat, kafka_topic
from .commits import COMMIT_PATIENCE, commit_within, fit_metadata
from .copies import Copies
from .fetch_client import new_fetch_client
from .fetcher import FILE_LIMIT, Fetcher
from .offset_reader import OffsetReader
from .ownership import Ownership
from .partitions import Partitions
from .reachability import Reachability
from .reading import PartitionState, tags_for
from .settings import fetcher_settings, member_settings
from .topics import TopicCatalog

__all__ = ["GROUP_SERVICE_INTERVAL", "MESSAGE_BALANCE_REFUSED", "WAIT_SLICE", "BrokerParts", "KafkaPullConsumer"]

logger = logging.getLogger(__name__)

#: Longest single wait inside a poll (seconds): the wakeup latency.
WAIT_SLICE = 0.02
#: Pause after consume came back early with nothing (seconds).
EMPTY_BACKOFF = 0.002
#: Longest time (seconds) :meth:`KafkaPullConsumer.poll_nowait` goes without
#: the group client being served (its rebalance callbacks and statistics):
#: then it answers ``None``, and the runtime calls :meth:`poll`.
GROUP_SERVICE_INTERVAL = 0.05
#: Why the Kafka source refuses ``Balance.MESSAGE``.
MESSAGE_BALANCE_REFUSED = (
    "Kafka's share groups (KIP-932) give up key order, and the confluent-kafka Python client has no "
    "share consumer; use Balance.QUEUE, or the Redis source for message-grain balancing"
)


def _check_arguments(group: object, consume_from: object, consume_timestamp: object, client_id: object) -> None:
    """A member's arguments, checked at construction: ``ConfigError``
    naming the first bad one."""
    check_member_arguments(group, consume_from, client_id)
    if consume_from is ConsumeFromWhere.TIMESTAMP and type(consume_timestamp) is not int:
        raise ConfigError("consume_timestamp", f"must be ms since the epoch with TIMESTAMP, got {consume_timestamp!r}")


class BrokerParts(Protocol):
    """What a member takes from its broker at construction (a
    :class:`KafkaBroker` has it all); it keeps the parts, not the broker."""

    @property
    def catalog(self) -> TopicCatalog: ...

    @property
    def copies(self) -> Copies: ...

    @property
    def format(self) -> RecordFormat: ...

    @property
    def reader(self) -> OffsetReader: ...

    @property
    def session_timeout(self) -> float: ...

    @property
    def metadata_max_bytes(self) -> int: ...

    def client_settings(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The librdkafka settings of a new consumer client."""
        ...

    def check_open(self) -> None:
        """``SourceClosedError`` once the broker is closed."""
        ...


class KafkaPullConsumer(QueueControl[PartitionState], PullSource):
    """A member of a Kafka consumer group; see
    :class:`~lite_push.sources.PullSource` and the module docstring.  Create
    it with :meth:`KafkaBroker.pull_consumer` (or with a broker, or anything
    that has its :class:`BrokerParts`, and the same arguments).  Owned by
    one thread; only :meth:`wakeup` and :meth:`end_offsets` may be called
    from others."""

    def __init__(
        self,
        broker: BrokerParts,
        group: str,
        *,
        consume_from: ConsumeFrom = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp: int | None = None,
        client_id: str | None = None,
        balance: Balance = Balance.QUEUE,
    ) -> None:
        consume_from, consume_timestamp = start_position(consume_from, consume_timestamp)
        _check_arguments(group, consume_from, consume_timestamp, client_id)
        check_balance(balance, MESSAGE_BALANCE_REFUSED)
        broker.check_open()
        self._catalog = broker.catalog
        self._copies = copies = broker.copies
        self._fmt = fmt = broker.format
        self._reader = broker.reader
        self._session_timeout = session_timeout = broker.session_timeout
        self._metadata_max_bytes = broker.metadata_max_bytes
        self._group = group
        self._cid = client_id or f"lite-push-{group}-{id(self):x}"
        self._owned = OwnedQueues[PartitionState](group, self._cid, self)
        self._store_malformed = partial(copies.store_malformed, group)  # records a poll cannot decode
        self._filters: dict[str, frozenset[str] | None] = {}  # Kafka name -> tag filter
        self._subscription_changed = False
        self._wakeup_flag = False
        self._event = threading.Event()  # ends a wait of a poll with nothing to fetch
        self._ownership = Ownership(session_timeout)
        self._reachability = Reachability(f"<KafkaPullConsumer {group!r}/{self._cid!r}>")
        #: When the group client must be served next (``time.monotonic``).
        self._serve_by = 0.0
        base = broker.client_settings()
        ownership, reachability = self._ownership, self._reachability

        def on_stats(raw: str) -> None:  # the client holds it: no reference to self
            ownership.on_stats(raw)
            reachability.on_stats(raw)

        settings = member_settings(base, group, self._cid, consume_from, session_timeout, on_stats)
        try:
            #: The group client: membership, callbacks, commits.
            self._kc = Consumer(settings)
            fetching = new_fetch_client(fetcher_settings(base, group, self._cid), LIBRDKAFKA_LOG)
        except KafkaException as e:
            raise ConfigError("consumer_config", str(e.args[0].str() if e.args else e)) from None
        except ValueError as e:  # a property the compiled client's librdkafka refused
            raise ConfigError("consumer_config", str(e)) from None
        by_name: dict[tuple[str, int], PartitionState] = {}
        #: The fetcher: reads the owned partitions.
        self._fetcher = Fetcher(fetching, self._owned, by_name, fmt, self._store_malformed)
        self._partitions = Partitions(
            self._owned,
            by_name,
            self._fetcher,
            self._filters,
            fmt.broker_name,
            self._ownership,
            consume_from,
            consume_timestamp,
        )

    # -- identity -------------------------------------------------------------

    @property
    def group(self) -> str:
        return self._group

    @property
    def client_id(self) -> str:
        return self._cid

    @property
    def session_timeout(self) -> float:
        return self._session_timeout

    @property
    def delayed_delivery(self) -> bool:
        return False

    @property
    def assignment_is_lock(self) -> bool:
        return True

    @property
    def metadata_limit(self) -> int:
        return self._metadata_max_bytes

    @property
    def delay_levels(self) -> tuple[float, ...]:
        return self._copies.delay_levels

    def dead_letter_reader(self) -> DeadLetterReader:
        """See :meth:`PullSource.dead_letter_reader`: the broker's offset
        reader (a client of its own per read, outside the group)."""
        return self._reader

    def queue_count(self, topic: str) -> int | None:
        try:
            return self._catalog.partition_count(topic)
        except (KafkaException, ValueError):
            return None

    def owned_for(self) -> dict[MessageQueue, float]:
        left = self._ownership.left()
        return dict.fromkeys(self._owned.states, left)

    @property
    def closed(self) -> bool:
        return self._owned.closed

    def __repr__(self) -> str:
        return f"<KafkaPullConsumer {self._group!r}/{self._cid!r}{' closed' if self._owned.closed else ''}>"

    def _check_open(self) -> None:
        self._owned.check_open()

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
            if self._catalog.partition_count(topic, fresh=True, client=self._kc) is None:
                if not is_retry_or_dlq_topic(topic):
                    raise UnknownTopicError(topic)
                self._catalog.ensure_topic(topic, 1)
        new = name not in self._filters
        self._filters[name] = tags
        for st in self._owned.states.values():
            st.tags = tags_for(self._filters, st.name)
        # The subscription reaches librdkafka at the next poll, whole: topics
        # subscribed one after another (a topic, then the retry topic) make
        # one join, not a join and a rebalance.
        self._subscription_changed |= new

    def set_rebalance_listener(self, listener: RebalanceListener | None) -> None:
        self._check_open()
        self._owned.listener = listener

    # -- polling --------------------------------------------------------------

    def poll(self, timeout: float, max_per_queue: int = 32) -> list[PollBatch]:
        self._check_open()
        if type(max_per_queue) is not int or max_per_queue < 1:
            raise ValueError(f"max_per_queue must be an int >= 1, got {max_per_queue!r}")
        deadline = time.monotonic() + max(0.0, timeout)
        if self._subscription_changed:
            self._subscription_changed = False
            p = self._partitions
            self._kc.subscribe(list(self._filters), on_assign=p.on_assign, on_revoke=p.on_revoke, on_lost=p.on_lost)
        while True:
            self._event.clear()
            if self._wakeup_flag:
                self._wakeup_flag = False
                return []
            left = max(0.0, min(WAIT_SLICE, deadline - time.monotonic()))
            active = self._owned.active
            if not self._filters:
                self._event.wait(left)
            elif not self._owned.states:
                self._serve_group(left)  # nothing owned yet: wait for the group's assignment
            else:
                self._serve_group()
                fetcher = self._fetcher
                ready = fetcher.ready()
                if not active:  # every owned partition paused: a resume's wakeup ends the wait
                    self._event.wait(left)
                elif ready < FILE_LIMIT:
                    wait = 0.0 if ready else left
                    began = time.monotonic()
                    got = fetcher.read(max_per_queue, wait)
                    self._check_open()
                    if not got and wait and time.monotonic() - began < wait:
                        # an empty fetch answer woke consume early (a broker that
                        # does not hold fetches, like the mock cluster): back off
                        self._event.wait(EMPTY_BACKOFF)
            out = self._fetcher.batches(max_per_queue)
            if out or time.monotonic() >= deadline:
                return out

    def poll_nowait(self, max_per_queue: int = 32) -> list[PollBatch] | None:
        """See :meth:`PullSource.poll_nowait`: what the fetcher has ready;
        ``None`` when the group client is due to be served (every
        :data:`GROUP_SERVICE_INTERVAL`, and after a subscription): that is
        :meth:`poll`'s, where its rebalance callbacks may wait."""
        self._check_open()
        if type(max_per_queue) is not int or max_per_queue < 1:
            raise ValueError(f"max_per_queue must be an int >= 1, got {max_per_queue!r}")
        if self._subscription_changed or time.monotonic() >= self._serve_by:
            return None
        self._wakeup_flag = False  # this read sees whatever the wake-up was for
        fetcher = self._fetcher
        if fetcher.ready() < FILE_LIMIT:
            fetcher.read(max_per_queue, 0.0)
        out = fetcher.batches(max_per_queue, store=False)
        if fetcher.malformed():
            self._serve_by = 0.0  # poll() stores its dead letter
        return out

    def _serve_group(self, wait: float = 0.0) -> None:
        """Serve the group client, waiting up to ``wait`` seconds for an
        event: its rebalance callbacks and statistics run inside this call
        (it returns no records: its partitions are paused; an error it
        reports is logged)."""
        for rec in self._kc.consume(64, wait):
            err = rec.error()
            if err is None:
                logger.debug(
                    "%r: the group client returned a record of %s [%d]; dropped", self, rec.topic(), rec.partition()
                )
            elif err.fatal():
                raise KafkaException(err)
            elif err.code() != KafkaError._PARTITION_EOF:
                logger.warning("%r: %s", self, err.str())
        self._check_open()
        self._serve_by = time.monotonic() + GROUP_SERVICE_INTERVAL

    # -- queue control ----------------------------------------------------------

    def pause(self, queues: Collection[MessageQueue]) -> None:
        states = [st for q in queues if (st := self._owned.states.get(q)) is not None and not st.paused]
        super().pause(queues)
        self._fetcher.pause(states)

    def resume(self, queues: Collection[MessageQueue]) -> None:
        states = [st for q in queues if (st := self._owned.states.get(q)) is not None and st.paused]
        super().resume(queues)
        self._fetcher.resume(states)

    def seek(self, queue: MessageQueue, offset: int) -> None:
        """Next poll of ``queue`` starts at ``offset`` clamped to the stored range."""
        self._check_open()
        self._fetcher.seek(self._owned.get(queue), offset)

    def position(self, queue: MessageQueue) -> int:
        self._check_open()
        return self._owned.get(queue).pos

    def end_offsets(self, queues: Collection[MessageQueue]) -> dict[MessageQueue, int]:
        """The high watermark the fetcher last saw for each queue (no
        request); queues it has not fetched yet are left out."""
        out: dict[MessageQueue, int] = {}
        for q in queues:
            try:
                name = kafka_topic(q.topic)
            except ValueError:
                continue
            hi = self._fetcher.high_watermark(name, q.queue_id)
            if hi is not None:
                out[q] = hi
        return out

    # -- offsets --------------------------------------------------------------

    def commit(self, offsets: Mapping[MessageQueue, OffsetAndMetadata | int]) -> None:
        """Commit the owned partitions' offsets with their offset maps
        (a map over ``metadata_max_bytes`` is cut to the longest prefix that
        fits); partitions not owned (revoked, lost) are ignored."""
        self._check_open()
        limit = self._metadata_max_bytes
        tps = []
        for q, om in commit_entries(offsets).items():
            st = self._owned.states.get(q)
            if st is None:
                logger.debug("%r: commit of %s ignored: not its partition", self, q)
                continue
            tps.append(TopicPartition(st.name, q.queue_id, om.offset, metadata=fit_metadata(om, limit, q)))
        if tps:
            session = self._session_timeout
            commit_within(self._kc, tps, session if self._partitions.revoking else min(session, COMMIT_PATIENCE), self)

    def committed(self, queue: MessageQueue) -> OffsetAndMetadata | None:
        self._check_open()
        (tp,) = self._kc.committed([TopicPartition(kafka_topic(queue.topic), queue.queue_id)], timeout=10.0)
        if tp.offset == OFFSET_INVALID or tp.offset < 0:
            return None
        return OffsetAndMetadata(tp.offset, tp.metadata or "")

    def committed_all(self, queues: Collection[MessageQueue]) -> dict[MessageQueue, OffsetAndMetadata]:
        """One OffsetFetch for all of ``queues``."""
        self._check_open()
        qs = list(queues)
        if not qs:
            return {}
        tps = self._kc.committed([TopicPartition(kafka_topic(q.topic), q.queue_id) for q in qs], timeout=10.0)
        out: dict[MessageQueue, OffsetAndMetadata] = {}
        for q, tp in zip(qs, tps, strict=True):
            if tp.error is None and tp.offset != OFFSET_INVALID and tp.offset >= 0:
                out[q] = OffsetAndMetadata(tp.offset, tp.metadata or "")
        return out

    # -- locks: the assignment is the lock ----------------------------------------

    def lock(self, queues: Collection[MessageQueue], lease: float) -> frozenset[MessageQueue]:
        self._check_open()
        check_lease(lease)
        return frozenset(q for q in queues if q in self._owned.states)

    def unlock(self, queues: Collection[MessageQueue]) -> None:
        self._check_open()

    # -- failures -------------------------------------------------------------

    def send_back(self, items: Sequence[tuple[MessageExt, int]]) -> list[BaseException | None]:
        """Produce each copy to the retry topic at once (the runtime has
        held it for its delay level already: ``delayed_delivery`` is False)."""
        self._check_open()
        return self._copies.store_retries(self._group, items)

    def send_to_dlq(self, items: Sequence[tuple[MessageExt, str, str]]) -> list[BaseException | None]:
        self._check_open()
        return self._copies.store_dead_letters(self._group, items)

    # -- lifecycle ------------------------------------------------------------

    def wakeup(self) -> None:
        self._wakeup_flag = True
        self._event.set()

    def close(self) -> None:
        """Leave the group: the partitions go to the other members at once
        (nothing is committed, no listener runs)."""
        if self._owned.closed:
            return
        self._partitions.closing = True
        try:
            self._kc.close()
        except (KafkaException, RuntimeError) as e:
            logger.warning("%r: leaving the group failed (%s); its session will expire", self, e)
        self._fetcher.close()
        self._owned.closed = True
        self._owned.clear()
        self._partitions.by_name.clear()

    def __enter__(self) -> KafkaPullConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
