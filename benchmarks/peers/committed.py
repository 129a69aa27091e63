"""What a peer's group committed, read after its runner exited: which
messages the broker now takes as done (``acked[seq]``), for the checker's
``lost`` (a message taken as done that was never handled).

* Kafka (:func:`kafka_acked`): a ``confluent_kafka.Consumer`` with the
  group's ``group.id`` asks ``committed()`` for every partition; a message
  is done when its offset is below its partition's committed offset.
  lite_push's commit metadata (the offset map of finished messages above
  the committed offset) is not read: only what any Kafka tool would take.
* lite_push's Redis topic (:func:`lite_push_redis_acked`):
  ``RedisBroker.committed(group, queue)``, the same rule.
* A Redis stream's consumer group (:func:`stream_group_acked`, faststream):
  a message is done when its entry id is at or below the group's
  ``last-delivered-id`` (``XINFO GROUPS``) and not pending
  (``XPENDING``: delivered, not acknowledged).
"""

from __future__ import annotations

from typing import Any

from .loading import Placement, entry_id

__all__ = ["kafka_acked", "lite_push_redis_acked", "stream_group_acked"]


def _below(placed: Placement, committed: dict[int, int]) -> bytearray:
    acked = bytearray(len(placed.part))
    for seq, (part, offset) in enumerate(zip(placed.part, placed.offset, strict=True)):
        if offset < committed.get(part, -1):
            acked[seq] = 1
    return acked


def kafka_acked(bootstrap: str, topic: str, group: str, placed: Placement) -> bytearray:
    """``acked[seq]``: below the group's committed offset of its partition."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        got = consumer.committed([TopicPartition(topic, p) for p in range(placed.parts)], timeout=20)
    finally:
        consumer.close()
    return _below(placed, {tp.partition: tp.offset for tp in got if tp.offset >= 0})


def lite_push_redis_acked(broker: Any, topic: str, group: str, placed: Placement) -> bytearray:
    """``acked[seq]``: below lite_push's committed offset of its queue."""
    committed = {}
    for queue in broker.queues(topic):
        got = broker.committed(group, queue)
        if got is not None:
            committed[queue.queue_id] = got.offset
    return _below(placed, committed)


def stream_group_acked(client: Any, stream: str, group: str, placed: Placement) -> bytearray:
    """``acked[seq]``: delivered to the stream group and not pending.  A
    group that does not exist (the runner never made it) acked nothing."""
    acked = bytearray(len(placed.stream_ids))
    groups = {_text(g["name"]): g for g in client.xinfo_groups(stream)}
    if group not in groups:
        return acked
    last = entry_id(groups[group]["last-delivered-id"])
    pending: set[tuple[int, int]] = set()
    low: str = "-"
    while True:
        page = client.xpending_range(stream, group, min=low, max="+", count=10_000)
        if not page:
            break
        pending.update(entry_id(p["message_id"]) for p in page)
        low = "(" + _text(page[-1]["message_id"])
    for seq, sid in enumerate(placed.stream_ids):
        if sid <= last and sid not in pending:
            acked[seq] = 1
    return acked


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
