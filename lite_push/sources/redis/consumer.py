"""RedisPullConsumer: a member of a consumer group on Redis Streams.

It keeps the broker's parts it uses, never the broker (:class:`BrokerParts`
says which; a :class:`RedisBroker` has them all): the connection, the topic
catalog, the retries and the registry of open consumers.
It reads its owned queues' streams (one pipelined round trip per poll, with
what its message model watches and the due-retry move: :mod:`.polling`)
and decodes the entries (:mod:`.codec`); ``poll_nowait`` is one such read
for the event loop's thread, which leaves a rebalance due to ``poll``.  Its message model, chosen once at construction,
says which queues it owns and where its offsets go:
:class:`~.clustering.Clustering` (heartbeats, owner keys, start positions,
commits, locks: the group's) or :class:`~.._member_model.Broadcasting`.

Blocking: a poll with nothing to read waits on a ``threading.Event``, at
most a short slice (0.25 s, and never past the timeout or the next due
retry), then reads again.  The event is set by ``wakeup()`` and by a
per-consumer :class:`~.notifier.Notifier` subscribed to the notify channel
of every subscribed topic and to the channels its model names (CLUSTERING:
the group's events channel and its retry topic's notify channel).

Errors: a dropped connection is logged once per episode; the poll returns []
after a back-off, and the next one resumes at the positions it had (nothing
is lost: positions move only after a successful read).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from functools import partial
from typing import Protocol

from ..._errors import ConfigError, LitePushError, UnknownTopicError
from ..._types import MessageExt, MessageQueue, OffsetAndMetadata, PollBatch
from ...rebalance.allocate import AVERAGELY, AllocateStrategy
from .._common import (
    BrokerClock,
    check_balance,
    check_lease,
    check_member_arguments,
    commit_entries,
    parse_tag_expression,
    start_position,
)
from .._member_model import Broadcasting, MemberModel, check_message_model, open_offset_store
from .._owned import OwnedQueues, QueueControl
from ..contract import (
    Balance,
    ConsumeFrom,
    ConsumeFromWhere,
    DeadLetterReader,
    MessageModel,
    PullSource,
    RebalanceListener,
    is_retry_or_dlq_topic,
)
from ..local_offsets import LocalOffsetStore
from .clustering import Clustering
from .connection import CONN_ERRORS, Connection, Outage
from .membership import Membership
from .message_grain import MessageGrain
from .notifier import Notifier
from .polling import MIN_WAIT, WAIT_SLICE, PollRead
from .reading import QueueReader, raise_floors, readers
from .registry import OpenConsumers
from .retries import Retries
from .topics import TopicCatalog

__all__ = ["BrokerParts", "RedisPullConsumer"]

logger = logging.getLogger(__name__)


class BrokerParts(Protocol):
    """What a consumer takes from its broker at construction (a
    :class:`RedisBroker` has it all); it keeps the parts, not the broker."""

    @property
    def conn(self) -> Connection: ...

    @property
    def catalog(self) -> TopicCatalog: ...

    @property
    def retries(self) -> Retries: ...

    @property
    def consumers(self) -> OpenConsumers: ...

    @property
    def session_timeout(self) -> float: ...

    @property
    def heartbeat_interval(self) -> float: ...

    @property
    def rebalance_interval(self) -> float: ...

    @property
    def clock(self) -> BrokerClock:
        """``.monotonic()``: the members' heartbeat schedules."""
        ...

    def check_open(self) -> None:
        """``SourceClosedError`` once the broker is closed."""
        ...

    def new_client_id(self) -> str: ...


