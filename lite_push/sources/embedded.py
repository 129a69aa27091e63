"""The embedded broker: topics, queues, consumer groups and rebalance in process.

Code: this module (the broker, sending), ``_embedded_consumer.py`` (the pull
consumer and the group state), ``_embedded_store.py`` (the files).

# ---------------------------------------------------------------------------
# Storage
#
# Each queue is a Python list of MessageExt; a message's queue_offset is its
# index (offsets run from 0, nothing is ever deleted, so min_offset is 0 and
# max_offset is len(list)).  poll() hands out slices of these lists: messages
# are shared, never copied, and must be treated as read-only.
#
# With a ``path`` the broker is durable:
#   path/LOCK                 flock'ed while a broker has the directory open
#   path/topics.json          {"version": 1, "topics": {topic: queue_count}}
#   path/offsets.json         {"version": 1, "groups": {group: {topic:
#                               {queue_id: {"offset": n, "metadata": s}}}}}
#   path/<topic>/<qid>.log    append-only records, one per message:
#       header  <IIIqqq  magic b"LPR1", meta_len, body_len, queue_offset,
#                        born_timestamp ms, store_timestamp ms
#       meta    orjson {"k": keys, "t": tags, "p": properties} (absent parts
#               omitted; zero bytes when the message has none of them)
#       body    body_len bytes
#       trailer <I       CRC32 of header + meta + body
# msg_id is not stored: it is f"{broker_name}-{topic}-{queue_id}-{offset}".
# The JSON files are replaced atomically (write a .tmp, os.replace).  Logs
# are written unbuffered (one write per queue per send/send_batch), so
# what send() acknowledged survives kill -9; ``fsync=True`` adds an fsync for
# power loss.  On reopen every record is checked (length, magic, CRC,
# consecutive offset); the first bad one -- a write torn by a crash -- and
# everything after it are truncated away with a warning.
#
# Rebalance and the queue hand-off
#
# Membership of a group starts at subscribe() and ends at close() (or when the
# member misses its session timeout).  On every membership change the broker
# recomputes each member's *target* (the allocation strategy over the topic's
# sorted queues and the sorted client ids of the members subscribed to it)
# and bumps the group's version.  The *owner* map (queue -> client id) changes
# only in the owning member's own poll():
#   1. a member whose owned queue left its target calls its listener's
#      on_revoked (it commits there, still the owner), then deletes its
#      owner entry and bumps the version, waking the waiting pollers;
#   2. a member takes a target queue only when the owner map has no entry
#      for it, reads the start position (committed offset, else the group's
#      first-ownership position from ConsumeFromWhere), then calls on_assigned.
# So two live members never own one queue at once, and the new owner starts
# at what the old one committed in on_revoked.  commit() stores only offsets of
# queues the committer owns in the owner map.  Liveness: every poll stamps
# the member's last_seen (injectable clock); a poll that sees another member
# silent for longer than its session timeout evicts it (drops it from the
# group and its owner entries) -- the one case where the queues move before
# their old owner ran on_revoked.  The evicted member's next poll sees its
# queues gone, calls on_revoked (its commits are fenced off by then: they are
# ignored), and rejoins.
#
# Locks
#   EmbeddedBroker._lock (with the Condition _cond on it) guards all shared
#     state: topics, the queue lists' growth, the log files' appends (so file
#     order is offset order), and every group's members, owner map, committed
#     offsets and version.  send_batch builds and validates the messages
#     without it, then takes it once per ~_CHUNK messages to number, write
#     and publish them, and notifies _cond; blocked polls wait on _cond.
#     Listener callbacks and writes of offsets.json never run under it.
#     (Big batches also pause the cyclic GC while they build messages: a
#     million new objects would otherwise trigger many full collections.)
#     (The round-robin counter is read and written without it: a race only
#     makes two senders pick the same queue.)
#   EmbeddedBroker._offsets_io_lock serialises writes of offsets.json; each
#     write carries a version so a late, older snapshot never overwrites a
#     newer one.
#   A consumer has no lock: it belongs to one thread (the PullSource
#   contract).  Its fast path reads the queue lists without the broker lock:
#   len() and slicing of a list are atomic, and lists only grow.  wakeup(),
#   the one method other threads may call, sets a flag and notifies _cond.
#   EmbeddedBroker._next_due_ms is written under _lock and read without it
#   by every poll (a float read is atomic; a stale value only makes a poll
#   look once more or a little later).
#
# Retries, dead letters and delayed delivery
#
# send_back and send_to_dlq (called through a consumer, for its group) store
# copies made by _base.origin_properties.  Dead letters go straight to
# %DLQ%<group>.  Retries are delayed like RocketMQ's SCHEDULE_TOPIC_XXXX: the
# internal topic SCHEDULE_TOPIC has one queue per delay level, and send_back
# appends the copy to its level's queue with REAL_TOPIC (%RETRY%<group>) and
# TIMER_DELIVER_MS (due time: the clock's .time() plus the level's delay, in
# ms).  One fixed delay per level makes each level queue FIFO by due time (as
# long as the wall clock does not go back), so only the heads are checked.
# Per level, the delivery offset -- what was already moved -- is the
# committed offset of the internal group %SCHEDULE% on that queue, stored in
# offsets.json with the other groups, so it survives a restart.  Delivering
# a due message appends a copy, minus REAL_TOPIC and TIMER_DELIVER_MS, to its
# retry topic and then advances the delivery offset, both under one lock;
# offsets.json is written after.  A crash between the log write and the
# offsets write delivers that message again after restart: delivery is
# at-least-once.  Delivery is lazy: every poll compares the clock with
# _next_due_ms (the earliest head due time, +inf when nothing is scheduled)
# and delivers what is due; a poll that waits does not wait past it.
# deliver_due() does the same for callers with no consumer.
#
# Retry and DLQ topics have one queue and are created on first use: by
# send_back/send_to_dlq, or by a subscribe() naming them.  SCHEDULE_TOPIC is
# created by the first send_back with one queue per delay level (grown on
# reopen when more levels are configured; extra queues of a shorter list are
# still delivered from).  It cannot be subscribed, sent to or created by
# users, and topics() does not list it.  A message's reconsume_times is its
# RECONSUME_TIME property (0 when absent), for every topic and also when a
# log is loaded, so the in-memory and the reopened broker agree.
# ---------------------------------------------------------------------------
"""

