"""``lite-push consume --processes P`` on Redis: msg/s for P = 1, 2, ... member
processes of one group, in the same run (issue 19, item 1).

    .venv/bin/python benchmarks/bench_processes.py --procs 1,2 --lanes 96,128,192,256 --repeat 3
    .venv/bin/python benchmarks/bench_processes.py --procs 1,2 --repeat 1 --messages 5000 --check   # smoke
    .venv/bin/python benchmarks/bench_processes.py --procs 2 --repeat 1 --messages 3000 --check --balance message

It starts its own redis-server on a free loopback port (no AOF; stopped by
its PID) and stores the ``sms-1m`` workload (``benchmarks/workloads.py``:
1,000,000 messages, 8 queues, 10,000 keys Zipf s = 0.5, 64-byte bodies, 1 ms
per message; ``--messages`` shrinks it) in topic ``BENCH``: the keys drawn
from the workload's exact key distribution (seed 42), each message's queue by
its key's hash (the Redis broker's ``send_batch``), its body its sequence
number (8 bytes) padded to 64 bytes.

Then for each repetition, for each P of ``--procs`` in turn (so the runs
alternate A B A B ...), with a fresh group from the first offset::

    lite-push consume --processes P --source redis://...?namespace=NS --group G --topic BENCH \\
        --from first --lanes 256 --listener process_listeners:sleep_1ms --metrics-port 0

as a subprocess (``benchmarks/`` on ``PYTHONPATH``).  The listener is an
``async def`` awaiting ``asyncio.sleep(0.001)``, so the command picks the
asyncio executor, on an event loop of the consumer's own: uvloop's when it
is installed (it is in the test environment).  P = 1 is the command's
single-process path (no supervisor); P > 1 a supervisor whose ``/metrics``
sums nothing itself: every member's series carries a ``member`` label.

The rate is N over the seconds from the first to the last consumed message
as seen by polling the command's ``/metrics`` (the sum over members of
``lite_push_messages_processed_total{outcome="success"}``): every 20 ms until
the first message and in the last second or so, every 0.5 s in between (a
scrape makes each member render its page and the supervisor parse them: at
50 a second that is CPU the run needs on a 2-core machine).  For P > 1 it
includes the members' start and the group's first rebalance (the first
member to join starts consuming at once), so a short run understates the
gain: use the full million.  Each line also gives the CPU seconds, between
the first and the last message, of the members, the supervisor and
redis-server (from ``/proc``), and when 50, 90 and 99 % of the messages were
consumed (the tail is the hottest key's chain of calls, which no number of
processes shortens).  Then SIGTERM; the run must exit 0 and the group must
have committed every queue to its end.  The table: msg/s per repetition and
the median per lanes and P, and the ratio of each P to the first one per
repetition (same run, same data).  ``--lanes 96,128``: each lane count is
run with every P (the runs alternate over all of them).

``--check``: the listener also logs every delivery (``process_listeners``:
``sleep_1ms_logged``) and the run is checked: nothing lost, no per-key
order inversion of first deliveries, no key in two processes at once
(``fault_suite.inversions`` / ``overlaps``), and duplicates are counted.
Logging costs a system call per message: do not compare its rates with
unlogged ones.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fault_suite import Row, inversions, overlaps
from fault_suite import _read as read_rows  # the fault suite's log format: process_listeners writes it
from workloads import Workload, get_workload, key_pmf, keys_for

from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer

TOPIC = "BENCH"
#: How often the run's /metrics is read (seconds) around the first and the
#: last message; in between, every ``POLL_SLOW`` (a scrape makes every
#: member render its page and the supervisor parse them all: at 50 a second
#: that is CPU the run itself needs on a 2-core machine).
POLL = 0.02
POLL_SLOW = 0.5
_PROCESSED = re.compile(r"^lite_push_messages_processed_total\{([^}]*)\} (\S+)$", re.MULTILINE)


@dataclass
class Run:
    procs: int
    rep: int
    lanes: int
    rate: float = 0.0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    check: str = ""
    #: CPU seconds used between the first and the last message, by role:
    #: "members" (the consuming processes), "supervisor", "redis-server".
    cpu: dict[str, float] = field(default_factory=dict)
    #: ``(seconds since the first message, messages consumed)`` at each poll.
    samples: list[tuple[float, int]] = field(default_factory=list)

    def reached(self, share: float) -> float:
        """Seconds after the first message until ``share`` of them were
        consumed (as polled: up to ``POLL_SLOW`` late before the last second)."""
        total = self.samples[-1][1] if self.samples else 0
        return next((t for t, n in self.samples if n >= share * total), float("nan"))


_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """``(parent pid, CPU seconds)`` of a live process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def cpu_by_role(root: int, redis_pid: int | None) -> dict[str, float]:
    """CPU seconds so far of the command ``root`` (the supervisor, or the
    single consumer), its descendants (the members) and redis-server."""
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            stats[int(name)] = st
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    below, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        below.append(pid)
        todo += children.get(pid, [])
    own = stats.get(root, (0, 0.0))[1]
    members = sum(stats[p][1] for p in below)
    out = {"members": members, "supervisor": own} if below else {"members": own, "supervisor": 0.0}
    if redis_pid is not None and redis_pid in stats:
        out["redis-server"] = stats[redis_pid][1]
    return out


