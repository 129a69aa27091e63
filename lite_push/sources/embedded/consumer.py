"""EmbeddedPullConsumer: a member of a consumer group on the embedded broker.

It keeps the broker's parts it uses, never the broker (:class:`BrokerParts`
says which; an :class:`EmbeddedBroker` has them all): the log store (the
queues' message lists, which a poll slices without the lock), the group
coordinator (registering, and for CLUSTERING joining, the owner map,
commits, locks) and the schedule (retries, dead letters, due deliveries).
Its message model (``_member_model``), chosen once at construction, says
which queues it owns and where its offsets go:
:class:`~.clustering.Clustering` (the hand-off protocol of :mod:`.groups`)
or :class:`~.._member_model.Broadcasting`.

A consumer has no lock of its own: it belongs to one thread (the PullSource
contract).  ``wakeup()``, the one method other threads may call, sets a flag
and notifies the broker's condition, on which blocked polls wait.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from ..._errors import ConfigError, UnknownTopicError
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
from .groups import SCHEDULE_GROUP, Group, GroupCoordinator, Member
from .log import LogStore
from .reading import QueueReader, readers, scan
from .schedule import SCHEDULE_TOPIC, Schedule

__all__ = ["MESSAGE_BALANCE_REFUSED", "BrokerParts", "EmbeddedPullConsumer"]

logger = logging.getLogger(__name__)

#: Shortest wait of a poll bounded by the next delayed retry's due time (a
#: due time already past -- delivery failed and waits to retry -- must not
#: make the poll spin).
_MIN_DUE_WAIT = 0.001
_INF = math.inf

#: Why the embedded broker refuses ``Balance.MESSAGE``.
MESSAGE_BALANCE_REFUSED = (
    "the embedded broker runs in one process, so there are no members to balance messages across "
    "(message-grain balancing is for the Redis source); use Balance.QUEUE"
)


def _check_arguments(
    group: object, consume_from: object, session_timeout: float | None, client_id: object, allocate: object
) -> None:
    """A consumer's arguments, checked at construction: ``ConfigError``
    naming the first bad one."""
    check_member_arguments(group, consume_from, client_id, allocate)
    if group == SCHEDULE_GROUP:
        raise ConfigError("group", f"{group!r} is internal to the broker")
    if session_timeout is not None and not session_timeout > 0:
        raise ConfigError("session_timeout", f"must be positive, got {session_timeout!r}")


class BrokerParts(Protocol):
    """What a consumer takes from its broker at construction (an
    :class:`EmbeddedBroker` has it all); it keeps the parts, not the broker."""

    @property
    def log(self) -> LogStore: ...

    @property
    def groups(self) -> GroupCoordinator: ...

    @property
    def schedule(self) -> Schedule: ...

    @property
    def clock(self) -> BrokerClock: ...

    def check_open(self) -> None:
        """``SourceClosedError`` once the broker is closed."""
        ...


class EmbeddedPullConsumer(QueueControl[QueueReader], PullSource):
    """A member of a consumer group on an :class:`EmbeddedBroker`; see
    :class:`~lite_push.sources.PullSource` for the contract of each method.
    Create it with :meth:`EmbeddedBroker.pull_consumer` (or with a broker,
    or anything that has its :class:`BrokerParts`, and the same arguments).

    Owned by one thread; only :meth:`wakeup` may be called from others.
    Listener exceptions are logged and do not stop the hand-off (a revoked
    queue is released even if ``on_revoked`` raised)."""

    def __init__(
        self,
        broker: BrokerParts,
        group: str,
        *,
        consume_from: ConsumeFrom = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp: int | None = None,
        client_id: str | None = None,
        allocate: AllocateStrategy = AVERAGELY,
        session_timeout: float | None = None,
        message_model: MessageModel = MessageModel.CLUSTERING,
        offset_file: str | os.PathLike[str] | None = None,
        balance: Balance = Balance.QUEUE,
    ) -> None:
        consume_from, consume_timestamp = start_position(consume_from, consume_timestamp)
        check_message_model(message_model, offset_file)
        _check_arguments(group, consume_from, session_timeout, client_id, allocate)
        check_balance(balance, MESSAGE_BALANCE_REFUSED)
        self._clock = broker.clock
        self._log = log = broker.log
        self._groups = groups = broker.groups
        self._schedule = broker.schedule
        self._lock = log.lock
        self._cond = log.cond
        timeout = float(session_timeout) if session_timeout is not None else groups.session_timeout
        # A blocked poll wakes up this often to stamp its heartbeat and look
        # for expired members.
        self._wait_slice = max(0.01, timeout / 3)
        self._filters: dict[str, frozenset[str] | None] = {}
        self._rr = 0
        self._wakeup = False
        with self._lock:
            broker.check_open()
            g = groups.group(group)
            if client_id is None:
                client_id = groups.new_client_id()
            groups.check_client_id(g, client_id)
            self._group = g
            self._owned = OwnedQueues[QueueReader](group, client_id, self)
            # last: BROADCASTING locks its file, and nothing above may fail after that
            self._model = self._model_for(
                message_model, offset_file, g, allocate, consume_from, consume_timestamp, timeout
            )
            groups.register(self, g, client_id)

    def _model_for(
        self,
        message_model: MessageModel,
        offset_file: str | os.PathLike[str] | None,
        group: Group,
        allocate: AllocateStrategy,
        consume_from: ConsumeFromWhere,
        consume_timestamp: int | None,
        timeout: float,
    ) -> MemberModel:
        """(lock held) The member's message model, chosen once."""
        log, reader = self._log, readers(self._log.log_of, self._filters)
        if message_model is MessageModel.BROADCASTING:
            store = open_offset_store(offset_file, log.broker_name, group.name)
            queues_of = lambda topic: log.topic(topic).queues  # noqa: E731
            return Broadcasting(self._owned, store, log, queues_of, reader, consume_from, consume_timestamp, self._lock)
        now = self._clock.monotonic()
        member = Member(self._owned.client_id, allocate, consume_from, consume_timestamp, timeout, now)
        return Clustering(
            self._owned, self._groups, self._schedule, group, member, self._clock, reader, self._wait_slice
        )

    # -- identity -----------------------------------------------------------

    @property
    def group(self) -> str:
        return self._group.name

    @property
    def client_id(self) -> str:
        return self._owned.client_id

    @property
    def session_timeout(self) -> float | None:
        return self._model.session_timeout

    def owned_for(self) -> dict[MessageQueue, float]:
        """See :meth:`PullSource.owned_for` (BROADCASTING: no sessions)."""
        return self._model.owned_for()

    @property
    def message_model(self) -> MessageModel:
        return self._model.message_model

    @property
    def offset_store(self) -> LocalOffsetStore | None:
        """The local offsets file of a BROADCASTING member (else None)."""
        return self._model.offset_store

    def queue_count(self, topic: str) -> int | None:
        t = self._log.get(topic)
        return len(t.queues) if t is not None else None

    @property
    def closed(self) -> bool:
        return self._owned.closed

    def __repr__(self) -> str:
        closed = " closed" if self._owned.closed else ""
        return f"<EmbeddedPullConsumer {self._group.name!r}/{self._owned.client_id!r}{closed}>"

    def mark_closed(self) -> None:
        """The broker closed (under its lock): every later call but
        :meth:`close` raises ``SourceClosedError``."""
        self._owned.closed = True

    def _check_open(self) -> None:
        self._owned.check_open()

    # -- subscription -------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Join the group on ``topic`` (or change the tag filter of a topic
        already subscribed).  Raises ``UnknownTopicError`` and ``ValueError``
        (malformed expression).  A missing retry or dead-letter topic
        (``%RETRY%...``, ``%DLQ%...``) is created with one queue; the
        internal ``SCHEDULE_TOPIC_XXXX`` is unknown to consumers."""
        self._check_open()
        tags = parse_tag_expression(expression)
        with self._lock:
            self._check_open()
            if self._log.get(topic) is None or topic == SCHEDULE_TOPIC:
                if not is_retry_or_dlq_topic(topic):
                    raise UnknownTopicError(topic)
                self._log.ensure_locked(topic, 1)
            new = topic not in self._filters
            self._filters[topic] = tags
            for st in self._owned.states.values():
                if st.mq.topic == topic:
                    st.tags = tags
            if new:
                self._model.subscribe(topic)
        logger.debug("%r subscribed to %r with %r", self, topic, expression)

    def set_rebalance_listener(self, listener: RebalanceListener | None) -> None:
        self._check_open()
        self._owned.listener = listener

    # -- polling ------------------------------------------------------------

    def poll(self, timeout: float, max_per_queue: int = 32) -> list[PollBatch]:
        """See :meth:`PullSource.poll`.  With a tag filter, at most
        ``4 * max_per_queue + 256`` messages of a queue are scanned per call;
        a batch whose scanned messages were all filtered out has no messages
        and a moved ``next_offset``."""
        owned = self._owned
        if owned.closed:
            owned.check_open()
        if type(max_per_queue) is not int or max_per_queue < 1:
            raise ValueError(f"max_per_queue must be an int >= 1, got {max_per_queue!r}")
        if self._wakeup:
            self._wakeup = False
            return []
        model = self._model
        clock = self._clock
        schedule = self._schedule
        deadline = -1.0
        while True:
            due = schedule.next_due_ms
            if due < _INF and due <= clock.time() * 1000.0:
                schedule.deliver_from_poll()
            if model.refresh():  # the owned queues changed
                owned.check_open()
            if owned.active:
                batches = self._scan(max_per_queue)
                if batches:
                    return batches
            if self._wakeup:
                self._wakeup = False
                return []
            if timeout <= 0:
                return []
            t = time.monotonic()
            if deadline < 0:
                deadline = t + timeout
            remaining = deadline - t
            if remaining <= 0:
                return []
            with self._cond:
                owned.check_open()
                if self._wakeup:
                    self._wakeup = False
                    return []
                if not model.stale() and not self._ready():
                    wait = min(remaining, self._wait_slice)
                    due = schedule.next_due_ms
                    if due < _INF:  # wake when the next delayed retry is due
                        wait = min(wait, max(_MIN_DUE_WAIT, due / 1000.0 - clock.time()))
                    self._cond.wait(wait)

    def poll_nowait(self, max_per_queue: int = 32) -> list[PollBatch] | None:
        """See :meth:`PullSource.poll_nowait`: one pass over the owned
        queues without the broker's condition; ``None`` while the group
        moved (the rebalance is :meth:`poll`'s) or a topic's queues are
        still to be taken."""
        owned = self._owned
        if owned.closed:
            owned.check_open()
        if type(max_per_queue) is not int or max_per_queue < 1:
            raise ValueError(f"max_per_queue must be an int >= 1, got {max_per_queue!r}")
        self._wakeup = False  # this read sees whatever the wake-up was for
        model = self._model
        if model.stale():
            return None
        schedule = self._schedule
        due = schedule.next_due_ms
        if due < _INF and due <= self._clock.time() * 1000.0:
            schedule.deliver_from_poll()
        if model.refresh(rebalance=False):  # the group moved meanwhile: the next poll is poll()'s
            return None
        return self._scan(max_per_queue) if owned.active else []

    def _ready(self) -> bool:
        for st in self._owned.active:
            if st.pos < len(st.log):
                return True
        return False

    def _scan(self, max_per_queue: int) -> list[PollBatch]:
        active = self._owned.active
        start = self._rr % len(active)
        self._rr = start + 1
        return scan(active, start, max_per_queue, self._log.unreadable)

    # -- positions (assignment, pause, resume: QueueControl) ------------------

    def seek(self, queue: MessageQueue, offset: int) -> None:
        """Next poll of ``queue`` starts at ``offset`` clamped to
        ``[0, max_offset]``."""
        self._check_open()
        st = self._owned.get(queue)
        st.pos = min(max(int(offset), 0), len(st.log))

    def position(self, queue: MessageQueue) -> int:
        self._check_open()
        return self._owned.get(queue).pos

    def end_offsets(self, queues: Collection[MessageQueue]) -> dict[MessageQueue, int]:
        """``PullSource.end_offsets``: the broker's next offset of each queue."""
        return {q: len(self._log.queue_log(q)) for q in queues}

    # -- offsets ------------------------------------------------------------

    def commit(self, offsets: Mapping[MessageQueue, OffsetAndMetadata | int]) -> None:
        """Store offsets of the queues this member owns (per the broker: a
        member that lost a queue, even one that has not noticed yet, cannot
        commit it).  Raises ``ValueError`` for a negative offset or a value
        that is neither ``int`` nor ``OffsetAndMetadata``."""
        self._check_open()
        entries = commit_entries(offsets)
        if entries:
            self._model.commit(entries)

    def committed(self, queue: MessageQueue) -> OffsetAndMetadata | None:
        self._check_open()
        return self._model.committed(queue)

    # -- broker-side queue locks (orderly consumption) ------------------------

    def lock(self, queues: Collection[MessageQueue], lease: float) -> frozenset[MessageQueue]:
        """See :meth:`PullSource.lock`; leases run on the broker's clock."""
        self._check_open()
        check_lease(lease)
        return self._model.lock(queues, lease)

    def unlock(self, queues: Collection[MessageQueue]) -> None:
        """See :meth:`PullSource.unlock`."""
        self._check_open()
        self._model.unlock(queues)

    # -- failures -------------------------------------------------------------

    @property
    def delay_levels(self) -> tuple[float, ...]:
        """See :attr:`PullSource.delay_levels` (the broker's)."""
        return self._schedule.delay_levels

    def dead_letter_reader(self) -> DeadLetterReader:
        """See :meth:`PullSource.dead_letter_reader`: the broker's log."""
        return self._log

    def send_back(self, items: Sequence[tuple[MessageExt, int]]) -> list[BaseException | None]:
        """See :meth:`PullSource.send_back`.  The copy waits in the broker's
        ``SCHEDULE_TOPIC_XXXX`` until due, then moves to ``%RETRY%<group>``
        when a consumer polls (or :meth:`EmbeddedBroker.deliver_due`)."""
        self._check_open()
        return self._model.send_back(items)

    def send_to_dlq(self, items: Sequence[tuple[MessageExt, str, str]]) -> list[BaseException | None]:
        """See :meth:`PullSource.send_to_dlq`."""
        self._check_open()
        return self._schedule.send_to_dlq(self._group.name, items)

    # -- lifecycle ----------------------------------------------------------

    def wakeup(self) -> None:
        self._wakeup = True
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """Leave the group; the owned queues are released at once (commit
        first: nothing is committed here and no listener is called)."""
        with self._lock:
            if self._owned.closed:
                return
            self._owned.closed = True
            self._groups.leave(self, self._group, self._owned.client_id)
            self._owned.clear()
        self._model.close()
        logger.debug("%r closed", self)

    def __enter__(self) -> EmbeddedPullConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
