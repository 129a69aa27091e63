"""The Redis Streams source: topics, queues and consumer groups on a Redis server.

Code: this module (the broker, sending, the consumer), ``_redis_scripts.py``
(the Lua scripts).

# ---------------------------------------------------------------------------
# Mapping onto Redis (``ns`` is the broker's ``namespace``)
#
# Topics
#   ns:topics                       hash  topic -> queue count
#   ns:{<topic>#<q>}:seq            string: the next offset of queue q
#   ns:{<topic>#<q>}:log            stream: the messages of queue q
#     A queue's keys share the hash tag {<topic>#<q>}, so they live in one
#     Cluster slot.  Offsets are consecutive integers per queue, assigned at
#     send time by the SEND script: INCRBY seq, then XADD with the explicit
#     stream id "<offset+1>-0" (ids must be > 0-0), so reading from offset o
#     is XRANGE log (o+1)-0 + .  Entry fields: b = body (raw bytes), m =
#     orjson {"k": keys, "t": tags, "p": properties, "bt": born ms}, s = store
#     ms (server TIME).  A batch send is one SEND call per queue (pipelined),
#     so a batch's messages of one queue are contiguous (up to 65536 per
#     queue per call; bigger batches are split).  msg_id is
#     "<namespace>-<topic>-<q>-<offset>"; MessageQueue.broker_name is the
#     namespace.
#
# Retry and dead-letter topics (%RETRY%<group>, %DLQ%<group>): normal topics
#   of one queue, created on first use (send_back, send_to_dlq, subscribe).
#   Delayed retries wait in the retry queue's own hash tag:
#   ns:{%RETRY%<g>#0}:sched        zset  copy id -> due ms (broker clock .time())
#   ns:{%RETRY%<g>#0}:sbody / :smeta  hashes copy id -> body / meta
#   The MOVE_DUE script moves every due copy to the retry stream (same slot,
#   atomic), returning the next due time.  Every poll iteration runs it for
#   its group, and a waiting poll never waits past the next due time.
#
# Consumer groups (hash tag {g:<group>})
#   ns:{g:<g>}:members    zset  client id -> session expiry (server ms)
#   ns:{g:<g>}:subs       hash  client id -> orjson list of subscribed topics
#   ns:{g:<g>}:version    counter bumped on every membership change/release
#   ns:{g:<g>}:owner:<topic>#<q>   string: owning client id, PX session_timeout
#   ns:{g:<g>}:offsets    hash  "<topic>#<q>" -> orjson [offset, metadata]
#   ns:{g:<g>}:initial    hash  "<topic>#<q>" -> start offset fixed when the
#                         group first owned the queue (ConsumeFromWhere)
#   ns:{g:<g>}:lock:<topic>#<q>    string: orderly lock holder, PX lease
#   ns:{g:<g>}:events     pub/sub channel announcing membership changes
#
# Rebalance and the hand-off (all on the owning thread, inside poll)
#   HEARTBEAT (at subscribe, on a version change, at least every
#   heartbeat_interval, every rebalance_interval, while a wanted queue is
#   still taken) drops members whose session expired, (re)adds the caller
#   with expiry now + session_timeout, bumps the version on a change, renews
#   the caller's owner keys (reporting those it lost) and returns the live
#   members' subscriptions.  The target is the allocation strategy over the
#   topic's sorted queues and the sorted ids of the members subscribed to
#   it.  Owned queues that left the target (or were lost) go through
#   on_revoked, then their owner keys are compare-and-deleted (RELEASE,
#   which bumps the version so the others look at once).  Target queues are
#   taken by ACQUIRE (free, or already ours); their start position is the
#   committed offset, else the group's initial position; then on_assigned.
#   A queue still owned by another member is retried on every poll
#   iteration until it is released or its owner key expires (the previous
#   owner missed its session).  commit() stores only offsets of queues whose
#   owner key holds the caller's id (COMMIT), so late commits are fenced.
#   Every poll iteration reads the version (pipelined with the reads), so a
#   membership change is seen at once (pub/sub, below) or within one wait
#   slice.  Sessions expire on the server's clock (TIME in the scripts), so
#   members on different machines agree on them.
#
# BROADCASTING members (message_model=BROADCASTING) touch none of the group
#   keys above: no registry entry, no owner keys, no locks.  A member owns
#   every queue of its topics from its first poll after subscribe, starting
#   at its offset in its local file (lite_push.sources.local_offsets), else
#   at consume_from (written to the file at once); commit() writes the file.
#   send_back is refused (the runtime retries failures in the member).
#
# Blocking: a poll with nothing to read waits on a threading.Event, at most
#   a short slice (0.25 s, and never past the timeout or the next due retry),
#   then reads again.  The event is set by wakeup() and by a per-consumer
#   notifier thread on its own pub/sub connection, subscribed to the group's
#   events channel and to ns:notify:<topic> of every subscribed topic (and
#   of the group's retry topic): SEND and MOVE_DUE publish there, so a
#   waiting poll reads a new message or a membership change at once.
#
# Redis Cluster: every script's keys share one hash tag (a queue's, or a
#   group's, or the retry queue's for the schedule), and ns:topics is only
#   used by single-key commands.  A redis.RedisCluster client cannot
#   pipeline scripts, so on a cluster the pipelined steps (batch send, the
#   poll's reads) run one by one (_Sequential).
#
# Reading: polls go through a second client on the broker's connection pool
#   whose XRANGE replies are left as hiredis' lists (redis-py would build a
#   dict per entry); offsets come from the first id while the entries are
#   consecutive; the cyclic GC is paused while a big read is parsed and
#   decoded (it only creates live objects).
#
# Errors: a dropped connection is logged once per episode; the poll returns
#   [] after a back-off, and the next one resumes at the positions it had
#   (nothing is lost: positions move only after a successful read).  A rebalance that fails half way keeps the revoked
#   queues' owner keys in _unreleased and deletes them on the next attempt
#   (their on_revoked is not called twice).
# ---------------------------------------------------------------------------
"""