def store(broker: RedisBroker, workload: Workload) -> dict[tuple[int, int], str]:
    """Send the workload to ``TOPIC``; its ``(queue, offset) -> key``."""
    broker.create_topic(TOPIC, queue_count=workload.queues)
    keys = keys_for(workload)
    rng = random.Random(workload.seed)
    ranks = rng.choices(range(workload.keys), weights=key_pmf(workload), k=workload.messages)
    pad = b"\0" * max(0, workload.body_size - 8)
    stored: dict[tuple[int, int], str] = {}
    for lo in range(0, workload.messages, 20_000):
        seqs = range(lo, min(lo + 20_000, workload.messages))
        chunk = [(seq.to_bytes(8, "big") + pad, keys[ranks[seq]]) for seq in seqs]
        for (_, key), r in zip(chunk, broker.send_batch(TOPIC, chunk), strict=True):
            stored[(r.queue.queue_id, r.offset)] = key
    return stored


def consumed(url: str) -> int | None:
    """The run's messages processed successfully (summed over members), or
    ``None`` when its endpoint does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=2.0) as r:
            page = r.read().decode()
    except OSError:
        return None
    return int(sum(float(v) for labels, v in _PROCESSED.findall(page) if 'outcome="success"' in labels))


def _metrics_url(stdout: Path, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.findall(r"^metrics: (\S+)$", stdout.read_text(), re.MULTILINE)
        if found:
            return str(found[0])
        if proc.poll() is not None:
            raise RuntimeError(f"lite-push consume exited {proc.returncode} before serving metrics")
        time.sleep(POLL)
    raise RuntimeError("lite-push consume did not print its metrics URL")


def run_once(
    url: str,
    broker: RedisBroker,
    procs: int,
    rep: int,
    lanes: int,
    args: argparse.Namespace,
    total: int,
    stored: dict[tuple[int, int], str],
    redis_pid: int | None = None,
) -> Run:
    run = Run(procs, rep, lanes)
    group = f"bench-{procs}p-r{rep}-{uuid.uuid4().hex[:6]}"
    work = Path(tempfile.mkdtemp(prefix=f"lite-push-procs-{procs}p-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITE_PUSH_") or k.endswith("EXTENSIONS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    listener = "process_listeners:sleep_1ms"
    if args.check:
        (work / "log").mkdir()
        env["BENCH_PROCESSES_LOG"] = str(work / "log")
        listener += "_logged"
    cmd = [
        sys.executable,
        "-m",
        "lite_push",
        "consume",
        "--processes",
        str(procs),
        "--source",
        url,
        "--group",
        group,
        "--topic",
        TOPIC,
        "--from",
        "first",
        "--lanes",
        str(lanes),
        "--listener",
        listener,
        "--metrics-port",
        "0",
        "--log-level",
        "WARNING",
        "--progress",
        "off",
        "--balance",
        args.balance,
    ]
    stdout, stderr = work / "stdout.txt", work / "stderr.txt"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
    try:
        metrics = _metrics_url(stdout, proc)
        first = last = None
        cpu0: dict[str, float] = {}
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline and proc.poll() is None:
            n = consumed(metrics)
            now = time.monotonic()
            if n is not None and n > 0 and first is None:
                first = now
                cpu0 = cpu_by_role(proc.pid, redis_pid)
            if first is not None and n is not None:
                run.samples.append((now - first, n))
            if n is not None and n >= total:
                last = now
                cpu1 = cpu_by_role(proc.pid, redis_pid)
                run.cpu = {k: v - cpu0.get(k, 0.0) for k, v in cpu1.items()}
                break
            pause = POLL
            if first is not None and n:  # slow polls until a second or so is left
                left = (total - n) / (n / max(now - first, 1e-3))
                pause = POLL if left < 2 * POLL_SLOW else POLL_SLOW
            time.sleep(max(0.0, now + pause - time.monotonic()))
        if first is None or last is None or last <= first:
            run.problems.append(f"did not consume {total:,} within {args.timeout:g}s")
        else:
            run.seconds = last - first
            run.rate = total / run.seconds
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(args.timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    if code != 0:
        run.problems.append(f"exit status {code}: {stderr.read_text()[-2000:]}")
    short = uncommitted(broker, group)
    if short:
        run.problems.append(f"queues not committed to their end: {short}")
    if args.check:
        run.check = check(work / "log", stored)
        if not run.check.startswith("ok"):
            run.problems.append(run.check)
    if run.problems:
        run.problems.append(f"output and logs kept in {work}")
    elif args.keep:
        print(f"  output and logs kept in {work}", flush=True)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return run


def uncommitted(broker: RedisBroker, group: str) -> list[int]:
    """The queues of ``TOPIC`` that ``group`` did not commit to their end."""
    short = []
    for q in broker.queues(TOPIC):
        c = broker.committed(group, q)
        if c is None or c.offset != broker.max_offset(q):
            short.append(q.queue_id)
    return short


def check(log_dir: Path, stored: dict[tuple[int, int], str]) -> str:
    """Loss, per-key order, cross-process overlaps and duplicates of a run's
    delivery logs; ``"ok ..."`` or what is wrong."""
    rows: list[Row] = [r for path in sorted(log_dir.glob("*.log")) for r in read_rows(path)]
    delivered = {(r[1], r[2]) for r in rows}
    lost = len(set(stored) - delivered)
    wrong_key = sum(1 for r in rows if stored.get((r[1], r[2])) != r[3])
    inv = inversions(rows, set())
    ovl = overlaps(rows, set())
    dups = len(rows) - len(delivered)
    pids = len({r[0] for r in rows})
    verdict = "ok" if lost == wrong_key == inv == ovl == 0 else "FAILED"
    return (
        f"{verdict}: {len(rows):,} deliveries by {pids} processes, lost {lost}, inversions {inv}, "
        f"overlaps {ovl}, duplicates {dups}, wrong keys {wrong_key}; {hottest(rows)}"
    )


def hottest(rows: Sequence[Row]) -> str:
    """The hottest key's chain of calls against the run: a key-ordered run
    cannot end before its last call does."""
    if not rows:
        return "no deliveries"
    t0 = min(r[4] for r in rows)
    end = max(r[5] for r in rows)
    by_key: dict[str, list[tuple[int, int]]] = {}
    for r in rows:
        by_key.setdefault(r[3], []).append((r[4], r[5]))
    key = max(by_key, key=lambda k: len(by_key[k]))
    calls = sorted(by_key[key])
    busy = sum(e - s for s, e in calls) / 1e9
    gaps = sum(max(0, calls[i + 1][0] - calls[i][1]) for i in range(len(calls) - 1)) / 1e9
    return (
        f"hottest key: {len(calls):,} calls from {(calls[0][0] - t0) / 1e9:.2f} s to {(calls[-1][1] - t0) / 1e9:.2f} s "
        f"of a {(end - t0) / 1e9:.2f} s run, {busy:.2f} s in calls ({busy / len(calls) * 1e3:.2f} ms each), "
        f"{gaps:.2f} s between them"
    )


def table(runs: Sequence[Run], procs: Sequence[int], lanes: Sequence[int], repeat: int) -> str:
    """msg/s per repetition and the median, per lanes and processes; the
    ratio of each P to the first P per repetition (same run, same data)."""
    lines = ["lanes | procs | " + " | ".join(f"rep {r + 1}" for r in range(repeat)) + " | median"]
    lines.append("|".join(["---"] * (repeat + 3)))
    rate = {(r.lanes, r.procs, r.rep): r.rate for r in runs}
    base = procs[0]
    for n in lanes:
        for p in procs:
            rates = [rate[(n, p, r)] for r in range(repeat)]
            lines.append(
                f"{n} | {p} | " + " | ".join(f"{x:,.0f}" for x in rates) + f" | {statistics.median(rates):,.0f}"
            )
        for p in procs[1:]:
            ratios = [
                rate[(n, p, r)] / rate[(n, base, r)] if rate[(n, base, r)] else float("nan") for r in range(repeat)
            ]
            lines.append(
                f"{n} | ratio {p}/{base} | "
                + " | ".join(f"{x:.2f}" for x in ratios)
                + f" | {statistics.median(ratios):.2f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--procs", default="1,2", help="member processes per run, in order (default 1,2)")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions of the whole alternation (default 3)")
    ap.add_argument("--messages", type=int, default=None, help="messages (default: the workload's 1,000,000)")
    ap.add_argument("--lanes", default="256", help="lanes per process; comma-separated: each is run (default 256)")
    ap.add_argument("--check", action="store_true", help="log every delivery and check loss and key order")
    ap.add_argument(
        "--balance",
        choices=("queue", "message"),
        default="queue",
        help="how the group spreads its messages (lite-push consume --balance; default queue)",
    )
    ap.add_argument("--keep", action="store_true", help="keep each run's output (and --check logs)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="longest run, seconds (default 1800)")
    args = ap.parse_args(argv)
    procs = [int(p) for p in args.procs.split(",")]
    lanes = [int(n) for n in str(args.lanes).split(",")]
    workload = get_workload("sms-1m")
    if args.messages is not None:
        workload = workload.replace(messages=args.messages)
    print(
        f"workload {workload.name}: {workload.messages:,} messages, {workload.queues} queues, {workload.keys:,} keys "
        f"({workload.skew} s={workload.zipf_s}), {workload.body_size} B, {workload.cost_ms:g} ms awaited; "
        f"lanes per process {lanes}; procs {procs} x {args.repeat}",
        flush=True,
    )
    runs: list[Run] = []
    with RedisServer(appendonly=False) as server:
        ns = f"procs-{uuid.uuid4().hex[:6]}"
        broker = RedisBroker(server.url, namespace=ns)
        try:
            t0 = time.monotonic()
            stored = store(broker, workload)
            print(f"stored in {time.monotonic() - t0:.1f}s", flush=True)
            for rep in range(args.repeat):
                for n, p in [(n, p) for n in lanes for p in procs]:  # A B A B ...: every config once per repetition
                    run = run_once(
                        f"{server.url}?namespace={ns}", broker, p, rep, n, args, workload.messages, stored, server.pid
                    )
                    runs.append(run)
                    status = "ok" if not run.problems else "; ".join(run.problems)
                    cpu = ", ".join(f"{k} {v:.1f}" for k, v in run.cpu.items())
                    cpu += "; 50/90/99 % consumed at " + "/".join(f"{run.reached(x):.1f}" for x in (0.5, 0.9, 0.99))
                    print(
                        f"rep {rep + 1} lanes {n} procs {p}: {run.rate:,.0f} msg/s over {run.seconds:.2f}s  {status}"
                        f"  (CPU s: {cpu})",
                        flush=True,
                    )
                    if run.check:
                        print(f"  check: {run.check}", flush=True)
        finally:
            broker.close()
    print()
    print(table(runs, procs, lanes, args.repeat))
    return 1 if any(r.problems for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
