"""Where lite_push's CPU goes per message, in one process (issue 31).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/peers/cpu_probe.py --messages 300000 --cost-ms 1 \\
        [--source kafka|embedded] [--keys 1000] [--partitions 8] [--set lanes=1024 ...]

The peer runner's consumer (``lite_push_consume.DEFAULTS``: an
``AsyncLitePushConsumer`` on uvloop, KEY_ORDERLY, the runner's settings,
``--set`` as there) and a listener that awaits ``asyncio.sleep(cost)``, run
in this process over a backlog of ``--messages`` messages (keys drawn
uniformly from ``--keys`` with a fixed seed) on a librdkafka mock cluster
(``kafka``, started on 127.0.0.1 and stopped by its PID) or the embedded
broker.  Measured from the first call to the last, it prints:

* msg/s, and the CPU per message of each thread (``/proc``: ``loop`` is the
  main thread, which reads the source too since issue 40, ``pull`` the pull
  task's helper thread (waiting polls, commits, rebalances), ``rdk:*``
  librdkafka's);
* the cyclic GC's collections and CPU per generation, by the thread that
  ran them (``gc.callbacks``);
* on Kafka, librdkafka's ``consume`` calls (counted by a subclass of
  confluent-kafka's ``Consumer`` put in the source module's place, so the
  member's group client and fetcher both): records per call, and the wall
  and CPU seconds inside them; the difference is time without the GIL,
  waiting for records or for another thread to hand the GIL back.

Machine noise is 20-30 % run to run: compare alternated runs.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import confluent_kafka
import uvloop
from kafka_peers import produce
from lite_push_consume import CHOICES, DEFAULTS, consumer_config
from runner_protocol import GcTimes, settings_of
from thread_cpu import snapshot

import lite_push.sources.kafka.consumer as kafka_consumer
from lite_push import AsyncLitePushConsumer, ConsumeFromWhere, EmbeddedBroker
from lite_push.sources.kafka import KafkaBroker
from lite_push.sources.kafka.mock_cluster import MockKafkaCluster

__all__ = ["main"]

#: ``consume`` calls: count, records, wall and CPU seconds (the pull thread's).
CONSUME: collections.Counter[str] = collections.Counter()


class CountingConsumer(confluent_kafka.Consumer):
    """confluent-kafka's ``Consumer``, its ``consume`` counted and timed."""

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        wall, cpu = time.perf_counter(), time.thread_time()
        records = super().consume(num_messages, timeout)
        CONSUME["calls"] += 1
        CONSUME["records"] += len(records)
        CONSUME["wall_s"] += time.perf_counter() - wall
        CONSUME["cpu_s"] += time.thread_time() - cpu
        return records


def thread_label(name: str) -> str:
    """``loop`` (the main thread), ``pull`` (lite_push's pull thread), or the thread's name."""
    if name == threading.main_thread().name:
        return "loop"
    return "pull" if name.startswith("lite-push-pull") else name


def backlog(args: argparse.Namespace, topic: str, keys: list[str], cluster: MockKafkaCluster | None) -> Any:
    """Fill ``topic`` and return the broker to read it from."""
    if cluster is None:
        broker = EmbeddedBroker()
        broker.create_topic(topic, args.partitions)
        broker.send_batch(topic, [(seq.to_bytes(8, "big") + bytes(56), k) for seq, k in enumerate(keys)])
        return broker
    cluster.create_topic(topic, args.partitions)
    produce(cluster.bootstrap, topic, keys, args.partitions, 64)
    return KafkaBroker(cluster.bootstrap, session_timeout=45.0)


def run(args: argparse.Namespace, cluster: MockKafkaCluster | None) -> None:
    settings = settings_of(args.set, DEFAULTS, CHOICES)
    if settings["executor"] != "asyncio" or settings["batch_size"] != 1:
        raise SystemExit("cpu_probe: the asyncio executor with batch_size 1 only (the runner's defaults)")
    rng = random.Random(31)
    keys = [f"key-{rng.randrange(args.keys)}" for _ in range(args.messages)]
    broker = backlog(args, "probe", keys, cluster)
    gcs = GcTimes()
    gcs.install()
    seen = 0
    cost = args.cost_ms / 1e3

    # read while the consumer's threads run: thread id -> label, and the GC of the measured span
    labels: dict[int, str] = {}
    gc_rows: dict[tuple[int, str], list[float]] = {}

    async def consume() -> tuple[float, int, dict[int, tuple[str, int]], dict[int, tuple[str, int]]]:
        nonlocal seen
        done = asyncio.Event()

        async def listener(msgs: list[Any]) -> None:
            nonlocal seen
            for _ in msgs:
                await asyncio.sleep(cost)
                seen += 1
                if seen >= args.messages:
                    done.set()

        config = consumer_config("probe", settings)
        source = broker.pull_consumer("probe", consume_from=ConsumeFromWhere.FIRST_OFFSET)
        consumer = AsyncLitePushConsumer(config, source=source, listener=listener)
        consumer.subscribe("probe")
        await consumer.start()
        while not seen:
            await asyncio.sleep(0.001)
        CONSUME.clear()
        gcs.reset()
        before, began, first = snapshot(os.getpid()), time.perf_counter(), seen
        await done.wait()
        seconds, after = time.perf_counter() - began, snapshot(os.getpid())
        gc_rows.update(gcs.rows)  # the measured span only
        labels.update({t.native_id: thread_label(t.name) for t in threading.enumerate() if t.native_id is not None})
        await consumer.shutdown(timeout=30)
        return seconds, seen - first, before, after

    seconds, n, before, after = uvloop.run(consume())
    gcs.uninstall()
    broker.close()
    tick = os.sysconf("SC_CLK_TCK")
    per_thread: collections.Counter[str] = collections.Counter()
    for tid, (name, ticks) in after.items():
        used = ticks - before.get(tid, (name, 0))[1]
        if used > 0:
            per_thread[labels.get(tid, name)] += used / tick
    total = sum(per_thread.values())
    print(
        f"{n / seconds:,.0f} msg/s over {n:,} messages, CPU {1e6 * total / n:.1f} us/msg: "
        + ", ".join(f"{label} {1e6 * s / n:.1f}" for label, s in per_thread.most_common())
    )
    gc_cells = [
        f"gen{g} {thread_label(who)} {int(c)}, {1e6 * s / n:.2f}" for (g, who), (c, s) in sorted(gc_rows.items())
    ]
    print("GC (collections, CPU us/msg): " + ", ".join(gc_cells))
    if CONSUME["calls"]:
        print(
            f"consume: {CONSUME['calls']:,} calls, {CONSUME['records'] / CONSUME['calls']:.0f} records each, "
            f"{CONSUME['wall_s']:.2f}s wall and {CONSUME['cpu_s']:.2f}s CPU inside of {seconds:.2f}s"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=150_000)
    parser.add_argument("--cost-ms", type=float, default=1.0)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--source", choices=("kafka", "embedded"), default="kafka")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a runner setting")
    args = parser.parse_args()
    if args.source == "embedded":
        run(args, None)
        return 0
    kafka_consumer.Consumer = CountingConsumer  # type: ignore[misc]
    with MockKafkaCluster() as cluster:
        run(args, cluster)
    return 0


if __name__ == "__main__":
    sys.exit(main())
