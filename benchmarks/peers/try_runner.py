"""Try one peer runner on a small backlog, before (or beside) ``bench_peers.py``.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/peers/try_runner.py \\
        benchmarks/out/peers/arroyo-venv/bin/python benchmarks/peers/arroyo_runner.py \\
        --messages 3000 --cost-ms 10 --set concurrency=64

Runs with the project's venv (it imports lite_push's mock cluster and the
benchmark modules).  It starts a ``MockKafkaCluster`` (one broker,
127.0.0.1, stopped by its PID), creates a topic of ``--partitions``
partitions, fills it with ``kafka_peers.produce`` (``--messages`` messages,
keys drawn uniformly from ``--keys`` keys with a fixed seed, every message
costing ``--cost-ms``), runs ``RUNNER`` under ``PYTHON`` with the runner
protocol's arguments (``--set`` passed through), and reads OUT.json back:
the rate (handled messages over the time from ``t0`` to the last call's
end) against the hot-key bound, CPU, peak RSS, the process's GC and
context switches (``runner_protocol``), ``bench_kafka.check``'s
counts, and whether any committed offset of the group passed a message
that was never handled (offsets read after the runner exited).
"""

from __future__ import annotations

import argparse
import array
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from bench_kafka import check
from confluent_kafka import Consumer, TopicPartition
from kafka_peers import produce
from partition import hot_key_rate
from peers.thread_cpu import shares, snapshot
from workloads import queue_of

from lite_push.sources.kafka.mock_cluster import MockKafkaCluster


def commits_past_unhandled(
    bootstrap: str, topic: str, group: str, keys: Sequence[str], partitions: int, handled: set[int]
) -> tuple[dict[int, int], list[str]]:
    """The group's committed offset per partition, and one line per
    partition whose commit passed a message never handled.  Offset ``i`` of
    partition ``p`` is the ``i``-th ``seq`` sent to ``p`` (the topic is new
    and ``produce`` sends in ``seq`` order)."""
    by_partition: list[list[int]] = [[] for _ in range(partitions)]
    for seq, key in enumerate(keys):
        by_partition[queue_of(key, partitions)].append(seq)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    finally:
        consumer.close()
    offsets: dict[int, int] = {}
    bad: list[str] = []
    for tp in committed:
        offsets[tp.partition] = tp.offset
        unhandled = [s for s in by_partition[tp.partition][: max(tp.offset, 0)] if s not in handled]
        if unhandled:
            bad.append(f"partition {tp.partition}: committed {tp.offset} passes {len(unhandled)} unhandled")
    return offsets, bad


def print_thread_shares(proc: subprocess.Popen[bytes], seconds: float) -> None:
    """Each of ``proc``'s threads' share of a core over ``seconds``, from
    one second after it started (on stderr)."""
    time.sleep(1.0)
    try:
        before = snapshot(proc.pid)
        time.sleep(seconds)
        after = snapshot(proc.pid)
    except OSError:
        print("threads: the runner ended before they were read", file=sys.stderr)
        return
    rows = shares(proc.pid, before, after, seconds)
    print("threads (share of a core): " + ", ".join(f"{label} {share:.1%}" for label, share in rows), file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("python", help="the runner's venv python")
    parser.add_argument("runner", help="benchmarks/peers/<name>_runner.py")
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--cost-ms", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--cap", type=float)
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--rebalance-delay-ms", type=int, default=0, help="the mock's initial rebalance delay")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--keep", type=Path, help="copy OUT.json here")
    parser.add_argument(
        "--threads",
        type=float,
        metavar="SECONDS",
        help="print each of the runner's threads' share of a core over SECONDS, from 1 s after it starts",
    )
    args = parser.parse_args()

    rng = random.Random(args.seed)
    keys = [f"key-{rng.randrange(args.keys)}" for _ in range(args.messages)]
    costs = [round(args.cost_ms * 1000)] * args.messages
    bound = hot_key_rate(keys, costs)
    with tempfile.TemporaryDirectory() as tmp, MockKafkaCluster(rebalance_delay_ms=args.rebalance_delay_ms) as cluster:
        topic, group = f"try-{time.strftime('%H%M%S')}", "try-group"
        cluster.create_topic(topic, args.partitions)
        secs = produce(cluster.bootstrap, topic, keys, args.partitions, 64)
        print(f"{args.messages} messages to {topic} in {secs:.2f}s; hot-key bound {bound:,.0f} msg/s", file=sys.stderr)
        costs_file, out_file = Path(tmp) / "costs", Path(tmp) / "out.json"
        costs_file.write_bytes(array.array("q", costs).tobytes())
        cmd = [
            str(Path(args.python).absolute()),
            str(Path(args.runner).absolute()),
            "--bootstrap",
            cluster.bootstrap,
            "--topic",
            topic,
            "--group",
            group,
            "--costs",
            str(costs_file),
            "--out",
            str(out_file),
            "--timeout",
            str(args.timeout),
        ]
        if args.cap is not None:
            cmd += ["--cap", str(args.cap)]
        for pair in args.set:
            cmd += ["--set", pair]
        began = time.perf_counter()
        # a session of its own, so that a runner which hangs is killed with whatever it started
        proc = subprocess.Popen(cmd, cwd=tmp, start_new_session=True)
        if args.threads:
            print_thread_shares(proc, args.threads)
        try:
            proc.wait(args.timeout + 60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        print(f"runner exited {proc.returncode} after {time.perf_counter() - began:.1f}s", file=sys.stderr)
        if not out_file.exists():
            print("no OUT.json", file=sys.stderr)
            return 1
        if args.keep:
            args.keep.write_bytes(out_file.read_bytes())
        out = json.loads(out_file.read_text())
        result = check(keys, out["seq"], out["start_ns"], out["end_ns"])
        handled = set(out["seq"])
        offsets, bad = commits_past_unhandled(cluster.bootstrap, topic, group, keys, args.partitions, handled)
    n = args.messages - result.lost
    seconds = (max(out["end_ns"]) - out["t0_ns"]) / 1e9 if out["end_ns"] else float("nan")
    first = (min(out["start_ns"]) - out["t0_ns"]) / 1e6 if out["start_ns"] else float("nan")
    rate = n / seconds if out["end_ns"] else 0.0
    after = n / (seconds - first / 1e3) if out["end_ns"] else 0.0
    print(
        f"{rate:,.0f} msg/s ({rate / bound:.1%} of the hot-key bound), {seconds:.2f}s, first call {first:.0f} ms "
        f"({after:,.0f} msg/s after it), "
        f"CPU {out['cpu_s']:.2f}s, peak RSS {out['peak_rss_kb'] / 1024:.0f} MiB, capped {out['capped']}, "
        f"error {out['error']}"
    )
    print(f"{result}; calls {len(out['seq'])}")
    if "gc" in out:
        gcs = out["gc"]
        per_gen = zip(gcs["collections"], gcs["seconds"], strict=True)
        print(
            "whole process: GC "
            + ", ".join(f"gen{g} {n} in {s:.2f}s" for g, (n, s) in enumerate(per_gen))
            + f" ({sum(gcs['seconds']):.2f}s CPU); context switches {out['context_switches'][0]:,} voluntary,"
            f" {out['context_switches'][1]:,} involuntary"
        )
    print(f"committed {offsets}; " + ("; ".join(bad) if bad else "no commit passes an unhandled message"))
    print(f"config {json.dumps(out['config'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
