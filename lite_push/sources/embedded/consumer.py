"""EmbeddedPullConsumer: a member of a consumer group on the embedded broker.

It reaches the broker through its parts only: the log store (``broker.log``:
the queues' message lists, which a poll slices without the lock), the group
coordinator (``broker.groups``: joining, the owner map, commits, locks) and
the schedule (``broker.schedule``: retries, dead letters, due deliveries).
The hand-off protocol is described in :mod:`.groups`.

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
from typing import TYPE_CHECKING

from ..._errors import ConfigError, SourceClosedError, UnknownTopicError
from ..._types import MessageExt, MessageQueue, OffsetAndMetadata, PollBatch
from ...rebalance.allocate import AVERAGELY, AllocateStrategy
from .._base import ConsumeFromWhere, MessageModel, PullSource, RebalanceListener, is_retry_or_dlq_topic
from .._common import (
    QueueStates,
    check_lease,
    check_message_model,
    commit_entries,
    no_send_back,
    open_offset_store,
    parse_tag_expression,
)
from ..local_offsets import LocalOffsetStore
from .groups import SCHEDULE_GROUP, Member
from .reading import QueueReader, scan
from .schedule import SCHEDULE_TOPIC

if TYPE_CHECKING:
    from .broker import EmbeddedBroker

__all__ = ["EmbeddedPullConsumer"]

logger = logging.getLogger(__name__)

#: Shortest wait of a poll bounded by the next delayed retry's due time (a
#: due time already past -- delivery failed and waits to retry -- must not
#: make the poll spin).
_MIN_DUE_WAIT = 0.001
_INF = math.inf


def _check_arguments(
    group: object, consume_from: object, session_timeout: float | None, client_id: object, allocate: object
) -> None:
    """A consumer's arguments, checked at construction: ``ConfigError``
    naming the first bad one."""
    if not isinstance(group, str) or not group:
        raise ConfigError("group", f"must be a non-empty string, got {group!r}")
    if group == SCHEDULE_GROUP:
        raise ConfigError("group", f"{group!r} is internal to the broker")
    if not isinstance(consume_from, ConsumeFromWhere):
        raise ConfigError("consume_from", f"must be a ConsumeFromWhere, got {consume_from!r}")
    if session_timeout is not None and not session_timeout > 0:
        raise ConfigError("session_timeout", f"must be positive, got {session_timeout!r}")
    if client_id is not None and (not isinstance(client_id, str) or not client_id):
        raise ConfigError("client_id", f"must be a non-empty string, got {client_id!r}")
    if not callable(allocate):
        raise ConfigError("allocate", f"must be an allocation strategy, got {allocate!r}")


class EmbeddedPullConsumer(QueueStates[QueueReader], PullSource):
    """A member of a consumer group on an :class:`EmbeddedBroker`; see
    :class:`~lite_push.sources.PullSource` for the contract of each method.
    Create it with :meth:`EmbeddedBroker.pull_consumer`.

    Owned by one thread; only :meth:`wakeup` may be called from others.
    Listener exceptions are logged and do not stop the hand-off (a revoked
    queue is released even if ``on_revoked`` raised)."""

    _broker: EmbeddedBroker

    def __init__(
        self,
        broker: EmbeddedBroker,
        group: str,
        *,
        consume_from: ConsumeFromWhere = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp: int | None = None,
        client_id: str | None = None,
        allocate: AllocateStrategy = AVERAGELY,
        session_timeout: float | None = None,
        message_model: MessageModel = MessageModel.CLUSTERING,
        offset_file: str | os.PathLike[str] | None = None,
    ) -> None:
        check_message_model(message_model, offset_file)
        _check_arguments(group, consume_from, session_timeout, client_id, allocate)
        self._broker = broker
        self._clock = broker.clock
        self._log = broker.log
        self._groups = broker.groups
        self._schedule = broker.schedule
        self._lock = broker.log.lock
        self._cond = broker.log.cond
        timeout = float(session_timeout) if session_timeout is not None else broker.session_timeout
        # A blocked poll wakes up this often to stamp its heartbeat and look
        # for expired members.
        self._wait_slice = max(0.01, timeout / 3)
        self._listener: RebalanceListener | None = None
        self._filters: dict[str, frozenset[str] | None] = {}
        self._states: dict[MessageQueue, QueueReader] = {}
        self._active: list[QueueReader] = []  # owned and not paused, sorted
        self._rr = 0
        self._seen_version = -1
        self._wakeup = False
        self._closed = False
        # BROADCASTING: every queue, offsets in a local file; _pending: a
        # topic was subscribed whose queues are not taken yet
        self._store: LocalOffsetStore | None = None
        self._pending = False
        groups = self._groups
        with self._lock:
            broker.check_open()
            g = groups.group(group)
            if client_id is None:
                client_id = groups.new_client_id()
            groups.check_client_id(g, client_id)
            # last: it locks the file, and nothing above may fail after that
            self._store = open_offset_store(message_model, offset_file, broker.broker_name, group)
            groups.register(self, g, client_id)
            self._group = g
            now = self._clock.monotonic()
            self._member = Member(client_id, allocate, consume_from, consume_timestamp, timeout, now)
        self._subscribed = False
        #: Fencing: when a heartbeat last found this member in its group
        #: (the broker clock); its queues are its own until then + timeout.
        self._confirmed = -math.inf

    # -- identity -----------------------------------------------------------

    @property
    def group(self) -> str:
        return self._group.name

    @property
    def client_id(self) -> str:
        return self._member.cid

    @property
    def session_timeout(self) -> float | None:
        return None if self._store is not None else self._member.session_timeout

    def owned_for(self) -> dict[MessageQueue, float]:
        """See :meth:`PullSource.owned_for` (BROADCASTING: no sessions)."""
        if self._store is not None:
            return {}
        return dict.fromkeys(self._states, self._confirmed + self._member.session_timeout - self._clock.monotonic())

    def queue_count(self, topic: str) -> int | None:
        t = self._log.get(topic)
        return len(t.queues) if t is not None else None

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"<EmbeddedPullConsumer {self._group.name!r}/{self._member.cid!r}{' closed' if self._closed else ''}>"

    def mark_closed(self) -> None:
        """The broker closed (under its lock): every later call but
        :meth:`close` raises ``SourceClosedError``."""
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise SourceClosedError(f"consumer {self._member.cid!r} of group {self._group.name!r} is closed")

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
            self._filters[topic] = tags
            for st in self._states.values():
                if st.mq.topic == topic:
                    st.tags = tags
            m = self._member
            if self._store is not None:  # BROADCASTING: not a group member
                if topic not in m.topics:
                    m.topics.add(topic)
                    self._pending = True
            elif topic not in m.topics:
                m.topics.add(topic)
                self._subscribed = True
                self._groups.join(self._group, m)
        logger.debug("%r subscribed to %r with %r", self, topic, expression)

    def set_rebalance_listener(self, listener: RebalanceListener | None) -> None:
        self._check_open()
        self._listener = listener

    # -- polling ------------------------------------------------------------

    def poll(self, timeout: float, max_per_queue: int = 32) -> list[PollBatch]:
        """See :meth:`PullSource.poll`.  With a tag filter, at most
        ``4 * max_per_queue + 256`` messages of a queue are scanned per call;
        a batch whose scanned messages were all filtered out has no messages
        and a moved ``next_offset``."""
        if self._closed:
            self._check_open()
        if type(max_per_queue) is not int or max_per_queue < 1:
            raise ValueError(f"max_per_queue must be an int >= 1, got {max_per_queue!r}")
        if self._wakeup:
            self._wakeup = False
            return []
        member = self._member
        group = self._group
        clock = self._clock
        schedule = self._schedule
        deadline = -1.0
        while True:
            due = schedule.next_due_ms
            if due < _INF and due <= clock.time() * 1000.0:
                schedule.deliver_from_poll()
            if self._store is not None:
                if self._pending:
                    self._assign_all()
                    self._check_open()
                if self._active:
                    batches = self._scan(max_per_queue)
                    if batches:
                        return batches
            elif self._subscribed:
                now = clock.monotonic()
                member.last_seen = now
                if now >= group.next_check:
                    self._groups.check_expiry(group, member, now)
                changed = group.version != self._seen_version or member.expired
                if changed:
                    self._rebalance()
                    self._check_open()
                if (changed or now - self._confirmed >= self._wait_slice) and self._groups.confirm(group, member, now):
                    self._confirmed = now
                if self._active:
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
                self._check_open()
                if self._wakeup:
                    self._wakeup = False
                    return []
                if self._store is not None:
                    changed = self._pending
                else:
                    changed = group.version != self._seen_version or member.expired
                if not changed and not self._ready():
                    wait = min(remaining, self._wait_slice)
                    due = schedule.next_due_ms
                    if due < _INF:  # wake when the next delayed retry is due
                        wait = min(wait, max(_MIN_DUE_WAIT, due / 1000.0 - clock.time()))
                    self._cond.wait(wait)

    def _ready(self) -> bool:
        for st in self._active:
            if st.pos < len(st.log):
                return True
        return False

    def _scan(self, max_per_queue: int) -> list[PollBatch]:
        start = self._rr % len(self._active)
        self._rr = start + 1
        return scan(self._active, start, max_per_queue, self._log.unreadable)

    def _assign_all(self) -> None:
        """BROADCASTING: own every queue of the subscribed topics, each from
        its offset in the local file, else from ``consume_from`` (stored in
        the file at once, so a restart before the first commit starts there
        too)."""
        store = self._store
        assert store is not None
        with self._lock:
            if self._closed:
                return
            new = sorted(q for t in self._member.topics for q in self._log.topic(t).queues if q not in self._states)
            starts = self._groups.local_starts(self._member, new, store)
            for q, pos in starts.items():
                self._states[q] = QueueReader(q, self._log.log_of(q), pos, self._filters.get(q.topic))
            self._pending = False
            if new:
                self._rebuild_active()
        if new:
            self._notify("on_assigned", new)

    def _rebalance(self) -> None:
        """Bring the owned set to the target: release what left the target
        (after ``on_revoked``), take what is free (then ``on_assigned``)."""
        groups = self._groups
        group = self._group
        member = self._member
        cid = member.cid
        while True:
            with self._lock:
                if self._closed:
                    return
                version = group.version
                if member.expired:
                    # Evicted for silence: its queues are already released.
                    # Rejoin; the local state goes through on_revoked below.
                    groups.rejoin(group, member)
                    continue
                lost, drop = groups.to_give_up(group, cid, self._states, member.target)
                if not lost and not drop:
                    taken = groups.take_free(group, member, self._states)
                    for q, pos in taken:
                        self._states[q] = QueueReader(q, self._log.log_of(q), pos, self._filters.get(q.topic))
                    if taken:
                        self._rebuild_active()
                    self._seen_version = version
                    break
            revoked = sorted(lost + drop)
            if lost:
                logger.warning("group %r: %r lost %s to the broker", group.name, cid, [str(q) for q in lost])
            self._notify("on_revoked", revoked)
            with self._lock:
                groups.release(group, cid, drop)
                for q in revoked:
                    self._states.pop(q, None)
                self._rebuild_active()
        if taken:
            self._notify("on_assigned", [q for q, _ in taken])

    # -- queue control: assignment, pause, resume (QueueStates) ---------------

    def seek(self, queue: MessageQueue, offset: int) -> None:
        """Next poll of ``queue`` starts at ``offset`` clamped to
        ``[0, max_offset]``."""
        self._check_open()
        st = self._owned(queue)
        st.pos = min(max(int(offset), 0), len(st.log))

    def position(self, queue: MessageQueue) -> int:
        self._check_open()
        return self._owned(queue).pos

    # -- offsets ------------------------------------------------------------

    def commit(self, offsets: Mapping[MessageQueue, OffsetAndMetadata | int]) -> None:
        """Store offsets of the queues this member owns (per the broker: a
        member that lost a queue, even one that has not noticed yet, cannot
        commit it).  Raises ``ValueError`` for a negative offset or a value
        that is neither ``int`` nor ``OffsetAndMetadata``."""
        self._check_open()
        entries = commit_entries(offsets)
        if not entries:
            return
        if self._store is not None:
            self._commit_local(entries)
            return
        groups = self._groups
        with self._lock:
            self._check_open()
            stored = groups.commit(self._group, self._member.cid, entries)
            if not stored or not self._log.durable:
                return
            snapshot, version = groups.offsets_snapshot()
        groups.save_offsets(snapshot, version)

    def committed(self, queue: MessageQueue) -> OffsetAndMetadata | None:
        self._check_open()
        if self._store is not None:
            return self._store.get(queue)
        with self._lock:
            return self._group.committed.get(queue)

    # -- broker-side queue locks (orderly consumption) ------------------------

    def lock(self, queues: Collection[MessageQueue], lease: float) -> frozenset[MessageQueue]:
        """See :meth:`PullSource.lock`; leases run on the broker's clock."""
        self._check_open()
        check_lease(lease)
        if self._store is not None:  # BROADCASTING: no other member reads "our" copy
            return frozenset(queues)
        with self._lock:
            self._check_open()
            return self._groups.lock_queues(self._group, self._member.cid, queues, lease)

    def unlock(self, queues: Collection[MessageQueue]) -> None:
        """See :meth:`PullSource.unlock`."""
        self._check_open()
        if self._store is not None:
            return
        with self._lock:
            self._groups.unlock_queues(self._group, self._member.cid, queues)

    # -- failures -------------------------------------------------------------

    @property
    def delay_levels(self) -> tuple[float, ...]:
        """See :attr:`PullSource.delay_levels` (the broker's)."""
        return self._broker.delay_levels

    def send_back(self, items: Sequence[tuple[MessageExt, int]]) -> list[BaseException | None]:
        """See :meth:`PullSource.send_back`.  The copy waits in the broker's
        ``SCHEDULE_TOPIC_XXXX`` until due, then moves to ``%RETRY%<group>``
        when a consumer polls (or :meth:`EmbeddedBroker.deliver_due`)."""
        self._check_open()
        if self._store is not None:
            return [no_send_back(self)] * len(items)
        return self._schedule.send_back(self._group.name, items)

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
            if self._closed:
                return
            self._closed = True
            self._groups.leave(self, self._group, self._member)
            self._states.clear()
            self._active = []
        if self._store is not None:
            self._store.close()
        logger.debug("%r closed", self)

    def __enter__(self) -> EmbeddedPullConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
