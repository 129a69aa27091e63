"""Retry and dead-letter copies on Kafka, and dead letters of malformed records.

Kafka has no delayed delivery: ``send_back`` produces the copy to the
group's retry topic at once, once the runtime has held the failed message
for its delay level (the source says ``delayed_delivery`` is False).  Both
kinds of copy go to partition 0 of a one-partition topic (created on first
use; names in :mod:`.codec`), with the record's key, body and tags, the
message's properties as headers plus the origin bookkeeping, all produced
with one flush.

A record the consumer cannot decode is dead-lettered as it is: its value and
readable headers, the reason and its origin.  Its undecodable key goes to
the :data:`MALFORMED_KEY` property and an undecodable header value to
``KAFKA_HEADER_HEX.<name>``, both in hex, so the dead letter reads back.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ..._types import MessageExt
from .._common import dead_letter_item, retry_item
from ..contract import (
    DLQ_EXCEPTION,
    DLQ_GROUP,
    DLQ_REASON,
    ORIGIN_MESSAGE_ID,
    ORIGIN_OFFSET,
    ORIGIN_QUEUE_ID,
    ORIGIN_TOPIC,
    RECONSUME_TIME,
    RETRY_TOPIC,
    dlq_topic,
    retry_topic,
)
from .codec import Record, RecordFormat, kafka_topic, lite_topic
from .producer import Sender
from .topics import TopicCatalog

__all__ = ["MALFORMED_HEADER_PREFIX", "MALFORMED_KEY", "Checked", "Copies"]

#: Property of a malformed record's dead letter: its undecodable key, in hex.
MALFORMED_KEY = "KAFKA_KEY_HEX"
#: Prefix of a property holding an undecodable header value of it, in hex.
MALFORMED_HEADER_PREFIX = "KAFKA_HEADER_HEX."

#: A send_back / send_to_dlq item checked: (message, copy properties) or why not.
Checked = tuple[MessageExt, dict[str, str]] | BaseException


class Copies:
    """A broker's retry and dead-letter copies (``KafkaBroker.copies``),
    produced through ``sender`` in ``fmt`` to topics ``catalog`` creates;
    ``delay_levels`` are the retry topic's, a copy's body may have
    ``max_message_size`` bytes."""

    __slots__ = ("_sender", "_catalog", "_fmt", "delay_levels", "_max_size")

    def __init__(
        self,
        sender: Sender,
        catalog: TopicCatalog,
        fmt: RecordFormat,
        delay_levels: tuple[float, ...],
        max_message_size: int,
    ) -> None:
        self._sender = sender
        self._catalog = catalog
        self._fmt = fmt
        self.delay_levels = delay_levels
        self._max_size = max_message_size

    def store_retries(self, group: str, items: Sequence[tuple[MessageExt, int]]) -> list[BaseException | None]:
        """``send_back`` of a member of ``group``: each item checked
        (:func:`~.._common.retry_item`), the good ones produced at once to
        the group's retry topic."""
        checked: list[Checked] = []
        for item in items:
            try:
                m, _level, props = retry_item(item, self.delay_levels, self._max_size)
                checked.append((m, props))
            except Exception as e:
                checked.append(e)
        return self.store_copies(retry_topic(group), checked)

    def store_dead_letters(
        self, group: str, items: Sequence[tuple[MessageExt, str, str]]
    ) -> list[BaseException | None]:
        """``send_to_dlq`` of a member of ``group``: each item checked, the
        good ones produced to the group's dead-letter topic."""
        checked: list[Checked] = []
        for item in items:
            try:
                checked.append(dead_letter_item(item, group, self._max_size))
            except Exception as e:
                checked.append(e)
        return self.store_copies(dlq_topic(group), checked)

    def store_copies(self, topic: str, checked: list[Checked]) -> list[BaseException | None]:
        """Produce retry or dead-letter copies to ``topic`` (a retry or
        dead-letter topic, created with one partition if missing), all to
        partition 0, one flush for all; one result per item (an item that
        failed its checks keeps its exception)."""
        good = [c for c in checked if not isinstance(c, BaseException)]
        results: Iterator[BaseException | None] = iter(())
        if good:
            try:
                self._catalog.ensure_topic(topic, 1)
                name = kafka_topic(topic)
                headers = self._fmt.headers
                records: list[Record] = [
                    (name, 0, None if m.keys is None else m.keys.encode("utf-8"), m.body, headers(m.tags, props))
                    for m, props in good
                ]
                results = iter(self._sender.produce(records))
            except Exception as e:
                results = iter([e] * len(good))
        return [c if isinstance(c, BaseException) else next(results) for c in checked]

    def store_malformed(self, group: str, record: Any, reason: str) -> BaseException | None:
        """Dead-letter a record the consumer could not decode: its value and
        headers, the reason and its origin; an undecodable key goes to the
        :data:`MALFORMED_KEY` property (the copy has no key) and an
        undecodable header value to ``KAFKA_HEADER_HEX.<name>``, both in
        hex, so the dead letter itself reads back."""
        topic = lite_topic(record.topic())
        origin = {
            ORIGIN_TOPIC: topic,
            RETRY_TOPIC: topic,
            ORIGIN_QUEUE_ID: str(record.partition()),
            ORIGIN_OFFSET: str(record.offset()),
            ORIGIN_MESSAGE_ID: f"{record.topic()}-{record.partition()}-{record.offset()}",
            DLQ_REASON: reason,
            DLQ_EXCEPTION: "",
            DLQ_GROUP: group,
            RECONSUME_TIME: "0",
        }
        # The dead letter must itself be readable: an undecodable key or
        # header value travels as hex in a property instead.
        headers: list[tuple[str, bytes]] = []
        for k, v in record.headers() or []:
            try:
                (v or b"").decode("utf-8")
                headers.append((k, v or b""))
            except UnicodeDecodeError:
                headers.append((MALFORMED_HEADER_PREFIX + k, v.hex().encode()))
        key = record.key()
        if key is not None:
            try:
                self._fmt.decode_key(key)
            except (UnicodeDecodeError, ValueError):
                headers.append((MALFORMED_KEY, key.hex().encode()))
                key = None
        headers += [(k, v.encode()) for k, v in origin.items()]
        try:
            self._catalog.ensure_topic(dlq_topic(group), 1)
            name = kafka_topic(dlq_topic(group))
            (err,) = self._sender.produce([(name, 0, key, record.value() or b"", headers)])
        except Exception as e:
            return e
        return err
