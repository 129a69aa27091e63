"""One key's listener call hangs: how long do the other keys wait (issue 29,
point 5)?  Lane stealing (``steal_after``) off and on, in the same run.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_hung_key.py --repeat 3                  # ~3 min
    PYTHONPATH=. .venv/bin/python benchmarks/bench_hung_key.py --executor asyncio --repeat 3
    PYTHONPATH=. .venv/bin/python benchmarks/bench_hung_key.py --steal-after 1.0           # plus a fixed setting
    PYTHONPATH=. .venv/bin/python benchmarks/bench_hung_key.py --lanes 2 --messages 200 --cap 3 --repeat 1  # smoke

The scenario (the issue's): the embedded broker (``EmbeddedBroker``), a
fresh topic of 4 queues, one consumer of a fresh group from the first
offset, ``KEY_ORDERLY``, ``lane_placement="load"`` (the default),
``commit_interval=0.2``, ``--lanes`` lanes of the ``--executor`` (thread by
default).  One message of key ``hung`` is sent; its listener call blocks
(on a ``threading.Event``, or an ``asyncio.Event`` for the asyncio
executor) until the end of the run: a downstream that stopped answering
for that account.  Once that call has started, ``--messages`` messages
(2,000) of ``--keys`` other keys (100: ``k0`` .. ``k99``, in turn) are sent
one ``send`` at a time; the listener sleeps ``--sleep`` seconds for each
of them (1 ms; ``asyncio.sleep`` for the asyncio executor).  The
consumer's ``batch_size`` is ``--batch-size`` (1: a call per message).

Measured: the seconds from the first of those sends to the end of the last
of their calls, capped at ``--cap`` (15 s), and how many of them had run by
then; how long the hung call had run at that moment; the consumer's
``stats()`` fields about moved keys where the consumer has them
(``steals``, ``stolen``, ``longest_call``: read with ``getattr``, shown as
``-`` when absent).  Then the hung call is released, every message must run
(60 s at most), the consumer shuts down, and the run is checked: every
message (the hung one included) ran exactly once, each key's messages ran
in the order they were sent, no key was in two calls at once, the group
committed every queue to its end, and the consumer logged no WARNING or
ERROR.  Any failure is printed as ``FAILED`` and the script exits 1.

Settings: ``before`` is ``steal_after=None`` (keys never move, the
behaviour before issue 29), ``after`` is ``steal_after="auto"`` (the
default), and ``--steal-after S`` adds ``fixed`` = ``S`` seconds.  For each
repetition, for each lane count, the settings run in turn, in reverse order
every other repetition (A B, B A, ...), each run in a fresh process (this
script with ``--one``), so a drift in the machine's speed favours none of
them.  The table: every run, the median per lane count and setting, and
after / before per lane count (of the medians, and the median of the
per-repetition ratios; with ``before`` capped, a bound).  Progress goes to
stderr, the table to stdout, every run's numbers to ``--json`` if given.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # this checkout's lite_push, whatever the venv's editable install says

TOPIC = "HUNG"
GROUP = "hung"
QUEUES = 4
HUNG = "hung"
#: The settings: name -> ``steal_after`` (``fixed`` takes ``--steal-after``).
SETTINGS: dict[str, float | str | None] = {"before": None, "after": "auto"}
#: The ``stats()`` fields about moved keys, read if the consumer has them.
STATS_FIELDS = ("steals", "stolen", "longest_call")
#: The 2 s target of the issue.
TARGET = 2.0


class Deliveries:
    """Every listener call of a run: how often each message ran, each key's
    messages in call order, keys in two calls at once, when each call ended."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: Counter[int] = Counter()
        self.order: defaultdict[str, list[int]] = defaultdict(list)
        self._running: set[str] = set()
        self.overlaps = 0
        #: seq -> ``time.monotonic()`` at the end of its first call.
        self.ended: dict[int, float] = {}
        self.others = 0  # messages of other keys ended (first calls)

    def begin(self, key: str, seq: int) -> None:
        with self._lock:
            if key in self._running:
                self.overlaps += 1
            self._running.add(key)
            self.calls[seq] += 1
            self.order[key].append(seq)

    def problems(self, total: int) -> list[str]:
        """What is wrong, for messages ``0 .. total - 1`` sent in that order
        (each key's in increasing seq): lost, run twice, run out of order,
        run while the key was in another call."""
        out = []
        missing = [s for s in range(total) if self.calls[s] == 0]
        dups = sum(n - 1 for n in self.calls.values() if n > 1)
        inversions = sum(1 for seqs in self.order.values() for a, b in zip(seqs, seqs[1:], strict=False) if b <= a)
        if missing:
            out.append(f"{len(missing)} message(s) never ran (first seqs {missing[:5]})")
        if dups:
            out.append(f"{dups} message(s) ran more than once")
        if inversions:
            out.append(f"{inversions} per-key order inversion(s)")
        if self.overlaps:
            out.append(f"{self.overlaps} call(s) of a key while another of its calls ran")
        return out

    def end(self, key: str, seq: int) -> None:
        now = time.monotonic()
        with self._lock:
            self._running.discard(key)
            if seq not in self.ended:
                self.ended[seq] = now
                if key != HUNG:
                    self.others += 1