from __future__ import annotations

import bisect
import gc
import itertools
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import orjson
import redis
from redis.exceptions import ClusterDownError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._errors import (
    ConfigError,
    MessageTooLargeError,
    SourceClosedError,
    UnknownTopicError,
)
from .._router import lane_of
from .._types import MessageExt, MessageQueue, OffsetAndMetadata, PollBatch, SendResult
from ..rebalance.allocate import AVERAGELY, AllocateStrategy
from . import _redis_scripts as scripts
from ._base import (
    DEFAULT_DELAY_LEVELS,
    DLQ_EXCEPTION,
    DLQ_GROUP,
    DLQ_REASON,
    RECONSUME_TIME,
    ConsumeFromWhere,
    MessageModel,
    PullSource,
    RebalanceListener,
    dlq_topic,
    is_retry_or_dlq_topic,
    origin_properties,
    reconsume_times_of,
    retry_topic,
)
from ._common import (
    BrokerClock,
    QueueStates,
    check_delay_levels,
    check_message,
    check_message_model,
    commit_entries,
    initial_position,
    no_send_back,
    now_ms,
    open_offset_store,
    parse_tag_expression,
    unpack_item,
    validate_topic,
)

__all__ = ["RedisBroker", "RedisPullConsumer"]

logger = logging.getLogger(__name__)

#: What a poll treats as "Redis is unreachable for now" (BusyLoadingError is
#: a ConnectionError; ClusterDownError/TryAgainError are cluster fail-overs).
_CONN_ERRORS = (RedisConnectionError, RedisTimeoutError, ClusterDownError, TryAgainError, OSError)
#: With a tag filter, one poll scans at most this many messages per queue
#: beyond ``4 * max_per_queue`` (as the embedded broker).
_SCAN_EXTRA = 256
#: Longest sleep of a waiting poll between two reads (seconds); pub/sub
#: notifications usually end it sooner.
_WAIT_SLICE = 0.25
_MIN_WAIT = 0.001
#: Delayed retries moved per MOVE_DUE call.
_MOVE_LIMIT = 1000
#: Messages of one queue stored per SEND call: a batch is atomic per queue up
#: to this size (a bigger one is split, so one call does not block the
#: server for long, and another sender's messages may then interleave).
_CHUNK = 65536
#: A poll that may read at least this many entries runs with the cyclic GC
#: paused while it parses and decodes them.
_GC_PAUSE_MIN = 256


def _qfield(q: MessageQueue) -> str:
    return f"{q.topic}#{q.queue_id}"


