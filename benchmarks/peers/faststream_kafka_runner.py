"""faststream's KafkaBroker (aiokafka) over a Kafka topic, as a runner of issue 31.

faststream 0.7.8 with aiokafka 0.14.0 (``faststream[kafka]``), on Python
3.11 (lite_push's interpreter), pinned in
``faststream_kafka.requirements.txt``.  Standard library, faststream and
aiokafka only (and ``faststream_common`` beside it).

The backend.  faststream's docs lead with ``faststream.kafka`` (aiokafka);
``faststream.confluent`` is the alternative.  aiokafka talks to librdkafka's
mock cluster, but a group of more than one aiokafka member never forms
there: the leader's SyncGroup carries every member's assignment, the mock
answers it and moves the group to Up, and a follower's SyncGroup that comes
after that is refused with INVALID_REQUEST (42) (a real broker hands a late
follower its assignment); aiokafka raises ``KafkaError(InvalidRequestError)``
out of ``consumer.start()``.  ``faststream.confluent`` 0.7.8 was tried too:
it refuses ``max_workers > 1`` with any ack policy but ``ack_first``
(``SetupError: Max workers not work with manual commit mode``), so its
at-least-once consumer handles one message at a time (~90 msg/s at 10 ms),
and with ``ack_first`` it gave 1.9-2.0k msg/s at 10 ms where aiokafka gave
5.5k.  So: aiokafka.

The docs' concurrency (Kafka subscriber, "Concurrent processing"):
``max_workers=N`` with ``AckPolicy.ACK_FIRST`` handles any message beside
any other, at most once (aiokafka's auto commit of what was fetched); with
``AckPolicy.NACK_ON_ERROR`` it is N consumers in the group, concurrent
between partitions, one message at a time within one, at least once, no
use beyond one worker per partition.  The runner's ``mode`` (``--set``):

* ``per_partition`` (the default): the second, without the group join the
  mock cannot do -- one subscriber per partition, each
  ``subscriber(partitions=[TopicPartition(topic, i)], group_id=G,
  ack_policy=NACK_ON_ERROR)`` (aiokafka's ``assign()``, offsets committed
  to G after every message).  At least once; a partition's messages one
  at a time in offset order, so a key's too.  (The partition count comes
  from one metadata request before ``t0``.)
* ``workers``: ``subscriber(topic, group_id=G, max_workers=N,
  ack_policy=...)``.  ``ack_policy=ack_first``: at most once, no key order
  (a key's messages overlap).  ``nack_on_error`` / ``ack``: fails on the
  mock for N > 1 (above); N = 1 is one message at a time.
* ``batch``: ``subscriber(topic, batch=True, max_records=M)``: the handler
  gets what one ``getmany`` returned and awaits its messages with
  ``asyncio.gather``; the batch is committed when the handler returns (at
  least once).  No key order, unless ``batch_by_key``: the runner's own
  handler then runs a key's messages of the batch one after another.

Every mode: ``KafkaBroker(consumer_only=True, allow_auto_create_topics=False,
logger=None)`` (no producer and no admin client -- the mock has no
CreateTopics -- and no log line per message), ``auto_offset_reset=
"earliest"``, an ``async def`` handler taking the body as ``bytes`` and
awaiting ``asyncio.sleep(cost)``, the app ``FastStream(broker)`` started
and stopped by the runner (``app.start()`` / ``app.stop()``: the broker
waits up to its graceful timeout, 15 s, for handlers in flight).  ``t0``
is taken just before ``KafkaBroker(...)``.

Tried (rough msg/s on the mock cluster, 8 partitions, 1,000 keys uniform,
20,000 messages at 1 and 10 ms, 5,000 at 100 ms, 10 s cap; a 2-core
machine shared with other runs):

    mode / setting                         1 ms     10 ms    100 ms   key order
    per_partition (8 subscribers)          2,900      600        77   kept
    workers nack_on_error N=1                  -       90         -   kept
    workers nack_on_error N=64/256/1000    fails on the mock (SyncGroup)
    workers ack_first N=64                     -    5,100         -   overlaps
    workers ack_first N=256                6,500    5,500     2,400   overlaps
    workers ack_first N=1000               6,000    5,500     4,100   overlaps
    batch (max_records unset)             31,000   32,000    14,000   overlaps
    batch, max_records=100 / 1000              -  6,700 / 26,000  -   overlaps
    batch_by_key                          36,000   17,000     2,700   kept
    batch_by_key, max_records=1000        27,000    7,500       950   kept

``workers`` runs at one core at 1 and 10 ms (~180 us of CPU per message
in faststream and aiokafka); ``per_partition`` is bound by its 8 serial
partitions plus a commit round trip per message.  With ``max_records``
unset a batch is whatever aiokafka has buffered (up to 1 MiB a partition):
here, most of the backlog at once.
"""

from __future__ import annotations

import importlib.metadata
import logging
import sys
from typing import Any

from aiokafka.client import AIOKafkaClient
from faststream import FastStream
from faststream.kafka import KafkaBroker, TopicPartition
from faststream.kafka.annotations import KafkaMessage
from faststream.kafka.schemas import Topic
from faststream.middlewares import AckPolicy
from faststream_common import Run, main_of

