"""The topics of one Redis namespace: their queue counts (``ns:topics``,
cached once read), and where each queue's messages are stored.  The first
topic read from Redis loads the Redis Function library
(:class:`~.functions.FunctionLoader`).

Thread-safe: the cache is filled under a lock; a topic's queue count never
changes once it exists.
"""

from __future__ import annotations

import bisect
import threading

from ..._errors import UnknownTopicError
from ..._types import MessageExt, MessageQueue
from .._sending import RoundRobin
from .codec import decode, offset_of
from .connection import Connection

__all__ = ["TopicCatalog", "TopicInfo"]


class TopicInfo:
    """One topic: its queues, and the round robin of messages sent to it
    without a key or a queue."""

    __slots__ = ("name", "queues", "rr")

    def __init__(self, name: str, broker_name: str, count: int) -> None:
        self.name = name
        self.queues = [MessageQueue(name, broker_name, i) for i in range(count)]
        self.rr = RoundRobin()


class TopicCatalog:
    """The topics of ``conn``'s namespace; their queues name ``broker_name``."""

    def __init__(self, conn: Connection, broker_name: str) -> None:
        self._conn = conn
        self._broker_name = broker_name
        self._topics: dict[str, TopicInfo] = {}
        self._lock = threading.Lock()

    def ensure(self, topic: str, queue_count: int) -> TopicInfo:
        """The topic, created with ``queue_count`` queues if it does not exist."""
        t = self._topics.get(topic)
        if t is not None:
            return t
        self._conn.functions.ensure()
        key = self._conn.topics_key()
        pipe = self._conn.pipeline()
        pipe.hsetnx(key, topic, str(queue_count))
        pipe.hget(key, topic)
        _, raw = pipe.execute()
        return self._cache(topic, int(raw))

    def _cache(self, topic: str, count: int) -> TopicInfo:
        with self._lock:
            t = self._topics.get(topic)
            if t is None:
                t = self._topics[topic] = TopicInfo(topic, self._broker_name, count)
            return t

    def get(self, topic: str) -> TopicInfo:
        """The topic (cached); ``UnknownTopicError`` if Redis has none."""
        t = self._topics.get(topic)
        if t is not None:
            return t
        self._conn.functions.ensure()
        raw = self._conn.client.hget(self._conn.topics_key(), topic)
        if raw is None:
            raise UnknownTopicError(topic)
        return self._cache(topic, int(raw))

    def cached(self, topic: str) -> TopicInfo | None:
        """The topic if it was read already (no Redis call)."""
        return self._topics.get(topic)

    def names(self) -> list[str]:
        """Every topic's name, sorted."""
        return sorted(k.decode() for k in self._conn.client.hkeys(self._conn.topics_key()))

    def queues(self, topic: str) -> list[MessageQueue]:
        """The queues of ``topic``, sorted.  ``UnknownTopicError`` if none."""
        return list(self.get(topic).queues)

    # -- stored messages --------------------------------------------------------

    def messages(self, queue: MessageQueue, start: int = 0, stop: int | None = None) -> list[MessageExt]:
        """The stored messages of ``queue`` in ``[start, stop)`` (tools, and a
        consumer reading its group's dead letters; malformed entries are
        left out)."""
        if stop is not None and stop <= start:
            return []
        hi = "+" if stop is None else f"{stop}-0"
        log = self._conn.queue_key(queue.topic, queue.queue_id, "log")
        entries = self._conn.client.xrange(log, f"{start + 1}-0", hi)
        return decode(self._broker_name, queue, entries, [])

    def max_offset(self, queue: MessageQueue) -> int:
        """The offset the next message of ``queue`` will get (past a
        foreign entry above the queue's ``seq``: see ``scripts.QUEUE_END``)."""
        keys = [self._conn.queue_key(queue.topic, queue.queue_id, what) for what in ("seq", "log")]
        return int(self._conn.run(self._conn.queue_end, keys, []))

    def min_offset(self, queue: MessageQueue) -> int:
        """The lowest stored offset of ``queue``."""
        # seq is read first: were the stream empty, a message sent between the
        # two reads would otherwise be skipped
        pipe = self._conn.pipeline()
        pipe.get(self._conn.queue_key(queue.topic, queue.queue_id, "seq"))
        pipe.xrange(self._conn.queue_key(queue.topic, queue.queue_id, "log"), "-", "+", count=1)
        seq, first = pipe.execute()
        if first:
            return offset_of(first[0][0])
        return int(seq) if seq is not None else 0

    def stored_range(self, queue: MessageQueue) -> tuple[int, int]:
        """``(min_offset, max_offset)`` of ``queue``."""
        return self.min_offset(queue), self.max_offset(queue)

    def first_stored_at(self, queue: MessageQueue, lo: int, hi: int, timestamp: int) -> int:
        """The first offset in ``[lo, hi)`` of ``queue`` stored at or after
        ``timestamp`` (epoch ms; the server's store time), ``hi`` if none:
        a bisection, one short XRANGE per step.  An offset without an entry
        (a gap) or a foreign entry without a store time counts as the next
        entry that has one."""
        key = self._conn.queue_key(queue.topic, queue.queue_id, "log")
        client = self._conn.client

        def stored(off: int) -> int:
            start: bytes | str = f"{off + 1}-0"
            for _ in range(8):  # usually one step: the entry at off
                got = client.xrange(key, start, "+", count=1)
                if not got:
                    break
                eid, fields = got[0]
                raw = fields.get(b"s")
                if raw is not None and raw.isdigit():
                    return int(raw)
                start = b"(" + eid if isinstance(eid, bytes) else f"({eid}"
            return 1 << 62  # nothing (readable) stored from off on

        return bisect.bisect_left(range(lo, hi), timestamp, key=stored) + lo
