"""Throughput with Prometheus metrics on against off, same run (issue 8).

    .venv/bin/python benchmarks/bench_metrics.py                      # noop and sms, 3 pairs each
    .venv/bin/python benchmarks/bench_metrics.py --workloads noop-small,sms-small --repeat 1

For each workload (generated with Spark, as ``bench.py`` does) and each
configuration, ``harness.py`` runs with metrics off and with ``--metrics``
(a registry the consumer records into, scraped every second), alternating
off/on ``--repeat`` times, each run its own process.  The table shows the
median msg/s of each side, on/off of the medians and the median of the
per-pair ratios (each pair run back to back, in ABBA order, so a drift in the
machine's speed favours neither side), and the process's CPU time per
message, which a noisy neighbour disturbs less than the wall clock.  Issue 8
asks for on within 5 % of off.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench import run_harness
from workloads import get_workload

#: workload -> configurations (MODE, lanes, executor) measured on it
CONFIGS: dict[str, list[tuple[str, int, str]]] = {
    "noop": [("KEY_ORDERLY", 16, "thread")],
    "sms": [("KEY_ORDERLY", 64, "thread"), ("KEY_ORDERLY", 256, "uvloop")],
}


def _configs(workload: str) -> list[tuple[str, int, str]]:
    return CONFIGS[workload.split("-")[0]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="noop,sms", help="comma-separated named workloads (noop*, sms*)")
    parser.add_argument("--repeat", type=int, default=3, help="off/on pairs per configuration")
    parser.add_argument("--out", type=Path, default=HERE / "out", help="where the workloads are generated")
    parser.add_argument("--master", default="local[*]", help="Spark master for generation")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import gen_load

    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    for name in names:
        if name.split("-")[0] not in CONFIGS:
            parser.error(f"--workloads: {name!r} is not a noop or sms workload")
    spark = gen_load.spark_session(master=args.master)
    dirs: dict[str, Path] = {}
    logs = {name: args.out / name / "logs-metrics" for name in names}
    try:
        for name in names:
            dirs[name] = args.out / name / "workload"
            gen_load.generate(spark, get_workload(name), dirs[name])
    finally:
        spark.stop()
    lines = [
        "| workload | mode | lanes | executor | off msg/s | on msg/s | on / off (medians) | on / off (pairs, median) "
        + "| CPU µs/msg off | CPU µs/msg on | runs msg/s (off; on) |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    worst = 1.0
    for name in names:
        for mode, lanes, executor in _configs(name):
            off: list[dict[str, float]] = []
            on: list[dict[str, float]] = []
            for i in range(args.repeat):
                # ABBA: a drift in the machine's speed favours neither side
                order = ((False, off), (True, on)) if i % 2 == 0 else ((True, on), (False, off))
                for metrics, results in order:
                    result = run_harness(dirs[name], f"{mode}:{executor}", lanes, logs[name], metrics=metrics)
                    results.append({k: float(result[k]) for k in ("rate", "cpu_seconds", "messages")})  # type: ignore[arg-type]
                print(
                    f"{name} {mode}-{lanes} {executor}: off {off[-1]['rate']:,.0f}  on {on[-1]['rate']:,.0f}",
                    file=sys.stderr,
                )
            m_off = statistics.median(r["rate"] for r in off)
            m_on = statistics.median(r["rate"] for r in on)
            paired = statistics.median(b["rate"] / a["rate"] for a, b in zip(off, on, strict=True))
            cpu_off = statistics.median(r["cpu_seconds"] / r["messages"] * 1e6 for r in off)
            cpu_on = statistics.median(r["cpu_seconds"] / r["messages"] * 1e6 for r in on)
            worst = min(worst, m_on / m_off)
            runs = "; ".join(", ".join(f"{r['rate']:,.0f}" for r in side) for side in (off, on))
            lines.append(
                f"| {name} | {mode} | {lanes} | {executor} | {m_off:,.0f} | {m_on:,.0f} | {m_on / m_off:.1%} "
                f"| {paired:.1%} | {cpu_off:.2f} | {cpu_on:.2f} | {runs} |"
            )
    print("\n".join(lines))
    print(f"\nworst on/off (medians): {worst:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
