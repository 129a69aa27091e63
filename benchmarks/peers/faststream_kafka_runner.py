"""faststream's KafkaBroker (aiokafka) over a Kafka topic, as a runner of issue 31.

DRAFT: settings and numbers below are filled in once measured.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import sys
import traceback
from typing import Any

from aiokafka.client import AIOKafkaClient
from faststream import FastStream
from faststream.kafka import KafkaBroker, TopicPartition
from faststream.kafka.annotations import KafkaMessage
from faststream.kafka.schemas import Topic
from faststream.middlewares import AckPolicy
from faststream_common import Run, describe, parse_args, settings_of

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
            topic, batch=True, max_records=settings["max_records"] or None,
            batch_timeout_ms=settings["batch_timeout_ms"], **common,
        )  # fmt: skip
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


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], "kafka")
    settings = settings_of(args.set, DEFAULTS, CHOICES)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    run = Run(args.costs)
    error: str | None
    try:
        capped, error = asyncio.run(main_async(args, settings, run))
    except Exception as exc:  # the run's record says what broke, stderr has the traceback
        traceback.print_exc()
        capped, error = False, describe(exc)
    config = {
        "package": f"faststream=={importlib.metadata.version('faststream')}",
        "client": f"aiokafka=={importlib.metadata.version('aiokafka')}",
        **settings,
        "handler": "async def: await asyncio.sleep(cost)",
        "loop": "asyncio.run (default loop)",
        "keeps_key_order": keeps_key_order(settings),
    }
    run.write(args.out, capped=capped, error=error, config=config)
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
