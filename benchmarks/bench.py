"""The side-by-side benchmark: Spark-generated load, the QUEUE_ORDERLY
baseline against lite_push's modes on the same data, a Spark check of every
consumption log, a Markdown table and a PNG chart.

    .venv/bin/python benchmarks/bench.py sms                 # one workload, default runs
    .venv/bin/python benchmarks/bench.py sms-small --runs QUEUE_ORDERLY:20,KEY_ORDERLY:64
    .venv/bin/python benchmarks/bench.py poison          # poisoned keys: each run without, then with failures
    .venv/bin/python benchmarks/bench.py io5 --runs QUEUE_ORDERLY:20,KEY_ORDERLY:256:uvloop,KEY_ORDERLY:256:uvloop@java

A run is ``MODE:N[:EXECUTOR][@PLACEMENT]`` (:func:`parse_runs`): MODE one of
QUEUE_ORDERLY, KEY_ORDERLY, CONCURRENTLY, LOOP; N lanes (threads for
QUEUE_ORDERLY); EXECUTOR thread (default), asyncio or uvloop; PLACEMENT the
KEY_ORDERLY / LOOP lane placement, load (default), hash or java
(``harness.py --placement``).  Each run is its own process (``harness.py``),
one after another, so CPU and peak RSS belong to that run.  Ratios are to
the baseline measured in the same invocation.  The table gives each run's
rate against its partition bound (``partition.partition_bound`` with the
run's placement) and against the hot-key bound (the generated data's
``N / hottest key's total cost``).

A workload with poisoned keys (``poison_keys > 0``) runs each MODE:N twice,
first with ``--no-failures`` then with the failures, and its table compares
the healthy keys' throughput of the two (issue 5: KEY_ORDERLY should keep
>= 90 %, the QUEUE_ORDERLY baseline is expected to collapse).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from partition import PLACEMENTS
from workloads import Workload, get_workload, poisoned_share, skew_bound

DEFAULT_RUNS = (
    "QUEUE_ORDERLY:20,KEY_ORDERLY:8,KEY_ORDERLY:16,KEY_ORDERLY:32,KEY_ORDERLY:64,KEY_ORDERLY:128,KEY_ORDERLY:256,"
    "CONCURRENTLY:16,CONCURRENTLY:64"
)
#: Default runs for a workload with poisoned keys (each runs twice).
DEFAULT_POISON_RUNS = "QUEUE_ORDERLY:20,KEY_ORDERLY:16,KEY_ORDERLY:64"
#: Issue 5's target: healthy keys keep this share of the no-failure throughput (KEY_ORDERLY).
HEALTHY_TARGET = 0.90


class Run(NamedTuple):
    """One ``--runs`` entry."""

    #: The mode, with a ``:asyncio`` / ``:uvloop`` suffix for those executors.
    mode: str
    #: Lanes (pool threads for QUEUE_ORDERLY).
    n: int
    #: The lane placement (``load`` for modes that place no keys).
    placement: str = "load"


_RUNS_SYNTAX = (
    "expected MODE:N[:EXECUTOR][@PLACEMENT] with MODE one of QUEUE_ORDERLY, KEY_ORDERLY, CONCURRENTLY, LOOP; "
    "N >= 1; EXECUTOR one of thread, asyncio, uvloop (not for QUEUE_ORDERLY; LOOP needs asyncio or uvloop); "
    f"PLACEMENT one of {', '.join(PLACEMENTS)} (KEY_ORDERLY and LOOP only)"
)


def parse_runs(text: str) -> list[Run]:
    """``"MODE:N,MODE:N:EXECUTOR,MODE:N@PLACEMENT"`` -> ``[Run, ...]``
    (``Run.mode`` keeps a ``:asyncio`` / ``:uvloop`` suffix; ``:thread`` is
    the default and dropped), with clear errors (``SystemExit`` naming the
    entry; an entry equal to an earlier one is an error too).
    ``LOOP:N:EXECUTOR`` is no consumer: the event loop's ceiling for the
    same listener over N lanes of the placement's partitioning
    (``harness.py --bare``; ``load``: an offline greedy split)."""
    runs = []
    for part in text.split(","):
        entry = part.strip()
        spec, at, placement = entry.partition("@")
        mode, _, rest = spec.partition(":")
        n, _, executor = rest.partition(":")
        if not at:
            placement = "load"
        if (
            mode not in ("QUEUE_ORDERLY", "KEY_ORDERLY", "CONCURRENTLY", "LOOP")
            or not n.isdigit()
            or int(n) < 1
            or executor not in ("", "thread", "asyncio", "uvloop")
            or (executor not in ("", "thread") and mode == "QUEUE_ORDERLY")
            or (executor in ("", "thread") and mode == "LOOP")
            or placement not in PLACEMENTS
            or (at and mode not in ("KEY_ORDERLY", "LOOP"))
        ):
            raise SystemExit(f"--runs: bad entry {entry!r}; {_RUNS_SYNTAX}")
        run = Run(mode if executor in ("", "thread") else f"{mode}:{executor}", int(n), placement)
        if run in runs:  # same label, same log file
            raise SystemExit(f"--runs: entry {entry!r} repeats an earlier one (use --repeat to run one twice)")
        runs.append(run)
    return runs


def run_harness(
    workload_dir: Path,
    mode: str,
    n: int,
    log_dir: Path,
    no_failures: bool = False,
    metrics: bool = False,
    placement: str = "load",
) -> dict[str, object]:
    """Run ``harness.py`` in its own process; its JSON line as a dict.
    ``mode`` may carry an executor suffix (``KEY_ORDERLY:uvloop``).
    ``metrics``: with Prometheus metrics on (``harness.py --metrics``).
    ``placement``: KEY_ORDERLY's (and LOOP's) lane placement."""
    mode, _, executor = mode.partition(":")
    cmd = [
        sys.executable,
        str(HERE / "harness.py"),
        "--workload",
        str(workload_dir),
        "--mode",
        "KEY_ORDERLY" if mode == "LOOP" else mode,
        "--lanes",
        str(n),
        "--log",
        str(log_dir),
        "--progress",
        "--executor",
        executor or "thread",
    ]
    if mode == "LOOP":
        cmd.append("--bare")
    if placement != "load":
        cmd += ["--placement", placement]
    if no_failures:
        cmd.append("--no-failures")
    if metrics:
        cmd.append("--metrics")
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_repeated(
    workload_dir: Path, run: Run, log_dir: Path, repeat: int, no_failures: bool = False
) -> dict[str, object]:
    """Run a configuration ``repeat`` times (each its own process); return
    the run with the median rate, with ``rates`` (all of them) added.  Its
    consumption log is the one kept for the check."""
    mode, n, placement = run
    if repeat == 1:
        return run_harness(workload_dir, mode, n, log_dir, no_failures, placement=placement)
    runs = []
    for i in range(repeat):
        sub = log_dir / f"repeat-{i}"
        runs.append((run_harness(workload_dir, mode, n, sub, no_failures, placement=placement), sub))
    ordered = sorted(runs, key=lambda r: float(r[0]["rate"]))  # type: ignore[arg-type]
    median, sub = ordered[len(ordered) // 2]
    for path in sub.glob("*.parquet"):
        path.replace(log_dir / path.name)
    for _, d in runs:
        for path in d.glob("*.parquet"):
            path.unlink()
        d.rmdir()
    median["rates"] = [float(r[0]["rate"]) for r in runs]  # type: ignore[arg-type]
    return median


def chart(results: list[dict[str, object]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))

    def series_of(r: dict[str, object]) -> tuple[str, str, str]:
        return str(r["mode"]), str(r.get("executor", "thread")), str(r.get("placement") or "")

    colors: dict[str, str] = {}  # placement -> colour of its first KEY_ORDERLY series
    for mode, ex, placement in sorted({series_of(r) for r in results if r["mode"] != "QUEUE_ORDERLY"}):
        marker = "o" if mode == "KEY_ORDERLY" else "s"
        pts = sorted(
            (int(r["lanes"]), float(r["rate"]))  # type: ignore[call-overload, arg-type]
            for r in results
            if series_of(r) == (mode, ex, placement)
        )
        if pts:
            notes = ", ".join(x for x in ("" if ex == "thread" else ex, placement) if x)
            label = (f"lite_push {mode}" if mode != "LOOP" else "no consumer: loop ceiling") + (
                f" ({notes})" if notes else ""
            )
            (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=label)
            if mode == "KEY_ORDERLY":
                colors.setdefault(placement or "java", line.get_color())
    keyed = [r for r in results if r["mode"] == "KEY_ORDERLY" and r.get("bound_rate")]
    for placement in sorted({str(r.get("placement") or "java") for r in keyed}):
        bounds = sorted(
            {
                (int(r["lanes"]), float(r["bound_rate"]))  # type: ignore[call-overload, arg-type]
                for r in keyed
                if str(r.get("placement") or "java") == placement
            }
        )
        what = "any key-ordered consumer" if placement == "load" else f"busiest {placement} lane"
        ax.plot(
            [b[0] for b in bounds],
            [b[1] for b in bounds],
            linestyle=":",
            marker="_",
            markersize=14,
            color=colors.get(placement, "grey"),
            label=f"KEY_ORDERLY bound, {placement} ({what})",
        )
    hot = next((float(r["hot_key_rate"]) for r in results if r.get("hot_key_rate")), None)  # type: ignore[arg-type]
    if hot is not None:
        ax.axhline(hot, color="black", linestyle=":", label="hot-key bound")
    for r in results:
        if r["mode"] == "QUEUE_ORDERLY":
            ax.axhline(
                float(r["rate"]), color="grey", linestyle="--", label=f"baseline QUEUE_ORDERLY ({r['lanes']} threads)"
            )  # type: ignore[arg-type]
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


def poison_chart(pairs: list[tuple[dict[str, object], dict[str, object]]], title: str, path: Path) -> None:
    """Bars per MODE:N: the healthy keys' msg/s without and with failures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{nofail['mode']}\n{nofail['lanes']}" for nofail, _ in pairs]
    before = [float(nofail["healthy_rate"] or 0) for nofail, _ in pairs]  # type: ignore[arg-type]
    after = [float(fail["healthy_rate"] or 0) for _, fail in pairs]  # type: ignore[arg-type]
    xs = range(len(pairs))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.bar([x - 0.2 for x in xs], before, width=0.4, label="no failures")
    bars = ax.bar([x + 0.2 for x in xs], after, width=0.4, label="with poisoned keys")
    for bar, b, a in zip(bars, before, after, strict=True):
        if b:
            ax.annotate(f"{a / b:.0%}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom")
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("healthy keys: messages / s")
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mode_cell(r: dict[str, object]) -> str:
    """``MODE (executor, placement)``: the executor unless threads, the
    placement for runs that place keys."""
    ex = str(r.get("executor", "thread"))
    notes = [ex] if ex != "thread" else []
    if r.get("placement"):
        notes.append(str(r["placement"]))
    return f"{r['mode']}" + (f" ({', '.join(notes)})" if notes else "")


