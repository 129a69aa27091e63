"""Issue 40's grid in one command: lite_push's command line against a lean
hand-written loop and the floor.

    .venv/bin/python benchmarks/bench_hotpath.py --markdown          # kpipe-1ms, kpipe-10ms, 5 rounds
    .venv/bin/python benchmarks/bench_hotpath.py --shapes io1,io5,kpipe-100ms
    .venv/bin/python benchmarks/bench_hotpath.py --messages kpipe-1ms=400000 --repeat 7

The contenders (:data:`CONTENDERS`), each a peer of ``bench_peers.py``:
``lite-push consume`` on Kafka and on Redis, with its defaults and with
``--lanes 1024`` (``peers/lite_push_cli*.py``), the lean per-key loop on
aiokafka (``peers/aiokafka_runner.py``'s default ``mode=lean``) and the
floor (``peers/floor_runner.py``: a task per key awaiting each message's
cost, no source).  This script is ``bench_peers.py`` with those peers: it
calls its ``main`` with ``--peers``, ``--shapes``, ``--repeat`` (default
5), ``--messages``, ``--cap``, ``--timeout`` and any ``--set`` and
``--python`` given, so every shape's messages are stored once, the
contenders run one at a time in an order rotated each round
(``bench_kafka.rounds_order``), and each run is checked (``peers/measure.py``).
Then it reads the JSON ``bench_peers.py`` wrote (``--json``; it adds the
tables and the load average before and after under ``"hotpath"``) and
prints a table per shape (:func:`tables`, :func:`render`):

* msg/s: the median over the rounds of ``measure.py``'s rate (distinct
  messages over first call start to last call end);
* CPU us/msg: the median over the rounds of the runner process's CPU
  (``t0`` to the last message, start-up included) over the messages it
  handled; the broker's own processes (mock cluster, redis-server) are not
  in it;
* % of bound: the median rate over the shape's hot-key bound;
* x loop: the median over the rounds of the run's msg/s over the lean
  loop's in the same round; CPU x floor: likewise, CPU per message over the
  floor's;
* lost, duplicates, order violations, overlaps: summed over the rounds;
  capped: capped runs of all.

Under each table, lite_push's Redis/Kafka ratio (the median per-round ratio
of msg/s, defaults and ``--lanes 1024``).  Message counts: shapes.py's,
except ``kpipe-1ms`` at 150,000 (:data:`MESSAGES`, issue 40's count);
``--messages`` overrides (``N`` or ``SHAPE=N,...``).  A round at the
defaults' 16 lanes can outlast ``--cap`` (20 s) on the slower shapes: that
run is capped and rated over what it handled.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import bench_peers
from peers.shapes import SHAPES

#: The contenders, in the table's order, with what each row is.
CONTENDERS: dict[str, str] = {
    "lite_push_cli_kafka": "lite-push consume, Kafka, defaults",
    "lite_push_cli_kafka@1024": "lite-push consume, Kafka, --lanes 1024",
    "lite_push_cli_redis": "lite-push consume, Redis, defaults",
    "lite_push_cli_redis@1024": "lite-push consume, Redis, --lanes 1024",
    "aiokafka": "lean hand-written loop (aiokafka)",
    "floor": "floor (no source)",
}
#: The row every msg/s is divided by, and the one every CPU per message is.
LOOP, FLOOR = "aiokafka", "floor"
#: lite_push's Redis rows and the Kafka rows they are read against.
REDIS_OVER_KAFKA = {
    "lite_push_cli_redis": "lite_push_cli_kafka",
    "lite_push_cli_redis@1024": "lite_push_cli_kafka@1024",
}
#: Messages per shape where shapes.py's default is not used.
MESSAGES = {"kpipe-1ms": 150_000}
DEFAULT_SHAPES = ("kpipe-1ms", "kpipe-10ms")
COUNTS = ("lost", "duplicates", "order_violations", "overlaps")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes",
        default=",".join(DEFAULT_SHAPES),
        help=f"comma-separated, of {', '.join(SHAPES)} (default {','.join(DEFAULT_SHAPES)})",
    )
    parser.add_argument("--repeat", type=int, default=5, help="rounds; the tables give medians (default 5)")
    parser.add_argument(
        "--messages",
        type=bench_peers._messages,
        default={},
        help="N for every shape, or SHAPE=N[,SHAPE=N...] (default: kpipe-1ms 150,000, shapes.py's otherwise)",
    )
    parser.add_argument("--cap", type=float, default=20.0, help="seconds after which a run stops (default 20)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before a run is an error (default 120)")
    parser.add_argument("--set", action="append", default=[], metavar="PEER:KEY=VALUE", help="a contender's setting")
    parser.add_argument("--python", action="append", default=[], metavar="PEER=PATH", help="run PEER with PATH")
    parser.add_argument("--json", type=Path, help="every run (default benchmarks/out/peers/bench_hotpath-<time>.json)")
    parser.add_argument("--markdown", action="store_true", help="print the tables as markdown, for RESULTS.md")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        raise SystemExit("--repeat >= 1")
    return args


def _messages(shapes: list[str], given: dict[str, int]) -> str:
    """bench_peers' ``--messages``: :data:`MESSAGES` under what was given."""
    counts = {s: n for s, n in MESSAGES.items() if s in shapes}
    if "*" in given:
        counts = dict.fromkeys(shapes, given["*"])
    counts.update({s: n for s, n in given.items() if s != "*"})
    return ",".join(f"{s}={n}" for s, n in counts.items())


