"""The embedded broker's log store: its topics and their queues' messages.

Each queue is a Python list of MessageExt; a message's queue_offset is its
index (offsets run from 0, nothing is ever deleted, so min_offset is 0 and
max_offset is len(list)).  A poll hands out slices of these lists: messages
are shared, never copied, and must be treated as read-only.  Lists only
grow, so a consumer may read their length and slice them without the lock.

With files (a durable broker), every append is written to the queue's log
file first (``files.py``), one write per queue per append, so what ``send``
acknowledged survives kill -9.

:class:`LogStore` shares the broker's one lock (``lock``, with ``cond`` on
it): methods named ``*_locked`` expect it held; appending notifies ``cond``
so that waiting polls wake.
"""

from __future__ import annotations

import bisect
import logging
import threading
from operator import attrgetter
from zlib import crc32 as _crc32

from ..._errors import UnknownTopicError
from ..._types import MessageExt, MessageQueue
from .._common import now_ms, validate_topic
from .._sending import RoundRobin
from .files import HEADER, MAGIC, TRAILER, QueueLog, Store, encode_meta, msg_id_prefix

__all__ = ["Encoded", "LogStore", "Topic"]

logger = logging.getLogger(__name__)

_store_ts = attrgetter("store_timestamp")

#: What :meth:`LogStore.append_locked` takes: the (queue, start, stop)
#: slices to store, the messages per queue, and (durable only) per queue the
#: metadata lengths and the meta+body payloads of their records.
Encoded = tuple[list[tuple[int, int, int]], list[list[MessageExt]], list[list[int]], list[list[bytes]]]


class Topic:
    """One topic: its queues, their message lists and (durable) files, the
    msg_id prefix of each queue, and the round-robin counter for messages
    without a key."""

    __slots__ = ("name", "queues", "logs", "files", "prefixes", "rr")

    def __init__(self, name: str, broker_name: str, count: int) -> None:
        self.name = name
        self.queues = [MessageQueue(name, broker_name, i) for i in range(count)]
        self.logs: list[list[MessageExt]] = [[] for _ in range(count)]
        self.files: list[QueueLog] | None = None
        self.prefixes = [msg_id_prefix(broker_name, name, i) for i in range(count)]
        self.rr = RoundRobin()


