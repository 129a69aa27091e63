"""faststream's RedisBroker with a Redis Streams StreamSub, as a runner of issue 31.

DRAFT: settings and numbers below are filled in once measured.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import sys
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio
from faststream import FastStream
from faststream.middlewares import AckPolicy
from faststream.redis import RedisBroker, StreamSub
from faststream.redis.annotations import RedisBatchStreamMessage
from faststream.redis.parser import BinaryMessageFormatV1
from faststream_common import Run, describe, parse_args, settings_of

#: The header ``redis_streams.fill_faststream_stream`` puts the key in.
KEY_HEADER = "key"
#: The one field of a stream entry faststream writes (its body, headers included).
DATA_FIELD = b"__data__"

#: The settings ``--set`` takes, at the values the runner uses unless told.
DEFAULTS: dict[str, Any] = {
    # workers: subscriber(max_workers=N); batch: StreamSub(batch=True), the
    #   handler gets the entries of one XREADGROUP and runs them with
    #   asyncio.gather; they are XACKed when it returns.
    "mode": "workers",
    # subscriber(max_workers=...): that many handler tasks over the one
    # consumer (any message beside any other: no key order when > 1).
    "max_workers": 1,
    # subscriber(ack_policy=...): when the entry is XACKed.
    "ack_policy": "ack",
    # StreamSub(max_records=...): XREADGROUP COUNT (0: none, every new entry).
    "max_records": 0,
    # StreamSub(polling_interval=...): XREADGROUP BLOCK, milliseconds.
    "polling_interval": 100,
    # With batch: a key's messages of a batch one after another (the keys'
    # chains gathered), so that no two calls of a key overlap.
    "batch_by_key": False,
    # faststream logs every message at INFO on its default logger; off here.
    "log_messages": False,
}
CHOICES = {"mode": ("workers", "batch"), "ack_policy": ("ack", "nack_on_error", "reject_on_error", "ack_first")}


def keeps_key_order(settings: dict[str, Any]) -> bool:
    """Whether faststream promises a key's messages in order, one at a time."""
    if settings["mode"] == "batch":
        return bool(settings["batch_by_key"])
    return settings["max_workers"] <= 1


async def ensure_group(url: str, stream: str, group: str) -> None:
    """Create ``group`` at the start of ``stream`` unless it exists (before
    ``t0``).  faststream creates a missing group at ``$`` (the stream's end:
    a backlog would be skipped); with the group there it reads ``>``, every
    entry not yet delivered to the group."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        await client.xgroup_create(stream, group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
    finally:
        await client.aclose()


async def keep_entries(raw: dict[str, Any], original: Callable[[dict[str, Any]], Awaitable[Any]]) -> Any:
    """The batch subscriber's parser, around faststream's own.

    faststream 0.7.8's batch parser hands the handler the batch's bodies as
    one JSON list, made with ``json.dumps``-like encoding of each body: a
    body that is not UTF-8 (a ``seq`` byte >= 0x80) fails the whole batch
    with ``UnicodeDecodeError`` before the handler runs.  So faststream's
    parser gets the entries with empty bodies (JSON ``null``), and the
    entries themselves ride along in the raw message (``"entries"``) for
    the handler to parse with faststream's ``BinaryMessageFormatV1``.
    """
    blank = [{DATA_FIELD: b"null"} for _ in raw["data"]]
    return await original({**raw, "data": blank, "entries": raw["data"]})


def build(args: Any, settings: dict[str, Any], run: Run) -> FastStream:
    """The app: a broker with one StreamSub subscriber of the group."""
    broker = RedisBroker(
        args.redis,
        logger=logging.getLogger("faststream") if settings["log_messages"] else None,
    )
    stream = StreamSub(
        args.topic,
        group=args.group,
        consumer=f"{args.group}-runner",
        batch=settings["mode"] == "batch",
        max_records=settings["max_records"] or None,
        polling_interval=settings["polling_interval"],
    )
    ack_policy = AckPolicy(settings["ack_policy"])
    if settings["mode"] == "workers":

        @broker.subscriber(stream=stream, max_workers=settings["max_workers"], ack_policy=ack_policy)
        async def handle(body: bytes) -> None:
            await run.handle(body)

        return FastStream(broker, logger=None)

    by_key = settings["batch_by_key"]
    parse = BinaryMessageFormatV1.parse

    @broker.subscriber(stream=stream, ack_policy=ack_policy, parser=keep_entries)
    async def handle_batch(msg: RedisBatchStreamMessage) -> None:
        bodies = [parse(fields[DATA_FIELD]) for fields in msg.raw_message["entries"]]
        keys = [headers.get(KEY_HEADER) for _, headers in bodies] if by_key else None
        await run.handle_batch([body for body, _ in bodies], keys)

    return FastStream(broker, logger=None)


async def main_async(args: Any, settings: dict[str, Any], run: Run) -> tuple[bool, str | None]:
    await ensure_group(args.redis, args.topic, args.group)
    run.start()
    app = build(args, settings, run)
    await app.start()
    try:
        return await run.wait(args.timeout, args.cap)
    finally:
        await app.stop()


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], "redis")
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
        "client": f"redis=={importlib.metadata.version('redis')}",
        **settings,
        "handler": "async def: await asyncio.sleep(cost)",
        "loop": "asyncio.run (default loop)",
        "keeps_key_order": keeps_key_order(settings),
    }
    run.write(args.out, capped=capped, error=error, config=config)
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