class _TopicInfo:
    __slots__ = ("name", "queues", "rr")

    def __init__(self, name: str, broker_name: str, count: int) -> None:
        self.name = name
        self.queues = [MessageQueue(name, broker_name, i) for i in range(count)]
        self.rr = 0


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
        # Typed Any: redis-py types every command as "value or awaitable"
        # (one stub for its sync and asyncio clients); this one is sync.
        self._client: Any
        if isinstance(url_or_client, str):
            # bounded socket timeouts: a hung server must not block a poll for long
            self._client = redis.Redis.from_url(url_or_client, socket_connect_timeout=2.0, socket_timeout=5.0)
            self._own_client = True
        else:
            self._client = url_or_client
            self._own_client = False
        self.namespace = namespace
        self.broker_name = namespace
        self.max_message_size = max_message_size
        self.session_timeout = float(session_timeout)
        self.heartbeat_interval = float(heartbeat_interval)
        self.rebalance_interval = float(rebalance_interval)
        self._clock: BrokerClock = clock if clock is not None else time
        self._topics: dict[str, _TopicInfo] = {}
        self._lock = threading.Lock()
        self._consumers: set[RedisPullConsumer] = set()
        self._client_seq = itertools.count(1)
        self._closed = False
        c = self._client
        self._s_send = c.register_script(scripts.SEND)
        self._s_move = c.register_script(scripts.MOVE_DUE)
        self._s_heartbeat = c.register_script(scripts.HEARTBEAT)
        self._s_acquire = c.register_script(scripts.ACQUIRE)
        self._s_release = c.register_script(scripts.RELEASE)
        self._s_leave = c.register_script(scripts.LEAVE)
        self._s_commit = c.register_script(scripts.COMMIT)
        self._s_lock = c.register_script(scripts.LOCK)
        self._s_unlock = c.register_script(scripts.UNLOCK)
        self._s_schedule = c.register_script(scripts.SCHEDULE)
        # Redis Cluster clients cannot pipeline scripts: they run one by one
        self._cluster = isinstance(c, redis.RedisCluster)
        # Polls read through a second client on the same connection pool
        # whose XRANGE replies stay hiredis' nested lists: redis-py would make
        # a dict of every entry's fields, which costs more than the rest of
        # decoding (a caller's own client is left as it is).
        self._reader: Any = c
        if not self._cluster:
            self._reader = redis.Redis(connection_pool=c.connection_pool)
            self._reader.set_response_callback("XRANGE", _raw_entries)

    def _pipeline(self, reader: bool = False) -> Any:
        """A non-transactional pipeline (a sequential stand-in on a cluster);
        ``reader``: on the reader client, whose XRANGE replies are not
        parsed into dicts."""
        if self._cluster:
            return _Sequential(self._client)
        return (self._reader if reader else self._client).pipeline(transaction=False)

    def _script(self, script: Any, keys: list[str], args: list[Any], pipe: Any = None) -> Any:
        """Run ``script`` now (``pipe`` None) or queue it on ``pipe``."""
        if pipe is None:
            return script(keys=keys, args=args, client=self._client)
        if isinstance(pipe, _Sequential):
            pipe.results.append(script(keys=keys, args=args, client=self._client))
            return None
        return script(keys=keys, args=args, client=pipe)

    # -- keys -----------------------------------------------------------------

    def queue_key(self, topic: str, qid: int, what: str) -> str:
        """The Redis key of one queue's ``what`` (``log``, ...): a hash tag per
        queue, so a queue's keys share a cluster slot."""
        return f"{self.namespace}:{{{topic}#{qid}}}:{what}"

    def group_key(self, group: str, what: str) -> str:
        """The Redis key of one group's ``what`` (``offsets``,
        ``owner:<topic>#<queue>``, ...): a hash tag per group."""
        return f"{self.namespace}:{{g:{group}}}:{what}"

    def _notify_channel(self, topic: str) -> str:
        return f"{self.namespace}:notify:{topic}"

    @property
    def client(self) -> redis.Redis:
        client: redis.Redis = self._client
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
        self._check_open()
        t = self._ensure_topic(topic, queue_count)
        if len(t.queues) != queue_count:
            raise ConfigError("queue_count", f"topic {topic!r} exists with {len(t.queues)} queues, not {queue_count}")
        return list(t.queues)

    def _ensure_topic(self, topic: str, queue_count: int) -> _TopicInfo:
        t = self._topics.get(topic)
        if t is not None:
            return t
        key = f"{self.namespace}:topics"
        pipe = self._pipeline()
        pipe.hsetnx(key, topic, str(queue_count))
        pipe.hget(key, topic)
        _, raw = pipe.execute()
        return self._cache_topic(topic, int(raw))

    def _cache_topic(self, topic: str, count: int) -> _TopicInfo:
        with self._lock:
            t = self._topics.get(topic)
            if t is None:
                t = self._topics[topic] = _TopicInfo(topic, self.broker_name, count)
            return t

    def _topic(self, topic: str) -> _TopicInfo:
        t = self._topics.get(topic)
        if t is not None:
            return t
        raw = self._client.hget(f"{self.namespace}:topics", topic)
        if raw is None:
            raise UnknownTopicError(topic)
        return self._cache_topic(topic, int(raw))

    def topics(self) -> list[str]:
        return sorted(k.decode() for k in self._client.hkeys(f"{self.namespace}:topics"))

    def queues(self, topic: str) -> list[MessageQueue]:
        """The queues of ``topic``, sorted.  ``UnknownTopicError`` if none."""
        return list(self._topic(topic).queues)

    def max_offset(self, queue: MessageQueue) -> int:
        """The offset the next message of ``queue`` will get."""
        raw = self._client.get(self.queue_key(queue.topic, queue.queue_id, "seq"))
        return int(raw) if raw is not None else 0

    def min_offset(self, queue: MessageQueue) -> int:
        """The lowest stored offset of ``queue``."""
        # seq is read first: were the stream empty, a message sent between the
        # two reads would otherwise be skipped
        pipe = self._pipeline()
        pipe.get(self.queue_key(queue.topic, queue.queue_id, "seq"))
        pipe.xrange(self.queue_key(queue.topic, queue.queue_id, "log"), "-", "+", count=1)
        seq, first = pipe.execute()
        if first:
            return _offset_of(first[0][0])
        return int(seq) if seq is not None else 0

    def messages(self, queue: MessageQueue, start: int = 0, stop: int | None = None) -> list[MessageExt]:
        """The stored messages of ``queue`` in ``[start, stop)`` (tools, tests)."""
        hi = "+" if stop is None else f"{stop}-0"
        if stop is not None and stop <= start:
            return []
        entries = self._client.xrange(self.queue_key(queue.topic, queue.queue_id, "log"), f"{start + 1}-0", hi)
        return self._decode(queue, entries)

    def _decode(self, q: MessageQueue, entries: Sequence[Any]) -> list[MessageExt]:
        """Stream entries of ``q`` as messages.  An entry's fields come as
        the flat list ``[b"b", body, b"m", meta, b"s", stored]`` (the
        reader's raw XRANGE, see ``_raw_entries``) or as a dict (a cluster
        client's parsed reply).  Offsets are parsed from the ids only when
        the entries are not consecutive (never, unless a stream was edited)."""
        n = len(entries)
        if not n:
            return []
        first = _offset_of(entries[0][0])
        consecutive = n == 1 or _offset_of(entries[-1][0]) - first == n - 1
        topic = q.topic
        qid = q.queue_id
        bname = self.broker_name
        prefix = f"{self.namespace}-{topic}-{qid}-"
        loads = orjson.loads
        out = []
        off = first
        for eid, f in entries:
            if not consecutive:
                off = _offset_of(eid)
            if type(f) is list and len(f) == 6 and f[0] == b"b" and f[2] == b"m":
                body, raw, stored = f[1], f[3], f[5]
            else:
                if type(f) is list:
                    f = dict(zip(f[::2], f[1::2], strict=True))
                body, raw, stored = f[b"b"], f[b"m"], f[b"s"]
            meta = loads(raw)
            props = meta.get("p")
            rt = 0
            if props:
                try:
                    rt = reconsume_times_of(props)
                except ValueError:
                    rt = 0
            else:
                props = {}
            out.append(
                MessageExt(
                    topic, qid, off, body, meta.get("k"), meta.get("t"), props, meta.get("bt", 0), int(stored), rt,
                    prefix + str(off), bname,
                )  # fmt: skip
            )
            off += 1
        return out

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
        self._check_open()
        t = self._topic(topic)
        n = len(t.queues)
        limit = self.max_message_size
        born = now_ms()
        args: dict[int, list[bytes]] = {}
        order: list[tuple[int, int]] = []  # (queue, index within the queue's part)
        for item in items:
            body, keys, tags, props, qid = unpack_item(item)
            if type(body) is not bytes:
                raise TypeError(f"message body must be bytes, got {type(body).__name__}")
            if len(body) > limit:
                raise MessageTooLargeError(topic, len(body), limit)
            if keys is not None and type(keys) is not str:
                raise TypeError(f"keys must be str or None, got {type(keys).__name__}")
            if qid is not None:
                if type(qid) is not int or not 0 <= qid < n:
                    raise ValueError(f"queue_id must be an int in [0, {n}) for topic {topic!r}, got {qid!r}")
                q = qid
            elif keys:
                q = lane_of(keys, n)
            else:
                q = t.rr % n
                t.rr += 1
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
        first = self._store(topic, args)
        out = []
        for q, i in order:
            off = first[q][i // _CHUNK] + i % _CHUNK
            out.append(SendResult(t.queues[q], off, f"{self.namespace}-{topic}-{q}-{off}"))
        return out

    def _store(self, topic: str, args: Mapping[int, list[bytes]]) -> dict[int, list[int]]:
        """One SEND per queue (per ``_CHUNK`` messages of a queue), pipelined;
        returns per queue the first offset of each chunk."""
        pipe = self._pipeline()
        calls: list[int] = []
        for q in sorted(args):
            a = args[q]
            for start in range(0, len(a), 2 * _CHUNK):
                part = a[start : start + 2 * _CHUNK]
                self._script(
                    self._s_send,
                    [self.queue_key(topic, q, "seq"), self.queue_key(topic, q, "log")],
                    [len(part) // 2, self._notify_channel(topic), *part],
                    pipe,
                )
                calls.append(q)
        res = pipe.execute()
        first: dict[int, list[int]] = {}
        for q, r in zip(calls, res, strict=True):
            first.setdefault(q, []).append(int(r[0]))
        return first

    # -- retries and dead letters ---------------------------------------------

    def _send_back(self, group: str, items: Sequence[tuple[MessageExt, int]]) -> list[BaseException | None]:
        levels = self._delay_levels
        target = retry_topic(group)
        now_ms = int(self._clock.time() * 1000)
        results: list[BaseException | None] = [None] * len(items)
        built: list[int] = []
        sched: list[Any] = []
        for i, item in enumerate(items):
            try:
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
                sched += (
                    uuid.uuid4().hex,
                    now_ms + round(levels[level - 1] * 1000),
                    message.body,
                    _meta(message, props),
                )
            except Exception as e:
                results[i] = e
            else:
                built.append(i)
        if not built:
            return results
        try:
            self._ensure_topic(target, 1)
            keys = [self.queue_key(target, 0, what) for what in ("sched", "sbody", "smeta")]
            self._script(self._s_schedule, keys, sched)
        except Exception as e:
            logger.warning(
                "storing %d retr%s for group %r failed: %s", len(built), "y" if len(built) == 1 else "ies", group, e
            )
            for i in built:
                results[i] = e
        return results

    def _send_to_dlq(self, group: str, items: Sequence[tuple[MessageExt, str, str]]) -> list[BaseException | None]:
        target = dlq_topic(group)
        results: list[BaseException | None] = [None] * len(items)
        built: list[int] = []
        a: list[bytes] = []
        for i, item in enumerate(items):
            try:
                message, reason, text = item
                check_message(message, self.max_message_size)
                if type(reason) is not str or type(text) is not str:
                    raise TypeError(f"reason and exception text must be str, got {reason!r}, {text!r}")
                props = origin_properties(message)
                props[DLQ_REASON] = reason
                props[DLQ_EXCEPTION] = text
                props[DLQ_GROUP] = group
                props[RECONSUME_TIME] = str(message.reconsume_times)
                a.append(message.body)
                a.append(_meta(message, props))
            except Exception as e:
                results[i] = e
            else:
                built.append(i)
        if not built:
            return results
        try:
            self._ensure_topic(target, 1)
            self._store(target, {0: a})
        except Exception as e:
            logger.warning("storing %d dead letter(s) for group %r failed: %s", len(built), group, e)
            for i in built:
                results[i] = e
        return results

    def deliver_due(self, group: str) -> int:
        """Move ``group``'s due delayed retries to its retry topic now (polls
        do this on their own); return how many were moved."""
        moved, _ = self._move_due(None, group)
        return int(moved)

    def _move_due(self, pipe: Any, group: str) -> Any:
        target = retry_topic(group)
        return self._script(
            self._s_move,
            [
                self.queue_key(target, 0, "sched"),
                self.queue_key(target, 0, "sbody"),
                self.queue_key(target, 0, "smeta"),
                self.queue_key(target, 0, "seq"),
                self.queue_key(target, 0, "log"),
            ],
            [int(self._clock.time() * 1000), _MOVE_LIMIT, self._notify_channel(target)],
            pipe,
        )

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

    def committed(self, group: str, queue: MessageQueue) -> OffsetAndMetadata | None:
        """What ``group`` committed for ``queue`` (admin view)."""
        raw = self._client.hget(self.group_key(group, "offsets"), _qfield(queue))
        if raw is None:
            return None
        off, meta = orjson.loads(raw)
        return OffsetAndMetadata(off, meta)

    # -- lifecycle ------------------------------------------------------------

    def _check_open(self) -> None:
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
        for c in list(self._consumers):
            try:
                c.close()
            except Exception:
                logger.exception("closing %r failed", c)
        self._closed = True
        if self._own_client:
            self._client.close()

    def __enter__(self) -> RedisBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RedisBroker {self.namespace!r}{' closed' if self._closed else ''}>"


def _raw_entries(response: Any, **options: Any) -> Any:
    return response


def _offset_of(eid: bytes | str) -> int:
    if isinstance(eid, bytes):
        eid = eid.decode()
    return int(eid.split("-", 1)[0]) - 1


def _meta(message: MessageExt, props: dict[str, str]) -> bytes:
    meta: dict[str, Any] = {"bt": message.born_timestamp, "p": props}
    if message.keys:
        meta["k"] = message.keys
    if message.tags:
        meta["t"] = message.tags
    return orjson.dumps(meta)


class _Notifier:
    """A daemon thread on its own pub/sub connection: every message on the
    subscribed channels (new messages of a topic, membership changes of the
    group) sets the consumer's event, so a waiting poll reads at once.
    Channels are added from the owning thread through a list the notifier
    thread subscribes from (a PubSub is not thread-safe).  Losing the
    connection only makes polls fall back to their wait slices."""

    def __init__(self, client: redis.Redis, event: threading.Event, name: str) -> None:
        # Any: redis-py's pubsub() is unannotated (see RedisBroker._client)
        self._client: Any = client
        self._event = event
        self._lock = threading.Lock()
        self._new: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, channel: str) -> None:
        with self._lock:
            self._new.append(channel)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        ps = self._client.pubsub(ignore_subscribe_messages=True)
        channels: set[str] = set()
        down = False
        try:
            while not self._stop.is_set():
                try:
                    with self._lock:
                        new, self._new = self._new, []
                    new = [c for c in new if c not in channels]
                    if new:
                        ps.subscribe(*new)
                        channels.update(new)
                    if not channels:
                        self._stop.wait(0.05)
                        continue
                    msg = ps.get_message(timeout=0.2)
                    if down:
                        down = False
                        self._event.set()
                    if msg is not None:
                        self._event.set()
                except Exception as e:
                    if self._stop.is_set():
                        break
                    if not down:
                        logger.debug("pub/sub connection lost (%s); reconnecting", e)
                        down = True
                    try:
                        ps.close()
                    except Exception:
                        pass
                    ps = self._client.pubsub(ignore_subscribe_messages=True)
                    with self._lock:
                        self._new.extend(channels)
                    channels = set()
                    self._stop.wait(0.2)
        finally:
            try:
                ps.close()
            except Exception:
                pass


class _Sequential:
    """Stands in for a pipeline on a Redis Cluster client: runs each command
    at once and collects the results for :meth:`execute`."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.results: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> None:
            self.results.append(method(*args, **kwargs))

        return call

    def execute(self) -> list[Any]:
        out, self.results = self.results, []
        return out


class _QState:
    __slots__ = ("log_key", "mq", "paused", "pos", "tags")

    def __init__(self, mq: MessageQueue, log_key: str, pos: int, tags: frozenset[str] | None) -> None:
        self.mq = mq
        self.log_key = log_key
        self.pos = pos
        self.paused = False
        self.tags = tags


class RedisPullConsumer(QueueStates[_QState], PullSource):
    """A member of a consumer group on a :class:`RedisBroker`; see
    :class:`~lite_push.sources.PullSource`.  Owned by one thread; only
    :meth:`wakeup` may be called from others."""

    _broker: RedisBroker

    def __init__(
        self,
        broker: RedisBroker,
        group: str,
        *,
        consume_from: ConsumeFromWhere = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp: int | None = None,
        client_id: str | None = None,
        allocate: AllocateStrategy = AVERAGELY,
        message_model: MessageModel = MessageModel.CLUSTERING,
        offset_file: str | os.PathLike[str] | None = None,
    ) -> None:
        check_message_model(message_model, offset_file)
        if not isinstance(group, str) or not group:
            raise ConfigError("group", f"must be a non-empty string, got {group!r}")
        if not isinstance(consume_from, ConsumeFromWhere):
            raise ConfigError("consume_from", f"must be a ConsumeFromWhere, got {consume_from!r}")
        if client_id is not None and (not isinstance(client_id, str) or not client_id):
            raise ConfigError("client_id", f"must be a non-empty string, got {client_id!r}")
        if not callable(allocate):
            raise ConfigError("allocate", f"must be an allocation strategy, got {allocate!r}")
        broker._check_open()
        self._broker = broker
        self._client: Any = broker._client
        self._group = group
        if client_id is None:
            client_id = f"{socket.gethostname()}@{os.getpid()}@{next(broker._client_seq):06d}@{uuid.uuid4().hex[:8]}"
        others: list[RedisPullConsumer] = list(broker._consumers)
        if any(c._group == group and c._cid == client_id for c in others):
            raise ConfigError("client_id", f"{client_id!r} is already used by an open consumer of group {group!r}")
        self._cid: str = client_id
        self._consume_from = consume_from
        self._consume_timestamp = consume_timestamp
        self._allocate = allocate
        self._ttl_ms = max(1, round(broker.session_timeout * 1000))
        self._listener: RebalanceListener | None = None
        self._filters: dict[str, frozenset[str] | None] = {}
        self._states: dict[MessageQueue, _QState] = {}
        self._active: list[_QState] = []
        self._rr = 0
        self._seen_version: bytes | None = None
        self._pending = False
        # revoked after on_revoked, whose owner keys could not be deleted yet
        self._unreleased: set[MessageQueue] = set()
        self._last_hb = -math.inf
        self._last_rebalance = -math.inf
        self._locks: set[MessageQueue] = set()
        self._wakeup_flag = False
        self._event = threading.Event()
        self._closed = False
        self._down_since: float | None = None
        self._backoff = 0.1
        self._k_members = broker.group_key(group, "members")
        self._k_subs = broker.group_key(group, "subs")
        self._k_version = broker.group_key(group, "version")
        self._k_offsets = broker.group_key(group, "offsets")
        self._k_initial = broker.group_key(group, "initial")
        self._channel = broker.group_key(group, "events")
        self._notifier: _Notifier | None = None
        # BROADCASTING: every queue, offsets in a local file (opened last:
        # it locks the file, and nothing above may fail after that)
        self._store = open_offset_store(message_model, offset_file, broker.broker_name, group)
        broker._consumers.add(self)

    # -- identity -------------------------------------------------------------

    @property
    def group(self) -> str:
        return self._group

    @property
    def client_id(self) -> str:
        return self._cid

    def queue_count(self, topic: str) -> int | None:
        t = self._broker._topics.get(topic)  # cached by subscribe; no Redis call
        return len(t.queues) if t is not None else None

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"<RedisPullConsumer {self._group!r}/{self._cid!r}{' closed' if self._closed else ''}>"

    def _check_open(self) -> None:
        if self._closed:
            raise SourceClosedError(f"consumer {self._cid!r} of group {self._group!r} is closed")

    def _owner_key(self, q: MessageQueue) -> str:
        return self._broker.group_key(self._group, f"owner:{_qfield(q)}")

    def _lock_key(self, q: MessageQueue) -> str:
        return self._broker.group_key(self._group, f"lock:{_qfield(q)}")

    # -- subscription ---------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*") -> None:
        self._check_open()
        tags = parse_tag_expression(expression)
        broker = self._broker
        try:
            broker._topic(topic)
        except UnknownTopicError:
            if not is_retry_or_dlq_topic(topic):
                raise
            broker._ensure_topic(topic, 1)
        new = topic not in self._filters
        if new:
            if self._notifier is None:
                self._notifier = _Notifier(self._client, self._event, f"lite-push-redis-notify-{self._cid}")
                if self._store is None:
                    self._notifier.add(self._channel)
                    self._notifier.add(broker._notify_channel(retry_topic(self._group)))
            self._notifier.add(broker._notify_channel(topic))
        self._filters[topic] = tags
        for st in self._states.values():
            if st.mq.topic == topic:
                st.tags = tags
        if new:
            if self._store is not None:
                self._pending = True  # the next poll takes the topic's queues
            else:
                self._heartbeat()  # join: bumps the group's version
                self._seen_version = None

    def set_rebalance_listener(self, listener: RebalanceListener | None) -> None:
        self._check_open()
        self._listener = listener

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
                batches, wait_hint = self._poll_once(max_per_queue)
            except _CONN_ERRORS as e:
                if self._down_since is None:
                    self._down_since = time.monotonic()
                    logger.warning("%r: Redis connection lost (%s); retrying with back-off", self, e)
                wait = min(self._backoff, max(0.0, deadline - time.monotonic()))
                self._backoff = min(self._backoff * 2, 2.0)
                if wait > 0:
                    self._event.wait(wait)
                self._wakeup_flag = False
                return []
            if self._down_since is not None:
                logger.warning("%r: Redis connection back after %.1f s", self, time.monotonic() - self._down_since)
                self._down_since = None
                self._backoff = 0.1
            if batches is None:  # the assignment changed: read again at once
                continue
            if batches:
                return batches
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self._check_open()
            self._event.wait(max(_MIN_WAIT, min(remaining, _WAIT_SLICE, wait_hint)))
            self._check_open()

    def _poll_once(self, max_per_queue: int) -> tuple[list[PollBatch] | None, float]:
        broker = self._broker
        if self._store is not None and self._pending and self._assign_all():
            self._check_open()
            return None, 0.0
        subscribed = bool(self._filters) and self._store is None
        pipe = broker._pipeline(reader=True)
        if subscribed:
            pipe.get(self._k_version)
        broker._move_due(pipe, self._group)
        active = self._active
        n = len(active)
        if n:
            start = self._rr % n
            self._rr = start + 1
            order = active[start:] + active[:start]
        else:
            order = []
        for st in order:
            count = max_per_queue if st.tags is None else 4 * max_per_queue + _SCAN_EXTRA
            pipe.xrange(st.log_key, f"{st.pos + 1}-0", "+", count=count)
        # Parsing and decoding a big read only creates live objects: the
        # cyclic GC is paused meanwhile (else it runs a collection every
        # few hundred entries and costs a third of the read).
        pause = n * max_per_queue >= _GC_PAUSE_MIN and gc.isenabled()
        if pause:
            gc.disable()
        try:
            res = pipe.execute()
        finally:
            if pause:
                gc.enable()
        i = 0
        if subscribed:
            version = res[0]
            i = 1
            now = time.monotonic()
            if (
                version != self._seen_version
                or self._pending
                or now - self._last_hb >= broker.heartbeat_interval
                or now - self._last_rebalance >= broker.rebalance_interval
            ):
                if self._rebalance():
                    self._check_open()
                    return None, 0.0
        _moved, nxt = res[i]
        nxt = float(nxt)
        wait_hint = _WAIT_SLICE
        if nxt >= 0:
            wait_hint = max(_MIN_WAIT, nxt / 1000.0 - broker._clock.time())
        out: list[PollBatch] = []
        if pause:
            gc.disable()
        try:
            self._decode_into(out, order, res[i + 1 :], max_per_queue)
        finally:
            if pause:
                gc.enable()
        return out, wait_hint

    def _decode_into(
        self, out: list[PollBatch], order: list[_QState], replies: list[Any], max_per_queue: int
    ) -> None:
        broker = self._broker
        for st, entries in zip(order, replies, strict=True):
            if not entries or self._states.get(st.mq) is not st or st.paused:
                continue
            mq = st.mq
            if st.tags is None:
                msgs = broker._decode(mq, entries)
                st.pos = msgs[-1].queue_offset + 1
                out.append(PollBatch(mq, msgs, st.pos))
            else:
                tags = st.tags
                picked: list[MessageExt] = []
                nxt_off = st.pos
                for m in broker._decode(mq, entries):
                    nxt_off = m.queue_offset + 1
                    if m.tags in tags:
                        picked.append(m)
                        if len(picked) >= max_per_queue:
                            break
                st.pos = nxt_off
                out.append(PollBatch(mq, picked, nxt_off))

    # -- rebalance ------------------------------------------------------------

    def _heartbeat(self) -> tuple[bytes, list[MessageQueue], dict[str, list[str]]]:
        """Run HEARTBEAT; return (version, owned queues lost, topic -> cids)."""
        owned = sorted(self._states)
        broker = self._broker
        version, flags, subs = broker._s_heartbeat(
            keys=[self._k_members, self._k_subs, self._k_version, *(self._owner_key(q) for q in owned)],
            args=[self._cid, self._ttl_ms, orjson.dumps(sorted(self._filters)), self._channel],
        )
        self._last_hb = time.monotonic()
        lost = [q for q, f in zip(owned, flags, strict=True) if not int(f)]
        by_topic: dict[str, list[str]] = {}
        for j in range(0, len(subs), 2):
            cid = subs[j].decode()
            for topic in orjson.loads(subs[j + 1]):
                by_topic.setdefault(topic, []).append(cid)
        if isinstance(version, int):
            version = str(version).encode()
        return version, lost, by_topic

    def _release(self) -> None:
        """Compare-and-delete the owner keys of the queues revoked (after
        their on_revoked); kept for the next rebalance if Redis fails."""
        if self._unreleased:
            qs = list(self._unreleased)
            self._broker._s_release(
                keys=[self._k_version, *(self._owner_key(q) for q in qs)], args=[self._cid, self._channel]
            )
            self._unreleased.difference_update(qs)

    def _rebalance(self) -> bool:
        """Bring the owned set to the target; return whether it changed."""
        broker = self._broker
        self._release()  # what a failed rebalance left
        version, lost, by_topic = self._heartbeat()
        self._last_rebalance = time.monotonic()
        target: set[MessageQueue] = set()
        for topic in self._filters:
            queues = broker._topic(topic).queues
            cids = sorted(set(by_topic.get(topic, ())) | {self._cid})
            share = self._allocate(self._group, self._cid, queues, cids)
            target.update(q for q in share if q.topic == topic)
        lost_set = set(lost)
        drop = [q for q in self._states if q not in target and q not in lost_set]
        revoked = sorted(lost + drop)
        changed = False
        if lost:
            logger.warning("group %r: %r lost %s (its session expired)", self._group, self._cid, [str(q) for q in lost])
        if revoked:
            self._notify("on_revoked", revoked)
            for q in revoked:
                self._states.pop(q, None)
            self._rebuild_active()
            self._unreleased.update(drop)
            changed = True
            self._release()
        new = sorted(q for q in target if q not in self._states)
        taken: list[MessageQueue] = []
        if new:
            flags = broker._s_acquire(keys=[self._owner_key(q) for q in new], args=[self._cid, self._ttl_ms])
            taken = [q for q, f in zip(new, flags, strict=True) if int(f)]
            # all positions first: if Redis fails here, nothing is half taken
            # (the owner keys are ours; the next attempt takes them again)
            positions = [self._start_position(q) for q in taken]
            for q, pos in zip(taken, positions, strict=True):
                log_key = broker.queue_key(q.topic, q.queue_id, "log")
                self._states[q] = _QState(q, log_key, pos, self._filters.get(q.topic))
        self._pending = len(taken) < len(new)
        self._seen_version = version
        if changed or taken:
            self._rebuild_active()
        if taken:
            self._notify("on_assigned", taken)
            changed = True
        return changed

    def _assign_all(self) -> bool:
        """BROADCASTING: own every queue of the subscribed topics, each from
        its offset in the local file, else from ``consume_from`` (stored in
        the file at once, so a restart before the first commit starts there
        too).  Return whether queues were added."""
        broker = self._broker
        new = sorted(q for topic in self._filters for q in broker._topic(topic).queues if q not in self._states)
        store = self._store
        assert store is not None
        starts: dict[MessageQueue, int] = {}
        fresh: dict[MessageQueue, OffsetAndMetadata] = {}
        for q in new:
            lo, hi = broker.min_offset(q), broker.max_offset(q)
            om = store.get(q)
            if om is None:
                pos = self._initial_position(q, lo, hi)
                fresh[q] = OffsetAndMetadata(pos)
            else:
                pos = om.offset
            starts[q] = min(max(pos, lo), hi)
        if fresh:
            try:
                store.commit(fresh)
            except OSError as e:
                logger.warning("%r: storing the start offsets in %s failed: %s", self, store.path, e)
        for q, pos in starts.items():
            self._states[q] = _QState(q, broker.queue_key(q.topic, q.queue_id, "log"), pos, self._filters.get(q.topic))
        self._pending = False
        if new:
            self._rebuild_active()
            self._notify("on_assigned", new)
        return bool(new)

    def _initial_position(self, q: MessageQueue, lo: int, hi: int) -> int:
        """Where ``consume_from`` starts on ``q`` (stored range ``[lo, hi)``)."""
        return initial_position(
            self._consume_from, self._consume_timestamp, lo, hi, lambda ts: self._search_timestamp(q, lo, hi, ts)
        )

    def _start_position(self, q: MessageQueue) -> int:
        broker = self._broker
        lo, hi = broker.min_offset(q), broker.max_offset(q)
        field = _qfield(q)
        raw = self._client.hget(self._k_offsets, field)
        if raw is not None:
            return min(max(int(orjson.loads(raw)[0]), lo), hi)
        init = self._client.hget(self._k_initial, field)
        if init is None:
            pos = self._initial_position(q, lo, hi)
            self._client.hsetnx(self._k_initial, field, str(pos))
            init = self._client.hget(self._k_initial, field)
        return min(max(int(init), lo), hi)

    def _search_timestamp(self, q: MessageQueue, lo: int, hi: int, ts: int) -> int:
        """The first offset in [lo, hi) stored at or after ``ts`` (hi if none)."""
        key = self._broker.queue_key(q.topic, q.queue_id, "log")

        def stored(off: int) -> int:
            e = self._client.xrange(key, f"{off + 1}-0", f"{off + 1}-0")
            return int(e[0][1][b"s"]) if e else 0

        return bisect.bisect_left(range(lo, hi), ts, key=stored) + lo

    # -- queue control: assignment, pause, resume (QueueStates) ---------------

    def seek(self, queue: MessageQueue, offset: int) -> None:
        """Next poll of ``queue`` starts at ``offset`` clamped to the stored range."""
        self._check_open()
        st = self._owned(queue)
        lo, hi = self._broker.min_offset(queue), self._broker.max_offset(queue)
        st.pos = min(max(int(offset), lo), hi)

    def position(self, queue: MessageQueue) -> int:
        self._check_open()
        return self._owned(queue).pos

    # -- offsets --------------------------------------------------------------

    def commit(self, offsets: Mapping[MessageQueue, OffsetAndMetadata | int]) -> None:
        """Store offsets of the queues whose owner key holds this member."""
        self._check_open()
        entries = commit_entries(offsets)
        if self._store is not None:
            self._commit_local(entries)
            return
        if not entries:
            return
        keys = [self._owner_key(q) for q in entries]
        args: list[Any] = [self._cid]
        for q, om in entries.items():
            args += (_qfield(q), orjson.dumps([om.offset, om.metadata]))
        stored = self._broker._s_commit(keys=[self._k_offsets, *keys], args=args)
        if int(stored) < len(keys):
            logger.debug("%r: %d commit(s) ignored: not its queues", self, len(keys) - int(stored))

    def committed(self, queue: MessageQueue) -> OffsetAndMetadata | None:
        self._check_open()
        if self._store is not None:
            return self._store.get(queue)
        return self._broker.committed(self._group, queue)

    # -- broker-side queue locks ----------------------------------------------

    def lock(self, queues: Collection[MessageQueue], lease: float) -> frozenset[MessageQueue]:
        self._check_open()
        if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not lease > 0:
            raise ValueError(f"lease must be positive, got {lease!r}")
        qs = list(dict.fromkeys(queues))
        if not qs:
            return frozenset()
        if self._store is not None:  # BROADCASTING: no other member reads "our" copy
            return frozenset(qs)
        flags = self._broker._s_lock(
            keys=[self._lock_key(q) for q in qs], args=[self._cid, max(1, round(lease * 1000))]
        )
        held = frozenset(q for q, f in zip(qs, flags, strict=True) if int(f))
        self._locks |= held
        return held

    def unlock(self, queues: Collection[MessageQueue]) -> None:
        self._check_open()
        qs = list(dict.fromkeys(queues))
        if not qs or self._store is not None:
            return
        self._broker._s_unlock(keys=[self._lock_key(q) for q in qs], args=[self._cid])
        self._locks.difference_update(qs)

    # -- failures -------------------------------------------------------------

    @property
    def delay_levels(self) -> tuple[float, ...]:
        return self._broker.delay_levels

    def send_back(self, items: Sequence[tuple[MessageExt, int]]) -> list[BaseException | None]:
        """See :meth:`PullSource.send_back`: the copies wait in the group's
        schedule until due, then a poll moves them to ``%RETRY%<group>``."""
        self._check_open()
        if self._store is not None:
            return [no_send_back(self)] * len(items)
        return self._broker._send_back(self._group, items)

    def send_to_dlq(self, items: Sequence[tuple[MessageExt, str, str]]) -> list[BaseException | None]:
        self._check_open()
        return self._broker._send_to_dlq(self._group, items)

    # -- lifecycle ------------------------------------------------------------

    def wakeup(self) -> None:
        self._wakeup_flag = True
        self._event.set()

    def close(self) -> None:
        """Leave the group: owned queues and locks are released at once
        (nothing is committed, no listener runs)."""
        if self._closed:
            return
        self._closed = True
        self._broker._consumers.discard(self)
        self._event.set()
        if self._notifier is not None:
            self._notifier.stop()
        keys = [self._owner_key(q) for q in (*self._states, *self._unreleased)]
        keys += [self._lock_key(q) for q in self._locks]
        if self._store is not None:
            self._store.close()
            keys = []
        try:
            if self._filters and self._store is None:
                self._broker._s_leave(
                    keys=[self._k_members, self._k_subs, self._k_version, *keys], args=[self._cid, self._channel]
                )
            elif keys:
                self._broker._s_unlock(keys=keys, args=[self._cid])
        except _CONN_ERRORS as e:
            logger.warning("%r: leaving the group failed (%s); its session will expire", self, e)
        self._states.clear()
        self._active = []
        self._locks.clear()

    def __enter__(self) -> RedisPullConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
