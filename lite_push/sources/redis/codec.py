"""How a message is stored in a Redis stream entry, and read back.

Entry fields: ``b`` = body (raw bytes), ``m`` = orjson ``{"k": keys, "t":
tags, "p": properties, "bt": born ms}``, ``s`` = store ms (server TIME).  A
message's offset is its stream id minus one: id ``"<offset+1>-0"``.

An entry lite_push did not write (a raw ``XADD`` by another program) is
*foreign*: one without the three fields, whose metadata is no JSON object,
or whose id's sequence part is not 0 (``XADD key * ...`` twice in one
millisecond, ``XADD key 5-1 ...``: such an id shares its offset with the
entry before it, so it can never be a message).  :func:`decode` leaves it
out and hands it back as a stand-in with the reason, for the dead-letter
queue.  An entry with lite_push's fields and an id ``"<n>-0"`` is a message
at offset ``n - 1`` whoever wrote it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from ..._kernels.redis_decode import decode_plain
from ..._kernels.untrack import untrack_all
from ..._types import MessageExt, MessageQueue
from ..contract import reconsume_times_of

__all__ = ["ForeignIdError", "decode", "encode_meta", "malformed_reason", "offset_of"]


def offset_of(eid: bytes | str) -> int:
    """The offset of the stream entry with id ``eid``."""
    if isinstance(eid, bytes):
        eid = eid.decode()
    return int(eid.split("-", 1)[0]) - 1


def encode_meta(message: MessageExt, props: dict[str, str]) -> bytes:
    """The ``m`` field of a copy of ``message`` with properties ``props``."""
    meta: dict[str, Any] = {"bt": message.born_timestamp, "p": props}
    if message.keys:
        meta["k"] = message.keys
    if message.tags:
        meta["t"] = message.tags
    return orjson.dumps(meta)


def decode(
    namespace: str, q: MessageQueue, entries: Sequence[Any], bad: list[tuple[MessageExt, str]]
) -> list[MessageExt]:
    """Stream entries of ``q`` as messages.  An entry's fields come as the
    flat list ``[b"b", body, b"m", meta, b"s", stored]`` (the reader's raw
    XRANGE) or as a dict (a cluster client's parsed reply).  Offsets are
    parsed from the ids only when the entries are not consecutive (never,
    unless a stream was edited or holds a foreign entry).

    An entry that cannot be decoded (one lite_push did not write: missing
    fields, unreadable metadata, an id whose sequence part is not 0) is
    left out of the result and appended to ``bad`` as a stand-in message
    (whatever body it has, its offset) with the reason, which names the
    entry's id, for the dead-letter queue."""
    try:
        return _decode(namespace, q, entries)
    except Exception:  # some entry is malformed: decode them one by one
        pass
    out: list[MessageExt] = []
    for eid, f in entries:
        try:
            out += _decode(namespace, q, [(eid, f)])
        except Exception as e:
            bad.append((_stand_in(namespace, q, eid, f), malformed_reason(eid, f, e)))
    return out


class ForeignIdError(ValueError):
    """A stream id whose sequence part is not 0: not one lite_push wrote."""


def malformed_reason(eid: bytes | str, fields: Any, error: Exception) -> str:
    """Why entry ``eid`` (with ``fields``) is no message, as the reason of
    its dead letter: ``malformed entry <id>: ...``, naming what is wrong."""
    sid = eid.decode(errors="replace") if isinstance(eid, bytes) else str(eid)
    names = list(fields[::2]) if type(fields) is list else list(fields) if isinstance(fields, dict) else []
    shown = ", ".join(n.decode(errors="replace") if isinstance(n, bytes) else str(n) for n in names[:8])
    if isinstance(error, ForeignIdError):
        return f"malformed entry {sid}: not written by lite_push: {error}"
    if isinstance(error, KeyError) or len(names) != 3:
        why = f"fields {shown or '(none)'}, not b, m, s"
    else:
        why = f"{type(error).__name__}: {error}"
    return f"malformed entry {sid}: {why} (not written by lite_push?)"


def _stand_in(namespace: str, q: MessageQueue, eid: Any, f: Any) -> MessageExt:
    """A message for a malformed entry: its body when it has one."""
    fields = dict(zip(f[::2], f[1::2], strict=False)) if type(f) is list else dict(f) if isinstance(f, dict) else {}
    body = fields.get(b"b", b"")
    off = offset_of(eid)
    return MessageExt(
        q.topic,
        q.queue_id,
        off,
        body if isinstance(body, bytes) else b"",
        None,
        None,
        {},
        0,
        0,
        0,
        f"{namespace}-{q.topic}-{q.queue_id}-{off}",
        namespace,
    )


def _decode(namespace: str, q: MessageQueue, entries: Sequence[Any]) -> list[MessageExt]:
    n = len(entries)
    if not n:
        return []
    first = offset_of(entries[0][0])
    consecutive = n == 1 or offset_of(entries[-1][0]) - first == n - 1
    topic = q.topic
    qid = q.queue_id
    prefix = f"{namespace}-{topic}-{qid}-"
    if consecutive:
        # Most reads: lite_push's own entries, never retried (the fast
        # path, compiled when built; it leaves the rest to the loop below).
        plain = decode_plain(namespace, topic, qid, prefix, entries, first)
        if plain is not None:
            untrack_all(plain)
            return plain
    zero = b"-0" if type(entries[0][0]) is bytes else "-0"
    loads = orjson.loads
    out = []
    off = first
    for eid, f in entries:
        if not eid.endswith(zero):
            raise ForeignIdError("its id's sequence part is not 0 (lite_push writes <offset+1>-0)")
        if not consecutive:
            off = offset_of(eid)
        if type(f) is list and len(f) == 6 and f[0] == b"b" and f[2] == b"m":
            body, raw, stored = f[1], f[3], f[5]
        else:
            if type(f) is list:
                f = dict(zip(f[::2], f[1::2], strict=True))
            body, raw, stored = f[b"b"], f[b"m"], f[b"s"]
        meta = loads(raw)
        props = meta.get("p")
        rt = 0
        if props:
            try:
                rt = reconsume_times_of(props)
            except ValueError:
                rt = 0
        else:
            props = {}
        out.append(
            MessageExt(
                topic,
                qid,
                off,
                body,
                meta.get("k"),
                meta.get("t"),
                props,
                meta.get("bt", 0),
                int(stored),
                rt,
                prefix + str(off),
                namespace,
            )
        )
        off += 1
    untrack_all(out)  # held until finished: see lite_push._kernels.untrack_py
    return out
