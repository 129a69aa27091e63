"""Run pyrallel-consumer once over a topic and write down every handler call.

Started by ``bench_kafka.py`` (``kafka_peers.run_pyrallel``) with the
python of the pyrallel venv (pyrallel-consumer 1.0.0 needs Python >= 3.12);
it imports only the standard library, confluent_kafka and pyrallel_consumer.

    benchmarks/out/pyrallel-venv/bin/python benchmarks/pyrallel_runner.py \\
        --bootstrap 127.0.0.1:PORT --topic T --group G --costs FILE --out OUT.json

``--costs``: each message's cost in microseconds by ``seq``, int64 native
order (``array('q').tobytes()``).  A message's value starts with its ``seq``
(8 bytes big endian).  The consumer is pyrallel's ``PyrallelConsumer`` with
``KafkaConfig`` at its defaults but for the bootstrap servers and the group:
ordering ``key_hash`` (one call at a time per key and partition), execution
``async`` (an ``async def`` worker awaited on asyncio's default loop,
``max_in_flight`` 1000 unless ``--max-in-flight``), ``auto.offset.reset``
earliest.  The worker awaits ``asyncio.sleep(cost)`` and records ``(seq,
start_ns, end_ns)``; once every ``seq`` was handled the consumer is stopped
(it commits) and ``OUT`` gets ``t0_ns`` (``perf_counter_ns`` just before
``start()``), ``cpu_s`` (this process's CPU from then to the last message
seen handled), ``error`` and the calls as three lists.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import logging
import sys
import time
from pathlib import Path

from pyrallel_consumer import ExecutionMode, KafkaConfig, OrderingMode, PyrallelConsumer, WorkItem


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--costs", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--max-in-flight", type=int, help="ExecutionConfig.max_in_flight (default: pyrallel's)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)

    costs = array.array("q")
    costs.frombytes(args.costs.read_bytes())
    total = len(costs)

    config = KafkaConfig(BOOTSTRAP_SERVERS=args.bootstrap, CONSUMER_GROUP=args.group)
    pc = config.parallel_consumer
    pc.ordering_mode = OrderingMode.KEY_HASH  # the default, said out loud
    pc.execution.mode = ExecutionMode.ASYNC  # the default too
    if args.max_in_flight is not None:
        pc.execution.max_in_flight = args.max_in_flight

    seqs, starts, ends = array.array("q"), array.array("q"), array.array("q")
    seen = bytearray(total)
    state = {"distinct": 0}
    clock = time.perf_counter_ns

    async def run() -> tuple[int, float, str | None]:
        done = asyncio.Event()
        sleep = asyncio.sleep

        async def worker(item: WorkItem) -> None:
            seq = int.from_bytes(item.payload[:8], "big")
            start = clock()
            cost = costs[seq]
            if cost:
                await sleep(cost / 1e6)
            ends.append(clock())
            seqs.append(seq)
            starts.append(start)
            if not seen[seq]:
                seen[seq] = 1
                state["distinct"] += 1
                if state["distinct"] >= total:
                    done.set()

        consumer = PyrallelConsumer(config=config, worker=worker, topic=args.topic)
        error = None
        cpu0 = time.process_time()
        t0 = clock()
        await consumer.start()
        try:
            await asyncio.wait_for(done.wait(), args.timeout)
        except TimeoutError:
            error = f"timeout after {args.timeout:g}s ({state['distinct']} of {total} handled)"
        cpu = time.process_time() - cpu0
        await consumer.stop()
        return t0, cpu, error

    t0, cpu, error = asyncio.run(run())
    ex = pc.execution
    args.out.write_text(
        json.dumps(
            {
                "t0_ns": t0,
                "cpu_s": cpu,
                "error": error,
                "config": {
                    "package": "pyrallel-consumer 1.0.0",
                    "python": sys.version.split()[0],
                    "ordering_mode": pc.ordering_mode.value,
                    "execution.mode": ex.mode.value,
                    "max_in_flight": ex.max_in_flight,
                    "poll_batch_size": pc.poll_batch_size,
                    "queue_max_messages": pc.queue_max_messages,
                    "worker": "async def: await asyncio.sleep(cost)",
                    "loop": "asyncio.run (default loop)",
                },
                "seq": seqs.tolist(),
                "start_ns": starts.tolist(),
                "end_ns": ends.tolist(),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
