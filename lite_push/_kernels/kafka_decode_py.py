"""Pure-Python twin of ``lite_push._kernels.kafka_decode_c``: :func:`decode_plain`,
the message of a Kafka record without headers (most records: lite_push's
producers add headers only for tags, properties and retries), decoded
without the header pass of ``lite_push.sources.kafka.codec.decode``.

It is a fast path, not a second format: for any record it does not return
``None`` for, the message equals what ``codec.decode`` makes of it
(``tests/test_kafka_decode.py`` holds both twins to that).  The compiled twin
also skips the dataclass ``__init__`` and leaves the message untracked by
the cyclic garbage collector; measured in ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._types import MessageExt

__all__ = ["decode_plain"]


def decode_plain(record: Any, topic: str, decode_key: Callable[[bytes], str], broker_name: str) -> MessageExt | None:
    """The message of a confluent-kafka record that has no headers (``topic``:
    its lite_push name, ``decode_key`` the broker's key decoder); ``None``
    when it has headers or its key does not decode: then the full decoder
    (``lite_push.sources.kafka.codec.decode``) decides, and names what is
    malformed."""
    if record.headers():
        return None
    raw_key = record.key()
    keys = None
    if raw_key is not None:
        try:
            keys = decode_key(raw_key)
        except (UnicodeDecodeError, ValueError):
            return None
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
        None,
        {},
        ts,
        ts,
        0,
        f"{record.topic()}-{partition}-{offset}",
        broker_name,
    )