class LogStore:
    """The topics of one broker, in memory and (with ``files``) on disk."""

    def __init__(self, broker_name: str, lock: threading.Lock, files: Store | None) -> None:
        self.broker_name = broker_name
        #: the broker's one lock, and the condition polls wait on
        self.lock = lock
        self.cond = threading.Condition(lock)
        self.files = files
        self._topics: dict[str, Topic] = {}
        self._last_store_ms = 0
        #: Per queue, the offsets of records found unreadable in the middle
        #: of its file at start (lost; polls pass over them).  Empty unless
        #: a file was damaged.
        self.unreadable: dict[MessageQueue, frozenset[int]] = {}

    @property
    def durable(self) -> bool:
        """Whether appends are written to files."""
        return self.files is not None

    # -- reading --------------------------------------------------------------

    def get(self, name: str) -> Topic | None:
        """The topic called ``name``, if it exists."""
        return self._topics.get(name)

    def topic(self, name: str) -> Topic:
        """The topic called ``name``; ``UnknownTopicError`` if none."""
        t = self._topics.get(name)
        if t is None:
            raise UnknownTopicError(name)
        return t

    def names(self) -> list[str]:
        """Every topic's name, internal ones included, unsorted."""
        return list(self._topics)

    def queue_log(self, queue: MessageQueue) -> list[MessageExt]:
        """The message list of ``queue``; ``UnknownTopicError`` or
        ``ValueError`` naming the queue when the broker has no such queue."""
        t = self.topic(queue.topic)
        if queue.broker_name != self.broker_name or not 0 <= queue.queue_id < len(t.logs):
            raise ValueError(f"queue {queue} is not on broker {self.broker_name!r}")
        return t.logs[queue.queue_id]

    def queues(self, topic: str) -> list[MessageQueue]:
        """The queues of ``topic``, sorted.  ``UnknownTopicError`` if none."""
        return list(self.topic(topic).queues)

    def messages(self, queue: MessageQueue, start: int = 0, stop: int | None = None) -> list[MessageExt]:
        """The stored messages of ``queue`` in ``[start, stop)`` (tools, and a
        consumer reading its group's dead letters)."""
        return self.queue_log(queue)[start:stop]

    def log_of(self, queue: MessageQueue) -> list[MessageExt]:
        """The message list of a queue known to exist (a consumer's queue)."""
        return self._topics[queue.topic].logs[queue.queue_id]

    def stored_range(self, queue: MessageQueue) -> tuple[int, int]:
        """``(0, next offset)`` of a queue known to exist: nothing expires."""
        return 0, len(self._topics[queue.topic].logs[queue.queue_id])

    def first_stored_at(self, queue: MessageQueue, lo: int, hi: int, timestamp: int) -> int:
        """The first offset in ``[lo, hi)`` of a queue known to exist stored
        at or after ``timestamp`` (epoch ms), ``hi`` if none: store times
        never go back along a queue, so a bisection finds it."""
        return bisect.bisect_left(self.log_of(queue), timestamp, lo, hi, key=_store_ts)

    def message_count(self) -> int:
        """How many messages the broker holds, in every topic."""
        return sum(len(log) for t in self._topics.values() for log in t.logs)

    # -- topics ---------------------------------------------------------------

    def load(self) -> None:
        """Open the topics and their logs from the files (at start)."""
        files = self.files
        assert files is not None
        for name, count in files.load_topics().items():
            topic = Topic(name, self.broker_name, count)
            topic.files = [files.open_queue(name, i) for i in range(count)]
            for i, qfile in enumerate(topic.files):
                topic.logs[i] = qfile.load(name, i, self.broker_name)
                if qfile.unreadable:
                    self.unreadable[topic.queues[i]] = frozenset(qfile.unreadable)
            for msgs in topic.logs:
                if msgs:
                    self._last_store_ms = max(self._last_store_ms, msgs[-1].store_timestamp)
            self._topics[name] = topic

    def ensure_locked(self, topic: str, queue_count: int) -> Topic:
        """(lock held) The topic, created with ``queue_count`` queues (and
        saved, when durable) if it does not exist.  ``ValueError`` for a bad
        name."""
        t = self._topics.get(topic)
        if t is not None:
            return t
        validate_topic(topic)
        t = Topic(topic, self.broker_name, queue_count)
        if self.files is not None:
            counts = {name: len(x.queues) for name, x in self._topics.items()}
            counts[topic] = queue_count
            self.files.save_topics(counts)
            t.files = [self.files.open_queue(topic, i) for i in range(queue_count)]
        self._topics[topic] = t
        logger.debug("created topic %r with %d queues", topic, queue_count)
        return t

    def grow_locked(self, t: Topic, queue_count: int) -> None:
        """(lock held) Add queues to ``t`` (only the schedule topic grows:
        when the broker reopens with more delay levels than it had)."""
        old = len(t.queues)
        new = range(old, queue_count)
        t.queues.extend(MessageQueue(t.name, self.broker_name, i) for i in new)
        t.logs.extend([] for _ in new)
        t.prefixes.extend(msg_id_prefix(self.broker_name, t.name, i) for i in new)
        if self.files is not None and t.files is not None:
            counts = {name: len(x.queues) for name, x in self._topics.items()}
            self.files.save_topics(counts)
            t.files.extend(self.files.open_queue(t.name, i) for i in new)
        logger.info("topic %r grew from %d to %d queues", t.name, old, queue_count)

    # -- appending ------------------------------------------------------------

    def encode(self, messages: list[MessageExt], queue_count: int) -> Encoded:
        """Group ``messages`` (their ``queue_id`` set) per queue and, when
        durable, encode their records' payloads: the arguments of
        :meth:`append_locked`.  Runs without the lock."""
        per_q: list[list[MessageExt]] = [[] for _ in range(queue_count)]
        meta_lens: list[list[int]] = [[] for _ in range(queue_count)]
        payloads: list[list[bytes]] = [[] for _ in range(queue_count)]
        durable = self.files is not None
        for m in messages:
            q = m.queue_id
            per_q[q].append(m)
            if durable:
                meta = encode_meta(m.keys, m.tags, m.properties)
                meta_lens[q].append(len(meta))
                payloads[q].append(meta + m.body if meta else m.body)
        slices = [(q, 0, len(msgs)) for q, msgs in enumerate(per_q) if msgs]
        return slices, per_q, meta_lens, payloads

    def append_locked(
        self,
        t: Topic,
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
            _write(t.files, slices, per_q, meta_lens, payloads)
        for q, start, stop in slices:
            logs[q].extend(per_q[q][start:stop] if start or stop < len(per_q[q]) else per_q[q])
        self.cond.notify_all()

    def close_files(self) -> None:
        """Close every log file and the directory lock."""
        for t in self._topics.values():
            for log in t.files or ():
                log.close()
        if self.files is not None:
            self.files.close()


def _write(
    files: list[QueueLog],
    slices: list[tuple[int, int, int]],
    per_q: list[list[MessageExt]],
    meta_lens: list[list[int]],
    payloads: list[list[bytes]],
) -> None:
    """(lock held) Append the records of ``slices``, one write per slice;
    on failure cut every touched log back and raise."""
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
