"""RedisBroker: topics of N queues on Redis Streams, sending, retries and
dead letters, and the consumers of its groups (:mod:`.consumer`).

The key layout and the protocols are in the package docstring; the client,
scripts and key names in :mod:`.connection`, the entry format in
:mod:`.codec`.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
import redis

from ..._errors import ConfigError, SourceClosedError, UnknownTopicError
from ..._types import MessageExt, MessageQueue, OffsetAndMetadata, SendResult
from ...rebalance.allocate import AVERAGELY, AllocateStrategy
from .._base import (
    DEFAULT_DELAY_LEVELS,
    ConsumeFromWhere,
    MessageModel,
    is_retry_or_dlq_topic,
    reconsume_times_of,
)
from .._common import BrokerClock, check_delay_levels, now_ms, validate_topic
from .._sending import RoundRobin, checked_items
from .codec import decode, offset_of
from .connection import Connection, qfield
from .consumer import RedisPullConsumer
from .retries import Retries

__all__ = ["RedisBroker", "TopicInfo"]

logger = logging.getLogger(__name__)

#: Messages of one queue stored per SEND call: a batch is atomic per queue up
#: to this size (a bigger one is split, so one call does not block the
#: server for long, and another sender's messages may then interleave).
SEND_CHUNK = 65536


class TopicInfo:
    __slots__ = ("name", "queues", "rr")

    def __init__(self, name: str, broker_name: str, count: int) -> None:
        self.name = name
        self.queues = [MessageQueue(name, broker_name, i) for i in range(count)]
        self.rr = RoundRobin()


class RedisBroker:
    """Topics of N queues on Redis Streams, with consumer groups.

    ``url_or_client``: a ``redis://`` URL (the broker makes and closes its
    client) or a ``redis.Redis`` (not closed by :meth:`close`).  ``clock``
    (default: the ``time`` module): ``.time()`` drives the due times of
    delayed retries, ``.monotonic()`` the local heartbeat schedule; sessions
    and leases run on the Redis server's clock.  Thread-safe for sending.
    """

    def __init__(
        self,
        url_or_client: str | redis.Redis,
        *,
        namespace: str = "lite_push",
        clock: BrokerClock | None = None,
        max_message_size: int = 4 * 1024 * 1024,
        delay_levels: Sequence[float] = DEFAULT_DELAY_LEVELS,
        session_timeout: float = 30.0,
        heartbeat_interval: float = 10.0,
        rebalance_interval: float = 20.0,
    ) -> None:
        if not isinstance(namespace, str) or not namespace or "{" in namespace or "}" in namespace:
            raise ConfigError("namespace", f"must be a non-empty string without braces, got {namespace!r}")
        if not isinstance(max_message_size, int) or max_message_size < 1:
            raise ConfigError("max_message_size", f"must be a positive int, got {max_message_size!r}")
        for name, value in (
            ("session_timeout", session_timeout),
            ("heartbeat_interval", heartbeat_interval),
            ("rebalance_interval", rebalance_interval),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(name, f"must be a positive number of seconds, got {value!r}")
        if heartbeat_interval >= session_timeout:
            raise ConfigError("heartbeat_interval", "must be shorter than session_timeout")
        if clock is not None and not all(callable(getattr(clock, f, None)) for f in ("monotonic", "time")):
            raise ConfigError("clock", f"must have monotonic() and time(), got {clock!r}")
        self._delay_levels = check_delay_levels(delay_levels)
        client: Any
        if isinstance(url_or_client, str):
            # bounded socket timeouts: a hung server must not block a poll for long
            client = redis.Redis.from_url(url_or_client, socket_connect_timeout=2.0, socket_timeout=5.0)
            self._own_client = True
        else:
            client = url_or_client
            self._own_client = False
        #: The client, scripts, pipelines and key names (consumers use it too).
        self.conn = Connection(client, namespace)
        self.namespace = namespace
        self.broker_name = namespace
        self.max_message_size = max_message_size
        self.session_timeout = float(session_timeout)
        self.heartbeat_interval = float(heartbeat_interval)
        self.rebalance_interval = float(rebalance_interval)
        #: The clock of due times (``.time()``) and heartbeat schedules.
        self.clock: BrokerClock = clock if clock is not None else time
        self._topics: dict[str, TopicInfo] = {}
        self._lock = threading.Lock()
        self._consumers: set[RedisPullConsumer] = set()
        self._client_seq = itertools.count(1)
        self._closed = False
        #: Retries and dead letters of the groups (``send_back``, ``send_to_dlq``).
        self.retries = Retries(self)

    # -- keys -----------------------------------------------------------------

    def queue_key(self, topic: str, qid: int, what: str) -> str:
        """The Redis key of one queue's ``what`` (``seq``, ``log``, ...)."""
        return self.conn.queue_key(topic, qid, what)

    def group_key(self, group: str, what: str) -> str:
        """The Redis key of one group's ``what`` (``offsets``,
        ``owner:<topic>#<queue>``, ...)."""
        return self.conn.group_key(group, what)

    @property
    def client(self) -> redis.Redis:
        """The redis-py client."""
        client: redis.Redis = self.conn.client
        return client

    @property
    def delay_levels(self) -> tuple[float, ...]:
        return self._delay_levels

    # -- topics ---------------------------------------------------------------

    def create_topic(self, topic: str, queue_count: int = 4) -> list[MessageQueue]:
        """Create ``topic`` with ``queue_count`` queues (idempotent for the
        same count; ``ConfigError`` naming ``queue_count`` otherwise)."""
        validate_topic(topic)
        if not isinstance(queue_count, int) or isinstance(queue_count, bool) or queue_count < 1:
            raise ConfigError("queue_count", f"must be an int >= 1, got {queue_count!r}")
        if queue_count != 1 and is_retry_or_dlq_topic(topic):
            raise ConfigError(
                "queue_count", f"retry and dead-letter topics have 1 queue, not {queue_count} ({topic!r})"
            )
        self.check_open()
        t = self.ensure_topic(topic, queue_count)
        if len(t.queues) != queue_count:
            raise ConfigError("queue_count", f"topic {topic!r} exists with {len(t.queues)} queues, not {queue_count}")
        return list(t.queues)

    def ensure_topic(self, topic: str, queue_count: int) -> TopicInfo:
        """The topic, created with ``queue_count`` queues if it does not exist."""
        t = self._topics.get(topic)
        if t is not None:
            return t
        key = self.conn.topics_key()
        pipe = self.conn.pipeline()
        pipe.hsetnx(key, topic, str(queue_count))
        pipe.hget(key, topic)
        _, raw = pipe.execute()
        return self._cache_topic(topic, int(raw))

    def _cache_topic(self, topic: str, count: int) -> TopicInfo:
        with self._lock:
            t = self._topics.get(topic)
            if t is None:
                t = self._topics[topic] = TopicInfo(topic, self.broker_name, count)
            return t

    def topic(self, topic: str) -> TopicInfo:
        """The topic (cached); ``UnknownTopicError`` if Redis has none."""
        t = self._topics.get(topic)
        if t is not None:
            return t
        raw = self.conn.client.hget(self.conn.topics_key(), topic)
        if raw is None:
            raise UnknownTopicError(topic)
        return self._cache_topic(topic, int(raw))

    def topics(self) -> list[str]:
        return sorted(k.decode() for k in self.conn.client.hkeys(self.conn.topics_key()))

    def queues(self, topic: str) -> list[MessageQueue]:
        """The queues of ``topic``, sorted.  ``UnknownTopicError`` if none."""
        return list(self.topic(topic).queues)

    def max_offset(self, queue: MessageQueue) -> int:
        """The offset the next message of ``queue`` will get."""
        raw = self.conn.client.get(self.queue_key(queue.topic, queue.queue_id, "seq"))
        return int(raw) if raw is not None else 0

    def min_offset(self, queue: MessageQueue) -> int:
        """The lowest stored offset of ``queue``."""
        # seq is read first: were the stream empty, a message sent between the
        # two reads would otherwise be skipped
        pipe = self.conn.pipeline()
        pipe.get(self.queue_key(queue.topic, queue.queue_id, "seq"))
        pipe.xrange(self.queue_key(queue.topic, queue.queue_id, "log"), "-", "+", count=1)
        seq, first = pipe.execute()
        if first:
            return offset_of(first[0][0])
        return int(seq) if seq is not None else 0

    def messages(self, queue: MessageQueue, start: int = 0, stop: int | None = None) -> list[MessageExt]:
        """The stored messages of ``queue`` in ``[start, stop)`` (tools, tests;
        malformed entries are left out)."""
        hi = "+" if stop is None else f"{stop}-0"
        if stop is not None and stop <= start:
            return []
        entries = self.conn.client.xrange(self.queue_key(queue.topic, queue.queue_id, "log"), f"{start + 1}-0", hi)
        return decode(self.namespace, queue, entries, [])

    # -- sending --------------------------------------------------------------

    def send(
        self,
        topic: str,
        body: bytes,
        keys: str | None = None,
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
        queue_id: int | None = None,
    ) -> SendResult:
        """Store one message; the queue is ``queue_id`` when given, else
        ``lane_of(keys, queue_count)`` for non-empty keys, else round robin."""
        item = {"body": body, "keys": keys, "tags": tags, "properties": properties, "queue_id": queue_id}
        return self.send_batch(topic, (item,))[0]

    def send_batch(self, topic: str, items: Iterable[Any]) -> list[SendResult]:
        """Store many messages; each item is ``body``, ``(body, keys)`` or a
        mapping (``body``, ``keys``, ``tags``, ``properties``, ``queue_id``).
        Every item is checked first (a bad one stores nothing); then one
        atomic SEND script per queue, pipelined, so a batch's messages of one
        queue get consecutive offsets.  Results in input order."""
        self.check_open()
        t = self.topic(topic)
        n = len(t.queues)
        limit = self.max_message_size
        born = now_ms()
        args: dict[int, list[bytes]] = {}
        order: list[tuple[int, int]] = []  # (queue, index within the queue's part)
        for body, keys, tags, props, q in checked_items(items, topic, n, limit, t.rr):
            if props:
                reconsume_times_of(props)
            meta: dict[str, Any] = {"bt": born}
            if keys:
                meta["k"] = keys
            if tags:
                meta["t"] = tags
            if props:
                meta["p"] = props
            a = args.setdefault(q, [])
            idx = len(a) // 2
            a.append(body)
            a.append(orjson.dumps(meta))
            order.append((q, idx))
        if not order:
            return []
        first = self.store(topic, args)
        out = []
        for q, i in order:
            off = first[q][i // SEND_CHUNK] + i % SEND_CHUNK
            out.append(SendResult(t.queues[q], off, f"{self.namespace}-{topic}-{q}-{off}"))
        return out

    def store(self, topic: str, args: Mapping[int, list[bytes]]) -> dict[int, list[int]]:
        """One SEND per queue (per ``SEND_CHUNK`` messages of a queue), pipelined;
        returns per queue the first offset of each chunk."""
        pipe = self.conn.pipeline()
        calls: list[int] = []
        for q in sorted(args):
            a = args[q]
            for start in range(0, len(a), 2 * SEND_CHUNK):
                part = a[start : start + 2 * SEND_CHUNK]
                self.conn.run(
                    self.conn.send,
                    [self.queue_key(topic, q, "seq"), self.queue_key(topic, q, "log")],
                    [len(part) // 2, self.conn.notify_channel(topic), *part],
                    pipe,
                )
                calls.append(q)
        res = pipe.execute()
        first: dict[int, list[int]] = {}
        for q, r in zip(calls, res, strict=True):
            first.setdefault(q, []).append(int(r[0]))
        return first

    # -- retries ----------------------------------------------------------------

    def deliver_due(self, group: str) -> int:
        """Move ``group``'s due delayed retries to its retry topic now (polls
        do this on their own); return how many were moved."""
        moved, _ = self.retries.move_due(None, group)
        return int(moved)

    # -- consumers ------------------------------------------------------------

    def pull_consumer(
        self,
        group: str,
        *,
        consume_from: ConsumeFromWhere = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp: int | None = None,
        client_id: str | None = None,
        allocate: AllocateStrategy = AVERAGELY,
        message_model: MessageModel = MessageModel.CLUSTERING,
        offset_file: str | os.PathLike[str] | None = None,
    ) -> RedisPullConsumer:
        """A new member of ``group`` (it joins at subscribe).  With
        ``message_model=BROADCASTING`` it reads every queue and keeps its
        offsets in ``offset_file`` (default
        :func:`~lite_push.sources.local_offsets.default_offset_file`)."""
        return RedisPullConsumer(
            self,
            group,
            consume_from=consume_from,
            consume_timestamp=consume_timestamp,
            client_id=client_id,
            allocate=allocate,
            message_model=message_model,
            offset_file=offset_file,
        )

    def cached_topic(self, topic: str) -> TopicInfo | None:
        """The topic if this broker has seen it (no Redis call)."""
        return self._topics.get(topic)

    def new_client_id(self) -> str:
        """A client id unique across machines and processes."""
        return f"{socket.gethostname()}@{os.getpid()}@{next(self._client_seq):06d}@{uuid.uuid4().hex[:8]}"

    def register(self, consumer: RedisPullConsumer) -> None:
        """An open consumer; ``ConfigError`` if another open one of its group
        has its client id."""
        with self._lock:
            if any(c.group == consumer.group and c.client_id == consumer.client_id for c in self._consumers):
                raise ConfigError(
                    "client_id",
                    f"{consumer.client_id!r} is already used by an open consumer of group {consumer.group!r}",
                )
            self._consumers.add(consumer)

    def unregister(self, consumer: RedisPullConsumer) -> None:
        """A consumer closed."""
        with self._lock:
            self._consumers.discard(consumer)

    def committed(self, group: str, queue: MessageQueue) -> OffsetAndMetadata | None:
        """What ``group`` committed for ``queue`` (admin view)."""
        raw = self.conn.client.hget(self.group_key(group, "offsets"), qfield(queue))
        if raw is None:
            return None
        off, meta = orjson.loads(raw)
        return OffsetAndMetadata(off, meta)

    # -- lifecycle ------------------------------------------------------------

    def check_open(self) -> None:
        if self._closed:
            raise SourceClosedError(f"redis broker {self.namespace!r} is closed")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close every consumer (they leave their groups), then the client
        if the broker made it.  Idempotent."""
        if self._closed:
            return
        with self._lock:
            consumers = list(self._consumers)
        for c in consumers:
            try:
                c.close()
            except Exception:
                logger.exception("closing %r failed", c)
        self._closed = True
        if self._own_client:
            self.conn.client.close()

    def __enter__(self) -> RedisBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RedisBroker {self.namespace!r}{' closed' if self._closed else ''}>"
