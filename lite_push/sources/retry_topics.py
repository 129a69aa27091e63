"""Retry and dead-letter topics: their names, RocketMQ's delay levels, and
the properties a source adds to the copies it stores there (what
``lite_push.dlq.resend`` strips to give the user's properties back).  Part
of the source contract; :mod:`.contract` re-exports every name."""

from __future__ import annotations

from collections.abc import Mapping

from .._types import MessageExt

#: Prefix of a group's retry topic (RocketMQ's ``MixAll.RETRY_GROUP_TOPIC_PREFIX``).
RETRY_PREFIX = "%RETRY%"
#: Prefix of a group's dead-letter topic (RocketMQ's ``MixAll.DLQ_GROUP_TOPIC_PREFIX``).
DLQ_PREFIX = "%DLQ%"

#: RocketMQ's default delay levels in seconds: 1s 5s 10s 30s 1m 2m 3m 4m 5m
#: 6m 7m 8m 9m 10m 20m 30m.  Level ``n`` (1-based) waits ``levels[n - 1]``.
DEFAULT_DELAY_LEVELS: tuple[float, ...] = (
    1.0,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    180.0,
    240.0,
    300.0,
    360.0,
    420.0,
    480.0,
    540.0,
    600.0,
    1200.0,
    1800.0,
)

# Property names a source adds to retry and dead-letter copies (RocketMQ's
# MessageConst names where RocketMQ has one).

#: The original topic (RocketMQ: ``PROPERTY_RETRY_TOPIC``); same as ORIGIN_TOPIC.
RETRY_TOPIC = "RETRY_TOPIC"
#: The topic the message was first stored in.
ORIGIN_TOPIC = "ORIGIN_TOPIC"
#: The queue id it was first stored in (decimal).
ORIGIN_QUEUE_ID = "ORIGIN_QUEUE_ID"
#: Its offset in that queue (decimal).
ORIGIN_OFFSET = "ORIGIN_OFFSET"
#: Its first message id (RocketMQ: ``PROPERTY_ORIGIN_MESSAGE_ID``).
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
#: How many times it was consumed again (RocketMQ: ``PROPERTY_RECONSUME_TIME``);
#: a stored message's ``reconsume_times`` is this property (0 when absent), so
#: it survives a restart of a durable source.
RECONSUME_TIME = "RECONSUME_TIME"
#: Why the message was dead-lettered.
DLQ_REASON = "DLQ_REASON"
#: The text of the exception that failed it last (may be empty).
DLQ_EXCEPTION = "DLQ_EXCEPTION"
#: The consumer group that dead-lettered it.
DLQ_GROUP = "DLQ_GROUP"
#: Schedule only: the topic a delayed message is delivered to when due
#: (RocketMQ: ``PROPERTY_REAL_TOPIC``).  Removed on delivery.
REAL_TOPIC = "REAL_TOPIC"
#: Schedule only: when a delayed message is due, wall-clock ms since the
#: epoch (RocketMQ: ``PROPERTY_TIMER_DELIVER_MS``).  Removed on delivery.
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"


# Dead letters that keep a key's order (``dead_letter_order="key"``; see
# ``lite_push._lanes.held_keys``) and their release (``lite_push.dlq.resend_key``).

