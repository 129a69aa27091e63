"""Throughput of two checkouts of lite_push on the same workloads, same run.

    .venv/bin/python benchmarks/bench_ab.py --base /work/wt-base                  # the 3 configurations, 5 pairs each
    .venv/bin/python benchmarks/bench_ab.py --base /work/wt-base --head . --repeat 9
    .venv/bin/python benchmarks/bench_ab.py --base /work/wt-base --configs sms-1m:KEY_ORDERLY:256:uvloop:3
    .venv/bin/python benchmarks/bench_ab.py --base /work/wt-base --head /work/wt-base --repeat 1 \\
        --configs noop-small:KEY_ORDERLY:16:thread,sms-small:KEY_ORDERLY:64:thread   # A/A: a few minutes

``--base`` is a checkout of the code before a change (e.g. ``git worktree add
--detach /work/wt-base <commit>`` then ``scripts/bootstrap.sh --bench`` in it),
``--head`` the checkout after it (default: the one this script is in).  Each
side runs with its own checkout's interpreter and harness,
``<tree>/.venv/bin/python <tree>/benchmarks/harness.py``, so each measures
its own code (and its own compiled kernels); both get the same workload
directory and the same arguments, and only options every harness has had
since commit ``4f25972`` (``--workload --mode --lanes --log --executor
--progress``); each tree's harness is checked for them before any run.

Each workload is generated once with Spark (``gen_load.py``, as
``bench_metrics.py`` does), or reused from ``OUT/<workload>/workload`` when
its ``_workload.json`` is the named workload's.  For each configuration
(``WORKLOAD:MODE:LANES:EXECUTOR``, optionally ``:REPEAT`` for that one alone)
base and head run ``--repeat`` times each, alternating in ABBA order
(base-head, head-base, ...), each run its own process, so a drift in the
machine's speed favours neither side.  The table shows the median msg/s of
each side, head/base of the medians, the median of the per-pair ratios, the
process's CPU time per message (median; a noisy neighbour disturbs it less
than the wall clock) and every run's rate; the header names each tree's
commit.  The report goes to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the benchmark modules import each other flat (``import gen_load``)
    sys.path.insert(0, str(HERE))

#: The refactor's three configurations (``WORKLOAD:MODE:LANES:EXECUTOR``).
DEFAULT_CONFIGS = "noop:KEY_ORDERLY:16:thread,sms:KEY_ORDERLY:64:thread,sms-1m:KEY_ORDERLY:256:uvloop"
MODES = ("KEY_ORDERLY", "CONCURRENTLY", "QUEUE_ORDERLY")
EXECUTORS = ("thread", "asyncio", "uvloop")
#: The harness options this script passes: every harness since commit 4f25972 has them.
HARNESS_OPTIONS = ("--workload", "--mode", "--lanes", "--log", "--executor", "--progress")
#: The keys of the harness's JSON line this script reads.
RESULT_KEYS = ("rate", "cpu_seconds", "messages")

#: What a tree's interpreter reports about the lite_push it imports.
_PROBE = (
    "import json, sys, lite_push as lp; "
    "print(json.dumps({'file': lp.__file__, 'python': sys.version.split()[0], "
    "'impls': {n: str(getattr(lp, n)) for n in sorted(dir(lp)) if n.endswith('_IMPL')}}))"
)


@dataclass(frozen=True)
class Config:
    """One measured configuration; ``repeat`` None means ``--repeat``."""

    workload: str
    mode: str
    lanes: int
    executor: str
    repeat: int | None = None

    @property
    def label(self) -> str:
        return f"{self.workload} {self.mode}-{self.lanes} {self.executor}"


@dataclass(frozen=True)
class Tree:
    """A checkout: its interpreter, harness and what they import."""

    name: str
    root: Path
    commit: str
    #: ``git status``: tracked files changed since ``commit``, and untracked files
    modified: int
    untracked: int
    python: str
    impls: dict[str, str]

    @property
    def interpreter(self) -> Path:
        return self.root / ".venv" / "bin" / "python"

    @property
    def harness(self) -> Path:
        return self.root / "benchmarks" / "harness.py"

    def describe(self) -> str:
        state = (
            f"uncommitted: {self.modified} changed, {self.untracked} untracked file(s)"
            if self.modified or self.untracked
            else "clean"
        )
        impls = ", ".join(f"{k}={v}" for k, v in self.impls.items()) or "no *_IMPL"
        return f"`{self.root}` at `{self.commit}` ({state}); Python {self.python}; {impls}"


def parse_configs(text: str) -> list[Config]:
    """``"WORKLOAD:MODE:LANES:EXECUTOR[:REPEAT],..."`` -> configurations,
    with clear errors."""
    from workloads import WORKLOADS

    configs = []
    for part in text.split(","):
        fields = part.strip().split(":")
        ok = len(fields) in (4, 5)
        if ok:
            workload, mode, lanes, executor = fields[:4]
            repeat = fields[4] if len(fields) == 5 else "1"
            ok = (
                workload in WORKLOADS
                and mode in MODES
                and lanes.isdigit()
                and int(lanes) >= 1
                and executor in EXECUTORS
                and not (mode == "QUEUE_ORDERLY" and executor != "thread")
                and repeat.isdigit()
                and int(repeat) >= 1
            )
        if not ok:
            raise SystemExit(
                f"--configs: bad entry {part!r}; expected WORKLOAD:MODE:LANES:EXECUTOR[:REPEAT] with WORKLOAD one of "
                f"{', '.join(WORKLOADS)}; MODE one of {', '.join(MODES)}; EXECUTOR one of {', '.join(EXECUTORS)} "
                "(thread for QUEUE_ORDERLY); LANES and REPEAT >= 1"
            )
        configs.append(Config(workload, mode, int(lanes), executor, int(fields[4]) if len(fields) == 5 else None))
    return configs


def _git(root: Path, *args: str) -> str:
    # --no-optional-locks: `status` must not refresh the index of a tree someone is editing
    return subprocess.run(
        ["git", "--no-optional-locks", "-C", str(root), *args], check=True, stdout=subprocess.PIPE, text=True
    ).stdout.strip()


def probe_tree(name: str, root: Path) -> Tree:
    """Check that ``root`` is a bootstrapped checkout whose interpreter
    imports its own lite_push and whose harness has :data:`HARNESS_OPTIONS`."""
    root = root.resolve()
    python = root / ".venv" / "bin" / "python"
    harness = root / "benchmarks" / "harness.py"
    for path in (python, harness):
        if not path.exists():
            raise SystemExit(f"--{name}: {path} is missing (run scripts/bootstrap.sh --bench in {root})")
    info = json.loads(
        subprocess.run([str(python), "-c", _PROBE], check=True, cwd=root, stdout=subprocess.PIPE, text=True).stdout
    )
    package = Path(info["file"]).resolve()
    if not package.is_relative_to(root):
        raise SystemExit(f"--{name}: {python} imports lite_push from {package}, not from {root}")
    usage = subprocess.run(
        [str(python), str(harness), "--help"], check=True, cwd=root, stdout=subprocess.PIPE, text=True
    ).stdout
    missing = [opt for opt in HARNESS_OPTIONS if opt not in usage]
    if missing:
        raise SystemExit(f"--{name}: {harness} has no {', '.join(missing)}")
    status = _git(root, "status", "--porcelain").splitlines()
    untracked = sum(1 for line in status if line.startswith("??"))
    commit = _git(root, "rev-parse", "--short", "HEAD")
    return Tree(name, root, commit, len(status) - untracked, untracked, info["python"], info["impls"])


def workload_dirs(names: list[str], out: Path, regenerate: bool, master: str) -> dict[str, Path]:
    """``OUT/<name>/workload`` per named workload: reused if it holds that
    workload (its ``_workload.json`` matches), else generated with Spark (one
    session for all of them)."""
    import gen_load
    from workloads import get_workload

    dirs = {name: out / name / "workload" for name in dict.fromkeys(names)}
    todo = []
    for name, path in dirs.items():
        meta = path / gen_load.WORKLOAD_JSON
        if (
            not regenerate
            and meta.exists()
            and any(path.glob("*.parquet"))
            and json.loads(meta.read_text()) == get_workload(name).to_dict()
        ):
            print(f"{name}: reusing {path}", file=sys.stderr)
        else:
            todo.append(name)
    if todo:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        spark = gen_load.spark_session(master=master)
        try:
            for name in todo:
                t0 = time.perf_counter()
                gen_load.generate(spark, get_workload(name), dirs[name])
                print(f"{name}: generated with Spark in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        finally:
            # the JVM keeps working after a job: stop it before the first run
            spark.stop()
    return dirs


def run_side(
    tree: Tree, config: Config, workload: Path, log_dir: Path, progress: bool, extra: list[str] | None = None
) -> dict[str, float]:
    """One harness run of ``tree`` in its own process: the JSON line's
    :data:`RESULT_KEYS` and ``wall`` (the process's seconds, load included)."""
    cmd = [
        str(tree.interpreter),
        str(tree.harness),
        "--workload",
        str(workload),
        "--mode",
        config.mode,
        "--lanes",
        str(config.lanes),
        "--log",
        str(log_dir),
        "--executor",
        config.executor,
    ]
    if progress:
        cmd.append("--progress")
    cmd += extra or []
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=True, cwd=tree.root, stdout=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if "detected_seconds" in result:
        # a harness since issue 17 times a run to the end of its last listener
        # call; older ones to when their progress loop (10 ms steps) saw it:
        # both sides are compared the older way
        result["rate"] = result["messages"] / result["detected_seconds"]
    return {**{k: float(result[k]) for k in RESULT_KEYS}, "wall": wall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="checkout before the change (its own .venv)")
    parser.add_argument(
        "--head", type=Path, default=HERE.parent, help=f"checkout after the change (default {HERE.parent})"
    )
    parser.add_argument("--repeat", type=int, default=5, help="base/head pairs per configuration (default 5)")
    parser.add_argument(
        "--head-args",
        default="",
        help="more harness options for the head side only, e.g. --head-args=--tracing with --base . --head . "
        "(the head tree's harness must have them)",
    )
    parser.add_argument(
        "--configs",
        default=DEFAULT_CONFIGS,
        help=f"WORKLOAD:MODE:LANES:EXECUTOR[:REPEAT] list; REPEAT overrides --repeat (default {DEFAULT_CONFIGS})",
    )
    parser.add_argument("--out", type=Path, default=HERE / "out", help="where workloads and logs go")
    parser.add_argument("--regenerate", action="store_true", help="generate the workloads even if present")
    parser.add_argument("--master", default="local[*]", help="Spark master for generation")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=sys.stderr.isatty(),
        help="the harness's progress bar on stderr (default: if stderr is a terminal)",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    configs = parse_configs(args.configs)
    base = probe_tree("base", args.base)
    head = probe_tree("head", args.head)
    for tree in (base, head):
        print(f"{tree.name}: {tree.describe()}", file=sys.stderr)
    out = args.out.resolve()
    dirs = workload_dirs([c.workload for c in configs], out, args.regenerate, args.master)

    lines = [
        "| workload | mode | lanes | executor | pairs | base msg/s | head msg/s | head / base (medians) "
        + "| head / base (pairs, median) | CPU µs/msg base | CPU µs/msg head | runs msg/s (base; head) |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    walls = []
    t_start = time.perf_counter()
    for config in configs:
        repeat = config.repeat or args.repeat
        sides: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
        for i in range(repeat):
            # ABBA: a drift in the machine's speed favours neither side
            for tree in (base, head) if i % 2 == 0 else (head, base):
                log_dir = out / config.workload / "logs-ab" / tree.name
                extra = args.head_args.split() if tree.name == "head" and args.head_args else None
                sides[tree.name].append(run_side(tree, config, dirs[config.workload], log_dir, args.progress, extra))
            b, h = sides["base"][-1], sides["head"][-1]
            print(
                f"{config.label} pair {i + 1}/{repeat}: base {b['rate']:,.0f} msg/s ({b['wall']:.0f} s), "
                f"head {h['rate']:,.0f} msg/s ({h['wall']:.0f} s), head/base {h['rate'] / b['rate']:.1%}",
                file=sys.stderr,
            )
        m_base, m_head = (statistics.median(r["rate"] for r in sides[s]) for s in ("base", "head"))
        paired = statistics.median(h["rate"] / b["rate"] for b, h in zip(sides["base"], sides["head"], strict=True))
        cpu_base, cpu_head = (
            statistics.median(r["cpu_seconds"] / r["messages"] * 1e6 for r in sides[s]) for s in ("base", "head")
        )
        runs = "; ".join(", ".join(f"{r['rate']:,.0f}" for r in sides[s]) for s in ("base", "head"))
        lines.append(
            f"| {config.workload} | {config.mode} | {config.lanes} | {config.executor} | {repeat} | {m_base:,.0f} "
            f"| {m_head:,.0f} | {m_head / m_base:.1%} | {paired:.1%} | {cpu_base:.2f} | {cpu_head:.2f} | {runs} |"
        )
        walls.append(
            f"{config.label}: {statistics.median(r['wall'] for r in sides['base'] + sides['head']):.0f} s per run"
        )
    print(f"- base: {base.describe()}")
    print(f"- head: {head.describe()}")
    print()
    print("\n".join(lines))
    print()
    print(
        f"Wall time (process, workload load included, median): {'; '.join(walls)}; "
        f"all runs {time.perf_counter() - t_start:.0f} s."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
