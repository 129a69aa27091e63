"""Kafka side by side (issue 18): lite_push, pyrallel-consumer and a serial
confluent-kafka loop on one broker, the same messages, in one run.

    .venv/bin/python benchmarks/bench_kafka.py                              # io5 and io1, --repeat 3
    .venv/bin/python benchmarks/bench_kafka.py --workloads io5 --repeat 1
    .venv/bin/python benchmarks/bench_kafka.py --consumers pyrallel,serial  # without lite_push
    .venv/bin/python benchmarks/bench_kafka.py --lanes 256 --executor uvloop --pyrallel-python /path/to/python3.12

The broker is librdkafka's mock cluster (``MockKafkaCluster``, one broker,
127.0.0.1, stopped by its PID at the end).  Per workload (``workloads.py``;
keys and costs per ``seq`` from ``redraw.draw``, the generator's exactly) one
topic of the workload's partition count is created and filled once by a
plain ``confluent_kafka.Producer``: key = the message key (UTF-8), value =
``seq`` (8 bytes big endian) padded to ``body_size``, partition =
``queue_of(key, partitions)``, the harness's (Java's hash, floorMod) -- not
Kafka's default partitioner.  Then ``--repeat`` rounds; in each, every
consumer reads the whole topic from the earliest offset with a group of its
own, one consumer at a time, the order rotated each round (round 1 A B C,
round 2 B C A, ...).  The consumers (``kafka_peers.py``):

* ``lite_push``: its Kafka source, KEY_ORDERLY, ``--lanes`` lanes (256) on
  the asyncio executor (``--executor uvloop``), the harness's ``async def``
  listener (``await asyncio.sleep(cost)``);
* ``pyrallel``: pyrallel-consumer 1.0.0, ``key_hash`` ordering, ``async``
  execution, an ``async def`` worker awaiting the same sleep, its defaults
  otherwise (``max_in_flight`` 1000; ``--pyrallel-max-in-flight``), in a
  subprocess with a venv of its own (``benchmarks/out/peers/pyrallel-venv``,
  made from ``peers/pyrallel.requirements.txt`` with Python 3.12 when
  missing; ``peers/pyrallel_runner.py``, ``bench_peers.py``'s runner);
* ``serial``: one ``confluent_kafka.Consumer``, ``poll`` one message,
  ``time.sleep(cost)``, ``store_offsets``, next; auto commit, a final commit.

A run is timed from just before the consumer's Kafka client is made (so
connecting and joining the group count, alike for all three) to the end of
its last handler call, as the harness times to the last listener end;
"first call ms" is when its first handler call started, "msg/s after first
call" the rate from then on.  Every run
is checked: ``lost`` (a ``seq`` never handled), ``duplicates`` (calls beyond
the first per ``seq``), ``order violations`` (per key, the first deliveries
in order of start whose ``seq`` is below the one before: a key's messages are
in one partition in ``seq`` order), ``overlaps`` (per key, calls that start
before an earlier call of that key ended).  The report gives the medians of
the rounds, each consumer's share of the hot-key bound
(``partition.hot_key_rate``: N / the hottest key's total cost) and the
ratios between consumers of this one run; ``--json`` keeps every run.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import logging
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from kafka_peers import Run, produce, pyrallel_python, run_lite_push, run_pyrallel, run_serial
from partition import hot_key_rate
from redraw import draw
from workloads import get_workload

CONSUMERS = ("lite_push", "pyrallel", "serial")


@dataclass(frozen=True)
class Check:
    """What one run's handler calls say about delivery."""

    lost: int
    duplicates: int
    order_violations: int
    overlaps: int

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicates or self.order_violations or self.overlaps)


