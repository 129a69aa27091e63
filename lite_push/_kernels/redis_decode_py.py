"""Pure-Python twin of ``lite_push._kernels.redis_decode_c``: :func:`decode_plain`,
the messages of a run of Redis stream entries that are all plain (most
reads: lite_push's own entries of a message never retried), without the
checks and the properties pass of ``lite_push.sources.redis.codec.decode``.

It is a fast path, not a second format: for any run it does not return
``None`` for, the messages equal what ``codec.decode`` makes of it
(``tests/test_redis_decode.py`` holds both twins to that).  The compiled
twin also skips the dataclass ``__init__`` and leaves each message
untracked by the cyclic garbage collector; measured in
``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from .._types import MessageExt

__all__ = ["decode_plain"]


def decode_plain(
    namespace: str, topic: str, qid: int, prefix: str, entries: Sequence[Any], first: int
) -> list[MessageExt] | None:
    """The messages of ``entries``, a read of queue ``qid`` of ``topic``
    whose offsets run from ``first`` one by one, when every entry is plain:
    an id ``b"<offset+1>-0"`` and the fields ``[b"b", body, b"m", meta,
    b"s", stored]`` (the reader's raw XRANGE), its metadata a JSON object
    without properties.  ``prefix`` starts each ``msg_id``
    (``"<namespace>-<topic>-<qid>-"``).  ``None`` for anything else: the
    full decoder (``codec.decode``) decides, and names what is malformed."""
    loads = orjson.loads
    out: list[MessageExt] = []
    off = first
    for entry in entries:
        eid, f = entry
        if type(eid) is not bytes or not eid.endswith(b"-0"):
            return None
        if type(f) is not list or len(f) != 6 or f[0] != b"b" or f[2] != b"m" or f[4] != b"s":
            return None
        body, raw, stored = f[1], f[3], f[5]
        try:
            meta = loads(raw)
        except orjson.JSONDecodeError:
            return None
        if type(meta) is not dict or meta.get("p") or type(body) is not bytes:
            return None
        try:
            store = int(stored)
        except (TypeError, ValueError):
            return None
        out.append(
            MessageExt(
                topic,
                qid,
                off,
                body,
                meta.get("k"),
                meta.get("t"),
                {},
                meta.get("bt", 0),
                store,
                0,
                prefix + str(off),
                namespace,
            )
        )
        off += 1
    return out
