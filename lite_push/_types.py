"""Value types shared by every part of lite_push.

``MessageQueue`` is frozen, hashable and orderable (allocation strategies sort
it).  ``MessageExt`` is slotted and, on the hot path, shared between the source
and the runtime: treat it as read-only.  The runtime copies a message before it
changes anything on it (for example ``reconsume_times`` on a retry).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

__all__ = [
    "AsyncListener",
    "ConsumeResult",
    "Listener",
    "MessageExt",
    "MessageQueue",
    "OffsetAndMetadata",
    "PollBatch",
    "SendResult",
]


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    """One queue (Kafka: partition) of a topic on one broker.

    Ordered by ``(topic, broker_name, queue_id)``, which is the order
    RocketMQ's allocation strategies sort queues in.
    """

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}#{self.queue_id}"


@dataclass(slots=True)
class MessageExt:
    """A message as the consumer sees it.

    ``queue_offset`` is the message's position in its queue; offsets of one
    queue are consecutive integers from 0 (a consumer may see gaps where the
    source filtered messages by tag).  Timestamps are milliseconds since the
    epoch.
    """

    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    keys: str | None = None
    tags: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    born_timestamp: int = 0
    store_timestamp: int = 0
    reconsume_times: int = 0
    msg_id: str = ""
    broker_name: str = "embedded"

    @property
    def queue(self) -> MessageQueue:
        """The :class:`MessageQueue` this message was stored in."""
        return MessageQueue(self.topic, self.broker_name, self.queue_id)


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where a sent message was stored."""

    queue: MessageQueue
    offset: int
    msg_id: str


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    """A committed position: the next offset to consume, plus free-form
    metadata the committer stored with it (empty when none)."""

    offset: int
    metadata: str = ""


@dataclass(frozen=True, slots=True)
class PollBatch:
    """What one poll returned for one queue.

    ``messages`` are in increasing offset order.  ``next_offset`` is the
    offset after the last message the source scanned for this batch, filtered
    messages included, so a consumer whose work is all done may commit
    ``next_offset``.  A batch may hold no messages when everything scanned was
    filtered out; it still moves ``next_offset``.
    """

    queue: MessageQueue
    messages: list[MessageExt]
    next_offset: int


class ConsumeResult(enum.Enum):
    """What a listener returns.  ``None`` means ``SUCCESS``; raising an
    exception means ``RETRY_LATER``."""

    SUCCESS = "SUCCESS"
    #: Process the messages again later (concurrent modes: RECONSUME_LATER).
    RETRY_LATER = "RETRY_LATER"
    #: RocketMQ's orderly "retry after suspend"; same as RETRY_LATER here.
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"
    #: The messages can never succeed: send them to the dead-letter queue
    #: now, without retries (as raising ``NonRetryableError`` does).
    DLQ_NOW = "DLQ_NOW"


# The application's listener, as both consumers and their executors take it
# (one definition: the executors import it from here).

#: The user's code: takes a batch of messages, returns ``None`` or
#: ``ConsumeResult.SUCCESS`` when they are done; raising or returning
#: ``RETRY_LATER`` means "process them again later".
Listener = Callable[[list[MessageExt]], ConsumeResult | None]
#: The same as an ``async def`` (``executor="asyncio"``).
AsyncListener = Callable[[list[MessageExt]], Awaitable[ConsumeResult | None]]
