"""Pure-Python twin of ``lite_push._kernels.kafka_fetch_c``: the fetcher's client on
confluent-kafka's ``Consumer`` (manual assignment, no group callbacks).

Each record ``consume`` returns is a confluent-kafka ``Message``, decoded
into its message as it is filed (``reading.file_records``); the compiled
twin reads librdkafka's records directly and makes no ``Message``.  Both
have the same methods, and the same results (``tests/test_kafka_fetch.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, TopicPartition

from .client_log import LogSink
from .codec import RecordFormat
from .reading import PartitionState, file_records

__all__ = ["FetchClient"]


class FetchClient:
    """A consumer client that reads by manual assignment: ``settings`` are
    librdkafka properties (strings), its log lines go to ``logger``.  One
    thread at a time.  Errors are confluent-kafka's ``KafkaException``."""

    __slots__ = ("_kc",)

    def __init__(self, settings: Mapping[str, str], logger: LogSink) -> None:
        self._kc = Consumer({**settings, "logger": logger})

    def read(
        self,
        by_name: dict[tuple[str, int], PartitionState],
        count: int,
        timeout: float,
        fmt: RecordFormat,
        owner: object,
    ) -> int:
        """Fetch up to ``count`` records (waiting up to ``timeout`` seconds
        for the first) and file each in its partition's state of
        ``by_name``, decoded in ``fmt`` (``reading.file_records``); return
        how many records came."""
        if count <= 0:
            return 0
        records = self._kc.consume(count, timeout)
        if records:
            file_records(by_name, records, fmt, owner)
        return len(records)

    def load_metadata(self, topic: str, timeout: float) -> None:
        """Ask for ``topic``'s metadata (a client starts fetching a topic it
        knows at once)."""
        self._kc.list_topics(topic, timeout=timeout)

    def assign(self, partitions: list[tuple[str, int, int]]) -> None:
        """Read ``(topic, partition, offset)``s from their offsets."""
        self._kc.incremental_assign([TopicPartition(t, p, o) for t, p, o in partitions])

    def unassign(self, partitions: list[tuple[str, int]]) -> None:
        """Stop reading ``(topic, partition)``s."""
        self._kc.incremental_unassign(_tps(partitions))

    def pause(self, partitions: list[tuple[str, int]]) -> None:
        """Stop fetching ``(topic, partition)``s."""
        self._kc.pause(_tps(partitions))

    def resume(self, partitions: list[tuple[str, int]]) -> None:
        """Fetch ``(topic, partition)``s again."""
        self._kc.resume(_tps(partitions))

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Fetch ``topic``'s ``partition`` from ``offset`` (no wait)."""
        self._kc.seek(TopicPartition(topic, partition, offset))

    def watermarks(self, topic: str, partition: int, timeout: float) -> tuple[int, int]:
        """``(low, high)`` of a partition, asked of its broker."""
        lo, hi = self._kc.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
        return int(lo), int(hi)

    def cached_high(self, topic: str, partition: int) -> int | None:
        """The high watermark of a partition as last fetched (no request);
        ``None`` when it was not fetched yet."""
        found: Any = self._kc.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        if found is None:
            return None
        hi = found[1]
        return None if hi is None or hi < 0 or hi == OFFSET_INVALID else int(hi)

    def close(self) -> None:
        """Stop fetching and let go of the client (idempotent)."""
        self._kc.close()


def _tps(partitions: list[tuple[str, int]]) -> list[TopicPartition]:
    return [TopicPartition(t, p) for t, p in partitions]