def run_once(spec: dict[str, Any]) -> dict[str, Any]:
    """One run in this process (``--one``): the scenario of the module
    docstring with ``spec``'s lanes, executor, steal_after, messages, keys,
    sleep and cap; its numbers and the problems found."""
    import lite_push
    from lite_push import ConsumeMode, ConsumerConfig, LitePushConsumer
    from lite_push.sources import ConsumeFromWhere, EmbeddedBroker

    messages, keys, sleep, cap = spec["messages"], spec["keys"], spec["sleep"], spec["cap"]
    rec = Deliveries()
    hung_started = threading.Event()
    hung_at: list[float] = []
    releases: list[Callable[[], None]] = []
    problems: list[str] = []

    def seq_key(m: Any) -> tuple[int, str]:
        return int.from_bytes(m.body, "big"), m.keys

    def listener(msgs: list[Any]) -> None:
        for m in msgs:
            seq, key = seq_key(m)
            rec.begin(key, seq)
            if key == HUNG:
                release = threading.Event()
                releases.append(release.set)
                hung_at.append(time.monotonic())
                hung_started.set()
                release.wait(cap + 300)
            else:
                time.sleep(sleep)
            rec.end(key, seq)

    async def async_listener(msgs: list[Any]) -> None:
        for m in msgs:
            seq, key = seq_key(m)
            rec.begin(key, seq)
            if key == HUNG:
                release = asyncio.Event()
                releases.append(functools.partial(asyncio.get_running_loop().call_soon_threadsafe, release.set))
                hung_at.append(time.monotonic())
                hung_started.set()
                await release.wait()
            else:
                await asyncio.sleep(sleep)
            rec.end(key, seq)

    broker = EmbeddedBroker()
    broker.create_topic(TOPIC, queue_count=QUEUES)
    config = ConsumerConfig(
        group=GROUP,
        mode=ConsumeMode.KEY_ORDERLY,
        lanes=spec["lanes"],
        executor=spec["executor"],
        steal_after=spec["steal_after"],
        batch_size=spec.get("batch_size", 1),
        commit_interval=0.2,
    )
    consumer = LitePushConsumer(
        config,
        broker.pull_consumer(GROUP, consume_from=ConsumeFromWhere.FIRST_OFFSET),
        async_listener if spec["executor"] == "asyncio" else listener,
    )
    consumer.subscribe(TOPIC)
    consumer.start()
    out: dict[str, Any] = {**spec, "lite_push": str(Path(lite_push.__file__).parent)}
    try:
        broker.send(TOPIC, (0).to_bytes(8, "big"), keys=HUNG)
        if not hung_started.wait(30):
            raise RuntimeError("the hung key's call did not start within 30 s")
        t0 = time.monotonic()
        for i in range(messages):
            broker.send(TOPIC, (i + 1).to_bytes(8, "big"), keys=f"k{i % keys}")
        out["send_seconds"] = time.monotonic() - t0
        deadline = t0 + cap
        while rec.others < messages and time.monotonic() < deadline:
            time.sleep(0.005)
        looked = time.monotonic()
        stats = consumer.stats()
        for name in STATS_FIELDS:
            value = getattr(stats, name, None)
            if name == "longest_call" and value is not None:
                value = {"key": str(value.key), "lane": value.lane, "seconds": value.seconds}
            out[name] = value
        out["lane_depths"] = list(stats.lane_depths)
        ends = [t for s, t in rec.ended.items() if s != 0]
        by_cap = [t for t in ends if t <= deadline]
        out["ran_by_cap"] = len(by_cap)
        out["capped"] = len(by_cap) < messages
        done_at = deadline if out["capped"] else max(by_cap)
        out["seconds"] = done_at - t0
        out["hung_call_age"] = done_at - hung_at[0]
        out["looked_after"] = looked - t0
        # release the hung call: everything must run, then the consumer stops
        for release in releases:
            release()
        end = time.monotonic() + 60
        while len(rec.ended) < messages + 1 and time.monotonic() < end:
            time.sleep(0.01)
    finally:
        for release in releases:
            release()
        out["shutdown_in_time"] = consumer.shutdown(timeout=30)
    committed_short = []
    for q in broker.queues(TOPIC):
        c = broker.committed(GROUP, q)
        if c is None or c.offset != broker.max_offset(q):
            committed_short.append(q.queue_id)
    broker.close()

    total = messages + 1
    problems += rec.problems(total)
    if committed_short:
        problems.append(f"queues not committed to their end: {committed_short}")
    if not out["shutdown_in_time"]:
        problems.append("shutdown did not finish the queued work in 30 s")
    out["ran"] = sum(1 for s in range(total) if rec.calls[s])
    out["ran_once"] = sum(1 for s in range(total) if rec.calls[s] == 1)
    out["problems"] = problems
    return out


