"""The queues of a topic and the offsets they hold, on any source: what
``topic describe`` prints and ``group describe`` / ``group reset-offsets``
measure lag and targets against."""

from __future__ import annotations

from dataclasses import dataclass

from .._types import MessageQueue
from .sources import Broker

__all__ = ["QueueRange", "queue_ranges"]


@dataclass(frozen=True)
class QueueRange:
    """One queue's stored offsets: ``first`` is the lowest stored offset,
    ``end`` the offset its next message will get (``end - first`` messages
    are stored)."""

    queue: MessageQueue
    first: int
    end: int


def queue_ranges(broker: Broker, topic: str) -> list[QueueRange]:
    """Every queue of ``topic`` with its stored range, in queue order;
    ``UnknownTopicError`` when the source has no such topic."""
    out = []
    for q in broker.queues(topic):
        if hasattr(broker, "watermarks"):  # Kafka: one request per partition
            first, end = broker.watermarks(q)
        else:
            first, end = broker.min_offset(q), broker.max_offset(q)
        out.append(QueueRange(q, first, end))
    return out