#: On a dead letter: the key it holds (its key's later messages of its
#: queue follow it into the dead-letter topic until the key is released).
HELD_KEY = "lite_push.HELD_KEY"
#: On a dead letter stored because its key was held, not because it failed:
#: what it waits behind (the first held dead letter's origin,
#: ``topic/queue_id/offset``).
HELD_BEHIND = "lite_push.HELD_BEHIND"
#: On a release record (an empty body in the dead-letter topic, no dead
#: letter): the key whose dead letters were resent.
RELEASED_KEY = "lite_push.RELEASED_KEY"
#: On a release record: the dead-letter topic offset of the last dead
#: letter resent (the key's held dead letters up to it are released).
RELEASED_THROUGH = "lite_push.RELEASED_THROUGH"
#: On a release record: where the copies went, JSON
#: ``[[topic, queue_id, offset of the last copy], ...]``.
RESENT_TO = "lite_push.RESENT_TO"
#: On a resent copy: the origin (``topic/queue_id/offset``) of the dead
#: letter it copies.
RESENT_OF = "lite_push.RESENT_OF"
#: On a resend record (an empty body in the dead-letter topic, no dead
#: letter): the dead letters sent back to their topics and where each copy
#: went, JSON ``[[dead-letter topic offset, "topic/queue_id/offset"], ...]``.
RESENT_LETTERS = "lite_push.RESENT_LETTERS"

#: Every property a source adds for retries and dead letters: what
#: ``lite_push.dlq.resend`` strips to get the user's properties back.
BOOKKEEPING_PROPERTIES = frozenset(
    {
        HELD_KEY,
        HELD_BEHIND,
        RELEASED_KEY,
        RELEASED_THROUGH,
        RESENT_TO,
        RESENT_OF,
        RESENT_LETTERS,
        RETRY_TOPIC,
        ORIGIN_TOPIC,
        ORIGIN_QUEUE_ID,
        ORIGIN_OFFSET,
        ORIGIN_MESSAGE_ID,
        RECONSUME_TIME,
        DLQ_REASON,
        DLQ_EXCEPTION,
        DLQ_GROUP,
        REAL_TOPIC,
        TIMER_DELIVER_MS,
    }
)


def retry_topic(group: str) -> str:
    """The retry topic of ``group``: ``"%RETRY%" + group``."""
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    """The dead-letter topic of ``group``: ``"%DLQ%" + group``."""
    return DLQ_PREFIX + group


def is_retry_or_dlq_topic(topic: str) -> bool:
    """Whether ``topic`` names a retry or dead-letter topic: ``%RETRY%`` or
    ``%DLQ%`` followed by a group name.  Sources create these on first use
    (see :meth:`PullSource.subscribe`)."""
    return (topic.startswith(RETRY_PREFIX) and len(topic) > len(RETRY_PREFIX)) or (
        topic.startswith(DLQ_PREFIX) and len(topic) > len(DLQ_PREFIX)
    )


def origin_properties(message: MessageExt) -> dict[str, str]:
    """A copy of ``message.properties`` for its retry or dead-letter copy:
    the origin bookkeeping (:data:`ORIGIN_TOPIC`, :data:`RETRY_TOPIC`,
    :data:`ORIGIN_QUEUE_ID`, :data:`ORIGIN_OFFSET`,
    :data:`ORIGIN_MESSAGE_ID`) is set from the message unless it already
    carries an origin (it came from a retry topic): the very first origin is
    kept.  Schedule-only properties are dropped; the caller sets the rest."""
    props = dict(message.properties)
    props.pop(REAL_TOPIC, None)
    props.pop(TIMER_DELIVER_MS, None)
    if ORIGIN_TOPIC not in props:
        props[ORIGIN_TOPIC] = message.topic
        props[ORIGIN_QUEUE_ID] = str(message.queue_id)
        props[ORIGIN_OFFSET] = str(message.queue_offset)
        props[ORIGIN_MESSAGE_ID] = message.msg_id
    props.setdefault(RETRY_TOPIC, props[ORIGIN_TOPIC])
    return props


def reconsume_times_of(properties: Mapping[str, str]) -> int:
    """The :data:`RECONSUME_TIME` property as an int (0 when absent).
    Raises ``ValueError`` naming the property when it is not a decimal
    integer >= 0."""
    raw = properties.get(RECONSUME_TIME)
    if raw is None:
        return 0
    if type(raw) is not str or not raw.isdecimal() or not raw.isascii():
        raise ValueError(f"property {RECONSUME_TIME} must be a decimal integer >= 0, got {raw!r}")
    return int(raw)