# -- the parent: runs, table ---------------------------------------------------------


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """:func:`run_once` in a fresh process of this script; a crash, a
    warning or an error it logged is a problem of the run."""
    done = subprocess.run(
        [sys.executable, __file__, "--one", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=spec["cap"] + 180,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {**spec, "problems": [f"the run's process exited {done.returncode}: {done.stderr.strip()[-1500:]}"]}
    result: dict[str, Any] = json.loads(lines[-1])
    logged = [line for line in done.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    if logged:
        result["problems"].append(f"{len(logged)} WARNING/ERROR line(s) logged, first: {logged[0][:300]}")
    return result


def _s(x: float) -> str:
    return f"{x:.2f}"


def _run_cell(r: dict[str, Any]) -> str:
    if "seconds" not in r:
        return "failed"
    if r["capped"]:
        return f"≥{r['cap']:g} ({r['ran_by_cap']:,} ran)"
    return _s(r["seconds"])


def _field(rs: list[dict[str, Any]], name: str) -> str:
    values = [r.get(name) for r in rs]
    if all(v is None for v in values):
        return "-"
    if name == "longest_call":
        return ", ".join("-" if v is None else f"{v['key']} {v['seconds']:.1f} s" for v in values)
    return ", ".join("-" if v is None else f"{v:,}" for v in values)


def table(results: list[dict[str, Any]], lanes: list[int], settings: list[str], messages: int) -> str:
    lines = [
        f"| lanes | setting | steal_after | runs: s until all {messages:,} ran (capped: how many ran) | median s "
        "| every run done | < 2 s | hung call had run (median s) | steals | stolen | longest_call |",
        "|---:|---|---|---|---:|---|---|---:|---|---|---|",
    ]
    for n in lanes:
        medians: dict[str, float] = {}
        for name in settings:
            rs = sorted((r for r in results if r["lanes"] == n and r["setting"] == name), key=lambda r: r["rep"])
            ok = [r for r in rs if "seconds" in r]
            if not ok:
                lines.append(f"| {n} | {name} | | failed | | | | | | | |")
                continue
            med = medians[name] = statistics.median(r["seconds"] for r in ok)
            all_done = not any(r["capped"] for r in ok) and len(ok) == len(rs)
            met = all_done and all(r["seconds"] < TARGET for r in ok)
            steal = ok[0]["steal_after"]
            lines.append(
                f"| {n} | {name} | {'None' if steal is None else steal} | {', '.join(_run_cell(r) for r in rs)} "
                f"| {'≥' if any(r['capped'] for r in ok) and med >= ok[0]['cap'] else ''}{_s(med)} "
                f"| {'yes' if all_done else 'no'} | {'yes' if met else 'no'} "
                f"| {_s(statistics.median(r['hung_call_age'] for r in ok))} | {_field(rs, 'steals')} "
                f"| {_field(rs, 'stolen')} | {_field(rs, 'longest_call')} |"
            )
        if "before" in medians:
            for name in settings:
                if name == "before" or name not in medians:
                    continue
                by_rep = {
                    r["rep"]: r["seconds"]
                    for r in results
                    if r["lanes"] == n and r["setting"] == "before" and "seconds" in r
                }
                pairs = [
                    r["seconds"] / by_rep[r["rep"]]
                    for r in results
                    if r["lanes"] == n and r["setting"] == name and "seconds" in r and by_rep.get(r["rep"])
                ]
                lines.append(
                    f"| {n} | {name} / before | | pairs {', '.join(f'{x:.3f}' for x in pairs)} "
                    f"| {medians[name] / medians['before']:.3f} (pairs median {statistics.median(pairs):.3f}) "
                    "| | | | | | |"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--lanes", default="8,16,64", help="comma-separated lane counts (default 8,16,64)")
    ap.add_argument("--executor", choices=("thread", "asyncio"), default="thread")
    ap.add_argument("--steal-after", type=float, default=None, help="also run steal_after=S seconds ('fixed')")
    ap.add_argument("--settings", default="before,after", help="of before,after (default both)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each configuration (default 3)")
    ap.add_argument("--messages", type=int, default=2000, help="messages of the other keys (default 2000)")
    ap.add_argument("--keys", type=int, default=100, help="how many other keys (default 100)")
    ap.add_argument("--sleep", type=float, default=0.001, help="seconds each other call sleeps (default 0.001)")
    ap.add_argument("--batch-size", type=int, default=1, help="the consumer's batch_size (default 1)")
    ap.add_argument("--cap", type=float, default=15.0, help="longest wait for the other keys, seconds (default 15)")
    ap.add_argument("--json", type=Path, default=None, help="write every run's numbers here")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child run: its spec as JSON
    args = ap.parse_args(argv)
    if args.one is not None:
        logging.basicConfig(level=logging.WARNING)
        print(json.dumps(run_once(json.loads(args.one))), flush=True)
        return 0
    try:
        lanes = [int(x) for x in args.lanes.split(",")]
    except ValueError:
        ap.error(f"--lanes: comma-separated integers, got {args.lanes!r}")
    settings = [s for s in args.settings.split(",") if s]
    bad = [s for s in settings if s not in SETTINGS]
    if bad or not settings:
        ap.error(f"--settings: of {', '.join(SETTINGS)}, got {args.settings!r}")
    values = {name: SETTINGS[name] for name in settings}
    if args.steal_after is not None:
        if args.steal_after <= 0:
            ap.error(f"--steal-after must be > 0 seconds, got {args.steal_after}")
        values["fixed"] = args.steal_after
        settings.append("fixed")
    if min(lanes) < 1 or min(args.repeat, args.messages, args.keys, args.batch_size) < 1 or args.cap <= 0:
        ap.error("--lanes, --repeat, --messages, --keys and --batch-size must be >= 1, --cap > 0")

    print(
        f"hung key: embedded broker, topic of {QUEUES} queues, KEY_ORDERLY, lane_placement load, "
        f"{args.executor} executor, batch_size {args.batch_size}; {args.messages:,} messages of {args.keys} other "
        f"keys, {args.sleep * 1e3:g} ms per message; cap {args.cap:g} s; {args.repeat} run(s) each; "
        f"{os.cpu_count()} CPUs",
        flush=True,
    )
    results: list[dict[str, Any]] = []
    t_start = time.monotonic()
    for rep in range(args.repeat):
        for n in lanes:
            for name in settings if rep % 2 == 0 else settings[::-1]:  # A B, B A, ...
                spec = {
                    "rep": rep,
                    "lanes": n,
                    "setting": name,
                    "steal_after": values[name],
                    "executor": args.executor,
                    "messages": args.messages,
                    "keys": args.keys,
                    "sleep": args.sleep,
                    "cap": args.cap,
                    "batch_size": args.batch_size,
                }
                r = run_child(spec)
                results.append(r)
                print(
                    f"rep {rep + 1} lanes {n} {name}: "
                    + (
                        f"{_run_cell(r)} s, hung call {r['hung_call_age']:.2f} s, "
                        f"steals {r.get('steals') if r.get('steals') is not None else '-'}, "
                        f"stolen {r.get('stolen') if r.get('stolen') is not None else '-'}, ran once {r['ran_once']:,}"
                        if "seconds" in r
                        else "no numbers"
                    )
                    + (f"  FAILED: {'; '.join(r['problems'])}" if r["problems"] else ""),
                    file=sys.stderr,
                    flush=True,
                )
    print()
    print(table(results, lanes, settings, args.messages))
    print()
    failed = [r for r in results if r["problems"]]
    total = args.messages + 1
    if failed:
        for r in failed:
            print(f"FAILED: rep {r['rep'] + 1} lanes {r['lanes']} {r['setting']}: {'; '.join(r['problems'])}")
    else:
        print(
            f"check: ok: in all {len(results)} runs each of the {total:,} messages ran exactly once, each key in the "
            "order sent, no key in two calls at once, every queue committed to its end"
        )
    paths = sorted({str(r["lite_push"]) for r in results if "lite_push" in r})
    print(f"lite_push imported from {', '.join(paths) or '?'}; all runs {time.monotonic() - t_start:.0f} s")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"args": {k: v for k, v in vars(args).items() if k not in ("json", "one")}, "runs": results},
                indent=1,
                default=str,
            )
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
