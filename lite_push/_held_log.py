"""Which keys a group's dead-letter topic holds (``dead_letter_order="key"``).

The dead-letter topic ``%DLQ%<group>`` is the record of held keys; nothing
else is stored.  Read in offset order, its records are folded here
(:class:`HeldLog`), by the tools (``lite_push.dlq.held_keys``,
``resend_key``) and by a consumer when it gains queues
(``lite_push._held_keys``):

* a dead letter with :data:`~lite_push.sources._base.HELD_KEY` ``K`` is a
  *held letter* of ``K``: open until a release of ``K`` covers it;
* a release record (an empty message with
  :data:`~lite_push.sources._base.RELEASED_KEY` ``K``, written by
  ``resend_key`` after it resent ``K``'s open letters) closes ``K``'s held
  letters up to its :data:`~lite_push.sources._base.RELEASED_THROUGH`
  offset, and says where their copies went
  (:data:`~lite_push.sources._base.RESENT_TO`: the offset of the last copy
  per queue);
* anything else (plain dead letters, messages sent there by hand) holds
  nothing.

So a key is held while it has open letters.  What the fold keeps is small:
each open letter's offset, origin and queue (and, for the one key a tool
asks for, the letter itself), and per key the last copy's offset per queue.
Reading is paged; its time grows with the topic's length, its memory with
the open letters.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from ._errors import UnknownTopicError
from ._types import MessageExt
from .sources._base import (
    HELD_KEY,
    ORIGIN_OFFSET,
    ORIGIN_QUEUE_ID,
    ORIGIN_TOPIC,
    RELEASED_KEY,
    RELEASED_THROUGH,
    RESENT_TO,
    DeadLetterReader,
    dlq_topic,
)

__all__ = ["READ_PAGE", "HeldLetter", "HeldLog", "QueueId", "origin_of"]

logger = logging.getLogger(__name__)

#: Offsets of the dead-letter topic read per call.
READ_PAGE = 1000

#: A queue as the held keys name it: ``(topic, queue_id)``.
QueueId = tuple[str, int]


def origin_of(message: MessageExt) -> str:
    """Where ``message`` was first stored, as ``topic/queue_id/offset``: its
    origin properties when it has them (a retry or dead-letter copy), else
    its own place.  A dead letter's origin and the message it was made of
    agree (``origin_properties``)."""
    props = message.properties
    topic = props.get(ORIGIN_TOPIC)
    if topic is None:
        return f"{message.topic}/{message.queue_id}/{message.queue_offset}"
    return f"{topic}/{props.get(ORIGIN_QUEUE_ID)}/{props.get(ORIGIN_OFFSET)}"


def _origin_queue(message: MessageExt) -> QueueId:
    props = message.properties
    topic = props.get(ORIGIN_TOPIC)
    if topic is None:
        return message.topic, message.queue_id
    return topic, int(props.get(ORIGIN_QUEUE_ID, ""))


@dataclass(frozen=True, slots=True)
class HeldLetter:
    """An open held letter: where it is in the dead-letter topic, the key it
    holds, the queue it came from and its origin; ``message`` only for the
    key a tool asked to keep (:class:`HeldLog` ``keep``)."""

    dlq_offset: int
    key: str
    queue: QueueId
    origin: str
    message: MessageExt | None = None


class HeldLog:
    """The held keys of a dead-letter topic read so far (see the module
    docstring).  Fed records in offset order (:meth:`feed`, or :meth:`read`
    from a reader); ``keep`` names a key whose letters are kept whole.
    Used by one thread at a time."""

    __slots__ = ("copies", "keep", "next_offset", "open")

    def __init__(self, keep: str | None = None) -> None:
        #: Key -> its open letters, in offset order.
        self.open: dict[str, list[HeldLetter]] = {}
        #: Key -> per queue, the offset of the last copy a release sent there.
        self.copies: dict[str, dict[QueueId, int]] = {}
        #: The dead-letter topic offset to read next.
        self.next_offset = 0
        self.keep = keep

    def feed(self, messages: Iterable[MessageExt]) -> None:
        """Fold dead-letter topic records, in offset order.  A record whose
        bookkeeping is malformed holds nothing (logged)."""
        for m in messages:
            props = m.properties
            try:
                key = props.get(HELD_KEY)
                if key is not None:
                    kept = m if key == self.keep else None
                    letter = HeldLetter(m.queue_offset, key, _origin_queue(m), origin_of(m), kept)
                    self.open.setdefault(key, []).append(letter)
                elif (released := props.get(RELEASED_KEY)) is not None:
                    self._release(released, int(props[RELEASED_THROUGH]), json.loads(props.get(RESENT_TO) or "[]"))
            except (KeyError, ValueError, TypeError) as e:
                logger.warning("%s offset %d holds no key: malformed bookkeeping (%r)", m.topic, m.queue_offset, e)
            self.next_offset = m.queue_offset + 1

    def _release(self, key: str, through: int, resent_to: list[list[object]]) -> None:
        letters = self.open.get(key)
        if letters is not None:
            rest = [x for x in letters if x.dlq_offset > through]
            if rest:
                self.open[key] = rest
            else:
                del self.open[key]
        copies = self.copies.setdefault(key, {})
        for topic, qid, offset in resent_to:
            if not isinstance(topic, str) or type(qid) is not int or type(offset) is not int:
                raise ValueError(f"{RESENT_TO}: not [topic, queue_id, offset]: {[topic, qid, offset]!r}")
            copies[(topic, qid)] = max(offset, copies.get((topic, qid), -1))

    def read(self, reader: DeadLetterReader, group: str, page: int = READ_PAGE) -> int:
        """Read and fold what ``group``'s dead-letter topic holds from
        :attr:`next_offset` on, ``page`` offsets at a time; return how many
        records were read (0 when the group has no dead-letter topic)."""
        try:
            (queue,) = reader.queues(dlq_topic(group))
        except UnknownTopicError:
            return 0
        n = 0
        while batch := reader.messages(queue, self.next_offset, self.next_offset + page):
            self.feed(batch)
            n += len(batch)
        return n
