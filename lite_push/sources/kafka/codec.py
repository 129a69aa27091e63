"""Kafka records as lite_push messages, and lite_push topic names as Kafka's.

Topic names
    Kafka allows ``[a-zA-Z0-9._-]``, at most 249 characters.  lite_push's
    retry and dead-letter topics are ``%RETRY%<group>`` and ``%DLQ%<group>``
    (RocketMQ's names), which Kafka refuses, so on Kafka they are stored as

        %RETRY%<group>  ->  lite-push.retry.<escaped group>
        %DLQ%<group>    ->  lite-push.dlq.<escaped group>

    where the group is escaped reversibly: ``[A-Za-z0-9.-]`` stay, ``_``
    becomes ``__`` and every other character becomes ``_`` followed by the
    two hex digits of each byte of its UTF-8 form (``orders/eu`` ->
    ``orders_2feu``).  The consumer shows messages with the lite_push name
    (``message.topic == "%RETRY%g"``), so the runtime and ``lite_push.dlq``
    work as on the other sources; Kafka tools see the stored name.  Every
    other topic is used under its own name, which must be a legal Kafka
    name.

Records
    key      the message's ``keys`` (the ordering key), decoded with the
             broker's ``key_encoding`` (``"utf-8"`` by default, any Python
             codec, or ``"hex"``); no key -> ``None`` (keyless)
    value    the body (a null value -> ``b""``)
    headers  ``tags_header`` (default ``"tags"``) -> ``tags``; every other
             header -> ``properties`` (values decoded as UTF-8; for a
             repeated header the last one wins)
    offsets  ``queue_offset`` is the Kafka offset, ``queue_id`` the
             partition; the timestamp is both ``born_timestamp`` and
             ``store_timestamp``; ``msg_id`` is ``<topic>-<partition>-<offset>``
             of the stored topic name; ``reconsume_times`` is the
             ``RECONSUME_TIME`` header (0 when absent)

A record whose key or a header does not decode is malformed:
:func:`decode` raises :class:`MalformedRecord` with the reason, and the
consumer dead-letters it (:meth:`.copies.Copies.store_malformed`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..._types import MessageExt
from ..contract import DLQ_PREFIX, RECONSUME_TIME, RETRY_PREFIX, reconsume_times_of

__all__ = [
    "DLQ_TOPIC_PREFIX",
    "RETRY_TOPIC_PREFIX",
    "MalformedRecord",
    "ReadRecord",
    "Record",
    "RecordFormat",
    "decode",
    "encode_headers",
    "key_decoder",
    "kafka_topic",
    "lite_topic",
]

#: Kafka name prefix of a group's retry topic.
RETRY_TOPIC_PREFIX = "lite-push.retry."
#: Kafka name prefix of a group's dead-letter topic.
DLQ_TOPIC_PREFIX = "lite-push.dlq."
_LEGAL = re.compile(r"[A-Za-z0-9._-]{1,249}")
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-")
_HEX = re.compile(r"_([0-9a-f]{2})")


#: One record to produce: (Kafka topic, partition or None, key, value, headers).
Record = tuple[str, int | None, bytes | None, bytes, list[tuple[str, bytes]]]


class ReadRecord:
    """A record the compiled fetcher read (``lite_push._kernels.kafka_fetch_c``), as
    the full decoder (:func:`decode`) reads records: the methods of
    confluent-kafka's ``Message`` that it calls."""

    __slots__ = ("_headers", "_key", "_offset", "_partition", "_timestamp", "_topic", "_value")

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]] | None,
        timestamp_type: int,
        timestamp: int,
    ) -> None:
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._key = key
        self._value = value
        self._headers = headers
        self._timestamp = (timestamp_type, timestamp)

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return self._timestamp

    def error(self) -> None:
        return None


class MalformedRecord(ValueError):
    """A record lite_push cannot turn into a message; the text is the reason
    stored with its dead letter."""


def _escape(group: str) -> str:
    out = []
    for c in group:
        if c in _PLAIN:
            out.append(c)
        elif c == "_":
            out.append("__")
        else:
            out.append("".join(f"_{b:02x}" for b in c.encode("utf-8")))
    return "".join(out)


