"""Reading a partition by offset without joining a group.

Tools (``lite_push.dlq``, ``lite-push dlq``) and a member that reads its
group's dead-letter topic back (``dead_letter_order="key"``) read records
between two offsets: a short-lived consumer of the reader group
``lite-push-reader`` is assigned the partition at the first offset (it
never subscribes, so it joins nothing and commits nothing), and records it
cannot decode are left out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from ..._types import MessageExt, MessageQueue
from .client_log import LIBRDKAFKA_LOG
from .codec import MalformedRecord, RecordFormat, kafka_topic
from .topics import TopicCatalog

__all__ = ["READ_TIMEOUT", "OffsetReader"]

#: Longest one :meth:`OffsetReader.messages` call reads (seconds).
READ_TIMEOUT = 30.0


class OffsetReader:
    """Reads stored records by offset (``KafkaBroker.reader``): ``settings``
    make each reading client (the broker's client settings), ``catalog``
    knows the topics, ``fmt`` turns records into messages, ``check_open``
    raises once the broker is closed.  Thread-safe: each read has a client
    of its own; watermarks may share one (:meth:`shared_client`)."""

    __slots__ = ("_catalog", "_check_open", "_fmt", "_settings", "_shared", "_shared_lock")

    def __init__(
        self,
        settings: Callable[[Mapping[str, Any]], dict[str, Any]],
        catalog: TopicCatalog,
        fmt: RecordFormat,
        check_open: Callable[[], None],
    ) -> None:
        self._settings = settings
        self._catalog = catalog
        self._fmt = fmt
        self._check_open = check_open
        self._shared: Consumer | None = None
        #: Guards the making and closing of the shared client.
        self._shared_lock = threading.Lock()

    def shared_client(self) -> Consumer:
        """One reading client for watermark requests, made on first use and
        kept until :meth:`close` (librdkafka answers watermark requests from
        any thread)."""
        with self._shared_lock:
            if self._shared is None:
                self._shared = self.client()
            return self._shared

    def close(self) -> None:
        """Close the shared client, if one was made."""
        with self._shared_lock:
            shared, self._shared = self._shared, None
        if shared is not None:
            shared.close()

    def client(self) -> Consumer:
        """A new reading client (the caller closes it)."""
        return Consumer(
            self._settings({"group.id": "lite-push-reader", "enable.auto.commit": "false", "logger": LIBRDKAFKA_LOG})
        )

    @staticmethod
    def marks(c: Consumer, name: str, partition: int) -> tuple[int, int]:
        """``(low, high)`` watermarks of partition ``partition`` of Kafka
        topic ``name``, through client ``c``."""
        marks = c.get_watermark_offsets(TopicPartition(name, partition), timeout=10.0)
        if marks is None:
            raise TimeoutError(f"no watermarks for {name}-{partition}")
        return int(marks[0]), int(marks[1])

    def queues(self, topic: str) -> list[MessageQueue]:
        """The queues of ``topic``, sorted; ``UnknownTopicError`` if none."""
        return self._catalog.queues(topic)

    def messages(self, queue: MessageQueue, start: int = 0, stop: int | None = None) -> list[MessageExt]:
        """The stored messages of ``queue`` at offsets ``[start, stop)`` (up
        to the partition's end when it was asked; at most
        :data:`READ_TIMEOUT` of reading; malformed records are left out)."""
        self._check_open()
        name = kafka_topic(queue.topic)
        c = self.client()
        try:
            lo, hi = self.marks(c, name, queue.queue_id)
            end = hi if stop is None else min(stop, hi)
            begin = max(start, lo)
            out: list[MessageExt] = []
            if begin >= end:
                return out
            c.assign([TopicPartition(name, queue.queue_id, begin)])
            deadline = time.monotonic() + READ_TIMEOUT
            pos = begin
            while pos < end and time.monotonic() < deadline:
                for rec in c.consume(500, 0.2):
                    if rec.error() is not None:
                        continue
                    off = int(rec.offset() or 0)
                    pos = off + 1
                    if off >= end:
                        break
                    try:
                        out.append(self._fmt.decode(rec, queue.topic))
                    except MalformedRecord:
                        continue
            return out
        finally:
            c.close()
