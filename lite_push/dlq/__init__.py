"""Dead letters: read them, and send them back to be consumed again.

A message that failed ``max_reconsume_times`` times (or was rejected for
good) is stored in its group's dead-letter topic ``%DLQ%<group>`` by
:meth:`PullSource.send_to_dlq <lite_push.sources.PullSource.send_to_dlq>`,
with properties saying why and where it came from.  Read them like any
topic (``pull_consumer(...).subscribe("%DLQ%<group>")``, or
:func:`dead_letters` on an :class:`~lite_push.sources.EmbeddedBroker`), turn
each into a :class:`DeadLetter` with :meth:`DeadLetter.from_message`, and,
once the cause is fixed, :func:`resend` it to its original topic::

    for dl in dead_letters(broker, "orders-consumer"):
        log.info("%s failed %d times: %s", dl.origin_msg_id, dl.reconsume_times, dl.reason)
        resend(broker, dl)

The dead-letter topic itself is append-only: resending does not remove the
dead letter.  :func:`record_resent` writes a resend record into it after
the dead letters it names were resent, and :func:`resent_letters` says
which were, and where their copies went (``lite-push dlq resend`` does
both, and skips what was resent already unless told ``--force``)::

    done = resent_letters(broker, "orders-consumer")
    todo = [dl for dl in dead_letters(broker, "orders-consumer") if dl.message.queue_offset not in done]
    record_resent(broker, "orders-consumer", [(dl.message.queue_offset, resend(broker, dl)) for dl in todo])

A group consumed with ``dead_letter_order="key"`` *holds* a key once one of
its messages is dead-lettered: the key's later messages of that queue
follow it into the dead-letter topic instead of running.  :func:`held_keys`
says which keys are held; :func:`resend_key` sends a held key's dead
letters back to their queues in the key's order and releases it (the
consumer runs the copies, then the key's later messages, in order)::

    for held in held_keys(broker, "orders-consumer"):
        log.info("%s: %d messages held behind %s", held.key, held.behind, held.first_origin)
    resend_key(broker, "orders-consumer", "account-42")
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .._errors import UnknownTopicError
from .._types import MessageExt, SendResult
from ..sources.contract import (
    BOOKKEEPING_PROPERTIES,
    DLQ_EXCEPTION,
    DLQ_GROUP,
    DLQ_REASON,
    HELD_BEHIND,
    HELD_KEY,
    ORIGIN_MESSAGE_ID,
    ORIGIN_OFFSET,
    ORIGIN_QUEUE_ID,
    ORIGIN_TOPIC,
    RECONSUME_TIME,
    RELEASED_KEY,
    RELEASED_THROUGH,
    RESENT_LETTERS,
    RESENT_OF,
    RESENT_TO,
    DeadLetterReader,
    dlq_topic,
)
from ._held_log import HeldLog, QueueId
from ._resent_log import RECORD_LETTERS, ResentLog, resend_record

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence

__all__ = [
    "RESEND_BATCH",
    "DeadLetter",
    "DeadLetterBroker",
    "DeadLetterReader",
    "HeldKey",
    "Sender",
    "dead_letters",
    "held_keys",
    "iter_dead_letters",
    "record_resent",
    "resend",
    "resend_key",
    "resent_letters",
    "user_properties",
]

logger = logging.getLogger(__name__)


@runtime_checkable
class Sender(Protocol):
    """Anything that stores a message in a topic (an
    :class:`~lite_push.sources.EmbeddedBroker` is one)."""

    def send(
        self,
        topic: str,
        body: bytes,
        keys: str | None = None,
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> SendResult:
        """Store one message in ``topic``; return where it was stored."""
        ...


@runtime_checkable
class DeadLetterBroker(DeadLetterReader, Sender, Protocol):
    """What :func:`resend_key` needs: a :class:`DeadLetterReader` and
    :class:`Sender` that also stores messages in a queue of its choice (an
    :class:`~lite_push.sources.EmbeddedBroker`, a ``RedisBroker``, a
    ``KafkaBroker``)."""

    def send_batch(self, topic: str, items: Iterable[Any]) -> Sequence[SendResult]:
        """Store messages in ``topic`` in order; each item a mapping with
        ``body``, ``keys``, ``tags``, ``properties`` and ``queue_id``."""
        ...


def _required(props: Mapping[str, str], name: str) -> str:
    value = props.get(name)
    if value is None:
        raise ValueError(f"not a dead letter: property {name} is missing")
    return value


def _int(props: Mapping[str, str], name: str) -> int:
    raw = _required(props, name)
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"dead letter property {name} must be an integer, got {raw!r}") from None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message of a dead-letter topic, with its bookkeeping parsed."""

    #: The message as stored in the dead-letter topic.
    message: MessageExt = field(hash=False)
    #: The consumer group that gave up on it.
    group: str
    #: Why (e.g. "max reconsume times exceeded" or a listener's verdict).
    reason: str
    #: The text of the last exception ("" when there was none).
    exception: str
    #: Where the message was first stored: topic, queue id, offset, id.
    origin_topic: str
    origin_queue_id: int
    origin_offset: int
    origin_msg_id: str
    #: How many times it had been consumed again when it was dead-lettered.
    reconsume_times: int
    #: ``dead_letter_order="key"``: the key this dead letter holds (``None``:
    #: it holds none), and, when it was stored because that key was held
    #: already, the origin of the dead letter it waits behind.
    held_key: str | None = None
    held_behind: str | None = None

    @classmethod
    def from_message(cls, message: MessageExt) -> DeadLetter:
        """Parse a message read from a ``%DLQ%<group>`` topic.  Raises
        ``ValueError`` naming the property that is missing or malformed
        when ``message`` is not a dead letter."""
        props = message.properties
        group = _required(props, DLQ_GROUP)
        reason = _required(props, DLQ_REASON)
        origin_topic = _required(props, ORIGIN_TOPIC)
        origin_queue_id = _int(props, ORIGIN_QUEUE_ID)
        origin_offset = _int(props, ORIGIN_OFFSET)
        origin_msg_id = _required(props, ORIGIN_MESSAGE_ID)
        times = _int(props, RECONSUME_TIME) if RECONSUME_TIME in props else message.reconsume_times
        return cls(
            message=message,
            group=group,
            reason=reason,
            exception=props.get(DLQ_EXCEPTION, ""),
            origin_topic=origin_topic,
            origin_queue_id=origin_queue_id,
            origin_offset=origin_offset,
            origin_msg_id=origin_msg_id,
            reconsume_times=times,
            held_key=props.get(HELD_KEY),
            held_behind=props.get(HELD_BEHIND),
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary: where it sits in the dead-letter topic
        (``dlq_offset``, ``msg_id``), why it is there, where it came from, and
        the message (``keys``, ``tags``, :func:`user_properties`, ``body`` as
        text when it is UTF-8, else base64, as ``body_encoding`` says)."""
        m = self.message
        try:
            body, encoding = m.body.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            body, encoding = base64.b64encode(m.body).decode("ascii"), "base64"
        return {
            "dlq_topic": m.topic,
            "dlq_offset": m.queue_offset,
            "msg_id": m.msg_id,
            "group": self.group,
            "reason": self.reason,
            "exception": self.exception,
            "origin_topic": self.origin_topic,
            "origin_queue_id": self.origin_queue_id,
            "origin_offset": self.origin_offset,
            "origin_msg_id": self.origin_msg_id,
            "reconsume_times": self.reconsume_times,
            "held_key": self.held_key,
            "held_behind": self.held_behind,
            "store_timestamp": m.store_timestamp,
            "keys": m.keys,
            "tags": m.tags,
            "properties": user_properties(m),
            "body": body,
            "body_encoding": encoding,
        }


def user_properties(message: MessageExt) -> dict[str, str]:
    """``message.properties`` without the bookkeeping a source added for
    retries and dead letters (``DLQ_*``, ``ORIGIN_*``, ``RETRY_TOPIC``,
    ``RECONSUME_TIME``, schedule properties): what the producer set."""
    return {k: v for k, v in message.properties.items() if k not in BOOKKEEPING_PROPERTIES}


def resend(sender: Sender, dead_letter: DeadLetter | MessageExt) -> SendResult:
    """Send a dead letter back to its original topic as a new message: its
    original body, keys, tags and :func:`user_properties`, so it is consumed
    again from scratch (``reconsume_times`` 0).  Accepts a
    :class:`DeadLetter` or the DLQ message itself (``ValueError`` when that
    is not a dead letter).  Returns what ``sender.send`` returned."""
    dl = dead_letter if isinstance(dead_letter, DeadLetter) else DeadLetter.from_message(dead_letter)
    m = dl.message
    result = sender.send(dl.origin_topic, m.body, keys=m.keys, tags=m.tags, properties=user_properties(m))
    logger.info(
        "dead letter %s of group %r (first %s) resent to %r as %s",
        m.msg_id,
        dl.group,
        dl.origin_msg_id,
        dl.origin_topic,
        result.msg_id,
    )
    return result


def iter_dead_letters(
    reader: DeadLetterReader, group: str, start: int = 0, stop: int | None = None, *, page: int = 1000
) -> Iterator[DeadLetter]:
    """The dead letters of ``group`` at offsets ``[start, stop)`` of
    ``%DLQ%<group>``, in offset order, read ``page`` offsets at a time (none
    when the group has no dead-letter topic).  Reads only: joins no group,
    commits nothing.  Messages of that topic that are not dead letters (sent
    there by hand) are skipped with a warning, and the release records of
    :func:`resend_key` and the resend records of :func:`record_resent`
    without one."""
    if page < 1:
        raise ValueError(f"page must be >= 1, got {page}")
    try:
        (queue,) = reader.queues(dlq_topic(group))
    except UnknownTopicError:
        return
    pos = start
    while stop is None or pos < stop:
        end = pos + page if stop is None else min(pos + page, stop)
        batch = reader.messages(queue, pos, end)
        if not batch:
            return
        for m in batch:
            if RELEASED_KEY in m.properties or RESENT_LETTERS in m.properties:
                continue  # a release or resend record, not a dead letter
            try:
                yield DeadLetter.from_message(m)
            except ValueError as e:
                logger.warning("%s offset %d skipped: %s", queue, m.queue_offset, e)
        pos = batch[-1].queue_offset + 1


def dead_letters(reader: DeadLetterReader, group: str, start: int = 0, stop: int | None = None) -> list[DeadLetter]:
    """The dead letters of ``group`` stored in ``reader`` (an
    :class:`~lite_push.sources.EmbeddedBroker`, a ``RedisBroker``, ...) at
    offsets ``[start, stop)`` of ``%DLQ%<group>`` (empty when the group has
    none).  Messages of that topic that are not dead letters (sent there by
    hand) are skipped with a warning."""
    return list(iter_dead_letters(reader, group, start, stop))


# -- what was resent --------------------------------------------------------------


def resent_letters(reader: DeadLetterReader, group: str) -> dict[int, str]:
    """The dead letters of ``group`` sent back already, by their offsets in
    ``%DLQ%<group>``: where each one's copy went (``topic/queue_id/offset``,
    as :func:`record_resent` recorded it), or ``"released"`` for a held
    letter :func:`resend_key` released with its key.  Reads the whole topic
    (joins no group, commits nothing)."""
    log = ResentLog()
    log.read(reader, group)
    return log.resent


def record_resent(sender: Sender, group: str, resent: Sequence[tuple[int, SendResult]]) -> None:
    """Write into ``%DLQ%<group>`` that the dead letters at these offsets
    were resent, each with where its copy went (what :func:`resend`
    returned): one resend record per :data:`~lite_push.dlq._resent_log.RECORD_LETTERS`
    letters (nothing for none), in the topic their dead letters made.
    :func:`resent_letters` reads them."""
    places = [(offset, f"{r.queue.topic}/{r.queue.queue_id}/{r.offset}") for offset, r in resent]
    for i in range(0, len(places), RECORD_LETTERS):
        sender.send(dlq_topic(group), b"", properties=resend_record(group, places[i : i + RECORD_LETTERS]))


# -- held keys (dead_letter_order="key") -------------------------------------------


@dataclass(frozen=True, slots=True)
class HeldKey:
    """A key held behind its dead letters: those it has not yet released,
    in the key's order, by their dead-letter topic offsets and their
    logical origins (``topic/queue_id/offset``: where each message was
    first stored)."""

    key: str
    offsets: tuple[int, ...]
    origins: tuple[str, ...]

    @property
    def letters(self) -> int:
        """Held dead letters, the first one included."""
        return len(self.offsets)

    @property
    def behind(self) -> int:
        """Dead letters held behind the first."""
        return len(self.offsets) - 1

    @property
    def first_origin(self) -> str:
        """Where the first held message was first stored."""
        return self.origins[0]


def held_keys(reader: DeadLetterReader, group: str) -> list[HeldKey]:
    """The keys ``group``'s dead-letter topic holds (consumed with
    ``dead_letter_order="key"``), in the order they were first held.
    Reads the whole topic (joins no group, commits nothing)."""
    log = HeldLog()
    log.read(reader, group)
    out = []
    for key in log.open:
        letters = log.letters(key)
        out.append(HeldKey(key, tuple(x.dlq_offset for x in letters), tuple(x.origin for x in letters)))
    return sorted(out, key=lambda h: min(h.offsets))


#: Copies stored per ``send_batch`` call by :func:`resend_key`.
RESEND_BATCH = 1000


def _copy(m: MessageExt, origin: str, queue_id: int) -> dict[str, Any]:
    """The ``send_batch`` item of a held dead letter's copy."""
    props = {**user_properties(m), RESENT_OF: origin}
    return {"body": m.body, "keys": m.keys, "tags": m.tags, "properties": props, "queue_id": queue_id}