def _cpu_us(row: dict[str, Any]) -> float | None:
    if row.get("cpu_s") is None or not row.get("handled"):
        return None
    return float(row["cpu_s"]) / row["handled"] * 1e6


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _per_round(rows: list[dict[str, Any]], base: list[dict[str, Any]], value: Any) -> float | None:
    """The median over the rounds both ran of ``value(row) / value(base's row)``."""
    of_base = {r["round"]: value(r) for r in base if not r.get("error")}
    ratios = []
    for r in rows:
        mine, theirs = value(r), of_base.get(r["round"])
        if not r.get("error") and mine is not None and theirs:
            ratios.append(mine / theirs)
    return statistics.median(ratios) if ratios else None


def tables(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per shape: a row per contender (:data:`CONTENDERS` order) and the
    Redis/Kafka ratios, from ``bench_peers.py``'s JSON."""
    out = {}
    for shape, sd in data["shapes"].items():
        runs: dict[str, list[dict[str, Any]]] = sd["runs"]
        hot = sd["hot_key_rate"]
        rows = []
        for name, what in CONTENDERS.items():
            if name not in runs:
                reason = data.get("not_run", {}).get(name, "not selected")
                rows.append({"contender": name, "what": what, "not_run": reason})
                continue
            mine = runs[name]
            good = [r for r in mine if not r.get("error")]
            rate = _median([r["rate"] for r in good])
            row: dict[str, Any] = {
                "contender": name,
                "what": what,
                "rounds": len(mine),
                "rate": rate,
                "rates": [r["rate"] for r in mine],
                "cpu_us": _median([_cpu_us(r) for r in good]),
                "of_bound": rate / hot if rate is not None else None,
                "x_loop": _per_round(mine, runs.get(LOOP, []), lambda r: r.get("rate")),
                "cpu_x_floor": _per_round(mine, runs.get(FLOOR, []), _cpu_us),
                "capped": sum(1 for r in mine if r.get("capped")),
                "errors": [r["error"] for r in mine if r.get("error")],
            }
            for key in COUNTS:
                values = [r.get(key) for r in mine]
                row[key] = None if any(v is None for v in values) else sum(values)
            rows.append(row)
        ratios = {
            redis: _per_round(runs[redis], runs[kafka], lambda r: r.get("rate"))
            for redis, kafka in REDIS_OVER_KAFKA.items()
            if redis in runs and kafka in runs
        }
        out[shape] = {"messages": sd["messages"], "hot_key_rate": hot, "rows": rows, "redis_over_kafka": ratios}
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


HEADER = (
    "contender",
    "msg/s",
    "CPU us/msg",
    "% of bound",
    "x loop",
    "CPU x floor",
    "lost",
    "duplicates",
    "order violations",
    "overlaps",
    "capped",
)

NOTES = """\
msg/s: median over the rounds of distinct messages over first call start to last call end. CPU us/msg: median \
over the rounds of the runner process's CPU (start-up included, the broker's processes not) over the messages it \
handled. % of bound: median msg/s over the shape's hot-key bound. x loop: median over the rounds of msg/s over the \
lean aiokafka loop's in the same round; CPU x floor: median over the rounds of CPU per message over the floor's. \
Counts are summed over the rounds ('-': the committed offsets could not be read); capped: runs stopped at --cap, \
rated over what they handled."""


def render(shape_tables: dict[str, dict[str, Any]], markdown: bool, repeat: int) -> str:
    """The tables as text, or as markdown for RESULTS.md."""
    out: list[str] = []
    for shape, t in shape_tables.items():
        out.append(
            f"{'**' if markdown else ''}{shape}{'**' if markdown else ''}: {t['messages']:,} messages, "
            f"hot-key bound {t['hot_key_rate']:,.0f} msg/s, {repeat} rounds"
        )
        lines = []
        for row in t["rows"]:
            if "not_run" in row:
                lines.append([row["contender"], f"not run: {row['not_run']}"] + [""] * (len(HEADER) - 2))
                continue
            lines.append(
                [
                    row["contender"],
                    _fmt(row["rate"], ",.0f"),
                    _fmt(row["cpu_us"], ".2f"),
                    _fmt(row["of_bound"] and 100 * row["of_bound"], ".1f"),
                    _fmt(row["x_loop"], ".2f"),
                    _fmt(row["cpu_x_floor"], ".2f"),
                    *(_fmt(row[k], "d") for k in COUNTS),
                    f"{row['capped']}/{row['rounds']}",
                ]
            )
        if markdown:
            out.append("")
            out.append("| " + " | ".join(HEADER) + " |")
            out.append("|---|" + "---:|" * (len(HEADER) - 1))
            out += ["| " + " | ".join(cells[:2] if cells[1].startswith("not run") else cells) + " |" for cells in lines]
        else:
            widths = [max(len(str(c)) for c in col) for col in zip(HEADER, *lines, strict=False)]
            out.append("  ".join(h.ljust(w) for h, w in zip(HEADER, widths, strict=True)))
            out += ["  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip() for cells in lines]
        ratios = ", ".join(
            f"{redis.replace('lite_push_cli_redis', 'defaults').replace('defaults@', '--lanes ')} {_fmt(value, '.2f')}"
            for redis, value in t["redis_over_kafka"].items()
        )
        out += ["", f"lite_push Redis/Kafka (median per-round ratio of msg/s): {ratios or '-'}", ""]
        for row in t["rows"]:
            out += [f"- {row['contender']}: {e}" for e in row.get("errors", [])]
    out.append(NOTES)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown or not shapes:
        raise SystemExit(f"--shapes: unknown {unknown}; known: {', '.join(SHAPES)}")
    path = args.json or bench_peers.WORK / f"bench_hotpath-{time.strftime('%Y%m%d-%H%M%S')}.json"
    peers_argv = [
        "--peers",
        ",".join(CONTENDERS),
        "--shapes",
        ",".join(shapes),
        "--repeat",
        str(args.repeat),
        "--cap",
        f"{args.cap:g}",
        "--timeout",
        f"{args.timeout:g}",
        "--json",
        str(path),
    ]
    messages = _messages(shapes, args.messages)
    if messages:
        peers_argv += ["--messages", messages]
    for setting in args.set:
        peers_argv += ["--set", setting]
    for python in args.python:
        peers_argv += ["--python", python]
    load_before = os.getloadavg()
    status = bench_peers.main(peers_argv)
    load_after = os.getloadavg()
    data = json.loads(path.read_text())
    shape_tables = tables(data)
    data["hotpath"] = {
        "argv": peers_argv,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "tables": shape_tables,
    }
    path.write_text(json.dumps(data, indent=1, default=str))
    load = "load average (1, 5, 15 min): {:.2f} {:.2f} {:.2f} before, {:.2f} {:.2f} {:.2f} after".format(
        *load_before, *load_after
    )
    print(f"{load}; every run: {path}", file=sys.stderr)
    print(render(shape_tables, args.markdown, args.repeat))
    print(f"\n{load.capitalize()}; {os.cpu_count()} CPUs.")
    return status


if __name__ == "__main__":
    sys.exit(main())