class RedisPullConsumer(QueueControl[QueueReader], PullSource):
    """A member of a consumer group on a :class:`RedisBroker`; see
    :class:`~lite_push.sources.PullSource`.  Create it with
    :meth:`RedisBroker.pull_consumer` (or with a broker, or anything that
    has its :class:`BrokerParts`, and the same arguments).  Owned by one
    thread; only :meth:`wakeup` may be called from others."""

    def __init__(
        self,
        broker: BrokerParts,
        group: str,
        *,
        consume_from: ConsumeFrom = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp: int | None = None,
        client_id: str | None = None,
        allocate: AllocateStrategy = AVERAGELY,
        message_model: MessageModel = MessageModel.CLUSTERING,
        offset_file: str | os.PathLike[str] | None = None,
        balance: Balance = Balance.QUEUE,
    ) -> None:
        consume_from, consume_timestamp = start_position(consume_from, consume_timestamp)
        check_message_model(message_model, offset_file)
        check_balance(balance)  # the Redis source balances either way
        if balance is Balance.MESSAGE and message_model is not MessageModel.CLUSTERING:
            raise ConfigError(
                "balance", "Balance.MESSAGE spreads a group's messages over its members: it needs CLUSTERING"
            )
        check_member_arguments(group, consume_from, client_id, allocate)
        broker.check_open()
        self._conn = broker.conn
        self._topics = broker.catalog
        self._retries = retries = broker.retries
        self._consumers = consumers = broker.consumers
        if client_id is None:
            client_id = broker.new_client_id()
        self._group = group
        self._owned = OwnedQueues[QueueReader](group, client_id, self)
        self._store_malformed = partial(retries.store_malformed, group)  # entries a poll cannot decode
        self._filters: dict[str, frozenset[str] | None] = {}
        self._wakeup_flag = False
        self._event = threading.Event()
        self._outage = Outage(self)
        self._notifier: Notifier | None = None
        self._grain: MessageGrain | None = None
        consumers.add(self)
        try:  # last: BROADCASTING locks its file, and nothing above may fail after that
            if message_model is MessageModel.BROADCASTING:
                self._model: MemberModel = self._broadcasting(offset_file, consume_from, consume_timestamp)
            elif balance is Balance.MESSAGE:
                self._model = self._grain = self._message_grain(broker, consume_from, consume_timestamp)
            else:
                self._model = self._clustering(broker, allocate, consume_from, consume_timestamp)
        except BaseException:
            consumers.discard(self)
            raise
        self._read = PollRead(
            self._conn,
            retries,
            self._owned,
            self._model,
            self._grain,
            group=group,
            store_malformed=self._store_malformed,
            check_open=self._check_open,
        )

    def _clustering(
        self,
        broker: BrokerParts,
        allocate: AllocateStrategy,
        consume_from: ConsumeFromWhere,
        consume_timestamp: int | None,
    ) -> Clustering:
        conn = self._conn
        membership = self._membership(broker, consume_from, consume_timestamp)
        reader = readers(conn.queue_key, self._filters)
        return Clustering(
            self._owned,
            membership,
            conn,
            self._topics,
            self._retries,
            allocate,
            reader,
            broker.rebalance_interval,
        )

    def _membership(
        self, broker: BrokerParts, consume_from: ConsumeFromWhere, consume_timestamp: int | None
    ) -> Membership:
        return Membership(
            self._conn,
            self._group,
            self._owned.client_id,
            broker.session_timeout,
            consume_from,
            consume_timestamp,
            heartbeat_interval=broker.heartbeat_interval,
            monotonic=broker.clock.monotonic,
        )

    def _message_grain(
        self, broker: BrokerParts, consume_from: ConsumeFromWhere, consume_timestamp: int | None
    ) -> MessageGrain:
        conn = self._conn
        membership = self._membership(broker, consume_from, consume_timestamp)
        reader = readers(conn.queue_key, self._filters)
        return MessageGrain(
            self._owned,
            membership,
            conn,
            self._topics,
            self._retries,
            reader,
            self._filters.get,
        )

    def _broadcasting(
        self, offset_file: str | os.PathLike[str] | None, consume_from: ConsumeFromWhere, consume_timestamp: int | None
    ) -> Broadcasting[QueueReader]:
        topics = self._topics
        store = open_offset_store(offset_file, self._conn.namespace, self._group)  # the namespace is the broker name
        reader = readers(self._conn.queue_key, self._filters)
        return Broadcasting(
            self._owned, store, topics, lambda t: topics.get(t).queues, reader, consume_from, consume_timestamp
        )

    # -- identity -------------------------------------------------------------

    @property
    def group(self) -> str:
        return self._group

    @property
    def client_id(self) -> str:
        return self._owned.client_id

    @property
    def session_timeout(self) -> float | None:
        return self._model.session_timeout

    def owned_for(self) -> dict[MessageQueue, float]:  # BROADCASTING: no sessions
        return self._model.owned_for()

    @property
    def balance(self) -> Balance:
        """QUEUE, or MESSAGE (see :mod:`.message_grain`)."""
        return Balance.QUEUE if self._grain is None else Balance.MESSAGE

    @property
    def message_model(self) -> MessageModel:
        return self._model.message_model

    @property
    def offset_store(self) -> LocalOffsetStore | None:
        """The local offsets file of a BROADCASTING member (else None)."""
        return self._model.offset_store

    def queue_count(self, topic: str) -> int | None:
        t = self._topics.cached(topic)  # cached by subscribe; no Redis call
        return len(t.queues) if t is not None else None

    @property
    def closed(self) -> bool:
        return self._owned.closed

    def __repr__(self) -> str:
        closed = " closed" if self._owned.closed else ""
        return f"<RedisPullConsumer {self._group!r}/{self._owned.client_id!r}{closed}>"

    def _check_open(self) -> None:
        self._owned.check_open()

    # -- subscription ---------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*") -> None:
        self._check_open()
        tags = parse_tag_expression(expression)
        try:
            self._topics.get(topic)
        except UnknownTopicError:
            if not is_retry_or_dlq_topic(topic):
                raise
            self._topics.ensure(topic, 1)
        new = topic not in self._filters
        if new:
            if self._notifier is None:
                name = f"lite-push-redis-notify-{self._owned.client_id}"
                self._notifier = Notifier(self._conn.client, self._event, name)
                for channel in self._model.channels:
                    self._notifier.add(channel)
            self._notifier.add(self._conn.notify_channel(topic))
        self._filters[topic] = tags
        for st in self._owned.states.values():
            if st.mq.topic == topic:
                st.tags = tags
        if new:
            self._model.subscribe(topic)

    def set_rebalance_listener(self, listener: RebalanceListener | None) -> None:
        self._check_open()
        self._owned.listener = listener

    # -- polling --------------------------------------------------------------

    def poll(self, timeout: float, max_per_queue: int = 32) -> list[PollBatch]:
        """See :meth:`PullSource.poll`.  With a tag filter, at most
        ``4 * max_per_queue + 256`` messages of a queue are scanned per call."""
        self._check_open()
        if type(max_per_queue) is not int or max_per_queue < 1:
            raise ValueError(f"max_per_queue must be an int >= 1, got {max_per_queue!r}")
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            self._event.clear()
            if self._wakeup_flag:
                self._wakeup_flag = False
                return []
            try:
                batches, wait_hint = self._read(max_per_queue)
            except CONN_ERRORS as e:
                if self._grain is not None:  # a dispatch may have delivered what its lost reply held
                    self._grain.replies_lost()
                wait = self._outage.lost(e, deadline - time.monotonic())
                if wait > 0:
                    self._event.wait(wait)
                self._wakeup_flag = False
                return []
            self._outage.ok()
            if batches is None:  # the assignment changed: read again at once
                continue
            if batches:
                return batches
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self._check_open()
            self._event.wait(max(MIN_WAIT, min(remaining, WAIT_SLICE, wait_hint)))
            self._check_open()

    def poll_nowait(self, max_per_queue: int = 32) -> list[PollBatch] | None:
        """See :meth:`PullSource.poll_nowait`: one pipelined read (one round
        trip, what :meth:`poll` does before it would wait); ``None`` when the
        membership has work to do (a rebalance, a heartbeat, queues to join
        or give up: the rebalance listener is :meth:`poll`'s) or the read
        failed (:meth:`poll` meets the outage and reports it)."""
        self._check_open()
        if type(max_per_queue) is not int or max_per_queue < 1:
            raise ValueError(f"max_per_queue must be an int >= 1, got {max_per_queue!r}")
        if self._model.stale():
            return None
        if not self._read.ahead:  # a read sent ahead may predate the wake-up: the flag stays then
            self._wakeup_flag = False  # this read sees whatever the wake-up was for
        try:
            batches, _ = self._read(max_per_queue, rebalance=False)
        except CONN_ERRORS:
            if self._grain is not None:  # a dispatch may have delivered what its lost reply held
                self._grain.replies_lost()
            return None
        return batches

    def prefetch(self, max_per_queue: int = 32) -> None:
        """See :meth:`PullSource.prefetch`: the next pipelined read, sent on
        a connection of its own (by queue, on a single server; by message a
        DISPATCH delivers as it runs, so it is never sent ahead)."""
        if type(max_per_queue) is not int or max_per_queue < 1:
            raise ValueError(f"max_per_queue must be an int >= 1, got {max_per_queue!r}")
        if self._owned.closed or self._model.stale():
            return
        try:
            self._read.send_ahead(max_per_queue)
        except CONN_ERRORS as e:
            logger.debug("%r: a read sent ahead failed (%s); the next read meets it", self, e)

    # -- positions (assignment, pause, resume: QueueControl) ------------------

    def seek(self, queue: MessageQueue, offset: int) -> None:
        """Next poll of ``queue`` starts at ``offset`` clamped to the stored
        range (not with Balance.MESSAGE: the group's cursor is shared)."""
        self._check_open()
        if self._grain is not None:
            raise LitePushError(
                "seek() is not supported with Balance.MESSAGE: the group reads each queue with one shared cursor"
            )
        st = self._owned.get(queue)
        lo, hi = self._topics.stored_range(queue)
        st.restart(min(max(int(offset), lo), hi))

    def position(self, queue: MessageQueue) -> int:
        self._check_open()
        return self._owned.get(queue).pos

    def end_offsets(self, queues: Collection[MessageQueue]) -> dict[MessageQueue, int]:
        """``PullSource.end_offsets``: the broker's next offset of each queue."""
        return {q: self._topics.max_offset(q) for q in queues}

    # -- offsets --------------------------------------------------------------

    def commit(self, offsets: Mapping[MessageQueue, OffsetAndMetadata | int]) -> None:
        """Store offsets of the queues this member owns (CLUSTERING: those
        whose owner key holds it)."""
        self._check_open()
        entries = commit_entries(offsets)
        raise_floors(self._owned.states, entries)  # a read held at a jump of offsets may go on
        if entries:
            self._model.commit(entries)

    def committed(self, queue: MessageQueue) -> OffsetAndMetadata | None:
        self._check_open()
        return self._model.committed(queue)

    # -- broker-side queue locks ----------------------------------------------

    def lock(self, queues: Collection[MessageQueue], lease: float) -> frozenset[MessageQueue]:
        self._check_open()
        check_lease(lease)
        qs = list(dict.fromkeys(queues))
        return self._model.lock(qs, lease) if qs else frozenset()

    def unlock(self, queues: Collection[MessageQueue]) -> None:
        self._check_open()
        qs = list(dict.fromkeys(queues))
        if qs:
            self._model.unlock(qs)

    # -- failures -------------------------------------------------------------

    @property
    def delay_levels(self) -> tuple[float, ...]:
        return self._retries.delay_levels

    def dead_letter_reader(self) -> DeadLetterReader:
        """See :meth:`PullSource.dead_letter_reader`: the topic catalog."""
        return self._topics

    def send_back(self, items: Sequence[tuple[MessageExt, int]]) -> list[BaseException | None]:
        """See :meth:`PullSource.send_back`: the copies wait in the group's
        schedule until due, then a poll moves them to ``%RETRY%<group>``."""
        self._check_open()
        return self._model.send_back(items)

    def send_to_dlq(self, items: Sequence[tuple[MessageExt, str, str]]) -> list[BaseException | None]:
        self._check_open()
        return self._retries.store_dead_letters(self._group, items)

    # -- lifecycle ------------------------------------------------------------

    def wakeup(self) -> None:
        self._wakeup_flag = True
        self._event.set()

    def close(self) -> None:
        """Leave the group: owned queues and locks are released at once
        (nothing is committed, no listener runs)."""
        if self._owned.closed:
            return
        self._owned.closed = True
        self._consumers.discard(self)
        self._event.set()
        self._read.drop_ahead()
        if self._notifier is not None:
            self._notifier.stop()
        try:
            self._model.close()
        except CONN_ERRORS as e:
            logger.warning("%r: leaving the group failed (%s); its session will expire", self, e)
        self._owned.clear()

    def __enter__(self) -> RedisPullConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