def _unescape(text: str) -> str | None:
    raw = bytearray()
    i = 0
    while i < len(text):
        c = text[i]
        if c != "_":
            raw += c.encode()
            i += 1
        elif text.startswith("__", i):
            raw += b"_"
            i += 2
        elif (m := _HEX.match(text, i)) is not None:
            raw.append(int(m.group(1), 16))
            i += 3
        else:
            return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def kafka_topic(topic: str) -> str:
    """The Kafka name of lite_push topic ``topic``.  ``ValueError`` naming
    the topic when it cannot be one (illegal characters, too long)."""
    for prefix, stored in ((RETRY_PREFIX, RETRY_TOPIC_PREFIX), (DLQ_PREFIX, DLQ_TOPIC_PREFIX)):
        if topic.startswith(prefix) and len(topic) > len(prefix):
            name = stored + _escape(topic[len(prefix) :])
            if len(name) > 249:
                raise ValueError(f"topic {topic!r}: its Kafka name {name[:40]}... is longer than 249 characters")
            return name
    if not _LEGAL.fullmatch(topic) or topic in (".", ".."):
        raise ValueError(f"topic {topic!r} is not a legal Kafka topic name ([a-zA-Z0-9._-], 1 to 249 characters)")
    return topic


def lite_topic(stored: str) -> str:
    """The lite_push name of Kafka topic ``stored`` (the inverse of
    :func:`kafka_topic`)."""
    for prefix, lite in ((RETRY_TOPIC_PREFIX, RETRY_PREFIX), (DLQ_TOPIC_PREFIX, DLQ_PREFIX)):
        if stored.startswith(prefix) and len(stored) > len(prefix):
            group = _unescape(stored[len(prefix) :])
            if group is not None:
                return lite + group
    return stored


def key_decoder(encoding: str) -> Callable[[bytes], str]:
    """How a record key becomes the message's ``keys``: ``"hex"`` or a
    Python codec name.  ``LookupError`` for an unknown codec."""
    if encoding == "hex":
        return bytes.hex
    import codecs

    codecs.lookup(encoding)
    return lambda raw: raw.decode(encoding)


def encode_headers(tags: str | None, properties: Mapping[str, str], tags_header: str) -> list[tuple[str, bytes]]:
    """The headers of a record for ``tags`` and ``properties``."""
    headers = [(k, v.encode("utf-8")) for k, v in properties.items() if k != tags_header]
    if tags is not None:
        headers.append((tags_header, tags.encode("utf-8")))
    return headers


def decode(
    record: Any,
    topic: str,
    decode_key: Callable[[bytes], str],
    tags_header: str,
    broker_name: str,
) -> MessageExt:
    """The message of a confluent-kafka ``Message`` (``topic``: its
    lite_push name).  Raises :class:`MalformedRecord` with the reason."""
    raw_key = record.key()
    keys: str | None = None
    if raw_key is not None:
        try:
            keys = decode_key(raw_key)
        except (UnicodeDecodeError, ValueError) as e:
            raise MalformedRecord(f"undecodable key: {e}") from None
    tags: str | None = None
    props: dict[str, str] = {}
    headers = record.headers()
    if headers:
        for name, value in headers:
            try:
                text = "" if value is None else value.decode("utf-8")
            except UnicodeDecodeError as e:
                raise MalformedRecord(f"undecodable header {name!r}: {e}") from None
            if name == tags_header:
                tags = text
            else:
                props[name] = text
    try:
        times = reconsume_times_of(props) if RECONSUME_TIME in props else 0
    except ValueError as e:
        raise MalformedRecord(str(e)) from None
    value = record.value()
    ts = record.timestamp()[1]
    partition = record.partition()
    offset = record.offset()
    return MessageExt(
        topic,
        partition,
        offset,
        b"" if value is None else value,
        keys,
        tags,
        props,
        ts,
        ts,
        times,
        f"{record.topic()}-{partition}-{offset}",
        broker_name,
    )


@dataclass(frozen=True, slots=True)
class RecordFormat:
    """How one broker's records read as messages and back: the decoder of
    their keys (:func:`key_decoder`), the header holding the tags, and the
    broker name of their queues."""

    decode_key: Callable[[bytes], str]
    tags_header: str
    broker_name: str
    #: The name of the key encoding, when known ("" otherwise).
    key_encoding: str = ""
    #: Whether keys are UTF-8 (a compiled decoder decodes them itself).
    utf8_keys: bool = field(init=False)

    def __post_init__(self) -> None:
        utf8 = bool(self.key_encoding) and self.key_encoding != "hex"
        if utf8:
            import codecs

            utf8 = codecs.lookup(self.key_encoding).name == "utf-8"
        object.__setattr__(self, "utf8_keys", utf8)

    def decode(self, record: Any, topic: str) -> MessageExt:
        """:func:`decode` in this format."""
        return decode(record, topic, self.decode_key, self.tags_header, self.broker_name)

    def headers(self, tags: str | None, properties: Mapping[str, str]) -> list[tuple[str, bytes]]:
        """:func:`encode_headers` in this format."""
        return encode_headers(tags, properties, self.tags_header)
