"""What every broker's ``send_batch`` does the same way, written once: the
shapes an item may have, the checks it passes before anything is stored,
and the queue it goes to.

An item is ``body`` (bytes), ``(body, keys)`` or a mapping with ``body`` and
optionally ``keys``, ``tags``, ``properties`` and ``queue_id``
(:data:`ITEM_FIELDS`).  :func:`checked_items` unpacks and checks each item
of a batch and, given the topic's :class:`RoundRobin`, picks its queue the
way RocketMQ's producer does.  The embedded and the Redis brokers use it
so; the Kafka broker only checks its items here and leaves a keyed item
without ``queue_id`` to Kafka's own partitioner (murmur2, as the Java
producer), so that Kafka tools and lite_push agree on a key's partition.

A generator, not a function per item: it runs once per message sent, and a
generator's resume costs less than a call (a million-message batch spends
a tenth of its time here).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, overload

from .._errors import MessageTooLargeError
from .._kernels.router import lane_of

__all__ = ["ITEM_FIELDS", "RoundRobin", "checked_items", "unpack_mapping"]

#: The keys a mapping item of ``send_batch`` may have.
ITEM_FIELDS = frozenset({"body", "keys", "tags", "properties", "queue_id"})

#: One checked item: ``(body, keys, tags, properties, queue)``.
Item = tuple[bytes, str | None, str | None, dict[str, str], int]
#: One checked item whose queue the broker may choose (``None``).
OpenItem = tuple[bytes, str | None, str | None, dict[str, str], int | None]


class RoundRobin:
    """A topic's round-robin position: the next message without a key or a
    ``queue_id`` goes to queue ``next % queue_count``.  Kept with the topic;
    two senders racing on one topic may start at the same queue (round
    robin only spreads load)."""

    __slots__ = ("next",)

    def __init__(self) -> None:
        self.next = 0


def unpack_mapping(item: Mapping[str, Any]) -> tuple[Any, str | None, str | None, dict[str, str], int | None]:
    """``(body, keys, tags, properties, queue_id)`` of a mapping item of
    ``send_batch``; ``TypeError`` naming what is wrong (the body and keys
    are checked by the caller)."""
    unknown = set(item) - ITEM_FIELDS
    if unknown or "body" not in item:
        raise TypeError(f"send_batch mapping items need 'body' and take only {sorted(ITEM_FIELDS)}")
    tags = item.get("tags")
    if tags is not None and type(tags) is not str:
        raise TypeError(f"tags must be str or None, got {type(tags).__name__}")
    raw = item.get("properties")
    props: dict[str, str] = {}
    if raw:
        if not isinstance(raw, Mapping):
            raise TypeError(f"properties must be a mapping of str to str, got {type(raw).__name__}")
        props = dict(raw)
        for k, v in props.items():
            if type(k) is not str or type(v) is not str:
                raise TypeError(f"properties must map str to str, got {k!r}: {v!r}")
    return item["body"], item.get("keys"), tags or None, props, item.get("queue_id")


@overload
def checked_items(
    items: Iterable[Any],
    topic: str,
    queue_count: int,
    limit: int,
    rr: RoundRobin,
    trace: Mapping[str, str] | None = None,
) -> Iterator[Item]: ...


@overload
def checked_items(
    items: Iterable[Any],
    topic: str,
    queue_count: int,
    limit: int,
    rr: None = None,
    trace: Mapping[str, str] | None = None,
) -> Iterator[OpenItem]: ...


def checked_items(
    items: Iterable[Any],
    topic: str,
    queue_count: int,
    limit: int,
    rr: RoundRobin | None = None,
    trace: Mapping[str, str] | None = None,
) -> Iterator[Item] | Iterator[OpenItem]:
    """``(body, keys, tags, properties, queue)`` of each ``send_batch`` item
    of ``topic``, checked: ``TypeError`` for a shape that is none of the
    three, a body that is not bytes, keys that are not str (or tags and
    properties of the wrong types), ``MessageTooLargeError`` for a body
    over ``limit`` bytes, ``ValueError`` for a ``queue_id`` outside
    ``[0, queue_count)``.  Raised as the caller reaches the item: a caller
    stores nothing before it has taken every item.

    The queue: the item's ``queue_id`` when it has one; else, with the
    topic's round robin ``rr``, ``lane_of(keys, queue_count)`` for
    non-empty keys (RocketMQ's SelectMessageQueueByHash, with a
    non-negative modulo) or the next queue in round-robin order, which
    moves ``rr`` on once every item is taken; without ``rr``, ``None`` (the
    broker chooses).

    ``trace``: the sender's context (``traceparent``, ``tracestate``), put
    in each item's properties unless the item has a ``traceparent`` of its
    own (a dead letter sent again keeps its original context)."""
    by_key: dict[str, int] = {}  # a batch repeats its keys
    nxt = rr.next if rr is not None else 0
    for item in items:
        tp = type(item)
        tags = qid = None
        props: dict[str, str] = {}
        if tp is bytes:
            body, keys = item, None
        elif tp is tuple:
            if len(item) != 2:
                raise TypeError(f"send_batch items are body, (body, keys) or a mapping; got a {len(item)}-tuple")
            body, keys = item
        elif isinstance(item, Mapping):
            body, keys, tags, props, qid = unpack_mapping(item)
        else:
            raise TypeError(f"send_batch items are body, (body, keys) or a mapping; got {tp.__name__}")
        if type(body) is not bytes:
            raise TypeError(f"message body must be bytes, got {type(body).__name__}")
        if len(body) > limit:
            raise MessageTooLargeError(topic, len(body), limit)
        if keys is not None and type(keys) is not str:
            raise TypeError(f"keys must be str or None, got {type(keys).__name__}")
        if qid is not None:
            if type(qid) is not int or not 0 <= qid < queue_count:
                raise ValueError(f"queue_id must be an int in [0, {queue_count}) for topic {topic!r}, got {qid!r}")
        elif rr is None:
            pass
        elif keys:
            qid = by_key.get(keys, -1)
            if qid < 0:
                qid = by_key[keys] = lane_of(keys, queue_count)
        else:
            qid = nxt % queue_count
            nxt += 1
        if trace is not None and "traceparent" not in props:
            props = {**trace, **props}
        yield body, keys, tags, props, qid
    if rr is not None:
        rr.next = nxt