def check(keys: Sequence[str], seqs: Sequence[int], starts: Sequence[int], ends: Sequence[int]) -> Check:
    """Check the calls ``(seqs[i], starts[i], ends[i])`` of a run over the
    messages ``0 .. len(keys)-1`` (``keys[seq]``: its key).  See the module
    docstring for what each count means; a ``seq`` out of range is no
    delivery of any message (it is ignored)."""
    total = len(keys)
    calls_of: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    handled = bytearray(total)
    duplicates = 0
    for seq, start, end in zip(seqs, starts, ends, strict=True):
        if not 0 <= seq < total:
            continue
        if handled[seq]:
            duplicates += 1
        handled[seq] = 1
        calls_of[keys[seq]].append((start, end, seq))
    order = overlaps = 0
    for calls in calls_of.values():
        calls.sort()
        first_seen: set[int] = set()
        last_first = -1
        latest_end = None
        for start, end, seq in calls:
            if latest_end is not None and start < latest_end:
                overlaps += 1
            latest_end = end if latest_end is None else max(latest_end, end)
            if seq in first_seen:
                continue
            first_seen.add(seq)
            if seq < last_first:
                order += 1
            last_first = seq
    return Check(total - sum(handled), duplicates, order, overlaps)


def measure(run: Run, keys: Sequence[str], hot_rate: float) -> dict[str, object]:
    """A run's figures: msg/s to the end of its last call, its share of the
    hot-key bound, when its first call started, CPU, and the check."""
    total = len(keys)
    result = check(keys, run.seq, run.start_ns, run.end_ns)
    seconds = (max(run.end_ns) - run.t0_ns) / 1e9 if len(run.end_ns) else float("nan")
    handled = total - result.lost  # == total unless the run failed (then its rate is of what it handled)
    rate = handled / seconds if len(run.end_ns) else 0.0
    return {
        "consumer": run.consumer,
        "seconds": seconds,
        "rate": rate,
        "of_hot_key_bound": rate / hot_rate,
        "first_call_ms": (min(run.start_ns) - run.t0_ns) / 1e6 if len(run.start_ns) else None,
        # the rate once started: from the first call's start to the last call's end
        "rate_after_first": handled / ((max(run.end_ns) - min(run.start_ns)) / 1e9) if len(run.end_ns) else 0.0,
        "calls": len(run.seq),
        "cpu_s": run.cpu_s,
        "lost": result.lost,
        "duplicates": result.duplicates,
        "order_violations": result.order_violations,
        "overlaps": result.overlaps,
        "error": run.error,
        "config": run.config,
    }


def summarize(rows: list[dict[str, object]], hot_rate: float) -> dict[str, object]:
    """One consumer's rounds: median rate and first call, summed counts."""
    rates = [float(r["rate"]) for r in rows]  # type: ignore[arg-type]
    firsts = [float(r["first_call_ms"]) for r in rows if r["first_call_ms"] is not None]  # type: ignore[arg-type]
    rate = statistics.median(rates)
    return {
        "rate": rate,
        "rates": rates,
        "of_hot_key_bound": rate / hot_rate,
        "first_call_ms": statistics.median(firsts) if firsts else None,
        "rate_after_first": statistics.median(float(r["rate_after_first"]) for r in rows),  # type: ignore[arg-type]
        "cpu_s": statistics.median(float(r["cpu_s"]) for r in rows),  # type: ignore[arg-type]
        **{k: sum(int(r[k]) for r in rows) for k in ("lost", "order_violations", "overlaps", "duplicates")},  # type: ignore[call-overload]
        "errors": [r["error"] for r in rows if r["error"]],
        "runs": len(rows),
    }


def progress_line(row: dict[str, object]) -> str:
    """One run's figures on one line (stderr, while the benchmark runs)."""
    line = (
        f"{row['consumer']:9s} {row['rate']:>9,.0f} msg/s ({row['of_hot_key_bound']:.0%} of hot-key bound), "
        f"first call {row['first_call_ms'] or 0:.0f} ms, CPU {row['cpu_s']:.1f} s, lost {row['lost']} "
        f"dup {row['duplicates']} order {row['order_violations']} overlap {row['overlaps']}"
    )
    return line + (f"  ERROR {row['error']}" if row["error"] else "")


