"""pyrallel-consumer, as a runner of ``bench_peers.py`` (and of
``bench_kafka.py`` through ``kafka_peers.run_pyrallel``).

pyrallel-consumer 1.0.0 with confluent-kafka 2.16.1 (the project's
librdkafka), Python 3.12 (the package needs >= 3.12; ``pyrallel.requirements.txt``).
Its README's way for I/O-bound work: ``ExecutionMode.ASYNC`` (an ``async
def`` worker awaited on the runner's asyncio loop, at most ``max_in_flight``
at once) with ``OrderingMode.KEY_HASH`` (one call at a time per key within a
partition, a key's messages in offset order: it keeps per-key order).  The
worker awaits ``asyncio.sleep(cost)``.  ``KafkaConfig`` at its defaults but
for the bootstrap servers, the group and ``--set`` settings; it runs with
the environment variables of its settings removed (``kafka_peers`` /
``bench_peers`` start it so), so no ``.env`` or ``KAFKA_*`` changes it.
``start()`` makes its clients, so ``t0`` is taken just before it;
``stop()`` commits what is done (at-least-once) and closes them.

Settings (``--set KEY=VALUE``): ``max_in_flight`` (pyrallel's default
1000), ``poll_batch_size``, ``queue_max_messages`` (pyrallel's defaults
unless set).  Tried (issue 18, ``bench_kafka.py``): ``max_in_flight`` 1000
gave 3,516 msg/s on ``io5`` and 2,681 on ``io1`` (5.8 CPU s of a 7.5 s
``io1`` run: its own loop's CPU bounds it).  At 100 ms per message a run needs about 900 calls in flight to reach
the hot-key bound of 1,000 uniform keys: 1000 allows it.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import sys
import time
from typing import Any

from pyrallel_consumer import ExecutionMode, KafkaConfig, OrderingMode, PyrallelConsumer, WorkItem
from runner_protocol import Calls, Usage, load_costs, parse_args, settings_of, write_out

DEFAULTS: dict[str, Any] = {"max_in_flight": 2000, "poll_batch_size": 0, "queue_max_messages": 0}


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], "kafka")
    settings = settings_of(args.set, DEFAULTS)
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    costs = load_costs(args.costs)
    calls = Calls(len(costs))

    config = KafkaConfig(BOOTSTRAP_SERVERS=args.bootstrap, CONSUMER_GROUP=args.group)
    pc = config.parallel_consumer
    pc.ordering_mode = OrderingMode.KEY_HASH  # the default, said out loud
    pc.execution.mode = ExecutionMode.ASYNC  # the default too
    pc.execution.max_in_flight = settings["max_in_flight"]
    for name in ("poll_batch_size", "queue_max_messages"):
        if settings[name]:  # 0: pyrallel's default
            setattr(pc, name, settings[name])
    usage = Usage()
    clock = time.perf_counter_ns
    state: dict[str, Any] = {"capped": False, "error": None}

    async def run() -> None:
        done = asyncio.Event()
        sleep = asyncio.sleep

        async def worker(item: WorkItem) -> None:
            seq = int.from_bytes(item.payload[:8], "big")
            start = clock()
            cost = costs[seq]
            if cost:
                await sleep(cost / 1e6)
            calls.record(seq, start, clock())
            if calls.done:
                done.set()

        consumer = PyrallelConsumer(config=config, worker=worker, topic=args.topic)
        usage.start()
        await consumer.start()
        limit = min(args.timeout, args.cap) if args.cap is not None else args.timeout
        try:
            await asyncio.wait_for(done.wait(), max(0.0, limit - (clock() - usage.t0_ns) / 1e9))
        except TimeoutError:
            if args.cap is not None and args.cap <= args.timeout:
                state["capped"] = True
            else:
                state["error"] = f"timeout after {args.timeout:g}s ({calls.distinct} of {calls.total} handled)"
        usage.stop()
        await consumer.stop()

    asyncio.run(run())
    ex = pc.execution
    write_out(
        args.out,
        usage,
        calls,
        capped=state["capped"],
        error=state["error"],
        config={
            "package": f"pyrallel-consumer=={importlib.metadata.version('pyrallel-consumer')}",
            "confluent-kafka": importlib.metadata.version("confluent-kafka"),
            "ordering_mode": pc.ordering_mode.value,
            "execution.mode": ex.mode.value,
            "max_in_flight": ex.max_in_flight,
            "poll_batch_size": pc.poll_batch_size,
            "queue_max_messages": pc.queue_max_messages,
            "worker": "async def: await asyncio.sleep(cost)",
            "loop": "asyncio.run (default loop)",
            "keeps_key_order": True,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
