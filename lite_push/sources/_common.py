"""What the sources share, written once: the broker clock protocol, tag
expressions, input checks (a member's arguments and balance, topic names,
delay levels, lock leases,
messages handed to send_back/send_to_dlq), where a new group starts on a
queue (``consume_from``), commit entries, and pausing the cyclic GC
while a big read turns into messages (:func:`gc_paused`).

Elsewhere, once as well: ``send_batch`` items and their queues
(:mod:`._sending`), a member's owned queues (:mod:`._owned`), and the
message model -- CLUSTERING or BROADCASTING -- as a strategy
(:mod:`._member_model`)."""

from __future__ import annotations

import contextlib
import datetime
import gc
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Protocol

from .._errors import ConfigError, MessageTooLargeError
from .._types import MessageExt, MessageQueue, OffsetAndMetadata
from .contract import (
    DLQ_EXCEPTION,
    DLQ_GROUP,
    DLQ_REASON,
    RECONSUME_TIME,
    Balance,
    ConsumeFrom,
    ConsumeFromWhere,
    origin_properties,
)

__all__ = [
    "DEFAULT_TIMESTAMP_LAG_MS",
    "GC_PAUSE_MIN",
    "BrokerClock",
    "check_balance",
    "check_delay_levels",
    "check_lease",
    "check_member_arguments",
    "check_message",
    "commit_entries",
    "dead_letter_item",
    "gc_paused",
    "initial_position",
    "now_ms",
    "parse_tag_expression",
    "retry_item",
    "start_position",
    "warn_skipped_start",
    "validate_topic",
]

logger = logging.getLogger(__name__)

#: A read of at least this many entries or records runs with the cyclic GC
#: paused (:func:`gc_paused`).
GC_PAUSE_MIN = 256


@contextlib.contextmanager
def gc_paused(pause: bool) -> Iterator[None]:
    """The cyclic GC off meanwhile when ``pause`` (and it was on).  A read
    that turns hundreds of replies or records into messages only creates
    live objects, and the transient ones (a client's record objects, parsed
    replies) all at once: the collector would run a collection every few
    hundred of them for nothing, and promote the batch in flight.  Once
    they are gone the next allocation finds the count where it was."""
    pause = pause and gc.isenabled()
    if pause:
        gc.disable()
    try:
        yield
    finally:
        if pause:
            gc.enable()


#: ``check_member_arguments`` without an allocation strategy to check.
_NO_ALLOCATE = object()


def check_member_arguments(
    group: object, consume_from: object, client_id: object, allocate: object = _NO_ALLOCATE
) -> None:
    """What every source's consumer checks at construction (a source adds
    its own checks after): ``ConfigError`` naming the first bad argument.
    ``allocate`` is given where the source allocates queues itself."""
    if not isinstance(group, str) or not group:
        raise ConfigError("group", f"must be a non-empty string, got {group!r}")
    if not isinstance(consume_from, ConsumeFromWhere):
        raise ConfigError("consume_from", f"must be a ConsumeFromWhere, got {consume_from!r}")
    if client_id is not None and (not isinstance(client_id, str) or not client_id):
        raise ConfigError("client_id", f"must be a non-empty string, got {client_id!r}")
    if allocate is not _NO_ALLOCATE and not callable(allocate):
        raise ConfigError("allocate", f"must be an allocation strategy, got {allocate!r}")


#: ``consume_from`` words, as the command line's ``--from``.
_FROM_WORDS = {"first": ConsumeFromWhere.FIRST_OFFSET, "last": ConsumeFromWhere.LAST_OFFSET}


def start_position(consume_from: ConsumeFrom, consume_timestamp: int | None) -> tuple[ConsumeFromWhere, int | None]:
    """``consume_from`` as every source's member takes it (a
    :class:`ConsumeFromWhere`, ``"first"``/``"last"`` in any case, or a
    ``datetime``: ``TIMESTAMP`` at it), with the timestamp (ms) it implies;
    ``ConfigError`` naming ``consume_from`` for anything else."""
    if isinstance(consume_from, ConsumeFromWhere):
        return consume_from, consume_timestamp
    if isinstance(consume_from, datetime.datetime):
        if consume_timestamp is not None:
            raise ConfigError("consume_timestamp", "must be None when consume_from is a datetime (it is the time)")
        return ConsumeFromWhere.TIMESTAMP, int(consume_from.timestamp() * 1000)
    if isinstance(consume_from, str) and consume_from.strip().lower() in _FROM_WORDS:
        return _FROM_WORDS[consume_from.strip().lower()], consume_timestamp
    raise ConfigError(
        "consume_from", f"must be 'first', 'last', a datetime or a ConsumeFromWhere, got {consume_from!r}"
    )