from __future__ import annotations

import bisect
import gc
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from operator import attrgetter
from typing import Any, overload
from zlib import crc32 as _crc32

from .._errors import (
    ConfigError,
    MessageTooLargeError,
    SourceClosedError,
    UnknownTopicError,
)
from .._router import lane_of
from .._types import MessageExt, MessageQueue, OffsetAndMetadata, SendResult
from ..rebalance.allocate import AVERAGELY, AllocateStrategy
from ._base import (
    DEFAULT_DELAY_LEVELS,
    DLQ_EXCEPTION,
    DLQ_GROUP,
    DLQ_REASON,
    REAL_TOPIC,
    RECONSUME_TIME,
    TIMER_DELIVER_MS,
    ConsumeFromWhere,
    MessageModel,
    dlq_topic,
    is_retry_or_dlq_topic,
    origin_properties,
    reconsume_times_of,
    retry_topic,
)
from ._common import (
    BrokerClock,
    check_delay_levels,
    check_message,
    initial_position,
    now_ms,
    parse_tag_expression,
    unpack_mapping,
    validate_topic,
)
from ._embedded_consumer import (
    SCHEDULE_GROUP,
    SCHEDULE_TOPIC,
    EmbeddedPullConsumer,
    MonotonicClock,
    _Group,
    _Member,
)
from ._embedded_store import (
    HEADER,
    MAGIC,
    TRAILER,
    QueueLog,
    Store,
    encode_meta,
    msg_id_prefix,
)

__all__ = [
    "SCHEDULE_GROUP",
    "SCHEDULE_TOPIC",
    "BrokerClock",
    "EmbeddedBroker",
    "EmbeddedPullConsumer",
    "MonotonicClock",
    "SendResults",
    "parse_tag_expression",
]

logger = logging.getLogger(__name__)

#: Messages stored per lock acquisition in send_batch (bounds how long a huge
#: batch keeps pollers and wakeup() waiting).
_CHUNK = 65536
#: Batches at least this large run with the cyclic GC paused (creating
#: millions of objects otherwise triggers many full collections).
_GC_PAUSE_MIN = 4096
#: RocketMQ's default consume_timestamp: half an hour ago.
#: Due messages moved per lock acquisition by a delivery run.
_DELIVER_CHUNK = 4096
#: How long delivery waits before trying again after it failed (seconds).
_DELIVER_RETRY_DELAY = 1.0
_INF = math.inf
_store_ts = attrgetter("store_timestamp")


def _due_ms(m: MessageExt) -> int:
    """When a scheduled message is due (0, i.e. at once, when its property
    is missing or unreadable: it is then dropped with a warning)."""
    raw = m.properties.get(TIMER_DELIVER_MS)
    try:
        return int(raw) if raw is not None else 0
    except ValueError:
        return 0


_Encoded = tuple[list[tuple[int, int, int]], list[list[MessageExt]], list[list[int]], list[list[bytes]]]


class _Topic:
    __slots__ = ("name", "queues", "logs", "files", "prefixes", "rr")

    def __init__(self, name: str, broker_name: str, count: int) -> None:
        self.name = name
        self.queues = [MessageQueue(name, broker_name, i) for i in range(count)]
        self.logs: list[list[MessageExt]] = [[] for _ in range(count)]
        self.files: list[QueueLog] | None = None
        self.prefixes = [msg_id_prefix(broker_name, name, i) for i in range(count)]
        self.rr = 0


class SendResults(Sequence[SendResult]):
    """The results of :meth:`EmbeddedBroker.send_batch`, in input order.
    Built lazily from the stored messages, so a million-message batch does
    not create a million result objects nobody reads."""

    __slots__ = ("_queues", "_messages")

    def __init__(self, queues: list[MessageQueue], messages: list[MessageExt]) -> None:
        self._queues = queues
        self._messages = messages

    def __len__(self) -> int:
        return len(self._messages)

    @overload
    def __getitem__(self, index: int) -> SendResult: ...

    @overload
    def __getitem__(self, index: slice) -> list[SendResult]: ...

    def __getitem__(self, index: int | slice) -> SendResult | list[SendResult]:
        if isinstance(index, slice):
            return [self._result(m) for m in self._messages[index]]
        return self._result(self._messages[index])

    def __iter__(self) -> Iterator[SendResult]:
        for m in self._messages:
            yield self._result(m)

    def _result(self, m: MessageExt) -> SendResult:
        return SendResult(self._queues[m.queue_id], m.queue_offset, m.msg_id)

    def last_offsets(self) -> dict[MessageQueue, int]:
        """The highest offset stored per queue by this batch."""
        out: dict[MessageQueue, int] = {}
        for m in self._messages:
            out[self._queues[m.queue_id]] = m.queue_offset
        return out

    def __repr__(self) -> str:
        return f"<SendResults of {len(self._messages)} message(s)>"


