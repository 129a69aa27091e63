"""EmbeddedBroker: the embedded broker's public face.

It wires the parts (see the package docstring): the log store
(:mod:`.log`), the group coordinator (:mod:`.groups`) and the schedule of
retries and dead letters (:mod:`.schedule`), and offers what producers,
tools and :meth:`EmbeddedBroker.pull_consumer` need: topics, sending,
offsets, closing.  A consumer (:mod:`.consumer`) keeps the parts it uses
(``log``, ``groups``, ``schedule``, the clock), not the broker.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

from ..._errors import ConfigError, SourceClosedError
from ..._kernels.untrack import untrack_all
from ..._tracing import check_tracing, send_context
from ..._types import MessageExt, MessageQueue, OffsetAndMetadata, SendResult
from ...rebalance.allocate import AVERAGELY, AllocateStrategy
from .._common import BrokerClock, check_delay_levels, now_ms, validate_topic
from .._sending import checked_items
from ..contract import (
    DEFAULT_DELAY_LEVELS,
    Balance,
    ConsumeFrom,
    ConsumeFromWhere,
    MessageModel,
    is_retry_or_dlq_topic,
    reconsume_times_of,
)
from .consumer import EmbeddedPullConsumer
from .files import Store, encode_meta
from .group_admin import EmbeddedGroupAdmin
from .groups import GroupCoordinator
from .log import LogStore, Topic
from .schedule import SCHEDULE_TOPIC, Schedule

__all__ = ["EmbeddedBroker", "SendResults"]

logger = logging.getLogger(__name__)

#: Messages stored per lock acquisition in send_batch (bounds how long a huge
#: batch keeps pollers and wakeup() waiting).
_CHUNK = 65536
#: Batches at least this large run with the cyclic GC paused (creating
#: millions of objects otherwise triggers many full collections).
_GC_PAUSE_MIN = 4096


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
    levels, 1 s to 30 min).  ``tracing``: what is sent carries the
    sender's OpenTelemetry context (``lite-push[tracing]``), for the
    consumer's spans (``ConsumerConfig.tracing``) to continue its trace.
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
        tracing: bool = False,
    ) -> None:
        #: Whether what is sent carries the sender's OpenTelemetry context.
        self.tracing = check_tracing(tracing)
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
        #: The clock of sessions, leases and due times.
        self.clock: BrokerClock = clock if clock is not None else time
        self._closed = False
        files = Store(path, fsync) if path is not None else None
        #: The topics and their messages (the broker's one lock is ``log.lock``).
        self.log = LogStore(broker_name, threading.Lock(), files)
        #: Consumer groups: members, queue owners, committed offsets, locks.
        self.groups = GroupCoordinator(self.log, self.clock, self.session_timeout)
        #: Retries, dead letters and the delivery of due retries.
        self.schedule = Schedule(
            self.log, self.groups, self.clock, self._delay_levels, max_message_size, self.check_open
        )
        if files is not None:
            try:
                self._load(files)
            except BaseException:
                self.log.close_files()
                raise

    def _load(self, files: Store) -> None:
        with self.log.lock:
            self.log.load()
            self.schedule.grow_to_levels_locked()
            self.groups.load_offsets(files.load_offsets())
            self.schedule.recompute_next_due_locked()
        logger.info(
            "embedded broker %r opened %s: %d topic(s), %d message(s)",
            self.broker_name,
            files.path,
            len(self.log.names()),
            self.log.message_count(),
        )

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
        with self.log.lock:
            self.check_open()
            existing = self.log.get(topic)
            if existing is not None and len(existing.queues) != queue_count:
                raise ConfigError(
                    "queue_count", f"topic {topic!r} exists with {len(existing.queues)} queues, not {queue_count}"
                )
            return list(self.log.ensure_locked(topic, queue_count).queues)

    def topics(self) -> list[str]:
        """The names of the topics consumers can subscribe to, sorted: those
        made by :meth:`create_topic` and the retry and dead-letter topics
        (``%RETRY%<group>``, ``%DLQ%<group>``) that exist.  The internal
        ``SCHEDULE_TOPIC_XXXX`` (delayed retries) is not listed."""
        with self.log.lock:
            return sorted(name for name in self.log.names() if name != SCHEDULE_TOPIC)

    @property
    def delay_levels(self) -> tuple[float, ...]:
        """The seconds each delay level waits (level ``n`` is ``[n - 1]``)."""
        return self._delay_levels

    def queues(self, topic: str) -> list[MessageQueue]:
        """The queues of ``topic``, sorted.  ``UnknownTopicError`` if none."""
        return self.log.queues(topic)

    def max_offset(self, queue: MessageQueue) -> int:
        """The offset the next message of ``queue`` will get."""
        return len(self.log.queue_log(queue))

    def min_offset(self, queue: MessageQueue) -> int:
        """The lowest stored offset of ``queue`` (always 0: nothing expires)."""
        self.log.queue_log(queue)
        return 0

    @property
    def unreadable(self) -> dict[MessageQueue, frozenset[int]]:
        """Durable broker: per queue, the offsets of records found damaged in
        the middle of its file at start (each logged at ERROR).  Their
        messages are lost; their offsets hold placeholders that polls pass
        over, so consumers and their commits go on past them."""
        return dict(self.log.unreadable)

    def messages(self, queue: MessageQueue, start: int = 0, stop: int | None = None) -> list[MessageExt]:
        """The stored messages of ``queue`` in ``[start, stop)`` (for tests and
        tools; consumers use :meth:`pull_consumer`)."""
        return self.log.messages(queue, start, stop)

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
        self.check_open()
        if topic == SCHEDULE_TOPIC:
            raise ValueError(f"topic {topic!r} is internal to the broker")
        t = self.log.topic(topic)
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
        key_meta: dict[str | None, bytes] = {None: b"", "": b""}  # encoded metadata of keys-only messages
        if not isinstance(items, (list, tuple)):
            items = list(items)
        pause_gc = len(items) >= _GC_PAUSE_MIN and gc.isenabled()
        if pause_gc:
            gc.disable()
        try:
            trace = send_context() if self.tracing else None
            for body, keys, tags, props, q in checked_items(items, topic, n, limit, t.rr, trace):
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
            untrack_all(ordered)  # stored for the broker's life: see lite_push._kernels.untrack_py
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

    def _store_slices(
        self,
        t: Topic,
        slices: list[tuple[int, int, int]],
        per_q: list[list[MessageExt]],
        meta_lens: list[list[int]],
        payloads: list[list[bytes]],
    ) -> None:
        """Take the lock and append ``slices`` to ``t``."""
        with self.log.lock:
            self.check_open()
            self.log.append_locked(t, slices, per_q, meta_lens, payloads)

    def deliver_due(self) -> int:
        """Move every delayed retry that is due (by the clock's ``.time()``)
        to its retry topic; return how many were moved.  Polls do this on
        their own; call it when no consumer polls (tools, tests).  Delivery
        is at-least-once (see :mod:`.schedule`).  ``SourceClosedError``
        after :meth:`close`."""
        return self.schedule.deliver_due()

    # -- consumers ----------------------------------------------------------

    def committed(self, group: str, queue: MessageQueue) -> OffsetAndMetadata | None:
        """What ``group`` last committed for ``queue`` (an admin view, like
        RocketMQ's ``queryConsumeOffset``; it does not join the group)."""
        self.check_open()
        with self.log.lock:
            g = self.groups.find(group)
            return None if g is None else g.committed.get(queue)

    def group_admin(self, group: str) -> EmbeddedGroupAdmin:
        """``group`` read and changed from outside it: its members, committed
        offsets and owners, and a reset of its offsets while it is empty
        (:class:`~lite_push.sources.group_admin.GroupAdmin`)."""
        self.check_open()
        return EmbeddedGroupAdmin(group, self.log, self.groups, self.clock)

    def pull_consumer(
        self,
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
        :func:`~lite_push.sources.local_offsets.default_offset_file`).

        ``balance``: only ``Balance.QUEUE``; ``Balance.MESSAGE`` is a
        ``ConfigError`` (one process: no members to balance across)."""
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
            balance=balance,
        )

    # -- lifecycle ----------------------------------------------------------

    def check_open(self) -> None:
        """``SourceClosedError`` once the broker is closed."""
        if self._closed:
            raise SourceClosedError(f"embedded broker {self.broker_name!r} is closed")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close every consumer, write the offsets, close the files.
        Idempotent."""
        with self.log.lock:
            if self._closed:
                return
            self._closed = True
            snapshot, version = self.groups.close_all()
        try:
            self.groups.save_offsets(snapshot, version)
        finally:
            self.log.close_files()

    def __enter__(self) -> EmbeddedBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.log.files.path if self.log.files is not None else "memory"
        return f"<EmbeddedBroker {self.broker_name!r} {where}{' closed' if self._closed else ''}>"
