"""The embedded broker's pull consumer and the group state it shares with the
broker.  The storage format, the hand-off protocol and the locks are explained
in the block comment at the top of ``embedded.py``."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from .._errors import (
    ConfigError,
    SourceClosedError,
    UnknownTopicError,
)
from .._types import MessageExt, MessageQueue, OffsetAndMetadata, PollBatch
from ..rebalance.allocate import AVERAGELY, AllocateStrategy
from ._base import (
    ConsumeFromWhere,
    MessageModel,
    PullSource,
    RebalanceListener,
    is_retry_or_dlq_topic,
)
from ._common import (
    BrokerClock,
    QueueStates,
    check_message_model,
    commit_entries,
    no_send_back,
    open_offset_store,
    parse_tag_expression,
)
from .local_offsets import LocalOffsetStore

if TYPE_CHECKING:
    from .embedded import EmbeddedBroker

__all__ = [
    "SCHEDULE_GROUP",
    "SCHEDULE_TOPIC",
    "BrokerClock",
    "EmbeddedPullConsumer",
    "MonotonicClock",
    "parse_tag_expression",
]

logger = logging.getLogger("lite_push.sources.embedded")

#: With a tag filter, one poll scans at most this many messages per queue
#: beyond ``4 * max_per_queue`` (so a queue of filtered-out messages cannot
#: make a poll long).
_SCAN_EXTRA = 256
#: Shortest wait of a poll bounded by the next delayed retry's due time (a
#: due time already past -- delivery failed and waits to retry -- must not
#: make the poll spin).
_MIN_DUE_WAIT = 0.001
#: The broker's internal topic of delayed retries, one queue per delay level
#: (see ``embedded.py``); consumers cannot subscribe to it.
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
#: The internal group whose committed offsets on SCHEDULE_TOPIC say what was
#: already delivered; no consumer may use this group name.
SCHEDULE_GROUP = "%SCHEDULE%"
_INF = math.inf


#: The former name of :class:`BrokerClock` (it then had ``monotonic()`` only).
MonotonicClock = BrokerClock


class _Member:
    """A group member as the broker sees it (guarded by the broker lock,
    except ``last_seen``, which its own poll stamps without it)."""

    __slots__ = (
        "cid",
        "topics",
        "allocate",
        "consume_from",
        "consume_timestamp",
        "session_timeout",
        "last_seen",
        "target",
        "expired",
    )

    def __init__(
        self,
        cid: str,
        allocate: AllocateStrategy,
        consume_from: ConsumeFromWhere,
        consume_timestamp: int | None,
        session_timeout: float,
        now: float,
    ) -> None:
        self.cid = cid
        self.topics: set[str] = set()
        self.allocate = allocate
        self.consume_from = consume_from
        self.consume_timestamp = consume_timestamp
        self.session_timeout = session_timeout
        self.last_seen = now
        self.target: frozenset[MessageQueue] = frozenset()
        self.expired = False


class _Group:
    """A consumer group's shared state (guarded by the broker lock)."""

    __slots__ = ("name", "clients", "members", "owner", "committed", "initial", "version", "next_check", "locks")

    def __init__(self, name: str) -> None:
        self.name = name
        self.clients: set[str] = set()  # client ids of the open consumers
        self.members: dict[str, _Member] = {}  # subscribed, live members
        self.owner: dict[MessageQueue, str] = {}  # the hand-off's source of truth
        self.committed: dict[MessageQueue, OffsetAndMetadata] = {}
        self.initial: dict[MessageQueue, int] = {}  # start position fixed when first owned
        self.version = 0  # bumped on every target change and release
        self.next_check = float("-inf")  # next session-expiry scan (clock time)
        self.locks: dict[MessageQueue, tuple[str, float]] = {}  # queue -> (client id, lease end)


class _QState:
    """An owned queue, as its owner sees it (owner thread only)."""

    __slots__ = ("mq", "log", "pos", "paused", "tags")

    def __init__(self, mq: MessageQueue, log: list[MessageExt], pos: int, tags: frozenset[str] | None) -> None:
        self.mq = mq
        self.log = log  # the broker's list for this queue; it only grows
        self.pos = pos
        self.paused = False
        self.tags = tags


