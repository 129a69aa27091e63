"""faststream's Redis Streams messages, written and read back with redis-py.

Imported by the orchestrator from the project's venv (redis-py only, no
faststream), to fill the stream that ``faststream_redis_runner.py``
consumes and to check afterwards what its consumer group acknowledged.

faststream's wire format (``faststream.redis``, 0.7: the publisher's
``XADD``, ``parser.binary.BinaryMessageFormatV1``): one field per entry,
``__data__``, holding

    b"\\x89BIN\\r\\n\\x1a\\n"                  identity, 8 bytes
    version           >H  (1)
    headers offset    >I  (18: where the header count is)
    data offset       >I  (where the body starts)
    header count      >H
    count x (key length >H, key, value length >H, value)   UTF-8
    body              the message's bytes, to the end

faststream's own publisher sends a ``correlation_id`` header (a UUID) and,
for a ``bytes`` body, no ``content-type``; the subscriber's parser gives the
headers as ``message.headers`` and the body as the handler's ``bytes``
argument.  A stream entry has no key of its own, so the ordering key goes
in a header, ``key`` (:data:`KEY_HEADER`): ``message.headers["key"]``.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import redis

__all__ = [
    "DATA_FIELD",
    "KEY_HEADER",
    "GroupAcks",
    "committed_position",
    "encode_message",
    "fill_faststream_stream",
    "seq_of_entry",
]

#: The one field of an entry faststream writes and reads.
DATA_FIELD = b"__data__"
#: The header the ordering key is sent in.
KEY_HEADER = "key"
#: Entries per pipeline round trip when filling.
FILL_BATCH = 1000
#: Entries per XRANGE / XPENDING call when reading back.
READ_BATCH = 10_000

_IDENTITY = b"\x89BIN\r\n\x1a\n"
_VERSION = 1
_HEADERS_AT = len(_IDENTITY) + 2 + 4 + 4  # identity, version, two offsets


def _string(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 0xFFFF:
        raise ValueError(f"a header of faststream's format is at most 65535 bytes, got {len(raw)}")
    return struct.pack(">H", len(raw)) + raw


def encode_message(body: bytes, headers: dict[str, str]) -> bytes:
    """``body`` with ``headers`` in faststream's binary format (v1).  The
    lengths are of the UTF-8 bytes (faststream 0.7.8 writes the length of
    the ``str``: the same for the ASCII keys used here)."""
    packed = b"".join(_string(k) + _string(v) for k, v in headers.items())
    data_at = _HEADERS_AT + 2 + len(packed)
    return _IDENTITY + struct.pack(">HIIH", _VERSION, _HEADERS_AT, data_at, len(headers)) + packed + body


def fill_faststream_stream(client: redis.Redis, stream: str, items: list[tuple[str, bytes]]) -> None:
    """Append ``(key, value)`` messages to ``stream`` in order, as
    faststream's ``RedisBroker.publish(value, stream=..., headers={"key":
    key})`` would (each with a new ``correlation_id``), ``FILL_BATCH`` per
    pipeline round trip (no transaction)."""
    for at in range(0, len(items), FILL_BATCH):
        pipe = client.pipeline(transaction=False)
        for key, value in items[at : at + FILL_BATCH]:
            headers = {"correlation_id": str(uuid.uuid4()), KEY_HEADER: key}
            pipe.xadd(stream, {DATA_FIELD: encode_message(value, headers)})
        pipe.execute()


def seq_of_entry(fields: dict[bytes, bytes]) -> int:
    """The ``seq`` of an entry :func:`fill_faststream_stream` wrote: the
    first 8 bytes (big endian) of its body."""
    data = fields[DATA_FIELD]
    if not data.startswith(_IDENTITY):
        raise ValueError("not a faststream binary message (no identity header)")
    (data_at,) = struct.unpack_from(">I", data, _HEADERS_AT - 4)
    return int.from_bytes(data[data_at : data_at + 8], "big")


@dataclass(frozen=True)
class GroupAcks:
    """What a consumer group of a stream has delivered and acknowledged.

    Redis acknowledges entries one by one (``XACK``), not up to a position:
    an entry is acknowledged when it was delivered to the group (its id is
    at most ``last_delivered_id``) and is no longer pending.
    """

    #: ``XINFO GROUPS``' last-delivered-id ("0-0": nothing delivered, or no group).
    last_delivered_id: str
    #: ``XINFO GROUPS``' entries-read and lag (Redis >= 7; None before, or when unknown).
    entries_read: int | None
    lag: int | None
    #: Delivered and not acknowledged (``XPENDING``), in id order.
    pending_ids: tuple[str, ...]
    #: The ``seq`` of every acknowledged entry, ascending.
    acknowledged_seqs: tuple[int, ...]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pending_ids(client: redis.Redis, stream: str, group: str) -> list[str]:
    out: list[str] = []
    start = "-"
    while True:
        rows = client.xpending_range(stream, group, min=start, max="+", count=READ_BATCH)
        out += [_text(row["message_id"]) for row in rows]
        if len(rows) < READ_BATCH:
            return out
        start = "(" + out[-1]


def _entries(client: redis.Redis, stream: str, last: str) -> Iterable[tuple[str, dict[bytes, bytes]]]:
    start = "-"
    while True:
        rows = client.xrange(stream, min=start, max=last, count=READ_BATCH)
        for entry_id, fields in rows:
            yield _text(entry_id), fields
        if len(rows) < READ_BATCH:
            return
        start = "(" + _text(rows[-1][0])


def committed_position(client: redis.Redis, stream: str, group: str) -> GroupAcks:
    """What ``group`` acknowledged of ``stream`` (see :class:`GroupAcks`);
    a missing stream or group acknowledged nothing."""
    try:
        groups = client.xinfo_groups(stream)
    except redis.ResponseError:  # no such stream
        groups = []
    info = next((g for g in groups if _text(g["name"]) == group), None)
    if info is None:
        return GroupAcks("0-0", None, None, (), ())
    last = _text(info["last-delivered-id"])
    pending = _pending_ids(client, stream, group)
    skip = set(pending)
    acked = sorted(seq_of_entry(fields) for entry_id, fields in _entries(client, stream, last) if entry_id not in skip)
    entries_read, lag = info.get("entries-read"), info.get("lag")
    return GroupAcks(
        last,
        None if entries_read is None else int(entries_read),
        None if lag is None else int(lag),
        tuple(pending),
        tuple(acked),
    )