def resend_key(broker: DeadLetterBroker, group: str, key: str) -> list[SendResult]:
    """Release held ``key`` of ``group``: send its held dead letters back,
    in the key's order (by the place each stands for in its queue: see
    :class:`HeldKey`), each to the queue it came from as a new message
    (body, keys, tags and :func:`user_properties`, plus
    :data:`~lite_push.sources.contract.RESENT_OF` naming its place), then
    write a release record for ``key`` into the dead-letter topic.  The
    consumer runs the copies, and once it has met them all the key's later
    messages run again.  Returns where the copies went (empty when ``key``
    holds nothing).

    A message of ``key`` consumed between this read and the copies is held
    behind them (it came later): the key then stays held, with that
    message's dead letter, until it is resent too.  Interrupted before the
    release record, it can be run again (copies sent twice run twice)."""
    log = HeldLog(keep=key)
    log.read(broker, group)
    letters = log.letters(key)
    results: list[SendResult] = []
    last: dict[QueueId, int] = {}
    for topic, run in itertools.groupby(letters, key=lambda x: x.queue[0]):
        copies = [_copy(x.message, x.origin, x.queue[1]) for x in run if x.message is not None]  # all: kept
        for i in range(0, len(copies), RESEND_BATCH):
            for r in broker.send_batch(topic, copies[i : i + RESEND_BATCH]):
                last[(r.queue.topic, r.queue.queue_id)] = r.offset
                results.append(r)
    if not letters:
        return results
    release = {
        RELEASED_KEY: key,
        DLQ_GROUP: group,
        RELEASED_THROUGH: str(max(x.dlq_offset for x in letters)),
        RESENT_TO: json.dumps([[t, q, off] for (t, q), off in sorted(last.items())]),
    }
    broker.send(dlq_topic(group), b"", properties=release)
    logger.info(
        "group %r: key %r released: %d dead letter(s) resent, up to %s offset %d",
        group,
        key,
        len(letters),
        dlq_topic(group),
        max(x.dlq_offset for x in letters),
    )
    return results
