"""Try one peer runner on a fresh mock cluster and check what it did.

Until the issue-31 orchestrator runs every peer, this is how the aiokafka and
faust runners were tried: it starts ``MockKafkaCluster()``, creates topic
``T`` (8 partitions), fills it with ``kafka_peers.produce`` (``--messages``
messages, keys drawn uniformly from ``--keys`` keys, every message costing
``--cost-ms``), runs the runner with the given python, then checks its
OUT.json with ``bench_kafka.check`` (lost, duplicates, order violations,
same-key overlaps) and the group's committed offsets (no commit may pass a
message that was not handled).  From the project venv, in the worktree:

    PYTHONPATH=$PWD .venv/bin/python benchmarks/peers/try_aiokafka.py \\
        --python benchmarks/out/peers/aiokafka-venv/bin/python \\
        --runner benchmarks/peers/aiokafka_runner.py --messages 5000 --cost-ms 10 \\
        --set mode=keys --set max_in_flight=20000
"""

from __future__ import annotations

import argparse
import array
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from bench_kafka import check
from confluent_kafka import Consumer, TopicPartition
from kafka_peers import produce
from partition import hot_key_rate
from redraw import draw
from workloads import get_workload, queue_of

from lite_push.sources.kafka.mock_cluster import MockKafkaCluster

PARTITIONS = 8


def commits(
    bootstrap: str, topic: str, group: str, keys: list[str], partitions: int, handled: set[int]
) -> tuple[int, int]:
    """How many messages lie below the group's committed offsets, and how
    many of those were not handled (0 for an at-least-once consumer).  Partition ``p``'s
    offset ``i`` is the ``i``-th seq produced to it (``produce`` sends in seq
    order)."""
    by_partition: list[list[int]] = [[] for _ in range(partitions)]
    for seq, key in enumerate(keys):
        by_partition[queue_of(key, partitions)].append(seq)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        offsets = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    finally:
        consumer.close()
    below = [seq for tp in offsets for seq in by_partition[tp.partition][: max(tp.offset, 0)]]
    return len(below), sum(1 for seq in below if seq not in handled)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="the runner's venv python")
    parser.add_argument("--runner", required=True, type=Path)
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--cost-ms", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--cap", type=float)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workload", help="a workloads.py workload (io5, io1, ...) instead of the uniform shape")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--keep", type=Path, help="copy the runner's OUT.json here")
    args = parser.parse_args()

    partitions = PARTITIONS
    if args.workload:
        workload = get_workload(args.workload)
        keys, costs = draw(workload)
        partitions = workload.queues
        args.messages = len(keys)
    else:
        rng = random.Random(args.seed)
        keys = [f"key-{rng.randrange(args.keys)}" for _ in range(args.messages)]
        costs = [round(args.cost_ms * 1000)] * args.messages
    bound = hot_key_rate(keys, costs)
    with MockKafkaCluster() as cluster, tempfile.TemporaryDirectory() as tmp:
        cluster.create_topic("T", partitions)
        produce(cluster.bootstrap, "T", keys, partitions, 64)
        costs_file, out_file = Path(tmp) / "costs", Path(tmp) / "out.json"
        costs_file.write_bytes(array.array("q", costs).tobytes())
        group = f"try-{time.time_ns()}"
        cmd = [
            args.python, str(args.runner), "--bootstrap", cluster.bootstrap, "--topic", "T", "--group", group,
            "--costs", str(costs_file), "--out", str(out_file), "--timeout", str(args.timeout),
        ]
        cmd += ["--cap", str(args.cap)] if args.cap is not None else []
        for pair in args.set:
            cmd += ["--set", pair]
        began = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout + 60)
        took = time.monotonic() - began
        if proc.returncode != 0 or not out_file.exists():
            print(f"runner exited {proc.returncode}:\n{proc.stderr[-3000:]}", file=sys.stderr)
            return 1
        out = json.loads(out_file.read_text())
        if args.keep:
            args.keep.write_text(out_file.read_text())
        handled = set(out["seq"])
        committed, past = commits(cluster.bootstrap, "T", group, keys, partitions, handled)
    result = check(keys, out["seq"], out["start_ns"], out["end_ns"])
    seconds = (max(out["end_ns"]) - out["t0_ns"]) / 1e9 if out["end_ns"] else float("nan")
    rate = (args.messages - result.lost) / seconds
    first = (min(out["start_ns"]) - out["t0_ns"]) / 1e6 if out["start_ns"] else float("nan")
    after = (args.messages - result.lost) / (seconds - first / 1e3)
    print(
        f"{rate:,.0f} msg/s ({rate / bound:.0%} of hot-key bound {bound:,.0f}), first call {first:.0f} ms, "
        f"{after:,.0f} msg/s after it, "
        f"CPU {out['cpu_s']:.2f} s, RSS {out['peak_rss_kb'] / 1024:.0f} MiB, process {took:.1f} s | "
        f"lost {result.lost} dup {result.duplicates} order {result.order_violations} overlap {result.overlaps} "
        f"committed {committed} (past unhandled {past}) | capped {out['capped']} error {out['error']}"
    )
    print(json.dumps(out["config"]))
    if proc.stderr.strip():
        print(f"runner stderr (tail):\n{proc.stderr[-1500:]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