#: The settings ``--set`` takes, at the values the runner uses unless told.
DEFAULTS: dict[str, Any] = {
    # per_partition: one subscriber per partition of the topic, subscriber i
    #   given partition i (subscriber(partitions=[TopicPartition(topic, i)],
    #   group_id=G): aiokafka's assign(), no group membership, commits to G),
    #   each one message at a time: what max_workers gives with an
    #   after-handling ack policy, without the group join that fails on the
    #   mock cluster (see the module docstring).
    # workers: one subscriber(max_workers=N): with an after-handling ack
    #   policy, N aiokafka consumers in the group (concurrency between
    #   partitions); with ack_first, N handler tasks over one consumer.
    # batch: one subscriber(batch=True): the handler gets what one getmany
    #   returned (at most max_records) and runs it with asyncio.gather; the
    #   batch is committed when the handler returns.
    "mode": "per_partition",
    # subscriber(ack_policy=...): nack_on_error (the docs' at-least-once
    # concurrent mode), ack, or ack_first (at-most-once: aiokafka's auto
    # commit of what was fetched, every 5 s and at stop).
    "ack_policy": "nack_on_error",
    "max_workers": 256,
    "max_records": 0,  # 0: none (getmany returns what is buffered)
    "batch_timeout_ms": 200,
    # batch: a key's messages of a batch one after another (the keys'
    # chains gathered), so that no two calls of a key overlap.
    "batch_by_key": False,
    # faststream logs every message at INFO on its default logger; off here
    # (KafkaBroker(logger=None)) so the run measures consuming, not logging.
    "log_messages": False,
}
CHOICES = {"mode": ("per_partition", "workers", "batch"), "ack_policy": ("nack_on_error", "ack", "ack_first")}


def keeps_key_order(settings: dict[str, Any]) -> bool:
    """Whether the configuration keeps a key's messages in order, one at a time."""
    if settings["mode"] == "batch":
        return bool(settings["batch_by_key"])
    if settings["mode"] == "per_partition":
        return True  # each partition one message at a time
    return settings["max_workers"] <= 1 or settings["ack_policy"] != "ack_first"


async def partitions_of(bootstrap: str, topic: str) -> int:
    """How many partitions ``topic`` has (one metadata request, before ``t0``)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        found = (await client.fetch_all_metadata()).partitions_for_topic(topic)
    finally:
        await client.close()
    if not found:
        raise RuntimeError(f"topic {topic!r} has no partitions on {bootstrap}")
    return len(found)


def build(args: Any, settings: dict[str, Any], run: Run, partitions: int) -> FastStream:
    """The app: a consumer-only broker (no producer, no admin client: the
    mock cluster has no CreateTopics) with one subscriber on the topic."""
    broker = KafkaBroker(
        args.bootstrap,
        consumer_only=True,
        allow_auto_create_topics=False,
        logger=logging.getLogger("faststream") if settings["log_messages"] else None,
    )
    common: dict[str, Any] = {
        "group_id": args.group,
        "auto_offset_reset": "earliest",
        "ack_policy": AckPolicy(settings["ack_policy"]),
    }
    topic = Topic(args.topic, declare=False)
    if settings["mode"] == "per_partition":

        async def handle_one(body: bytes) -> None:
            await run.handle(body)

        for i in range(partitions):
            part = TopicPartition(args.topic, i, declare=False)
            broker.subscriber(partitions=[part], **common)(handle_one)

    elif settings["mode"] == "workers":

        @broker.subscriber(topic, max_workers=settings["max_workers"], **common)
        async def handle(body: bytes) -> None:
            await run.handle(body)

    else:
        by_key = settings["batch_by_key"]

        @broker.subscriber(
            topic,
            batch=True,
            max_records=settings["max_records"] or None,
            batch_timeout_ms=settings["batch_timeout_ms"],
            **common,
        )
        async def handle_batch(body: list[bytes], msg: KafkaMessage) -> None:
            await run.handle_batch(body, [record.key for record in msg.raw_message] if by_key else None)

    return FastStream(broker, logger=None)


async def main_async(args: Any, settings: dict[str, Any], run: Run) -> tuple[bool, str | None]:
    partitions = await partitions_of(args.bootstrap, args.topic) if settings["mode"] == "per_partition" else 0
    settings["partitions"] = partitions
    run.start()
    app = build(args, settings, run, partitions)
    await app.start()
    try:
        return await run.wait(args.timeout, args.cap)
    finally:
        await app.stop()


def client_config(settings: dict[str, Any]) -> dict[str, Any]:
    """What OUT.json says of the client and the settings."""
    return {
        "client": f"aiokafka=={importlib.metadata.version('aiokafka')}",
        **settings,
        "keeps_key_order": keeps_key_order(settings),
    }


def main() -> int:
    return main_of("kafka", __doc__.splitlines()[0], DEFAULTS, CHOICES, main_async, client_config)


if __name__ == "__main__":
    sys.exit(main())