def source_digest() -> str:
    """The first 12 hex digits of the SHA-256 over lite_push's Kafka source
    files (it may be uncommitted while it is written): which code ran."""
    h = hashlib.sha256()
    for path in sorted((HERE.parent / "lite_push" / "sources" / "kafka").glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def rounds_order(consumers: Sequence[str], rnd: int) -> list[str]:
    """The consumers in round ``rnd``'s order: rotated by ``rnd``."""
    k = rnd % len(consumers)
    return list(consumers[k:]) + list(consumers[:k])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="io5,io1", help="comma-separated (default io5,io1)")
    parser.add_argument("--consumers", default=",".join(CONSUMERS), help=f"subset of {','.join(CONSUMERS)}")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the report gives medians (default 3)")
    parser.add_argument("--lanes", type=int, default=256, help="lite_push lanes (default 256)")
    parser.add_argument("--executor", default="uvloop", choices=["uvloop", "asyncio"], help="lite_push's loop")
    parser.add_argument("--pyrallel-python", help="a Python 3.12 to make the pyrallel venv with")
    parser.add_argument(
        "--pyrallel-max-in-flight", type=int, default=1000, help="ExecutionConfig.max_in_flight (default 1000, its own)"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run before it is given up")
    parser.add_argument(
        "--log-level", default="ERROR", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="logging on stderr"
    )
    parser.add_argument("--json", type=Path, help="write every run here (default benchmarks/out/kafka/<time>.json)")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    consumers = [c.strip() for c in args.consumers.split(",") if c.strip()]
    unknown = set(consumers) - set(CONSUMERS)
    if unknown or not consumers or args.repeat < 1:
        raise SystemExit(f"--consumers must name some of {CONSUMERS} (got {sorted(unknown)}); --repeat >= 1")
    work_dir = HERE / "out" / "kafka"
    work_dir.mkdir(parents=True, exist_ok=True)
    pyrallel_exe = pyrallel_python(args.pyrallel_python) if "pyrallel" in consumers else None
    if "lite_push" in consumers:
        try:
            import lite_push.sources.kafka as lp_kafka

            lp_kafka.KafkaBroker  # noqa: B018 - fail here, not in the first round
        except (ImportError, AttributeError) as exc:
            msg = f"lite_push's Kafka source does not import ({exc}); leave it out with --consumers"
            raise SystemExit(msg) from exc

    from lite_push.sources.kafka.mock_cluster import MockKafkaCluster

    stamp = time.strftime("%Y%m%d-%H%M%S")
    out: dict[str, object] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "loadavg_at_start": os.getloadavg(),
        "lite_push_kafka_source_sha256": source_digest(),
        "workloads": {},
    }
    print(
        f"load average {os.getloadavg()[0]:.2f}; lite_push Kafka source {out['lite_push_kafka_source_sha256']}",
        file=sys.stderr,
    )
    with MockKafkaCluster(brokers=1) as cluster:
        print(f"mock cluster pid {cluster.pid} on {cluster.bootstrap}", file=sys.stderr)
        for name in [w.strip() for w in args.workloads.split(",") if w.strip()]:
            workload = get_workload(name)
            keys, costs = draw(workload)
            hot_rate = hot_key_rate(keys, costs)
            topic = f"bench-{name}-{stamp}"
            cluster.create_topic(topic, workload.queues)
            secs = produce(cluster.bootstrap, topic, keys, workload.queues, workload.body_size)
            print(
                f"{name}: {len(keys):,} messages to {topic} ({workload.queues} partitions) in {secs:.2f}s; "
                f"hot-key bound {hot_rate:,.0f} msg/s",
                file=sys.stderr,
            )
            runs: dict[str, list[dict[str, object]]] = {c: [] for c in consumers}
            for rnd in range(args.repeat):
                for consumer in rounds_order(consumers, rnd):
                    group = f"{consumer}-{name}-{stamp}-{rnd}"
                    gc.collect()
                    if consumer == "serial":
                        run = run_serial(cluster.bootstrap, topic, group, costs, args.timeout)
                    elif consumer == "lite_push":
                        run = run_lite_push(
                            cluster.bootstrap,
                            topic,
                            group,
                            costs,
                            args.timeout,
                            args.lanes,
                            args.executor,
                            cluster.create_topic,
                        )
                    else:
                        assert pyrallel_exe is not None
                        run = run_pyrallel(
                            pyrallel_exe,
                            cluster.bootstrap,
                            topic,
                            group,
                            costs,
                            args.timeout,
                            work_dir,
                            args.pyrallel_max_in_flight,
                        )
                    row = measure(run, keys, hot_rate)
                    row["round"] = rnd
                    runs[consumer].append(row)
                    print(f"  round {rnd + 1} {progress_line(row)}", file=sys.stderr)
            out["workloads"][name] = {  # type: ignore[index]
                "messages": len(keys),
                "partitions": workload.queues,
                "hot_key_rate": hot_rate,
                "summary": {c: summarize(rows, hot_rate) for c, rows in runs.items()},
                "runs": runs,
            }
    path = args.json or work_dir / f"bench_kafka-{stamp}.json"
    path.write_text(json.dumps(out, indent=1, default=str))
    print(report(out["workloads"], args.repeat))  # type: ignore[arg-type]
    print(f"\nevery run: {path}", file=sys.stderr)
    return 0


