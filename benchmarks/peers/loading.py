"""Filling the brokers once per shape, before any peer runs (a backlog).

Every message ``seq`` has the value ``seq`` (8 bytes big endian) padded to
the shape's ``body_size`` and the key ``keys[seq]``.  Each filler returns a
:class:`Placement`: where each ``seq`` was stored (``part``, ``offset``) and
its send wall time (``time.time_ns()`` when it was handed to the client;
per batch for the Redis fillers), which the checker uses for the committed
offsets and the latency.

* :func:`produce_kafka` -- a ``confluent_kafka.Producer``; a key's partition
  is ``queue_of(key, partitions)`` (Java's ``String.hashCode``, floorMod: the
  harness's, not Kafka's default partitioner), in ``seq`` order; offsets
  from the delivery reports.
* :func:`fill_lite_push_redis` -- lite_push's Redis topic
  (``RedisBroker.send_batch``: a key's queue is ``lane_of(key, queues)``,
  the same split as the Kafka partitions).
* :func:`fill_faststream_redis` -- one Redis stream in faststream's entry
  format (``peers/redis_streams.fill_faststream_stream``, written with
  faststream's runner); ``part`` 0, ``offset`` the entry's index, and the
  entry ids in order (:attr:`Placement.stream_ids`) for the checker.
* :func:`place_nowhere` -- nothing stored, for a runner without a broker
  (the floor): ``part`` the key's partition as in the Kafka topic, ``offset``
  its index there, and a send time of 0, so a message is there from the
  run's start (``measure.p99_ms``).
"""

from __future__ import annotations

import array
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workloads import queue_of

__all__ = [
    "Placement",
    "entry_id",
    "fill_faststream_redis",
    "fill_lite_push_redis",
    "place_nowhere",
    "produce_kafka",
]

#: Messages per Redis batch (send_batch / the faststream filler).
REDIS_BATCH = 5_000


@dataclass
class Placement:
    """Where each ``seq`` is stored and when it was sent."""

    parts: int
    part: array.array[int] = field(default_factory=lambda: array.array("q"))
    offset: array.array[int] = field(default_factory=lambda: array.array("q"))
    sent_ns: array.array[int] = field(default_factory=lambda: array.array("q"))
    #: Redis stream entry ids ``(ms, seq)`` in stream order (faststream's stream only).
    stream_ids: list[tuple[int, int]] = field(default_factory=list)
    seconds: float = 0.0

    @classmethod
    def sized(cls, parts: int, total: int) -> Placement:
        zeros = array.array("q", bytes(8 * total))
        return cls(parts, array.array("q", zeros), array.array("q", zeros), array.array("q", zeros))


def _value(seq: int, pad: bytes) -> bytes:
    return seq.to_bytes(8, "big") + pad


def produce_kafka(bootstrap: str, topic: str, keys: list[str], partitions: int, body_size: int) -> Placement:
    """Produce every message to ``topic`` (which must exist with
    ``partitions`` partitions) and wait for every delivery."""
    from confluent_kafka import Producer

    total = len(keys)
    placed = Placement.sized(partitions, total)
    failed: list[str] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(str(err))
            return
        seq = int.from_bytes(msg.value()[:8], "big")
        placed.part[seq] = msg.partition()
        placed.offset[seq] = msg.offset()

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": False})
    pad = b"\0" * max(0, body_size - 8)
    t0 = time.perf_counter()
    for seq, key in enumerate(keys):
        value = _value(seq, pad)
        part = queue_of(key, partitions)
        while True:
            try:
                placed.sent_ns[seq] = time.time_ns()
                producer.produce(topic, value, key.encode(), partition=part, on_delivery=report)
                break
            except BufferError:  # the local queue is full: let deliveries drain
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(120)
    if left or failed:
        raise RuntimeError(f"producing {topic}: {left} undelivered, {len(failed)} failed ({failed[:3]})")
    placed.seconds = time.perf_counter() - t0
    return placed


def fill_lite_push_redis(broker: Any, topic: str, keys: list[str], queues: int, body_size: int) -> Placement:
    """Store every message in lite_push's Redis topic ``topic`` (created
    here with ``queues`` queues) through ``broker`` (a ``RedisBroker``)."""
    total = len(keys)
    placed = Placement.sized(queues, total)
    broker.create_topic(topic, queues)
    pad = b"\0" * max(0, body_size - 8)
    t0 = time.perf_counter()
    for first in range(0, total, REDIS_BATCH):
        seqs = range(first, min(total, first + REDIS_BATCH))
        sent = time.time_ns()
        results = broker.send_batch(topic, [(_value(seq, pad), keys[seq]) for seq in seqs])
        for seq, result in zip(seqs, results, strict=True):
            placed.part[seq] = result.queue.queue_id
            placed.offset[seq] = result.offset
            placed.sent_ns[seq] = sent
    placed.seconds = time.perf_counter() - t0
    return placed


def place_nowhere(keys: list[str], partitions: int) -> Placement:
    """Where each ``seq`` would be in a Kafka topic of ``partitions``
    partitions, sent at time 0 (see the module docstring)."""
    placed = Placement.sized(partitions, len(keys))
    next_offset = [0] * partitions
    for seq, key in enumerate(keys):
        part = queue_of(key, partitions)
        placed.part[seq] = part
        placed.offset[seq] = next_offset[part]
        next_offset[part] += 1
    return placed


def entry_id(raw: bytes | str) -> tuple[int, int]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def fill_faststream_redis(
    client: Any, stream: str, keys: list[str], body_size: int, filler: Callable[[Any, str, list[Any]], None]
) -> Placement:
    """Append every message to the Redis stream ``stream`` in faststream's
    format with ``filler`` (``redis_streams.fill_faststream_stream(client,
    stream, items)``, items ``(key, value)``), in ``seq`` order; then read
    the entry ids back (the n-th entry is ``seq`` n)."""
    total = len(keys)
    placed = Placement.sized(1, total)
    pad = b"\0" * max(0, body_size - 8)
    t0 = time.perf_counter()
    for first in range(0, total, REDIS_BATCH):
        seqs = range(first, min(total, first + REDIS_BATCH))
        sent = time.time_ns()
        filler(client, stream, [(keys[seq], _value(seq, pad)) for seq in seqs])
        for seq in seqs:
            placed.offset[seq] = seq
            placed.sent_ns[seq] = sent
    placed.seconds = time.perf_counter() - t0
    low: bytes | str = "-"
    while True:
        page = client.xrange(stream, min=low, max="+", count=10_000)
        if not page:
            break
        placed.stream_ids.extend(entry_id(raw) for raw, _ in page)
        last = page[-1][0]
        low = "(" + (last.decode() if isinstance(last, bytes) else last)  # exclusive: after the last one
    if len(placed.stream_ids) != total:
        raise RuntimeError(f"stream {stream}: {len(placed.stream_ids)} entries after filling {total}")
    return placed
