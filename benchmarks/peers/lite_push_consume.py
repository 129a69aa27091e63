"""lite_push's side of the runner protocol, shared by its two runners
(``lite_push_kafka_runner.py``, ``lite_push_redis_runner.py``), which differ
only in the source they make.

The consumer is the one users are told to write for awaited I/O: an
``AsyncLitePushConsumer`` (lanes are coroutines on the running loop, uvloop
by default), ``KEY_ORDERLY`` (one call at a time per key, a key's messages in
offset order), ``lane_placement`` ``"load"`` (the default), ``batch_size`` 1,
and an ``async def`` listener that awaits ``asyncio.sleep(cost)``.  It reads
the group's backlog from the first offset.  On stopping (every ``seq``
handled, ``--cap`` or ``--timeout``) ``shutdown`` lets the lanes finish what
they hold, commits and closes the source.

Settings (``--set KEY=VALUE``): ``lanes`` (default 2048: at 100 ms per
message a run near the hot-key bound of 1,000 uniform keys has about 700-900
calls in flight, ``bound x cost``, and fewer lanes than twice the keys left
keys sharing lanes: see ``lite_push_kafka_runner.py``; lanes beyond the
keys cost a few idle coroutines),
``batch_size`` (1, a listener call per message; 16 ran slower on
``kpipe-1ms``, 51,000 msg/s against 54,000-59,000: chunks of more than one
message take the lanes' slow path), ``pull_batch_size`` (128, not the default 32: fewer, larger polls; on
``kpipe-10ms`` 53,000-55,700 msg/s against 49,000-52,000, less CPU),
``pull_threshold_for_queue`` (5000, not the default 1000: with a backlog,
a queue paused at 1000 unfinished messages and resumed left the Kafka
source's partitions waiting for fetches; since the source fetches with
``fetch.wait.max.ms`` 100 the default does nearly as well on ``kpipe-1ms``,
61,000 against 66,000, but not on ``kpipe-10ms``, 38,000 against 47,000),
``lane_capacity`` (1000), ``loop_turn_target`` (the default 1.5 ms;
0 turns admission off: 60,600 against 59,500-71,300 on ``kpipe-1ms``),
``loop`` (``uvloop`` or ``asyncio``), ``executor`` (``asyncio``, or
``threads``: lanes are threads, at most 1,024, and the listener a plain
function that blocks in ``time.sleep(cost)``; on ``io1``, where the hot
key's 1 ms calls set the bound, 79 % of the bound with 256 lanes and 72 %
with 1,024, against 83 % on the event loop: a thread woken from its sleep
waits for the GIL).  What was tried before is in
``lite_push_kafka_runner.py``'s docstring.

The watcher that ends the run looks whether every ``seq`` was handled every
5 ms, and asks ``stats()`` for a consumer failure every 0.25 s only:
``stats()`` walks every lane, about a millisecond with 2,048 lanes.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import threading
import time
from collections.abc import Callable
from typing import Any

from runner_protocol import Calls, Usage, load_costs, settings_of, write_out

from lite_push import AsyncLitePushConsumer, ConsumeMode, ConsumerConfig, LitePushConsumer, MessageExt
from lite_push.sources import PullSource

__all__ = ["CHOICES", "DEFAULTS", "consume", "consumer_config"]

DEFAULTS: dict[str, Any] = {
    "lanes": 2048,
    "batch_size": 1,
    "pull_batch_size": 128,
    "pull_threshold_for_queue": 5000,
    "lane_capacity": 1000,
    "loop_turn_target": 0.0015,
    "loop": "uvloop",
    "executor": "asyncio",
}

#: The settings that take one of a few values.
CHOICES = {"loop": ("uvloop", "asyncio"), "executor": ("asyncio", "threads")}

#: How often the watcher looks whether the run is over (seconds).
WATCH_INTERVAL = 0.005
#: How often it asks the consumer for a failure (``stats()`` walks every
#: lane: about a millisecond with 2,048 lanes, a fifth of the loop's CPU when
#: asked every 5 ms).
FAILURE_INTERVAL = 0.25


def consumer_config(group: str, settings: dict[str, Any]) -> ConsumerConfig:
    """The runner's consumer configuration, from its settings (``DEFAULTS``
    with ``--set`` applied)."""
    return ConsumerConfig(
        group=group,
        mode=ConsumeMode.KEY_ORDERLY,
        lanes=settings["lanes"],
        batch_size=settings["batch_size"],
        executor="thread" if settings["executor"] == "threads" else "asyncio",
        pull_batch_size=settings["pull_batch_size"],
        pull_threshold_for_queue=settings["pull_threshold_for_queue"],
        lane_capacity=settings["lane_capacity"],
        loop_turn_target=settings["loop_turn_target"],
    )


def consume(args: Any, make_source: Callable[[str], PullSource], source_name: str) -> int:
    """Run lite_push over ``args.topic`` with the source ``make_source(group)``
    makes (``t0`` is taken just before it), and write OUT.json."""
    settings = settings_of(args.set, DEFAULTS, CHOICES)
    costs = load_costs(args.costs)
    calls = Calls(len(costs))
    record = calls.record
    clock = time.perf_counter_ns
    sleep = asyncio.sleep
    threads = settings["executor"] == "threads"

    async def listener(msgs: list[MessageExt]) -> None:
        for m in msgs:
            seq = int.from_bytes(m.body[:8], "big")
            start = clock()
            cost = costs[seq]
            if cost:
                await sleep(cost / 1e6)
            record(seq, start, clock())

    lock = threading.Lock()

    def blocking_listener(msgs: list[MessageExt]) -> None:
        for m in msgs:
            seq = int.from_bytes(m.body[:8], "big")
            start = clock()
            cost = costs[seq]
            if cost:
                time.sleep(cost / 1e6)
            end = clock()
            with lock:  # lanes are threads: one record at a time
                record(seq, start, end)

    config = consumer_config(args.group, settings)
    usage = Usage()
    state: dict[str, Any] = {"capped": False, "error": None, "next_check": 0.0}

    def go_on(consumer: LitePushConsumer | AsyncLitePushConsumer) -> bool:
        """Whether the run goes on: not every ``seq`` handled, no cap, no
        timeout, no consumer failure (asked every ``FAILURE_INTERVAL``)."""
        if calls.done:
            return False
        if usage.over(args.cap):
            state["capped"] = True
            return False
        if usage.over(args.timeout):
            state["error"] = f"timeout after {args.timeout:g}s ({calls.distinct} of {calls.total} handled)"
            return False
        if time.monotonic() >= state["next_check"]:
            failure = consumer.stats().failure
            if failure is not None:
                state["error"] = f"consumer failed: {failure}"
                return False
            state["next_check"] = time.monotonic() + FAILURE_INTERVAL
        return True

    async def main() -> None:
        usage.start()
        consumer = AsyncLitePushConsumer(config, source=make_source(args.group), listener=listener)
        consumer.subscribe(args.topic)
        await consumer.start()
        try:
            while go_on(consumer):
                await asyncio.sleep(WATCH_INTERVAL)
            usage.stop()
        finally:
            # drain what the lanes hold, commit, close the source
            await consumer.shutdown(timeout=60)

    def main_threads() -> None:
        usage.start()
        consumer = LitePushConsumer(config, source=make_source(args.group), listener=blocking_listener)
        consumer.subscribe(args.topic)
        consumer.start()
        try:
            while go_on(consumer):
                time.sleep(WATCH_INTERVAL)
            usage.stop()
        finally:
            consumer.shutdown(timeout=60)

    if threads:
        main_threads()
    elif settings["loop"] == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())
    write_out(
        args.out,
        usage,
        calls,
        capped=state["capped"],
        error=state["error"],
        config={
            "package": f"lite-push=={importlib.metadata.version('lite-push')}",
            "source": source_name,
            "mode": "KEY_ORDERLY",
            "lane_placement": config.lane_placement,
            **settings,
            "listener": "def: time.sleep(cost)" if threads else "async def: await asyncio.sleep(cost)",
            "keeps_key_order": True,
        },
    )
    return 0