def check_balance(balance: object, refused: str | None = None) -> Balance:
    """``balance`` checked at a member's construction: ``ConfigError``
    naming ``balance`` when it is not a :class:`Balance`, or when it is
    ``Balance.MESSAGE`` and the source gives ``refused``, the reason it
    cannot balance by message."""
    if not isinstance(balance, Balance):
        raise ConfigError("balance", f"must be Balance.QUEUE or Balance.MESSAGE, got {balance!r}")
    if balance is Balance.MESSAGE and refused is not None:
        raise ConfigError("balance", f"Balance.MESSAGE is refused: {refused}")
    return balance


#: ``ConsumeFromWhere.TIMESTAMP`` without a timestamp starts this long ago
#: (RocketMQ's default ``consumeTimestamp``: half an hour back).
DEFAULT_TIMESTAMP_LAG_MS = 30 * 60 * 1000


class BrokerClock(Protocol):
    """What a broker needs of a clock (lite_push's ``Clock`` fits):
    ``monotonic()`` for session timeouts and lock leases, ``time()`` (epoch
    seconds) for the due times of delayed retries."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...


def check_lease(lease: object) -> None:
    """A lock lease (:meth:`PullSource.lock`): ``ValueError`` unless a
    positive number of seconds."""
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not lease > 0:
        raise ValueError(f"lease must be positive, got {lease!r}")


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds (born and store timestamps)."""
    return time.time_ns() // 1_000_000


def parse_tag_expression(expression: str) -> frozenset[str] | None:
    """``"*"`` → ``None`` (everything); ``"A || B"`` → ``{"A", "B"}``.
    Whitespace around ``*`` and around tags is ignored.  Raises ``ValueError``
    naming the expression when it is empty, has an empty alternative, or a
    tag containing ``|``, ``*`` or whitespace."""
    if not isinstance(expression, str):
        raise ValueError(f"tag expression must be a string, got {expression!r}")
    if expression.strip() == "*":
        return None
    tags = []
    for part in expression.split("||"):
        tag = part.strip()
        if not tag or "|" in tag or "*" in tag or any(c.isspace() for c in tag):
            raise ValueError(f"malformed tag expression {expression!r}: expected '*' or 'TagA || TagB'")
        tags.append(tag)
    return frozenset(tags)


def initial_position(
    consume_from: ConsumeFromWhere,
    consume_timestamp: int | None,
    lo: int,
    hi: int,
    first_stored_at: Callable[[int], int],
) -> int:
    """Where a group with no committed offset starts on a queue whose stored
    offsets are ``[lo, hi)``: ``lo`` for FIRST_OFFSET, ``hi`` for
    LAST_OFFSET, and for TIMESTAMP the first offset stored at or after
    ``consume_timestamp`` (epoch ms; ``DEFAULT_TIMESTAMP_LAG_MS`` ago when
    ``None``), which ``first_stored_at(ts)`` finds in the source's log."""
    if consume_from is ConsumeFromWhere.FIRST_OFFSET:
        return lo
    if consume_from is ConsumeFromWhere.TIMESTAMP:
        ts = consume_timestamp
        if ts is None:
            ts = now_ms() - DEFAULT_TIMESTAMP_LAG_MS
        return first_stored_at(ts)
    return hi


def warn_skipped_start(group: str, topic: str, skipped: int) -> None:
    """Say out loud that a new group skips what is stored (one WARNING per
    group and topic, from the source that fixed the start positions)."""
    logger.warning(
        "group %r is new and starts at LAST_OFFSET on topic %r: the %d message(s) stored there now are "
        "skipped; to read them, start the group with consume_from=ConsumeFromWhere.FIRST_OFFSET "
        "(lite-push consume --from first)",
        group,
        topic,
        skipped,
    )