def _check_cell(c: dict[str, object]) -> str:
    if not c:
        return "not checked"
    return (
        f"lost {c.get('lost')}, dup {c.get('duplicates')}, inversions {c.get('inversions')}, "
        f"concurrent {c.get('concurrent')}"
    )


def poison_text(workload: Workload, workload_dir: Path) -> str:
    """What the poisoned keys hold in the generated data, and the least time
    their retries take (printed and put above the table)."""
    import gen_load

    from lite_push import ConsumerConfig

    ps = gen_load.poison_summary(workload_dir)
    suspend_s = ConsumerConfig(group="bench").suspend_ms / 1000.0
    per_msg = workload.poison_failures * suspend_s
    return (
        f"{workload.messages:,} messages, {workload.queues} queues, {workload.keys:,} keys, skew {workload.skew}, "
        f"cost {workload.cost} {workload.cost_ms:g} ms. Poisoned: {ps.keys} keys ({workload.poison_keys:.1%}) "
        f"hold {ps.messages:,} messages ({ps.messages / workload.messages:.2%}; expected "
        f"{poisoned_share(workload):.2%}); every one fails {workload.poison_failures}x before it succeeds, "
        f"{suspend_s * 1000:.0f} ms (`suspend_ms`) apart, so it costs at least {per_msg:g} s. "
        f"Messages per poisoned key: {list(ps.per_key.values())}; the busiest poisoned key alone keeps a "
        f"KEY_ORDERLY run going for at least {ps.largest_key * per_msg:g} s, and the queue with the most "
        f"poisoned messages ({ps.largest_queue}) stalls QUEUE_ORDERLY for at least {ps.largest_queue * per_msg:g} s."
    )