class EmbeddedPullConsumer(QueueStates[_QState], PullSource):
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
        self._broker = broker
        self._clock = broker._clock
        self._lock = broker._lock
        self._cond = broker._cond
        timeout = float(session_timeout) if session_timeout is not None else broker.session_timeout
        # A blocked poll wakes up this often to stamp its heartbeat and look
        # for expired members.
        self._wait_slice = max(0.01, timeout / 3)
        self._listener: RebalanceListener | None = None
        self._filters: dict[str, frozenset[str] | None] = {}
        self._states: dict[MessageQueue, _QState] = {}
        self._active: list[_QState] = []  # owned and not paused, sorted
        self._rr = 0
        self._seen_version = -1
        self._wakeup = False
        self._closed = False
        # BROADCASTING: every queue, offsets in a local file; _pending: a
        # topic was subscribed whose queues are not taken yet
        self._store: LocalOffsetStore | None = None
        self._pending = False
        with self._lock:
            broker._check_open()
            g = broker._group(group)
            if client_id is None:
                client_id = f"{broker.broker_name}@{os.getpid()}@{next(broker._client_seq):06d}"
            if client_id in g.clients:
                raise ConfigError("client_id", f"{client_id!r} is already used by an open consumer of group {group!r}")
            # last: it locks the file, and nothing above may fail after that
            self._store = open_offset_store(message_model, offset_file, broker.broker_name, group)
            g.clients.add(client_id)
            broker._consumers.add(self)
            self._group = g
            now = self._clock.monotonic()
            self._member = _Member(client_id, allocate, consume_from, consume_timestamp, timeout, now)
        self._subscribed = False

    # -- identity -----------------------------------------------------------

    @property
    def group(self) -> str:
        return self._group.name

    @property
    def client_id(self) -> str:
        return self._member.cid

    def queue_count(self, topic: str) -> int | None:
        t = self._broker._topics.get(topic)
        return len(t.queues) if t is not None else None

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"<EmbeddedPullConsumer {self._group.name!r}/{self._member.cid!r}{' closed' if self._closed else ''}>"

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
        broker = self._broker
        with self._lock:
            self._check_open()
            if topic not in broker._topics or topic == SCHEDULE_TOPIC:
                if not is_retry_or_dlq_topic(topic):
                    raise UnknownTopicError(topic)
                broker._ensure_topic_locked(topic, 1)
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
                m.last_seen = self._clock.monotonic()
                self._group.members[m.cid] = m
                self._subscribed = True
                broker._recompute(self._group)
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
        broker = self._broker
        deadline = -1.0
        while True:
            due = broker._next_due_ms
            if due < _INF and due <= clock.time() * 1000.0:
                broker._deliver_from_poll()
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
                    self._broker._check_expiry(group, member, now)
                if group.version != self._seen_version or member.expired:
                    self._rebalance()
                    self._check_open()
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
                    due = broker._next_due_ms
                    if due < _INF:  # wake when the next delayed retry is due
                        wait = min(wait, max(_MIN_DUE_WAIT, due / 1000.0 - clock.time()))
                    self._cond.wait(wait)

    def _ready(self) -> bool:
        for st in self._active:
            if st.pos < len(st.log):
                return True
        return False

    def _scan(self, max_per_queue: int) -> list[PollBatch]:
        active = self._active
        n = len(active)
        start = self._rr % n
        self._rr = start + 1
        out: list[PollBatch] = []
        for i in range(n):
            st = active[(start + i) % n]
            log = st.log
            pos = st.pos
            end = len(log)
            if pos >= end:
                continue
            if st.tags is None:
                stop = pos + max_per_queue
                if stop > end:
                    stop = end
                out.append(PollBatch(st.mq, log[pos:stop], stop))
                st.pos = stop
            else:
                tags = st.tags
                limit = pos + 4 * max_per_queue + _SCAN_EXTRA
                if limit > end:
                    limit = end
                picked: list[MessageExt] = []
                j = pos
                while j < limit:
                    m = log[j]
                    j += 1
                    if m.tags in tags:
                        picked.append(m)
                        if len(picked) >= max_per_queue:
                            break
                out.append(PollBatch(st.mq, picked, j))
                st.pos = j
        return out

    def _assign_all(self) -> None:
        """BROADCASTING: own every queue of the subscribed topics, each from
        its offset in the local file, else from ``consume_from`` (stored in
        the file at once, so a restart before the first commit starts there
        too)."""
        broker = self._broker
        store = self._store
        assert store is not None
        fresh: dict[MessageQueue, OffsetAndMetadata] = {}
        with self._lock:
            if self._closed:
                return
            new = sorted(
                q for topic in self._member.topics for q in broker._topics[topic].queues if q not in self._states
            )
            for q in new:
                log = broker._topics[q.topic].logs[q.queue_id]
                om = store.get(q)
                if om is None:
                    pos = broker._initial_position(self._member, q)
                    fresh[q] = OffsetAndMetadata(pos)
                else:
                    pos = min(max(om.offset, 0), len(log))
                self._states[q] = _QState(q, log, pos, self._filters.get(q.topic))
            self._pending = False
            if new:
                self._rebuild_active()
        if fresh:
            try:
                store.commit(fresh)
            except OSError as e:
                logger.warning("%r: storing the start offsets in %s failed: %s", self, store.path, e)
        if new:
            self._notify("on_assigned", new)

    def _rebalance(self) -> None:
        """Bring the owned set to the target: release what left the target
        (after ``on_revoked``), take what is free (then ``on_assigned``)."""
        broker = self._broker
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
                    member.expired = False
                    member.last_seen = self._clock.monotonic()
                    group.members[cid] = member
                    broker._recompute(group)
                    logger.warning("group %r: member %r rejoins after its session expired", group.name, cid)
                    continue
                owner = group.owner
                lost = [q for q in self._states if owner.get(q) != cid]
                drop = [q for q in self._states if q not in member.target and owner.get(q) == cid]
                if not lost and not drop:
                    new = sorted(q for q in member.target if q not in self._states and q not in owner)
                    for q in new:
                        owner[q] = cid
                        pos = broker._start_position(group, member, q)
                        log = broker._topics[q.topic].logs[q.queue_id]
                        self._states[q] = _QState(q, log, pos, self._filters.get(q.topic))
                    if new:
                        self._rebuild_active()
                    self._seen_version = version
                    break
            revoked = sorted(lost + drop)
            if lost:
                logger.warning("group %r: %r lost %s to the broker", group.name, cid, [str(q) for q in lost])
            self._notify("on_revoked", revoked)
            with self._lock:
                for q in drop:
                    if owner.get(q) == cid:
                        del owner[q]
                for q in revoked:
                    self._states.pop(q, None)
                self._rebuild_active()
                if drop:
                    broker._bump(group)
        if new:
            self._notify("on_assigned", new)

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
        broker = self._broker
        cid = self._member.cid
        group = self._group
        with self._lock:
            self._check_open()
            stored = 0
            for q, om in entries.items():
                if group.owner.get(q) == cid:
                    group.committed[q] = om
                    stored += 1
                else:
                    logger.debug("%r: commit of %s ignored: not its queue", self, q)
            if not stored or broker._store is None:
                return
            snapshot, version = broker._offsets_snapshot()
        broker._save_offsets(snapshot, version)

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
        if not lease > 0:
            raise ValueError(f"lease must be positive, got {lease!r}")
        if self._store is not None:  # BROADCASTING: no other member reads "our" copy
            return frozenset(queues)
        cid = self._member.cid
        with self._lock:
            self._check_open()
            now = self._clock.monotonic()
            locks = self._group.locks
            held = []
            for q in queues:
                current = locks.get(q)
                if current is None or current[0] == cid or current[1] <= now:
                    locks[q] = (cid, now + lease)
                    held.append(q)
            return frozenset(held)

    def unlock(self, queues: Collection[MessageQueue]) -> None:
        """See :meth:`PullSource.unlock`."""
        self._check_open()
        if self._store is not None:
            return
        cid = self._member.cid
        with self._lock:
            locks = self._group.locks
            for q in queues:
                current = locks.get(q)
                if current is not None and current[0] == cid:
                    del locks[q]

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
        return self._broker._send_back(self._group.name, items)

    def send_to_dlq(self, items: Sequence[tuple[MessageExt, str, str]]) -> list[BaseException | None]:
        """See :meth:`PullSource.send_to_dlq`."""
        self._check_open()
        return self._broker._send_to_dlq(self._group.name, items)

    # -- lifecycle ----------------------------------------------------------

    def wakeup(self) -> None:
        self._wakeup = True
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """Leave the group; the owned queues are released at once (commit
        first: nothing is committed here and no listener is called)."""
        broker = self._broker
        with self._lock:
            if self._closed:
                return
            self._closed = True
            broker._consumers.discard(self)
            group = self._group
            group.clients.discard(self._member.cid)
            for q in [q for q, (cid, _end) in group.locks.items() if cid == self._member.cid]:
                del group.locks[q]
            if group.members.get(self._member.cid) is self._member:
                del group.members[self._member.cid]
                for q in [q for q, cid in group.owner.items() if cid == self._member.cid]:
                    del group.owner[q]
                broker._recompute(group)
            self._states.clear()
            self._active = []
            self._cond.notify_all()
        if self._store is not None:
            self._store.close()
        logger.debug("%r closed", self)

    def __enter__(self) -> EmbeddedPullConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
