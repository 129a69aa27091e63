"""Message bodies as JSON, coded with orjson.

A listener that expects JSON calls :func:`json_body`; a body that is not
valid JSON raises :class:`~lite_push.MessageDecodeError`, which the consumer
treats as any failure (retried, then dead-lettered with the reason).  A
listener that knows a retry cannot help may raise
:class:`~lite_push.NonRetryableError` from it instead.
"""

from __future__ import annotations

from typing import Any

import orjson

from ._errors import MessageDecodeError
from ._types import MessageExt

__all__ = ["json_body", "to_json"]


def json_body(message: MessageExt) -> Any:
    """The message's body decoded from JSON.  Raises
    :class:`~lite_push.MessageDecodeError` naming the message (topic, queue,
    offset) and what is wrong with the body."""
    try:
        return orjson.loads(message.body)
    except orjson.JSONDecodeError as exc:
        raise MessageDecodeError(message.topic, message.queue_id, message.queue_offset, f"invalid JSON: {exc}") from exc
    except TypeError as exc:  # a body that is not bytes
        raise MessageDecodeError(
            message.topic, message.queue_id, message.queue_offset, f"body is {type(message.body).__name__}, not bytes"
        ) from exc


def to_json(value: Any) -> bytes:
    """``value`` as a JSON body (orjson; raises ``TypeError`` for values
    JSON cannot hold)."""
    return orjson.dumps(value)