def poison_table(
    name: str,
    pairs: list[tuple[dict[str, object], dict[str, object]]],
    checks: dict[str, dict[str, object]],
    text: str,
) -> str:
    """The Markdown table of a poisoned workload: one row per MODE:N, its
    no-failure run against its run with failures."""
    lines = [
        f"#### Workload `{name}`",
        "",
        text,
        "",
        (
            '"healthy msg/s" counts the messages of keys that never fail, over the time from the run\'s start to the '
            'end of the last of them; "no-failure msg/s" is the same measure (same messages) on the same '
            'configuration run with `--no-failures`; "healthy vs no-failure" is their ratio (issue 5\'s target: '
            f'>= {HEALTHY_TARGET:.0%} for KEY_ORDERLY). "total msg/s" is all messages over the whole run, the '
            'poisoned keys\' retries included. "retried" counts failed attempts. The check is the Spark check of '
            "the no-failure run, then of the run with failures (the log holds successful attempts only)."
        ),
        "",
        (
            "| mode | lanes / threads | no-failure msg/s | with failures: healthy msg/s | healthy vs no-failure "
            "| total msg/s | retried | check (no-failure; with failures) |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for nofail, fail in pairs:
        before = nofail.get("healthy_rate")
        after = fail.get("healthy_rate")
        ratio = f"{float(after) / float(before):.0%}" if before and after else "-"  # type: ignore[arg-type]
        check = f"{_check_cell(checks.get(str(nofail['run']), {}))}; {_check_cell(checks.get(str(fail['run']), {}))}"
        dead = int(fail.get("dead_lettered") or 0)  # type: ignore[call-overload]
        retried = f"{int(fail['retried']):,}" + (f" ({dead:,} dead-lettered)" if dead else "")  # type: ignore[call-overload]
        lines.append(
            f"| {_mode_cell(fail)} | {fail['lanes']} | {float(before or 0):,.0f} | "  # type: ignore[arg-type]
            f"{float(after or 0):,.0f} | {ratio} | "  # type: ignore[arg-type]
            f"{float(fail['rate']):,.0f} | {retried} | {check} |"  # type: ignore[arg-type]
        )
    return "\n".join(lines)


def table(name: str, results: list[dict[str, object]], checks: dict[str, dict[str, object]], bound_text: str) -> str:
    base = next((float(r["rate"]) for r in results if r["mode"] == "QUEUE_ORDERLY"), None)  # type: ignore[arg-type]
    lines = [
        f"#### Workload `{name}`",
        "",
        bound_text,
        "",
        "| mode | lanes / threads | msg/s | vs baseline | bound msg/s | of bound | of hot-key bound "
        "| p50 / p95 / p99 ms | CPU s | peak RSS MiB | check |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for r in results:
        check = _check_cell(checks.get(str(r["run"]), {}))
        ratio = f"{float(r['rate']) / base:.2f}x" if base else "-"  # type: ignore[arg-type]
        bound = r.get("bound_rate")
        bound_cells = f"{float(bound):,.0f} | {float(r['rate']) / float(bound):.0%}" if bound else "- | -"  # type: ignore[arg-type]
        hot = r.get("hot_key_rate")
        hot_cell = f"{float(r['rate']) / float(hot):.0%}" if hot and r["mode"] != "CONCURRENTLY" else "-"  # type: ignore[arg-type]
        rate = f"{float(r['rate']):,.0f}"  # type: ignore[arg-type]
        if r.get("rates"):
            rate += f" ({min(r['rates']):,.0f}–{max(r['rates']):,.0f})"  # type: ignore[type-var, call-overload]
        lines.append(
            f"| {_mode_cell(r)} | {r['lanes']} | {rate} | {ratio} | {bound_cells} | {hot_cell} | "
            f"{float(r['latency_ms_p50']):,.0f} / {float(r['latency_ms_p95']):,.0f} / "  # type: ignore[arg-type]
            f"{float(r['latency_ms_p99']):,.0f} | "  # type: ignore[arg-type]
            f"{float(r['cpu_seconds']):.1f} | {float(r['peak_rss_mib']):,.0f} | {check} |"  # type: ignore[arg-type]
        )
    return "\n".join(lines)


def _skew_table(workload: Workload, results: list[dict[str, object]], checks: dict[str, dict[str, object]]) -> str:
    """The table of a workload without failures, under its skew bound."""
    sb = skew_bound(workload)
    bound_text = (
        f"{workload.messages:,} messages, {workload.queues} queues, {workload.keys:,} keys, skew {workload.skew}; "
        f"hottest key {sb.top_share:.1%} of messages -> no key-ordered consumer can beat the baseline by more "
        f"than {sb.ceiling_ratio:.1f}x on this workload (its best rate is {sb.key_ordered_max_rate:,.0f} msg/s)."
    )
    hot = next((float(r["hot_key_rate"]) for r in results if r.get("hot_key_rate")), None)  # type: ignore[arg-type]
    if hot is not None:
        bound_text += (
            f" On the generated data the hot-key bound is {hot:,.0f} msg/s (N / the hottest key's total cost: no"
            ' key-ordered run beats it with any number of lanes); "of hot-key bound" is each run\'s rate over it'
            " (not for CONCURRENTLY, which may run a key's messages at once)."
        )
    placements = sorted({str(r["placement"]) for r in results if r.get("placement")}, key=PLACEMENTS.index)
    if any(r["mode"] == "LOOP" for r in results):
        bound_text += (
            " LOOP rows run no consumer: the same listener awaited by N coroutines over the messages partitioned"
            " into N lanes by the row's placement, read up front -- what the event loop can do with this listener"
            " at all (load: an offline greedy split, each key in order of first appearance to the lane with the"
            " least cost so far)."
        )
    keyed = {
        "load": "N / max(hottest key's total cost, total cost / lanes) with load placement (keys move between"
        " lanes, so this is the best any key-ordered consumer with that many lanes can do)",
        "hash": "the busiest lane's total cost with hash placement (lane `mixed_hash(key) % lanes`)",
        "java": "the busiest lane's total cost with java placement (lane `lane_of(key, lanes)`, Java's hash)",
    }
    key_text = f" for KEY_ORDERLY and LOOP {'; '.join(keyed[p] for p in placements)};" if placements else ""
    bound_text += (
        ' "bound" is the best rate the run\'s own partitioning allows on this data (`partition.partition_bound`):'
        f"{key_text} the busiest queue's for QUEUE_ORDERLY; the total over the lanes for CONCURRENTLY."
    )
    return table(workload.name, results, checks, bound_text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", help="a named workload (see workloads.py)")
    parser.add_argument(
        "--runs",
        help=f"MODE:N[:EXECUTOR][@PLACEMENT] list (default {DEFAULT_RUNS}; for a workload with poisoned keys "
        f"{DEFAULT_POISON_RUNS})",
    )
    parser.add_argument("--out", type=Path, default=HERE / "out", help="where workloads, logs and charts go")
    parser.add_argument("--master", default="local[*]", help="Spark master for generation and checking")
    parser.add_argument("--no-check", action="store_true", help="skip the Spark check of the logs")
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per configuration; the table shows the median (min-max)"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    workload = get_workload(args.workload)
    poisoned = workload.poison_keys > 0
    runs = parse_runs(args.runs or (DEFAULT_POISON_RUNS if poisoned else DEFAULT_RUNS))

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
        print(
            f"generated {workload.messages:,} messages with Spark in {time.perf_counter() - t0:.1f}s", file=sys.stderr
        )
    finally:
        # The JVM keeps working (JIT, cleanup) after a job: stop it, so the
        # first runs do not share the 2 cores with it.
        spark.stop()
    if log_dir.exists():
        for old in log_dir.glob("*.parquet"):
            old.unlink()
    results: list[dict[str, object]] = []
    pairs: list[tuple[dict[str, object], dict[str, object]]] = []
    text = poison_text(workload, workload_dir) if poisoned else ""
    if poisoned:
        print(text, file=sys.stderr)
    for run in tqdm(runs, desc=f"{workload.name}: runs", unit="run", file=sys.stderr):
        if poisoned:
            nofail = run_repeated(workload_dir, run, log_dir, args.repeat, no_failures=True)
            pair = (nofail, run_repeated(workload_dir, run, log_dir, args.repeat))
            pairs.append(pair)
            results.extend(pair)
        else:
            results.append(run_repeated(workload_dir, run, log_dir, args.repeat))
    checks: dict[str, dict[str, object]] = {}
    if not args.no_check:
        spark = gen_load.spark_session(master=args.master)
        try:
            for row in check_log.check(spark, workload_dir, [log_dir]):
                checks[str(row["run"])] = row
        finally:
            spark.stop()

    png = base / f"{workload.name}.png"
    if poisoned:
        md = poison_table(workload.name, pairs, checks, text)
        poison_chart(pairs, f"{workload.name}: healthy keys without and with poisoned keys", png)
    else:
        md = _skew_table(workload, results, checks)
        chart(results, f"{workload.name}: throughput vs lanes", png)
    (base / f"{workload.name}.md").write_text(md + f"\n\nChart: `{png}`\n")
    print(md)
    print(f"\nchart: {png}")
    bad = [
        run
        for run, c in checks.items()
        if not run.startswith("CONCURRENTLY")
        and (c.get("lost") or c.get("duplicates") or c.get("inversions") or c.get("concurrent"))
    ]
    if bad:
        print(
            f"CHECK FAILED for {bad}: ordered runs must show no loss, duplicates, inversions or concurrent keys",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
