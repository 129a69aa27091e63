"""First runtime benchmark (no Spark): lanes vs modes on the embedded broker,
and the runtime's no-op overhead against the source's raw poll rate.

    .venv/bin/python benchmarks/bench_runtime.py            # full (about a minute)
    .venv/bin/python benchmarks/bench_runtime.py --quick    # smoke run

Every ratio is between numbers measured in the same run.  The table is
printed as Markdown, ready for ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time

from lite_push import OFFSETS_IMPL, ROUTER_IMPL, ConsumeFromWhere, ConsumeMode, ConsumerConfig, EmbeddedBroker
from lite_push.demo import RunResult, fill_broker, lane_balance, run_once


def raw_poll_rate(broker: EmbeddedBroker, topic: str, pull_batch_size: int) -> RunResult:
    """Poll every message of ``topic`` and discard it: the source's ceiling."""
    total = sum(broker.max_offset(q) for q in broker.queues(topic))
    source = broker.pull_consumer("raw", consume_from=ConsumeFromWhere.FIRST_OFFSET)
    source.subscribe(topic)
    got = 0
    t0 = time.perf_counter()
    while got < total:
        for batch in source.poll(0.1, pull_batch_size):
            got += len(batch.messages)
    seconds = time.perf_counter() - t0
    source.close()
    return RunResult("raw poll-and-discard", total, seconds, 0, 0, 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--repeat", type=int, default=1, help="repeat the no-op comparison")
    args = parser.parse_args()
    sleep_n = 10_000 if args.quick else 100_000
    noop_n = 100_000 if args.quick else 1_000_000

    print(f"python {platform.python_version()}, router={ROUTER_IMPL}, offsets={OFFSETS_IMPL}", file=sys.stderr)

    # -- 1 ms listener: modes and lanes ------------------------------------
    broker = EmbeddedBroker()
    keys = fill_broker(broker, "SMS", sleep_n, queues=8, keys=10_000)

    def io(_s: float = 0.001) -> None:
        time.sleep(_s)

    rows: list[tuple[RunResult, str]] = []
    for label, mode, lanes in [
        ("KEY_ORDERLY, 64 lanes", ConsumeMode.KEY_ORDERLY, 64),
        ("CONCURRENTLY, 64 lanes", ConsumeMode.CONCURRENTLY, 64),
        ("KEY_ORDERLY, 8 lanes", ConsumeMode.KEY_ORDERLY, 8),
        ("QUEUE_ORDERLY (baseline), 20 threads", ConsumeMode.QUEUE_ORDERLY, 20),
    ]:
        gc.collect()
        cfg = ConsumerConfig(group=f"g-{mode.name}-{lanes}", mode=mode, lanes=lanes)
        res = run_once(broker, "SMS", label, cfg, io)
        check = (
            f"{res.lost} lost (no order promised)"
            if mode is ConsumeMode.CONCURRENTLY
            else f"{res.inversions} inversions, {res.lost} lost"
        )
        rows.append((res, check))
        print(f"{label}: {res.rate:,.0f} msg/s", file=sys.stderr)

    base = rows[2][0].rate
    print(f"\n### 1 ms listener: {sleep_n:,} messages, 8 queues, 10,000 keys\n")
    print("Keys are 10,000 random 16-digit account numbers; each key has 10 messages.")
    print("'lane bound' is lanes x 1000 msg/s divided by the busiest lane's share of the keys")
    print("over the mean (Java String.hashCode mod lanes); round-robin has no such bound;")
    print("QUEUE_ORDERLY runs one message per queue at a time, so its bound is 8 queues x 1 ms.\n")
    print("| run | msg/s | vs KEY_ORDERLY 8 lanes | % of lanes x 1 ms | % of lane bound | check |")
    print("|---|---:|---:|---:|---:|---|")
    for res, check in rows:
        lanes = int(res.label.split(",")[1].split()[0])
        if res.label.startswith("QUEUE"):
            lanes = 8  # one thread per queue at a time, whatever the pool size
        bound = lanes * 1000 / (lane_balance(keys, lanes) if res.label.startswith("KEY") else 1.0)
        print(
            f"| {res.label} | {res.rate:,.0f} | {res.rate / base:.2f}x | {res.rate / (lanes * 1000):.0%} "
            f"| {res.rate / bound:.0%} | {check} |"
        )

    # -- no-op listener vs raw poll -----------------------------------------
    broker = EmbeddedBroker()
    fill_broker(broker, "NOOP", noop_n, queues=8, keys=10_000, body_size=16)
    print(f"\n### No-op listener: {noop_n:,} messages, 8 queues, 16 lanes, KEY_ORDERLY\n")
    print("| try | raw poll msg/s | lite_push msg/s | lite_push / raw |")
    print("|---|---:|---:|---:|")
    for i in range(args.repeat):
        gc.collect()
        raw = raw_poll_rate(broker, "NOOP", 32)
        gc.collect()
        cfg = ConsumerConfig(group=f"noop-{i}", lanes=16)
        res = run_once(broker, "NOOP", "noop", cfg, None, check=False)
        print(f"| {i + 1} | {raw.rate:,.0f} | {res.rate:,.0f} | {res.rate / raw.rate:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