def commit_entries(offsets: Mapping[MessageQueue, OffsetAndMetadata | int]) -> dict[MessageQueue, OffsetAndMetadata]:
    """The values of a ``commit()`` as OffsetAndMetadata; ``ValueError``
    for a negative offset or a value that is neither ``int`` nor
    ``OffsetAndMetadata``."""
    entries: dict[MessageQueue, OffsetAndMetadata] = {}
    for q, value in offsets.items():
        if isinstance(value, OffsetAndMetadata):
            om = value
        elif isinstance(value, int) and not isinstance(value, bool):
            om = OffsetAndMetadata(value)
        else:
            raise ValueError(f"commit of {q}: expected int or OffsetAndMetadata, got {value!r}")
        if om.offset < 0:
            raise ValueError(f"commit of {q}: negative offset {om.offset}")
        entries[q] = om
    return entries


def validate_topic(topic: str) -> None:
    """``ValueError`` unless ``topic`` is a usable topic name."""
    if not isinstance(topic, str) or not topic or len(topic) > 255:
        raise ValueError(f"topic must be a non-empty string of at most 255 characters, got {topic!r}")
    if topic in (".", "..") or any(c in topic for c in "/\\\x00"):
        raise ValueError(f"topic {topic!r} must not contain '/', '\\\\' or NUL, nor be '.' or '..'")


def check_delay_levels(levels: object) -> tuple[float, ...]:
    """``delay_levels`` as a tuple of floats, or ``ConfigError``."""
    if isinstance(levels, (str, bytes)) or not isinstance(levels, Iterable):
        raise ConfigError("delay_levels", f"must be a sequence of seconds, got {levels!r}")
    out = tuple(levels)
    if not out:
        raise ConfigError("delay_levels", "must hold at least one level")
    for x in out:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
            raise ConfigError("delay_levels", f"every level must be a positive, finite number of seconds, got {x!r}")
    return tuple(float(x) for x in out)


def retry_item(
    item: tuple[MessageExt, int], levels: tuple[float, ...], limit: int
) -> tuple[MessageExt, int, dict[str, str]]:
    """One ``send_back`` item checked: the message, its delay level clamped
    to the last of ``levels``, and the properties of its retry copy (the
    origin's, with ``RECONSUME_TIME`` one more).  ``TypeError`` or
    ``ValueError`` naming what is wrong."""
    message, level = item
    check_message(message, limit)
    if isinstance(level, bool) or not isinstance(level, int):
        raise TypeError(f"delay level must be an int, got {level!r}")
    if level < 1:
        raise ValueError(f"delay level must be >= 1, got {level}")
    props = origin_properties(message)
    props[RECONSUME_TIME] = str(message.reconsume_times + 1)
    return message, min(level, len(levels)), props


def dead_letter_item(item: tuple[MessageExt, str, str], group: str, limit: int) -> tuple[MessageExt, dict[str, str]]:
    """One ``send_to_dlq`` item checked: the message and the properties of
    its dead letter (the origin's, the reason, the exception text, the
    group).  ``TypeError`` naming what is wrong."""
    message, reason, text = item
    check_message(message, limit)
    if type(reason) is not str or type(text) is not str:
        raise TypeError(f"reason and exception text must be str, got {reason!r}, {text!r}")
    props = origin_properties(message)
    props[DLQ_REASON] = reason
    props[DLQ_EXCEPTION] = text
    props[DLQ_GROUP] = group
    props[RECONSUME_TIME] = str(message.reconsume_times)
    return message, props


def check_message(m: object, limit: int) -> MessageExt:
    """A message handed to send_back/send_to_dlq, checked enough to be
    stored: ``TypeError`` / ``MessageTooLargeError`` otherwise."""
    if not isinstance(m, MessageExt):
        raise TypeError(f"expected a MessageExt, got {type(m).__name__}")
    if type(m.body) is not bytes:
        raise TypeError(f"message body must be bytes, got {type(m.body).__name__}")
    if len(m.body) > limit:
        raise MessageTooLargeError(m.topic, len(m.body), limit)
    if type(m.reconsume_times) is not int or m.reconsume_times < 0:
        raise ValueError(f"reconsume_times must be an int >= 0, got {m.reconsume_times!r}")
    for k, v in m.properties.items():
        if type(k) is not str or type(v) is not str:
            raise TypeError(f"properties must map str to str, got {k!r}: {v!r}")
    return m