class EmbeddedBroker:
    """An in-process broker: topics of N queues, optionally durable in
    ``path``, with consumer groups whose members share the queues.

    Thread-safe: any thread may send; each consumer belongs to one thread.
    ``clock`` (default: the ``time`` module) drives session timeouts and
    lock leases (``.monotonic()``) and the due times of delayed retries
    (``.time()``); message timestamps are wall-clock milliseconds.
    ``session_timeout`` is the default for consumers that do not set their
    own.  ``delay_levels`` are the seconds each delay level of
    :meth:`EmbeddedPullConsumer.send_back` waits (default RocketMQ's 16
    levels, 1 s to 30 min).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        broker_name: str = "embedded",
        max_message_size: int = 4 * 1024 * 1024,
        clock: BrokerClock | None = None,
        session_timeout: float = 30.0,
        fsync: bool = False,
        delay_levels: Sequence[float] = DEFAULT_DELAY_LEVELS,
    ) -> None:
        if not isinstance(broker_name, str) or not broker_name:
            raise ConfigError("broker_name", f"must be a non-empty string, got {broker_name!r}")
        if not isinstance(max_message_size, int) or max_message_size < 1:
            raise ConfigError("max_message_size", f"must be a positive int, got {max_message_size!r}")
        if not session_timeout > 0:
            raise ConfigError("session_timeout", f"must be positive, got {session_timeout!r}")
        if clock is not None and not all(callable(getattr(clock, f, None)) for f in ("monotonic", "time")):
            raise ConfigError("clock", f"must have monotonic() and time() (lite_push.Clock fits), got {clock!r}")
        self._delay_levels = check_delay_levels(delay_levels)
        self.broker_name = broker_name
        self.max_message_size = max_message_size
        self.session_timeout = float(session_timeout)
        self._clock: BrokerClock = clock if clock is not None else time
        # earliest due time (ms) of a scheduled message, +inf when none; see
        # "Retries, dead letters and delayed delivery" above
        self._next_due_ms = _INF
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._offsets_io_lock = threading.Lock()
        self._topics: dict[str, _Topic] = {}
        self._groups: dict[str, _Group] = {}
        self._consumers: set[EmbeddedPullConsumer] = set()
        self._last_store_ms = 0
        self._offsets_version = 0
        self._client_seq = itertools.count(1)
        self._closed = False
        self._store: Store | None = None
        if path is not None:
            self._store = Store(path, fsync)
            try:
                self._load()
            except BaseException:
                self._close_files()
                raise

    # -- durable state ------------------------------------------------------

    def _load(self) -> None:
        store = self._store
        assert store is not None
        for name, count in store.load_topics().items():
            topic = _Topic(name, self.broker_name, count)
            topic.files = [store.open_queue(name, i) for i in range(count)]
            for i, qfile in enumerate(topic.files):
                topic.logs[i] = qfile.load(name, i, self.broker_name)
            for msgs in topic.logs:
                if msgs:
                    self._last_store_ms = max(self._last_store_ms, msgs[-1].store_timestamp)
            self._topics[name] = topic
        schedule = self._topics.get(SCHEDULE_TOPIC)
        if schedule is not None and len(schedule.queues) < len(self._delay_levels):
            self._grow_locked(schedule, len(self._delay_levels))
        for group_name, entries in store.load_offsets().items():
            group = self._group(group_name)
            for (topic_name, qid), (offset, metadata) in entries.items():
                t = self._topics.get(topic_name)
                if t is None or not 0 <= qid < len(t.queues):
                    logger.warning("offsets for unknown queue %s#%d of group %r ignored", topic_name, qid, group_name)
                    continue
                group.committed[t.queues[qid]] = OffsetAndMetadata(offset, metadata)
        self._recompute_next_due_locked()
        logger.info(
            "embedded broker %r opened %s: %d topic(s), %d message(s)",
            self.broker_name,
            store.path,
            len(self._topics),
            sum(len(log) for t in self._topics.values() for log in t.logs),
        )

    def _offsets_snapshot(self) -> tuple[dict[str, dict[tuple[str, int], tuple[int, str]]], int]:
        """(lock held) What offsets.json should say now, and its version."""
        self._offsets_version += 1
        snap = {
            g.name: {(q.topic, q.queue_id): (om.offset, om.metadata) for q, om in g.committed.items()}
            for g in self._groups.values()
            if g.committed
        }
        return snap, self._offsets_version

    def _save_offsets(self, snapshot: dict[str, dict[tuple[str, int], tuple[int, str]]], version: int) -> None:
        if self._store is None:
            return
        with self._offsets_io_lock:
            self._store.save_offsets(snapshot, version)

    # -- topics -------------------------------------------------------------

    def create_topic(self, topic: str, queue_count: int = 4) -> list[MessageQueue]:
        """Create ``topic`` with ``queue_count`` queues and return them.
        Idempotent when the topic exists with that count; ``ConfigError`` (a
        ``ValueError`` naming ``queue_count``) when the count is < 1 or
        differs from the existing topic's; ``ValueError`` for a topic name
        that is empty, longer than 255 or holds ``/``, ``\\`` or NUL.  Retry
        and dead-letter topics (``%RETRY%...``, ``%DLQ%...``) have exactly one
        queue; the internal ``SCHEDULE_TOPIC_XXXX`` cannot be created."""
        validate_topic(topic)
        if not isinstance(queue_count, int) or isinstance(queue_count, bool) or queue_count < 1:
            raise ConfigError("queue_count", f"must be an int >= 1, got {queue_count!r}")
        if topic == SCHEDULE_TOPIC:
            raise ValueError(f"topic {topic!r} is internal to the broker")
        if queue_count != 1 and is_retry_or_dlq_topic(topic):
            raise ConfigError(
                "queue_count", f"retry and dead-letter topics have 1 queue, not {queue_count} ({topic!r})"
            )
        with self._lock:
            self._check_open()
            existing = self._topics.get(topic)
            if existing is not None and len(existing.queues) != queue_count:
                raise ConfigError(
                    "queue_count", f"topic {topic!r} exists with {len(existing.queues)} queues, not {queue_count}"
                )
            return list(self._ensure_topic_locked(topic, queue_count).queues)

    def _ensure_topic_locked(self, topic: str, queue_count: int) -> _Topic:
        """(lock held) The topic, created with ``queue_count`` queues (and
        saved, when durable) if it does not exist.  ``ValueError`` for a bad
        name."""
        t = self._topics.get(topic)
        if t is not None:
            return t
        validate_topic(topic)
        t = _Topic(topic, self.broker_name, queue_count)
        if self._store is not None:
            counts = {name: len(x.queues) for name, x in self._topics.items()}
            counts[topic] = queue_count
            self._store.save_topics(counts)
            t.files = [self._store.open_queue(topic, i) for i in range(queue_count)]
        self._topics[topic] = t
        logger.debug("created topic %r with %d queues", topic, queue_count)
        return t

    def _grow_locked(self, t: _Topic, queue_count: int) -> None:
        """(lock held) Add queues to ``t`` (only SCHEDULE_TOPIC grows: when
        the broker reopens with more delay levels than it was created with)."""
        old = len(t.queues)
        new = range(old, queue_count)
        t.queues.extend(MessageQueue(t.name, self.broker_name, i) for i in new)
        t.logs.extend([] for _ in new)
        t.prefixes.extend(msg_id_prefix(self.broker_name, t.name, i) for i in new)
        if self._store is not None and t.files is not None:
            counts = {name: len(x.queues) for name, x in self._topics.items()}
            self._store.save_topics(counts)
            t.files.extend(self._store.open_queue(t.name, i) for i in new)
        logger.info("topic %r grew from %d to %d queues", t.name, old, queue_count)

    def topics(self) -> list[str]:
        """The names of the topics consumers can subscribe to, sorted: those
        made by :meth:`create_topic` and the retry and dead-letter topics
        (``%RETRY%<group>``, ``%DLQ%<group>``) that exist.  The internal
        ``SCHEDULE_TOPIC_XXXX`` (delayed retries) is not listed."""
        with self._lock:
            return sorted(name for name in self._topics if name != SCHEDULE_TOPIC)

    @property
    def delay_levels(self) -> tuple[float, ...]:
        """The seconds each delay level waits (level ``n`` is ``[n - 1]``)."""
        return self._delay_levels

    def queues(self, topic: str) -> list[MessageQueue]:
        """The queues of ``topic``, sorted.  ``UnknownTopicError`` if none."""
        return list(self._topic(topic).queues)

    def _topic(self, topic: str) -> _Topic:
        t = self._topics.get(topic)
        if t is None:
            raise UnknownTopicError(topic)
        return t

    def _log(self, queue: MessageQueue) -> list[MessageExt]:
        t = self._topic(queue.topic)
        if queue.broker_name != self.broker_name or not 0 <= queue.queue_id < len(t.logs):
            raise ValueError(f"queue {queue} is not on broker {self.broker_name!r}")
        return t.logs[queue.queue_id]

    def max_offset(self, queue: MessageQueue) -> int:
        """The offset the next message of ``queue`` will get."""
        return len(self._log(queue))

    def min_offset(self, queue: MessageQueue) -> int:
        """The lowest stored offset of ``queue`` (always 0: nothing expires)."""
        self._log(queue)
        return 0

    def messages(self, queue: MessageQueue, start: int = 0, stop: int | None = None) -> list[MessageExt]:
        """The stored messages of ``queue`` in ``[start, stop)`` (for tests and
        tools; consumers use :meth:`pull_consumer`)."""
        return self._log(queue)[start:stop]

    # -- sending ------------------------------------------------------------

    def send(
        self,
        topic: str,
        body: bytes,
        keys: str | None = None,
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
        queue_id: int | None = None,
    ) -> SendResult:
        """Store one message.  The queue is ``queue_id`` when given, else
        ``lane_of(keys, queue_count)`` for non-empty ``keys`` (RocketMQ's
        SelectMessageQueueByHash, with a non-negative modulo), else the next
        queue in round-robin order.  Raises ``TypeError`` when ``body`` is not
        bytes (or keys/tags/properties have the wrong type),
        ``MessageTooLargeError`` above ``max_message_size``, ``ValueError``
        for a bad ``queue_id``, ``UnknownTopicError``, ``SourceClosedError``."""
        item = {"body": body, "keys": keys, "tags": tags, "properties": properties, "queue_id": queue_id}
        return self.send_batch(topic, (item,))[0]

    def send_batch(self, topic: str, items: Iterable[Any]) -> SendResults:
        """Store many messages, in order (per queue); returns their results in
        input order (a lazy sequence of :class:`SendResult`).

        Each item is ``body`` (bytes), ``(body, keys)``, or a mapping with
        ``body`` and optionally ``keys``, ``tags``, ``properties`` and
        ``queue_id`` (same rules as :meth:`send`).  Every item is checked
        before anything is stored, so a bad item stores nothing.  The broker
        lock is taken once per batch (once per ~65536 messages for bigger
        batches: another sender's messages may then interleave).  A
        ``RECONSUME_TIME`` property (reserved) sets the stored message's
        ``reconsume_times``; ``ValueError`` when it is not an int >= 0.  The
        internal ``SCHEDULE_TOPIC_XXXX`` takes no messages (``ValueError``)."""
        self._check_open()
        if topic == SCHEDULE_TOPIC:
            raise ValueError(f"topic {topic!r} is internal to the broker")
        t = self._topic(topic)
        n = len(t.queues)
        limit = self.max_message_size
        durable = t.files is not None
        name, bname = t.name, self.broker_name
        born = now_ms()
        per_q: list[list[MessageExt]] = [[] for _ in range(n)]
        # durable only: per queue, the metadata lengths and meta+body payloads
        meta_lens: list[list[int]] = [[] for _ in range(n)]
        payloads: list[list[bytes]] = [[] for _ in range(n)]
        ordered: list[MessageExt] = []
        add = ordered.append
        lane_cache: dict[str, int] = {}
        key_meta: dict[str | None, bytes] = {None: b"", "": b""}  # encoded metadata of keys-only messages
        rr = t.rr  # racy across senders on purpose: round-robin only spreads load
        if not isinstance(items, (list, tuple)):
            items = list(items)
        pause_gc = len(items) >= _GC_PAUSE_MIN and gc.isenabled()
        if pause_gc:
            gc.disable()
        try:
            for item in items:
                tp = type(item)
                tags = qid = None
                props: dict[str, str] = {}
                if tp is tuple:
                    if len(item) != 2:
                        raise TypeError(
                            f"send_batch items are body, (body, keys) or a mapping; got a {len(item)}-tuple"
                        )
                    body, keys = item
                elif tp is bytes:
                    body = item
                    keys = None
                elif isinstance(item, Mapping):
                    body, keys, tags, props, qid = self._unpack_mapping(item)
                else:
                    raise TypeError(f"send_batch items are body, (body, keys) or a mapping; got {tp.__name__}")
                if type(body) is not bytes:
                    raise TypeError(f"message body must be bytes, got {type(body).__name__}")
                if len(body) > limit:
                    raise MessageTooLargeError(topic, len(body), limit)
                if qid is not None:
                    if type(qid) is not int or not 0 <= qid < n:
                        raise ValueError(f"queue_id must be an int in [0, {n}) for topic {topic!r}, got {qid!r}")
                    q = qid
                elif keys:
                    q = lane_cache.get(keys, -1)
                    if q < 0:
                        if type(keys) is not str:
                            raise TypeError(f"keys must be str or None, got {type(keys).__name__}")
                        q = lane_cache[keys] = lane_of(keys, n)
                else:
                    if keys is not None and type(keys) is not str:
                        raise TypeError(f"keys must be str or None, got {type(keys).__name__}")
                    q = rr % n
                    rr += 1
                rt = reconsume_times_of(props) if props else 0
                m = MessageExt(name, q, -1, body, keys or None, tags, props, born, 0, rt, "", bname)
                per_q[q].append(m)
                add(m)
                if durable:
                    if tags is None and not props:
                        meta = key_meta.get(keys)
                        if meta is None:
                            meta = key_meta[keys] = encode_meta(keys, None, None)
                    else:
                        meta = encode_meta(keys, tags, props)
                    meta_lens[q].append(len(meta))
                    payloads[q].append(meta + body if meta else body)
            t.rr = rr
            # Store: one lock per group of queue slices totalling ~_CHUNK messages.
            group: list[tuple[int, int, int]] = []  # (queue, start, stop)
            size = 0
            for q in range(n):
                count = len(per_q[q])
                for start in range(0, count, _CHUNK):
                    stop = min(count, start + _CHUNK)
                    group.append((q, start, stop))
                    size += stop - start
                    if size >= _CHUNK:
                        self._store_slices(t, group, per_q, meta_lens, payloads)
                        group, size = [], 0
            if group:
                self._store_slices(t, group, per_q, meta_lens, payloads)
        finally:
            if pause_gc:
                gc.enable()
        return SendResults(t.queues, ordered)

    @staticmethod
    def _unpack_mapping(
        item: Mapping[str, Any],
    ) -> tuple[Any, str | None, str | None, dict[str, str], int | None]:
        return unpack_mapping(item)

    def _store_slices(
        self,
        t: _Topic,
        slices: list[tuple[int, int, int]],
        per_q: list[list[MessageExt]],
        meta_lens: list[list[int]],
        payloads: list[list[bytes]],
    ) -> None:
        """Take the lock and :meth:`_store_slices_locked`."""
        with self._lock:
            self._check_open()
            self._store_slices_locked(t, slices, per_q, meta_lens, payloads)

    def _store_slices_locked(
        self,
        t: _Topic,
        slices: list[tuple[int, int, int]],
        per_q: list[list[MessageExt]],
        meta_lens: list[list[int]],
        payloads: list[list[bytes]],
    ) -> None:
        """(lock held) Give the messages of ``slices`` their offsets, ids and
        store time, append them to the logs (file, then memory), wake the
        pollers."""
        now = self._last_store_ms = max(now_ms(), self._last_store_ms)  # never goes back
        logs = t.logs
        pending = [0] * len(logs)  # a queue may have several slices here
        for q, start, stop in slices:
            base = len(logs[q]) + pending[q] - start
            pending[q] += stop - start
            prefix = t.prefixes[q]
            msgs = per_q[q]
            for i in range(start, stop):
                m = msgs[i]
                off = base + i
                m.queue_offset = off
                m.msg_id = prefix + str(off)
                m.store_timestamp = now
        if t.files is not None:
            self._write(t.files, slices, per_q, meta_lens, payloads)
        for q, start, stop in slices:
            logs[q].extend(per_q[q][start:stop] if start or stop < len(per_q[q]) else per_q[q])
        self._cond.notify_all()

    def _encode(self, messages: list[MessageExt], queue_count: int) -> _Encoded:
        """Group ``messages`` (their ``queue_id`` set) per queue and, when
        the broker is durable, encode their records' payloads: the arguments
        of :meth:`_store_slices_locked`.  Runs without the lock."""
        per_q: list[list[MessageExt]] = [[] for _ in range(queue_count)]
        meta_lens: list[list[int]] = [[] for _ in range(queue_count)]
        payloads: list[list[bytes]] = [[] for _ in range(queue_count)]
        durable = self._store is not None
        for m in messages:
            q = m.queue_id
            per_q[q].append(m)
            if durable:
                meta = encode_meta(m.keys, m.tags, m.properties)
                meta_lens[q].append(len(meta))
                payloads[q].append(meta + m.body if meta else m.body)
        slices = [(q, 0, len(msgs)) for q, msgs in enumerate(per_q) if msgs]
        return slices, per_q, meta_lens, payloads

    @staticmethod
    def _write(
        files: list[QueueLog],
        slices: list[tuple[int, int, int]],
        per_q: list[list[MessageExt]],
        meta_lens: list[list[int]],
        payloads: list[list[bytes]],
    ) -> None:
        """(lock held) Append the records of ``slices``, one write per
        slice; on failure cut every touched log back and raise."""
        pack, crc_pack = HEADER.pack, TRAILER.pack
        done: list[tuple[QueueLog, int]] = []
        try:
            for q, start, stop in slices:
                msgs, lens, pays = per_q[q], meta_lens[q], payloads[q]
                parts: list[bytes] = []
                put = parts.append
                for i in range(start, stop):
                    m = msgs[i]
                    payload = pays[i]
                    meta_len = lens[i]
                    header = pack(
                        MAGIC, meta_len, len(payload) - meta_len, m.queue_offset, m.born_timestamp, m.store_timestamp
                    )
                    put(header)
                    put(payload)
                    put(crc_pack(_crc32(payload, _crc32(header))))
                log = files[q]
                done.append((log, log.size))
                log.append(b"".join(parts))
        except BaseException:
            for log, size in done:
                log.truncate(size)
            raise

    # -- retries, dead letters, delayed delivery ----------------------------

    def _send_back(self, group: str, items: Sequence[tuple[MessageExt, int]]) -> list[BaseException | None]:
        """:meth:`EmbeddedPullConsumer.send_back` for ``group``: store each
        copy in the schedule queue of its delay level, due ``delay`` seconds
        from the clock's ``.time()``, bound for ``%RETRY%<group>``."""
        levels = self._delay_levels
        target = retry_topic(group)
        now_ms = int(self._clock.time() * 1000)
        broker_name = self.broker_name

        def copy(item: tuple[MessageExt, int]) -> MessageExt:
            message, level = item
            check_message(message, self.max_message_size)
            if isinstance(level, bool) or not isinstance(level, int):
                raise TypeError(f"delay level must be an int, got {level!r}")
            if level < 1:
                raise ValueError(f"delay level must be >= 1, got {level}")
            level = min(level, len(levels))
            times = message.reconsume_times + 1
            props = origin_properties(message)
            props[RECONSUME_TIME] = str(times)
            props[REAL_TOPIC] = target
            props[TIMER_DELIVER_MS] = str(now_ms + round(levels[level - 1] * 1000))
            return MessageExt(
                SCHEDULE_TOPIC,
                level - 1,
                -1,
                message.body,
                message.keys,
                message.tags,
                props,
                message.born_timestamp,
                reconsume_times=times,
                broker_name=broker_name,
            )

        return self._store_copies(items, copy, SCHEDULE_TOPIC, len(levels), target)

    def _send_to_dlq(self, group: str, items: Sequence[tuple[MessageExt, str, str]]) -> list[BaseException | None]:
        """:meth:`EmbeddedPullConsumer.send_to_dlq` for ``group``."""
        target = dlq_topic(group)
        broker_name = self.broker_name

        def copy(item: tuple[MessageExt, str, str]) -> MessageExt:
            message, reason, text = item
            check_message(message, self.max_message_size)
            if type(reason) is not str or type(text) is not str:
                raise TypeError(f"reason and exception text must be str, got {reason!r}, {text!r}")
            props = origin_properties(message)
            props[DLQ_REASON] = reason
            props[DLQ_EXCEPTION] = text
            props[DLQ_GROUP] = group
            props[RECONSUME_TIME] = str(message.reconsume_times)
            return MessageExt(
                target,
                0,
                -1,
                message.body,
                message.keys,
                message.tags,
                props,
                message.born_timestamp,
                reconsume_times=message.reconsume_times,
                broker_name=broker_name,
            )

        return self._store_copies(items, copy, target, 1, None)

    def _store_copies(
        self,
        items: Sequence[Any],
        copy: Callable[[Any], MessageExt],
        topic: str,
        queue_count: int,
        also_create: str | None,
    ) -> list[BaseException | None]:
        """Build ``copy(item)`` of every item (an exception is that item's
        result), then store the copies in ``topic`` (created with
        ``queue_count`` queues if missing, as is ``also_create``) under one
        lock acquisition with one write per queue; a failure there is the
        result of every copy."""
        self._check_open()
        results: list[BaseException | None] = [None] * len(items)
        copies: list[MessageExt] = []
        built: list[int] = []
        for i, item in enumerate(items):
            try:
                copies.append(copy(item))
            except Exception as e:
                results[i] = e
            else:
                built.append(i)
        if not copies:
            return results
        encoded = self._encode(copies, queue_count)
        try:
            with self._lock:
                self._check_open()
                if also_create is not None:
                    self._ensure_topic_locked(also_create, 1)
                t = self._ensure_topic_locked(topic, queue_count)
                self._store_slices_locked(t, *encoded)
                if topic == SCHEDULE_TOPIC:
                    self._recompute_next_due_locked()
        except Exception as e:
            logger.warning("storing %d message(s) in %r failed: %s", len(copies), topic, e)
            for i in built:
                results[i] = e
        return results

    def deliver_due(self) -> int:
        """Move every delayed retry that is due (by the clock's ``.time()``)
        to its retry topic; return how many were moved.  Polls do this on
        their own; call it when no consumer polls (tools, tests).  Delivery
        is at-least-once (see the module comment).  ``SourceClosedError``
        after :meth:`close`."""
        now_ms = int(self._clock.time() * 1000)
        total = 0
        more = True
        while more:
            snapshot = None
            with self._lock:
                self._check_open()
                moved, advanced, more = self._deliver_locked(now_ms)
                if advanced and self._store is not None:
                    snapshot = self._offsets_snapshot()
            if snapshot is not None:
                self._save_offsets(*snapshot)
            total += moved
        if total:
            logger.debug("delivered %d delayed retr%s", total, "y" if total == 1 else "ies")
        return total

    def _deliver_locked(self, now_ms: int) -> tuple[int, bool, bool]:
        """(lock held) Move up to ``_DELIVER_CHUNK`` messages due at
        ``now_ms`` from the schedule queues' heads to their retry topics,
        then advance the delivery offsets.  Returns (how many were moved,
        whether a delivery offset moved, whether more may be due)."""
        t = self._topics.get(SCHEDULE_TOPIC)
        if t is None:
            return 0, False, False
        committed = self._group(SCHEDULE_GROUP).committed
        by_target: dict[str, list[MessageExt]] = {}
        advanced: list[tuple[MessageQueue, int]] = []
        budget = _DELIVER_CHUNK
        more = False
        broker_name = self.broker_name
        for q, log in zip(t.queues, t.logs, strict=True):
            om = committed.get(q)
            start = pos = om.offset if om is not None else 0
            end = len(log)
            while pos < end and _due_ms(log[pos]) <= now_ms:
                if not budget:
                    more = True
                    break
                budget -= 1
                m = log[pos]
                pos += 1
                props = dict(m.properties)
                target = props.pop(REAL_TOPIC, "")
                props.pop(TIMER_DELIVER_MS, None)
                try:
                    validate_topic(target)
                except ValueError:
                    logger.warning("scheduled message %s has no valid %s (%r); dropped", m.msg_id, REAL_TOPIC, target)
                    continue
                copy = MessageExt(
                    target,
                    0,
                    -1,
                    m.body,
                    m.keys,
                    m.tags,
                    props,
                    m.born_timestamp,
                    reconsume_times=m.reconsume_times,
                    broker_name=broker_name,
                )
                by_target.setdefault(target, []).append(copy)
            if pos != start:
                advanced.append((q, pos))
        moved = 0
        for target, msgs in by_target.items():
            tt = self._ensure_topic_locked(target, 1)
            self._store_slices_locked(tt, *self._encode(msgs, len(tt.queues)))
            moved += len(msgs)
        for q, pos in advanced:  # only once every copy is stored: at-least-once
            committed[q] = OffsetAndMetadata(pos)
        self._recompute_next_due_locked()
        return moved, bool(advanced), more

    def _recompute_next_due_locked(self) -> None:
        """(lock held) ``_next_due_ms`` := the earliest due time among the
        schedule queues' heads (+inf when nothing is scheduled)."""
        t = self._topics.get(SCHEDULE_TOPIC)
        g = self._groups.get(SCHEDULE_GROUP)
        best = _INF
        if t is not None:
            for q, log in zip(t.queues, t.logs, strict=True):
                om = g.committed.get(q) if g is not None else None
                pos = om.offset if om is not None else 0
                if pos < len(log):
                    best = min(best, _due_ms(log[pos]))
        self._next_due_ms = best

    def _deliver_from_poll(self) -> None:
        """:meth:`deliver_due` for a consumer's poll: a failure is logged
        (the poll goes on) and delivery is tried again a little later."""
        try:
            self.deliver_due()
        except SourceClosedError:
            pass  # the poll reports it
        except Exception:
            logger.exception("delivering delayed retries failed; trying again in %g s", _DELIVER_RETRY_DELAY)
            with self._lock:
                self._next_due_ms = (self._clock.time() + _DELIVER_RETRY_DELAY) * 1000

    # -- consumers ----------------------------------------------------------

    def committed(self, group: str, queue: MessageQueue) -> OffsetAndMetadata | None:
        """What ``group`` last committed for ``queue`` (an admin view, like
        RocketMQ's ``queryConsumeOffset``; it does not join the group)."""
        self._check_open()
        with self._lock:
            g = self._groups.get(group)
            return None if g is None else g.committed.get(queue)

    def pull_consumer(
        self,
        group: str,
        *,
        consume_from: ConsumeFromWhere = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp: int | None = None,
        client_id: str | None = None,
        allocate: AllocateStrategy = AVERAGELY,
        session_timeout: float | None = None,
        message_model: MessageModel = MessageModel.CLUSTERING,
        offset_file: str | os.PathLike[str] | None = None,
    ) -> EmbeddedPullConsumer:
        """A new member of ``group`` (it joins at :meth:`subscribe`).

        ``consume_from`` and ``consume_timestamp`` (ms; default half an hour
        ago) say where the group starts on a queue it has never committed;
        the position is fixed when the group first owns the queue.
        ``client_id`` must be unique among the group's open consumers
        (default: generated, increasing with creation order).  Every member of
        a group must use the same ``allocate`` strategy.

        ``message_model=BROADCASTING``: the consumer reads every queue of its
        topics, outside the group's rebalance, from its own offsets in
        ``offset_file`` (default
        :func:`~lite_push.sources.local_offsets.default_offset_file`)."""
        return EmbeddedPullConsumer(
            self,
            group,
            consume_from=consume_from,
            consume_timestamp=consume_timestamp,
            client_id=client_id,
            allocate=allocate,
            session_timeout=session_timeout,
            message_model=message_model,
            offset_file=offset_file,
        )

    def _group(self, name: str) -> _Group:
        g = self._groups.get(name)
        if g is None:
            g = self._groups[name] = _Group(name)
        return g

    def _recompute(self, group: _Group) -> None:
        """(lock held) New targets for every member; wakes the pollers."""
        by_topic: dict[str, list[str]] = {}
        for m in group.members.values():
            for topic in m.topics:
                by_topic.setdefault(topic, []).append(m.cid)
        for m in group.members.values():
            target: set[MessageQueue] = set()
            for topic in m.topics:
                queues = self._topics[topic].queues
                share = m.allocate(group.name, m.cid, queues, sorted(by_topic[topic]))
                target.update(q for q in share if q.topic == topic)
            m.target = frozenset(target)
        self._bump(group)

    def _bump(self, group: _Group) -> None:
        group.version += 1
        self._cond.notify_all()

    def _evict(self, group: _Group, member: _Member, why: str) -> None:
        """(lock held) Drop ``member`` and release its queues."""
        group.members.pop(member.cid, None)
        for q in [q for q, cid in group.owner.items() if cid == member.cid]:
            del group.owner[q]
        logger.warning("group %r: member %r %s; its queues are released", group.name, member.cid, why)
        self._recompute(group)

    def _check_expiry(self, group: _Group, caller: _Member, now: float) -> None:
        with self._lock:
            if now < group.next_check:
                return
            shortest = min((m.session_timeout for m in group.members.values()), default=self.session_timeout)
            group.next_check = now + min(1.0, shortest / 10)
            for m in list(group.members.values()):
                if m is not caller and now - m.last_seen > m.session_timeout:
                    m.expired = True
                    self._evict(group, m, f"missed its session timeout ({m.session_timeout:g} s)")

    def _start_position(self, group: _Group, member: _Member, q: MessageQueue) -> int:
        """(lock held) Where ``group`` reads ``q`` from when it takes it."""
        log = self._topics[q.topic].logs[q.queue_id]
        om = group.committed.get(q)
        if om is not None:
            return min(max(om.offset, 0), len(log))
        pos = group.initial.get(q)
        if pos is None:
            pos = group.initial[q] = self._initial_position(member, q)
        return min(pos, len(log))

    def _initial_position(self, member: _Member, q: MessageQueue) -> int:
        """(lock held) Where ``member.consume_from`` starts on ``q``."""
        log = self._topics[q.topic].logs[q.queue_id]
        return initial_position(
            member.consume_from,
            member.consume_timestamp,
            0,
            len(log),
            lambda ts: bisect.bisect_left(log, ts, key=_store_ts),
        )

    # -- lifecycle ----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise SourceClosedError(f"embedded broker {self.broker_name!r} is closed")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close every consumer, write the offsets, close the files.
        Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for c in list(self._consumers):
                c._closed = True
            self._consumers.clear()
            for g in self._groups.values():
                g.members.clear()
                g.owner.clear()
                g.clients.clear()
            snapshot, version = self._offsets_snapshot()
            self._cond.notify_all()
        try:
            self._save_offsets(snapshot, version)
        finally:
            self._close_files()

    def _close_files(self) -> None:
        for t in self._topics.values():
            for log in t.files or ():
                log.close()
        if self._store is not None:
            self._store.close()

    def __enter__(self) -> EmbeddedBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self._store.path if self._store is not None else "memory"
        return f"<EmbeddedBroker {self.broker_name!r} {where}{' closed' if self._closed else ''}>"

