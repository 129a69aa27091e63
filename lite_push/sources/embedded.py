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
# ---------------------------------------------------------------------------
"""

from __future__ import annotations

import bisect
import gc
import itertools
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from operator import attrgetter
from typing import Any, overload
from zlib import crc32 as _crc32

from .._errors import ConfigError, MessageTooLargeError, SourceClosedError, UnknownTopicError
from .._router import lane_of
from .._types import MessageExt, MessageQueue, OffsetAndMetadata, SendResult
from ..rebalance.allocate import AVERAGELY, AllocateStrategy
from ._base import ConsumeFromWhere
from ._embedded_consumer import EmbeddedPullConsumer, MonotonicClock, _Group, _Member, parse_tag_expression
from ._embedded_store import HEADER, MAGIC, TRAILER, QueueLog, Store, encode_meta, msg_id_prefix

__all__ = ["EmbeddedBroker", "EmbeddedPullConsumer", "MonotonicClock", "SendResults", "parse_tag_expression"]

logger = logging.getLogger(__name__)

#: Messages stored per lock acquisition in send_batch (bounds how long a huge
#: batch keeps pollers and wakeup() waiting).
_CHUNK = 65536
#: Batches at least this large run with the cyclic GC paused (creating
#: millions of objects otherwise triggers many full collections).
_GC_PAUSE_MIN = 4096
#: RocketMQ's default consume_timestamp: half an hour ago.
_DEFAULT_TIMESTAMP_LAG_MS = 30 * 60 * 1000
_store_ts = attrgetter("store_timestamp")
_ITEM_FIELDS = frozenset({"body", "keys", "tags", "properties", "queue_id"})


def _validate_topic(topic: str) -> None:
    if not isinstance(topic, str) or not topic or len(topic) > 255:
        raise ValueError(f"topic must be a non-empty string of at most 255 characters, got {topic!r}")
    if topic in (".", "..") or any(c in topic for c in "/\\\x00"):
        raise ValueError(f"topic {topic!r} must not contain '/', '\\\\' or NUL, nor be '.' or '..'")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


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
    ``clock`` (``.monotonic()``) drives session timeouts only; timestamps are
    wall-clock milliseconds.  ``session_timeout`` is the default for
    consumers that do not set their own.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        broker_name: str = "embedded",
        max_message_size: int = 4 * 1024 * 1024,
        clock: MonotonicClock | None = None,
        session_timeout: float = 30.0,
        fsync: bool = False,
    ) -> None:
        if not isinstance(broker_name, str) or not broker_name:
            raise ConfigError("broker_name", f"must be a non-empty string, got {broker_name!r}")
        if not isinstance(max_message_size, int) or max_message_size < 1:
            raise ConfigError("max_message_size", f"must be a positive int, got {max_message_size!r}")
        if not session_timeout > 0:
            raise ConfigError("session_timeout", f"must be positive, got {session_timeout!r}")
        self.broker_name = broker_name
        self.max_message_size = max_message_size
        self.session_timeout = float(session_timeout)
        self._clock: MonotonicClock = clock if clock is not None else time
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
        for group_name, entries in store.load_offsets().items():
            group = self._group(group_name)
            for (topic_name, qid), (offset, metadata) in entries.items():
                t = self._topics.get(topic_name)
                if t is None or not 0 <= qid < len(t.queues):
                    logger.warning("offsets for unknown queue %s#%d of group %r ignored", topic_name, qid, group_name)
                    continue
                group.committed[t.queues[qid]] = OffsetAndMetadata(offset, metadata)
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
        that is empty, longer than 255 or holds ``/``, ``\\`` or NUL."""
        _validate_topic(topic)
        if not isinstance(queue_count, int) or isinstance(queue_count, bool) or queue_count < 1:
            raise ConfigError("queue_count", f"must be an int >= 1, got {queue_count!r}")
        with self._lock:
            self._check_open()
            existing = self._topics.get(topic)
            if existing is not None:
                if len(existing.queues) != queue_count:
                    raise ConfigError(
                        "queue_count", f"topic {topic!r} exists with {len(existing.queues)} queues, not {queue_count}"
                    )
                return list(existing.queues)
            t = _Topic(topic, self.broker_name, queue_count)
            if self._store is not None:
                counts = {name: len(x.queues) for name, x in self._topics.items()}
                counts[topic] = queue_count
                self._store.save_topics(counts)
                t.files = [self._store.open_queue(topic, i) for i in range(queue_count)]
            self._topics[topic] = t
            logger.debug("created topic %r with %d queues", topic, queue_count)
            return list(t.queues)

    def topics(self) -> list[str]:
        """The topic names, sorted."""
        with self._lock:
            return sorted(self._topics)

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
        batches: another sender's messages may then interleave)."""
        self._check_open()
        t = self._topic(topic)
        n = len(t.queues)
        limit = self.max_message_size
        durable = t.files is not None
        name, bname = t.name, self.broker_name
        born = _now_ms()
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
                        raise TypeError(f"send_batch items are body, (body, keys) or a mapping; got a {len(item)}-tuple")
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
                m = MessageExt(name, q, -1, body, keys or None, tags, props, born, 0, 0, "", bname)
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
        unknown = set(item) - _ITEM_FIELDS
        if unknown or "body" not in item:
            raise TypeError(f"send_batch mapping items need 'body' and take only {sorted(_ITEM_FIELDS)}")
        tags = item.get("tags")
        if tags is not None and type(tags) is not str:
            raise TypeError(f"tags must be str or None, got {type(tags).__name__}")
        raw = item.get("properties")
        props: dict[str, str] = {}
        if raw:
            if not isinstance(raw, Mapping):
                raise TypeError(f"properties must be a mapping of str to str, got {type(raw).__name__}")
            props = dict(raw)
            for k, v in props.items():
                if type(k) is not str or type(v) is not str:
                    raise TypeError(f"properties must map str to str, got {k!r}: {v!r}")
        return item["body"], item.get("keys"), tags or None, props, item.get("queue_id")

    def _store_slices(
        self,
        t: _Topic,
        slices: list[tuple[int, int, int]],
        per_q: list[list[MessageExt]],
        meta_lens: list[list[int]],
        payloads: list[list[bytes]],
    ) -> None:
        """Under the lock: give the messages of ``slices`` their offsets, ids
        and store time, append them to the logs (file, then memory), wake the
        pollers."""
        with self._lock:
            self._check_open()
            now = self._last_store_ms = max(_now_ms(), self._last_store_ms)  # never goes back
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
                    header = pack(MAGIC, meta_len, len(payload) - meta_len, m.queue_offset, m.born_timestamp, m.store_timestamp)
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

    # -- consumers ----------------------------------------------------------

    def pull_consumer(
        self,
        group: str,
        *,
        consume_from: ConsumeFromWhere = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp: int | None = None,
        client_id: str | None = None,
        allocate: AllocateStrategy = AVERAGELY,
        session_timeout: float | None = None,
    ) -> EmbeddedPullConsumer:
        """A new member of ``group`` (it joins at :meth:`subscribe`).

        ``consume_from`` and ``consume_timestamp`` (ms; default half an hour
        ago) say where the group starts on a queue it has never committed;
        the position is fixed when the group first owns the queue.
        ``client_id`` must be unique among the group's open consumers
        (default: generated, increasing with creation order).  Every member of
        a group must use the same ``allocate`` strategy."""
        return EmbeddedPullConsumer(
            self,
            group,
            consume_from=consume_from,
            consume_timestamp=consume_timestamp,
            client_id=client_id,
            allocate=allocate,
            session_timeout=session_timeout,
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
            if member.consume_from is ConsumeFromWhere.FIRST_OFFSET:
                pos = 0
            elif member.consume_from is ConsumeFromWhere.TIMESTAMP:
                ts = member.consume_timestamp
                if ts is None:
                    ts = _now_ms() - _DEFAULT_TIMESTAMP_LAG_MS
                pos = bisect.bisect_left(log, ts, key=_store_ts)
            else:
                pos = len(log)
            group.initial[q] = pos
        return min(pos, len(log))

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

