"""RedisBroker: topics of N queues on Redis Streams, sending, admin reads,
closing; it wires the parts its consumers (:mod:`.consumer`) keep: the
connection, the topic catalog (:mod:`.topics`), the retries and dead
letters (:mod:`.retries`) and the registry of open consumers
(:mod:`.registry`).

The key layout and the protocols are in the package docstring; the client,
scripts and key names in :mod:`.connection`, the entry format in
:mod:`.codec`.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
import redis

from ..._errors import ConfigError, SourceClosedError, SourceUnavailableError
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
from .connection import CONN_ERRORS, Connection, chunk_offset, server_address
from .consumer import RedisPullConsumer
from .group_admin import RedisGroupAdmin
from .membership import read_committed
from .message_grain import grain_position
from .registry import OpenConsumers
from .retries import Retries
from .tls import TlsConnection
from .topics import TopicCatalog, TopicInfo

__all__ = ["DEFAULT_NAMESPACE", "RedisBroker", "TopicInfo"]

logger = logging.getLogger(__name__)

#: The key prefix of a broker given no ``namespace``.
DEFAULT_NAMESPACE = "lite_push"


def _reach(client: Any, own: bool) -> None:
    """PING the server: :class:`SourceUnavailableError` naming its address
    when it does not answer (``own``: the client is closed then)."""
    try:
        client.ping()
    except CONN_ERRORS as e:
        if own:
            client.close()
        raise SourceUnavailableError(server_address(client), f"{type(e).__name__}: {e}") from None


class RedisBroker:
    """Topics of N queues on Redis Streams, with consumer groups.

    ``url_or_client``: a ``redis://`` or ``rediss://`` (TLS) URL (the broker
    makes and closes its client) or a ``redis.Redis`` (not closed by
    :meth:`close`).  The server is asked once (PING): one that does not
    answer raises :class:`~lite_push.SourceUnavailableError` naming its
    address (a TLS handshake that fails or gets no answer within 2 s, too,
    saying TLS).  ``clock``
    (default: the ``time`` module): ``.time()`` drives the due times of
    delayed retries, ``.monotonic()`` the local heartbeat schedule; sessions
    and leases run on the Redis server's clock.  Thread-safe for sending.
    ``tracing``: what is sent carries the sender's OpenTelemetry context
    (``lite-push[tracing]``), for the consumer's spans to continue its trace.
    """

    def __init__(
        self,
        url_or_client: str | redis.Redis,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        clock: BrokerClock | None = None,
        max_message_size: int = 4 * 1024 * 1024,
        delay_levels: Sequence[float] = DEFAULT_DELAY_LEVELS,
        session_timeout: float = 30.0,
        heartbeat_interval: float = 10.0,
        rebalance_interval: float = 20.0,
        tracing: bool = False,
    ) -> None:
        #: Whether what is sent carries the sender's OpenTelemetry context.
        self.tracing = check_tracing(tracing)
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
            # bounded socket timeouts: a hung server must not block a poll for
            # long; rediss://: the TLS handshake is bounded by the connect
            # timeout and its failures say TLS (a plain port never answers it)
            tls: dict[str, Any] = {"connection_class": TlsConnection} if url_or_client.startswith("rediss:") else {}
            client = redis.Redis.from_url(url_or_client, socket_connect_timeout=2.0, socket_timeout=5.0, **tls)
            self._own_client = True
        else:
            client = url_or_client
            self._own_client = False
        _reach(client, self._own_client)
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
        #: The topics: queue counts (cached) and stored ranges.
        self.catalog = TopicCatalog(self.conn, namespace)
        #: The open consumers (closed with the broker).
        self.consumers = OpenConsumers()
        self._client_seq = itertools.count(1)
        self._closed = False
        #: Retries and dead letters of the groups (``send_back``, ``send_to_dlq``).
        self.retries = Retries(self.conn, self.catalog, self.clock, self._delay_levels, max_message_size)

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
        return self.catalog.ensure(topic, queue_count)

    def topic(self, topic: str) -> TopicInfo:
        """The topic (cached); ``UnknownTopicError`` if Redis has none."""
        return self.catalog.get(topic)

    def topics(self) -> list[str]:
        return self.catalog.names()

    def queues(self, topic: str) -> list[MessageQueue]:
        """The queues of ``topic``, sorted.  ``UnknownTopicError`` if none."""
        return list(self.topic(topic).queues)

    def max_offset(self, queue: MessageQueue) -> int:
        """The offset the next message of ``queue`` will get."""
        return self.catalog.max_offset(queue)

    def min_offset(self, queue: MessageQueue) -> int:
        """The lowest stored offset of ``queue``."""
        return self.catalog.min_offset(queue)

    def messages(self, queue: MessageQueue, start: int = 0, stop: int | None = None) -> list[MessageExt]:
        """The stored messages of ``queue`` in ``[start, stop)`` (tools, tests;
        malformed entries are left out)."""
        return self.catalog.messages(queue, start, stop)

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
        trace = send_context() if self.tracing else None
        for body, keys, tags, props, q in checked_items(items, topic, n, limit, t.rr, trace):
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
            off = chunk_offset(first[q], i)
            out.append(SendResult(t.queues[q], off, f"{self.namespace}-{topic}-{q}-{off}"))
        return out

    def store(self, topic: str, args: Mapping[int, list[bytes]]) -> dict[int, list[int]]:
        """One SEND per queue (per ``SEND_CHUNK`` messages of a queue), pipelined;
        returns per queue the first offset of each chunk
        (:meth:`Connection.append`)."""
        return self.conn.append(topic, args)

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
        consume_from: ConsumeFrom = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp: int | None = None,
        client_id: str | None = None,
        allocate: AllocateStrategy = AVERAGELY,
        message_model: MessageModel = MessageModel.CLUSTERING,
        offset_file: str | os.PathLike[str] | None = None,
        balance: Balance = Balance.QUEUE,
    ) -> RedisPullConsumer:
        """A new member of ``group`` (it joins at subscribe).  With
        ``message_model=BROADCASTING`` it reads every queue and keeps its
        offsets in ``offset_file`` (default
        :func:`~lite_push.sources.local_offsets.default_offset_file`).
        ``balance=Balance.MESSAGE``: every member takes part in every queue,
        message by message, a key held by one member at a time
        (:mod:`~lite_push.sources.redis.message_grain`); every member of
        the group must use the same balance."""
        return RedisPullConsumer(
            self,
            group,
            consume_from=consume_from,
            consume_timestamp=consume_timestamp,
            client_id=client_id,
            allocate=allocate,
            message_model=message_model,
            offset_file=offset_file,
            balance=balance,
        )

    def cached_topic(self, topic: str) -> TopicInfo | None:
        """The topic if this broker has seen it (no Redis call)."""
        return self.catalog.cached(topic)

    def new_client_id(self) -> str:
        """A client id unique across machines and processes."""
        return f"{socket.gethostname()}@{os.getpid()}@{next(self._client_seq):06d}@{uuid.uuid4().hex[:8]}"

    def committed(self, group: str, queue: MessageQueue) -> OffsetAndMetadata | None:
        """What ``group`` committed for ``queue`` (admin view; a group
        balanced by message: its lowest unacknowledged offset, as the
        queue's own state says)."""
        if self.conn.client.get(self.group_key(group, "balance")) == b"MESSAGE":
            return grain_position(self.conn, group, queue)
        return read_committed(self.conn, group, queue)

    def group_admin(self, group: str) -> RedisGroupAdmin:
        """``group`` read and changed from outside it: its members, committed
        offsets, owners and in-flight counts, and a reset of its offsets
        while no member's session lives
        (:class:`~lite_push.sources.group_admin.GroupAdmin`)."""
        self.check_open()
        return RedisGroupAdmin(group, self.conn, self.catalog, self.session_timeout)

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
        for c in self.consumers.snapshot():
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
