"""Which keys a group's dead-letter topic holds (``dead_letter_order="key"``).

The dead-letter topic ``%DLQ%<group>`` is the record of held keys; nothing
else is stored.  Read in offset order, its records are folded here
(:class:`HeldLog`), by the tools (``lite_push.dlq.held_keys``,
``resend_key``) and by a consumer when it gains queues
(``lite_push._lanes.held_keys``):

* a dead letter with :data:`~lite_push.sources.contract.HELD_KEY` ``K`` is a
  *held letter* of ``K``: open until a release of ``K`` covers it;
* a release record (an empty message with
  :data:`~lite_push.sources.contract.RELEASED_KEY` ``K``, written by
  ``resend_key`` after it resent ``K``'s open letters) closes ``K``'s held
  letters up to its :data:`~lite_push.sources.contract.RELEASED_THROUGH`
  offset, and says where their copies went
  (:data:`~lite_push.sources.contract.RESENT_TO`: the offset of the last copy
  per queue);
* anything else (plain dead letters, messages sent there by hand) holds
  nothing.

So a key is held while it has open letters.  Their order is not the
topic's: each letter stands for a place in its key's queue, its *logical
origin* (:func:`logical_origin`: where the message was first stored; for a
resent copy that was dead-lettered again, the letter it copied,
:data:`~lite_push.sources.contract.RESENT_OF`), and a key's letters go back in
the order of those places.  A copy that fails for good after a later
message of its key was held behind it thus keeps its place ahead of it.
Two open letters of one place (a copy resent twice) count once, the later.

What the fold keeps is small: each open letter's offset, key and logical
origin (and, for the one key a tool asks for, the letter itself), and per
key the last copy's offset per queue.  Reading is paged; its time grows
with the topic's length, its memory with the open letters.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from .._errors import UnknownTopicError
from .._types import MessageExt
from ..sources.contract import (
    HELD_KEY,
    ORIGIN_OFFSET,
    ORIGIN_QUEUE_ID,
    ORIGIN_TOPIC,
    RELEASED_KEY,
    RELEASED_THROUGH,
    RESENT_OF,
    RESENT_TO,
    DeadLetterReader,
    dlq_topic,
)

__all__ = [
    "READ_PAGE",
    "Folding",
    "HeldLetter",
    "HeldLog",
    "Place",
    "QueueId",
    "logical_origin",
    "place_text",
    "read_folded",
]

logger = logging.getLogger(__name__)

#: Offsets of the dead-letter topic read per call.
READ_PAGE = 1000


class Folding(Protocol):
    """A fold of a dead-letter topic's records (:class:`HeldLog`, the
    resend log): where it stands, and what takes the next records."""

    @property
    def next_offset(self) -> int: ...

    def feed(self, messages: list[MessageExt]) -> None: ...


def read_folded(fold: Folding, reader: DeadLetterReader, group: str, page: int = READ_PAGE) -> int:
    """Feed ``fold`` what ``group``'s dead-letter topic holds from its
    ``next_offset`` on, ``page`` offsets at a time; how many records were
    read (0 when the group has no dead-letter topic)."""
    try:
        (queue,) = reader.queues(dlq_topic(group))
    except UnknownTopicError:
        return 0
    n = 0
    while batch := reader.messages(queue, fold.next_offset, fold.next_offset + page):
        fold.feed(batch)
        n += len(batch)
    return n


#: A queue as the held keys name it: ``(topic, queue_id)``.
QueueId = tuple[str, int]

#: A place in a queue: ``(topic, queue_id, offset)``.
Place = tuple[str, int, int]


def place_text(place: Place) -> str:
    """``topic/queue_id/offset``."""
    return f"{place[0]}/{place[1]}/{place[2]}"


def _parse_place(text: str) -> Place:
    topic, qid, offset = text.rsplit("/", 2)
    return topic, int(qid), int(offset)


def logical_origin(message: MessageExt) -> Place:
    """The place ``message`` (or the dead letter made of it) stands for in
    its key's order: the dead letter a resent copy copies
    (:data:`RESENT_OF`), else where the message was first stored (its
    origin properties, as ``origin_properties`` sets them, else its own
    place).  ``ValueError`` when that bookkeeping is malformed."""
    props = message.properties
    copied = props.get(RESENT_OF)
    if copied is not None:
        return _parse_place(copied)
    topic = props.get(ORIGIN_TOPIC)
    if topic is None:
        return message.topic, message.queue_id, message.queue_offset
    return topic, int(props.get(ORIGIN_QUEUE_ID, "")), int(props.get(ORIGIN_OFFSET, ""))


@dataclass(frozen=True, slots=True)
class HeldLetter:
    """An open held letter: where it is in the dead-letter topic, the key it
    holds and its logical origin; ``message`` only for the key a tool asked
    to keep (:class:`HeldLog` ``keep``)."""

    dlq_offset: int
    key: str
    place: Place
    message: MessageExt | None = None

    @property
    def queue(self) -> QueueId:
        """The queue of its key it holds."""
        return self.place[0], self.place[1]

    @property
    def origin(self) -> str:
        """Its logical origin as text, ``topic/queue_id/offset``."""
        return place_text(self.place)


class HeldLog:
    """The held keys of a dead-letter topic read so far (see the module
    docstring).  Fed records in offset order (:meth:`feed`, or :meth:`read`
    from a reader); ``keep`` names a key whose letters are kept whole.
    Used by one thread at a time."""

    __slots__ = ("copies", "keep", "next_offset", "open")

    def __init__(self, keep: str | None = None) -> None:
        #: Key -> its open letters by logical origin (in the order read).
        self.open: dict[str, dict[Place, HeldLetter]] = {}
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
                    place = logical_origin(m)
                    letters = self.open.setdefault(key, {})
                    letters.pop(place, None)  # a place held twice counts once, the later letter
                    letters[place] = HeldLetter(m.queue_offset, key, place, m if key == self.keep else None)
                elif (released := props.get(RELEASED_KEY)) is not None:
                    self._release(released, int(props[RELEASED_THROUGH]), json.loads(props.get(RESENT_TO) or "[]"))
            except (KeyError, ValueError, TypeError) as e:
                logger.warning("%s offset %d holds no key: malformed bookkeeping (%r)", m.topic, m.queue_offset, e)
            self.next_offset = m.queue_offset + 1

    def _release(self, key: str, through: int, resent_to: object) -> None:
        sent: list[tuple[QueueId, int]] = []
        for entry in resent_to if isinstance(resent_to, list) else [resent_to]:
            match entry:
                case [str(topic), int(qid), int(offset)]:
                    sent.append(((topic, qid), offset))
                case _:
                    raise ValueError(f"{RESENT_TO}: not [topic, queue_id, offset]: {entry!r}")
        letters = self.open.get(key)
        if letters is not None:
            rest = {p: x for p, x in letters.items() if x.dlq_offset > through}
            if rest:
                self.open[key] = rest
            else:
                del self.open[key]
        copies = self.copies.setdefault(key, {})
        for queue, offset in sent:
            copies[queue] = max(offset, copies.get(queue, -1))

    def letters(self, key: str) -> list[HeldLetter]:
        """``key``'s open letters in its order: by queue, then by logical
        origin."""
        return sorted(self.open.get(key, {}).values(), key=lambda x: x.place)

    def read(self, reader: DeadLetterReader, group: str, page: int = READ_PAGE) -> int:
        """Read and fold what ``group``'s dead-letter topic holds from
        :attr:`next_offset` on, ``page`` offsets at a time; return how many
        records were read (0 when the group has no dead-letter topic)."""
        return read_folded(self, reader, group, page)
