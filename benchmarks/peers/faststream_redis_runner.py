"""faststream's RedisBroker with a Redis Streams StreamSub, as a runner of issue 31.

faststream 0.7.8 (``faststream[redis]``) on redis-py 8.1.0 with hiredis
3.5.0 (redis-py parses replies with it when it is installed: 2.0k -> 2.8k
msg/s below), Python 3.11 (lite_push's interpreter), pinned in
``faststream_redis.requirements.txt``; redis-server 7.0.  Standard
library, faststream and redis-py only (and ``faststream_common``).

The stream is one Redis stream (``--topic``) that
``redis_streams.fill_faststream_stream`` filled as faststream's publisher
writes (its binary format, the key in the ``key`` header).  The consumer
is ``StreamSub(stream, group=G, consumer=G + "-runner", max_records=...,
polling_interval=...)`` (XREADGROUP ``>``): the runner creates the group at
the stream's start before ``t0`` (faststream would create a missing group
at ``$``, the stream's end, and skip the backlog).  ``ack_policy=ack``:
each entry is XACKed when its handler returned (at least once; faststream's
default for a group, ``reject_on_error``, also XACKs after success).
Handler: ``async def`` taking the body as ``bytes``, awaiting
``asyncio.sleep(cost)``; ``RedisBroker(logger=None)`` (no log line per
message); the app ``FastStream(broker)`` started and stopped by the runner
(the broker waits up to 15 s for handlers in flight).  ``t0`` is taken just
before ``RedisBroker(...)``.

The docs' concurrency is ``subscriber(max_workers=N)`` (``mode=workers``):
one XREADGROUP loop hands entries to N handler tasks, any entry beside any
other: a key's messages overlap (no key order when N > 1; N = 1 keeps the
stream's order).  Every handler's XACK takes a pooled connection: redis-py
8's pool holds 100, and with N = 1000 at 100 ms a third of the XACKs failed
with ``MaxConnectionsError`` (the entries stayed pending), so the pool is
sized to N + 1 (``max_connections``).  ``mode=batch``:
``StreamSub(batch=True)``, the handler gets one XREADGROUP's entries and
awaits them with ``asyncio.gather``, XACKed together when it returns; no
key order unless ``batch_by_key`` (the runner's handler then runs a key's
entries one after another).  faststream 0.7.8's batch parser cannot carry a
body that is not UTF-8 (it JSON-encodes the batch's bodies:
``UnicodeDecodeError`` on the first ``seq`` byte >= 0x80, and the batch is
never handled), so the runner gives it a parser (``keep_entries``) that
hides the bodies from it and parses the entries in the handler.

Tried (rough msg/s, one stream, 1,000 keys uniform, 20,000 messages at 1
and 10 ms, 5,000 at 100 ms, 10 s cap; a 2-core machine shared with other
runs):

    mode / setting                         1 ms     10 ms    100 ms   key order
    workers N=1                              645       88        10   kept
    workers N=64                               -    2,700         -   overlaps
    workers N=256                          2,800    2,600     2,000   overlaps
    workers N=1000                         2,850    2,700     1,700   overlaps
    workers N=1000, max_records=1000       2,800    2,800         -   overlaps
    workers N=256, max_records=1000,
      polling_interval=10                      -    2,100         -   overlaps
    batch (max_records unset)             27,500   27,700    19,500   overlaps
    batch, max_records=500 / 1000              -  15,000 / 24,800  -  overlaps
    batch_by_key                          42,000   29,000     3,300   kept
    batch_by_key, max_records=1000        23,000   11,000     1,750   kept

``workers`` runs at one core from 1 to 10 ms (~350 us of CPU per message:
faststream's parsing and middlewares, the XACK round trip of each entry),
so N, ``max_records`` (XREADGROUP COUNT) and ``polling_interval``
(XREADGROUP BLOCK) change little; the defaults are N = 256, no COUNT (one
read takes what is there) and faststream's 100 ms block.  With
``max_records`` unset a batch is every new entry: here, the whole backlog.
"""

from __future__ import annotations

import importlib.metadata
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio
from faststream import FastStream
from faststream.middlewares import AckPolicy
from faststream.redis import RedisBroker, StreamSub
from faststream.redis.annotations import RedisBatchStreamMessage
from faststream.redis.parser import BinaryMessageFormatV1
from faststream_common import Run, main_of

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
    "max_workers": 256,
    # subscriber(ack_policy=...): when the entry is XACKed.
    "ack_policy": "ack",
    # StreamSub(max_records=...): XREADGROUP COUNT (0: none, every new entry).
    "max_records": 0,
    # StreamSub(polling_interval=...): XREADGROUP BLOCK, milliseconds.
    "polling_interval": 100,
    # With batch: a key's messages of a batch one after another (the keys'
    # chains gathered), so that no two calls of a key overlap.
    "batch_by_key": False,
    # RedisBroker(max_connections=...): redis-py's pool; every handler's
    # XACK takes a connection, and past the pool's size (redis-py 8: 100) an
    # XACK fails with MaxConnectionsError (the entry stays pending).  0:
    # max_workers + 1, at least redis-py's 100.
    "max_connections": 0,
    # faststream logs every message at INFO on its default logger; off here.
    "log_messages": False,
}
CHOICES = {"mode": ("workers", "batch"), "ack_policy": ("ack", "nack_on_error", "reject_on_error", "ack_first")}


def keeps_key_order(settings: dict[str, Any]) -> bool:
    """Whether the configuration keeps a key's messages in order, one at a time."""
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


def pool_size(settings: dict[str, Any]) -> int:
    """The connection pool's size (see ``max_connections`` in DEFAULTS)."""
    return settings["max_connections"] or max(100, settings["max_workers"] + 1)


def build(args: Any, settings: dict[str, Any], run: Run) -> FastStream:
    """The app: a broker with one StreamSub subscriber of the group."""
    broker = RedisBroker(
        args.redis,
        max_connections=pool_size(settings),
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


def hiredis_version() -> str | None:
    """hiredis's version, None when redis-py runs without it."""
    try:
        return importlib.metadata.version("hiredis")
    except importlib.metadata.PackageNotFoundError:
        return None


def client_config(settings: dict[str, Any]) -> dict[str, Any]:
    """What OUT.json says of the client and the settings."""
    return {
        "client": f"redis=={importlib.metadata.version('redis')}, hiredis=={hiredis_version()}",
        **settings,
        "max_connections": pool_size(settings),
        "keeps_key_order": keeps_key_order(settings),
    }


def main() -> int:
    return main_of("redis", __doc__.splitlines()[0], DEFAULTS, CHOICES, main_async, client_config)


if __name__ == "__main__":
    sys.exit(main())