def _ratios(name: str, runs: dict[str, list[dict[str, object]]]) -> list[str]:
    """Each pair of consumers: the ratio of their median rates, and the
    median of the ratios round by round (the two ran back to back)."""
    out = []
    pairs = [("lite_push", "pyrallel"), ("lite_push", "serial"), ("pyrallel", "serial")]
    for a, b in pairs:
        if a not in runs or b not in runs:
            continue
        ra = [float(r["rate"]) for r in runs[a]]  # type: ignore[arg-type]
        rb = [float(r["rate"]) for r in runs[b]]  # type: ignore[arg-type]
        if min(rb) <= 0:
            continue
        per_round = ", ".join(f"{x / y:.2f}" for x, y in zip(ra, rb, strict=True))
        out.append(
            f"{name}: {a} / {b} = {statistics.median(ra) / statistics.median(rb):.2f}x "
            f"(medians; round by round {per_round})"
        )
    return out


def report(workloads: dict[str, dict[str, object]], repeat: int) -> str:
    """The markdown table and the ratios of this run."""
    lines = [
        "| consumer | workload | msg/s (median) | runs msg/s | % of hot-key bound | first call ms "
        "| msg/s after first call | CPU s | lost | order violations | overlaps | duplicates |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios: list[str] = []
    errors: list[str] = []
    for name, data in workloads.items():
        summary: dict[str, dict[str, object]] = data["summary"]  # type: ignore[assignment]
        for consumer, s in summary.items():
            rates = ", ".join(f"{r:,.0f}" for r in s["rates"])  # type: ignore[attr-defined]
            first = s["first_call_ms"]
            if first is None:
                lines.append(f"| {consumer} | {name} | errors: {s['errors']} |")
                continue
            cells = [
                consumer,
                name,
                f"{s['rate']:,.0f}",
                rates,
                f"{s['of_hot_key_bound']:.0%}",
                f"{first:,.0f}",
                f"{s['rate_after_first']:,.0f}",
                f"{s['cpu_s']:.1f}",
                *(str(s[k]) for k in ("lost", "order_violations", "overlaps", "duplicates")),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        ratios += _ratios(name, data["runs"])  # type: ignore[arg-type]
        errors += [f"{consumer} on {name}: {e}" for consumer, s in summary.items() for e in s["errors"]]  # type: ignore[attr-defined]
    counts = f"lost, order violations, overlaps and duplicates: summed over the {repeat} run(s) of a row"
    return "\n".join(lines + ["", counts, "", *ratios] + (["", "ERRORS:", *errors] if errors else []))


if __name__ == "__main__":
    sys.exit(main())
