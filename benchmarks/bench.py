"""The side-by-side benchmark: Spark-generated load, the QUEUE_ORDERLY
baseline against lite_push's modes on the same data, a Spark check of every
consumption log, a Markdown table and a PNG chart.

    .venv/bin/python benchmarks/bench.py sms                 # one workload, default runs
    .venv/bin/python benchmarks/bench.py sms-small --runs QUEUE_ORDERLY:20,KEY_ORDERLY:64

Each run is its own process (``harness.py``), one after another, so CPU and
peak RSS belong to that run.  Ratios are to the baseline measured in the
same invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from workloads import get_workload, skew_bound  # noqa: E402

DEFAULT_RUNS = (
    "QUEUE_ORDERLY:20,KEY_ORDERLY:8,KEY_ORDERLY:16,KEY_ORDERLY:32,KEY_ORDERLY:64,KEY_ORDERLY:128,KEY_ORDERLY:256,"
    "CONCURRENTLY:16,CONCURRENTLY:64"
)


def parse_runs(text: str) -> list[tuple[str, int]]:
    """``"MODE:N,MODE:N"`` -> ``[(mode, n), ...]``, with clear errors."""
    runs = []
    for part in text.split(","):
        mode, _, n = part.strip().partition(":")
        if mode not in ("QUEUE_ORDERLY", "KEY_ORDERLY", "CONCURRENTLY") or not n.isdigit() or int(n) < 1:
            raise SystemExit(f"--runs: bad entry {part!r}; expected MODE:N with MODE one of QUEUE_ORDERLY, KEY_ORDERLY, CONCURRENTLY")
        runs.append((mode, int(n)))
    return runs


def run_harness(workload_dir: Path, mode: str, n: int, log_dir: Path) -> dict[str, object]:
    cmd = [
        sys.executable, str(HERE / "harness.py"), "--workload", str(workload_dir),
        "--mode", mode, "--lanes", str(n), "--log", str(log_dir), "--progress",
    ]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def chart(results: list[dict[str, object]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for mode, marker in (("KEY_ORDERLY", "o"), ("CONCURRENTLY", "s")):
        pts = sorted((int(r["lanes"]), float(r["rate"])) for r in results if r["mode"] == mode)  # type: ignore[arg-type]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=f"lite_push {mode}")
    bounds = sorted((int(r["lanes"]), float(r["bound_rate"])) for r in results if r["mode"] == "KEY_ORDERLY" and r.get("bound_rate"))  # type: ignore[arg-type]
    if bounds:
        ax.plot([b[0] for b in bounds], [b[1] for b in bounds], linestyle=":", color="C0", label="KEY_ORDERLY bound (busiest lane)")
    for r in results:
        if r["mode"] == "QUEUE_ORDERLY":
            ax.axhline(float(r["rate"]), color="grey", linestyle="--", label=f"baseline QUEUE_ORDERLY ({r['lanes']} threads)")  # type: ignore[arg-type]
    ax.set_xscale("log", base=2)
    ax.set_xlabel("lanes")
    ax.set_ylabel("messages / s")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(name: str, results: list[dict[str, object]], checks: dict[str, dict[str, object]], bound_text: str) -> str:
    base = next((float(r["rate"]) for r in results if r["mode"] == "QUEUE_ORDERLY"), None)  # type: ignore[arg-type]
    lines = [
        f"#### Workload `{name}`",
        "",
        bound_text,
        "",
        "| mode | lanes / threads | msg/s | vs baseline | bound msg/s | of bound | p50 / p95 / p99 ms | CPU s | peak RSS MiB | check |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for r in results:
        c = checks.get(str(r["run"]), {})
        check = (
            f"lost {c.get('lost')}, dup {c.get('duplicates')}, inversions {c.get('inversions')}, "
            f"concurrent {c.get('concurrent')}"
            if c
            else "not checked"
        )
        ratio = f"{float(r['rate']) / base:.2f}x" if base else "-"  # type: ignore[arg-type]
        bound = r.get("bound_rate")
        bound_cells = f"{float(bound):,.0f} | {float(r['rate']) / float(bound):.0%}" if bound else "- | -"  # type: ignore[arg-type]
        lines.append(
            f"| {r['mode']} | {r['lanes']} | {float(r['rate']):,.0f} | {ratio} | {bound_cells} | "  # type: ignore[arg-type]
            f"{float(r['latency_ms_p50']):,.0f} / {float(r['latency_ms_p95']):,.0f} / {float(r['latency_ms_p99']):,.0f} | "  # type: ignore[arg-type]
            f"{float(r['cpu_seconds']):.1f} | {float(r['peak_rss_mib']):,.0f} | {check} |"  # type: ignore[arg-type]
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", help="a named workload (see workloads.py)")
    parser.add_argument("--runs", default=DEFAULT_RUNS, help=f"MODE:N list (default {DEFAULT_RUNS})")
    parser.add_argument("--out", type=Path, default=HERE / "out", help="where workloads, logs and charts go")
    parser.add_argument("--master", default="local[*]", help="Spark master for generation and checking")
    parser.add_argument("--no-check", action="store_true", help="skip the Spark check of the logs")
    args = parser.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    runs = parse_runs(args.runs)
    workload = get_workload(args.workload)

    import check_log
    import gen_load
    from tqdm import tqdm

    base = args.out / workload.name
    workload_dir = base / "workload"
    log_dir = base / "logs"
    spark = gen_load.spark_session(master=args.master)
    try:
        t0 = time.perf_counter()
        gen_load.generate(spark, workload, workload_dir)
        print(f"generated {workload.messages:,} messages with Spark in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    finally:
        # The JVM keeps working (JIT, cleanup) after a job: stop it, so the
        # first runs do not share the 2 cores with it.
        spark.stop()
    if log_dir.exists():
        for old in log_dir.glob("*.parquet"):
            old.unlink()
    results = []
    for mode, n in tqdm(runs, desc=f"{workload.name}: runs", unit="run", file=sys.stderr):
        results.append(run_harness(workload_dir, mode, n, log_dir))
    checks: dict[str, dict[str, object]] = {}
    if not args.no_check:
        spark = gen_load.spark_session(master=args.master)
        try:
            for row in check_log.check(spark, workload_dir, [log_dir]):
                checks[str(row["run"])] = row
        finally:
            spark.stop()

    sb = skew_bound(workload)
    bound_text = (
        f"{workload.messages:,} messages, {workload.queues} queues, {workload.keys:,} keys, skew {workload.skew}; "
        f"hottest key {sb.top_share:.1%} of messages -> no key-ordered consumer can beat the baseline by more "
        f"than {sb.ceiling_ratio:.1f}x on this workload (its best rate is {sb.key_ordered_max_rate:,.0f} msg/s)."
    )
    bound_text += (
        " \"bound\" is the best rate the run's own partitioning allows on this data: the busiest lane's total"
        " cost for KEY_ORDERLY (Java-hash lanes), the busiest queue's for QUEUE_ORDERLY, the total over the lanes"
        " for CONCURRENTLY (`workloads.partition_bound`)."
    )
    md = table(workload.name, results, checks, bound_text)
    png = base / f"{workload.name}.png"
    chart(results, f"{workload.name}: throughput vs lanes", png)
    (base / f"{workload.name}.md").write_text(md + f"\n\nChart: `{png}`\n")
    print(md)
    print(f"\nchart: {png}")
    bad = [
        run
        for run, c in checks.items()
        if not run.startswith("CONCURRENTLY") and (c.get("lost") or c.get("inversions") or c.get("concurrent"))
    ]
    if bad:
        print(f"CHECK FAILED for {bad}: ordered runs must show no loss, inversions or concurrent keys", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
