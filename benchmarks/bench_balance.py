"""Message-grain vs queue balancing on Redis (issue 28): real member
processes of one group on one redis-server, both balances in the same run.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_balance.py --scenarios scale,hot,unequal,cost --repeat 3   # ~9 min
    PYTHONPATH=. .venv/bin/python benchmarks/bench_balance.py --scenarios scale --repeat 1 --messages 0.25   # smoke

The script starts its own redis-server (``RedisServer``, 127.0.0.1, a free
port, no AOF; stopped by its PID).  Every configuration runs with a fresh
namespace (``bb-<uuid>``) and group.  Each member is ``python -c <script>``
(as in ``fault_suite.py``): ``RedisBroker(url, namespace=..., session_timeout=10,
heartbeat_interval=1)``, ``pull_consumer(group, consume_from=FIRST_OFFSET,
client_id="m<i>", balance=...)``, ``ConsumerConfig(group=..., lanes=8,
commit_interval=0.2, poll_timeout=0.05, revoke_timeout=2)`` (threads
executor, KEY_ORDERLY, ``lane_placement="load"``).  The members are started,
and the messages are sent only once every member said "ready" (one second
after ``consumer.start()``) and the group's queues settled: with
``Balance.QUEUE`` every queue owned by one member and ``min(members, queues)``
members owning some, unchanged for 1.5 s; with ``Balance.MESSAGE`` every
member joined every queue (its ``on_assigned`` hook).  So no member starts
with a head start.

Scenarios (``--scenarios``; ``--messages F`` multiplies every message count):

* ``scale``: one queue, 400 keys drawn uniformly, 8,000 messages, a
  listener that sleeps 10 ms per message; 1, 2 and 4 members, queue then
  message balance for each (A B A B ...).  msg/s and the ratio to 1 member
  of the same balance in the same repetition.
* ``hot``: 8 queues, 4 members, 10 ms per message, 8,000 messages: 80 %
  of them on 400 keys of queue 0, 20 % on 400 other keys spread over
  queues 1-7 (``send_batch`` mapping items with ``queue_id``: each key in
  one queue).  Queue vs message msg/s and their ratio.
* ``unequal``: message balance, one queue, 400 keys, two members, one
  listener 4 ms per message, the other 1 ms, 30,000 messages: the
  deliveries of each member while both ran, and fast / slow.
* ``cost``: one member, a no-op listener, 4 queues, 400 keys, 300,000
  messages: queue vs message msg/s and message / queue.

Rate: messages / (last delivery end - first delivery start).  ``scale``,
``hot`` and ``unequal`` members append a line per delivery to a shared log
(``pid queue offset key start_ns end_ns 0``: ``fault_suite``'s row, on
``time.time_ns``), which is checked: nothing lost, no per-key inversion of
first deliveries, no key in two processes at once (``fault_suite.inversions``
/ ``overlaps``), duplicates counted.  The ``cost`` member only counts (a
write per message would be a large part of a no-op listener's cost) and
writes its first and last timestamps when its count reaches the messages
sent; the group's committed positions are then checked to reach the end.

All messages of a run are sent in one ``send_batch`` (one SEND script per
queue, pipelined), so they are there at once and the send does not pace
the consumers.  CPU: seconds of CPU of the members and of redis-server
(``/proc``) from the end of the send to the moment the run was seen done
(polled every 0.1 s), over the wall seconds of that window ("cores"), and
the rest of the machine's busy time in that window ("other": this script
and whatever else runs on the machine, the noise).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from fault_suite import Row, inversions, overlaps

from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer

TOPIC = "BB"
SCENARIOS = ["scale", "hot", "unequal", "cost"]
SESSION_TIMEOUT = 10.0
HEARTBEAT = 1.0
_TICK = os.sysconf("SC_CLK_TCK")

_MEMBER = textwrap.dedent(
    """
    import itertools, os, sys, time, logging
    sys.path.insert(0, {root!r})
    logging.basicConfig(level=logging.WARNING)
    from lite_push import Balance, ConsumerConfig, LitePushConsumer
    from lite_push.sources import ConsumeFromWhere
    from lite_push.sources.redis import RedisBroker
    broker = RedisBroker({url!r}, namespace={ns!r}, session_timeout={session!r}, heartbeat_interval={heartbeat!r})
    pid = os.getpid()
    sleep = {sleep!r}
    if {log!r}:
        log = os.open({log!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        def listener(msgs):
            start = time.time_ns()
            if sleep:
                time.sleep(sleep)
            end = time.time_ns()
            os.write(log, "".join(
                f"{{pid}} {{m.queue_id}} {{m.queue_offset}} {{m.keys}} {{start}} {{end}} 0\\n" for m in msgs).encode())
    else:  # count only: first and last timestamps written when the count reaches {expected}
        counter = itertools.count(1)
        first = []
        def listener(msgs):
            if not first:
                first.append(time.time_ns())
            for _ in msgs:
                if next(counter) == {expected}:
                    with open({done!r} + ".tmp", "w") as f:
                        f.write(f"{{first[0]}} {{time.time_ns()}}\\n")
                    os.rename({done!r} + ".tmp", {done!r})
    def hook(word):
        def h(queues):
            print(word, ",".join(str(q.queue_id) for q in queues), flush=True)
        return h
    consumer = LitePushConsumer(
        ConsumerConfig(group={group!r}, lanes={lanes!r}, commit_interval=0.2, poll_timeout=0.05, revoke_timeout=2.0),
        source=broker.pull_consumer({group!r}, consume_from=ConsumeFromWhere.FIRST_OFFSET, client_id={cid!r},
                                    balance=Balance.{balance}),
        listener=listener, on_assigned=hook("assigned"), on_revoked=hook("revoked"))
    consumer.subscribe({topic!r})
    consumer.start()
    time.sleep(1.0)
    print("ready", flush=True)
    time.sleep(3600)
    """
)


@dataclass
class Spec:
    """One configuration: a fresh topic of ``queues`` queues, one member per
    entry of ``sleeps`` (its listener's seconds per message), ``items`` sent
    once all joined."""

    scenario: str
    balance: str  # "QUEUE" or "MESSAGE"
    queues: int
    sleeps: list[float]
    items: list[Any]
    log: bool = True
    lanes: int = 8


@dataclass
class Result:
    spec: Spec
    rep: int
    rate: float = 0.0
    seconds: float = 0.0
    #: Deliveries per member (by index in ``spec.sleeps``).
    per_member: list[int] = field(default_factory=list)
    #: CPU cores used from the send to the end: members, redis-server, and
    #: every other process of the machine (this script, other work: noise).
    cores: dict[str, float] = field(default_factory=dict)
    check: str = ""
    problems: list[str] = field(default_factory=list)
    #: unequal: deliveries per member while both delivered, and that window.
    both: list[int] = field(default_factory=list)


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def machine_busy() -> float:
    """CPU seconds the whole machine spent busy so far (``/proc/stat``)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / _TICK  # all but idle and iowait


class Log:
    """The shared delivery log, read incrementally."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[Row] = []
        self.done: set[tuple[int, int]] = set()
        self._pos = 0
        self._tail = b""

    def read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self._pos)
            data = f.read()
        self._pos += len(data)
        data = self._tail + data
        lines = data.split(b"\n")
        self._tail = lines.pop()
        for line in lines:
            p = line.split()
            if len(p) == 7:
                row = (int(p[0]), int(p[1]), int(p[2]), p[3].decode(), int(p[4]), int(p[5]), int(p[6]))
                self.rows.append(row)
                self.done.add((row[1], row[2]))


def _lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def settled(outs: list[Path], balance: str, queues: int) -> tuple[bool, tuple[Any, ...]]:
    """Whether every member is ready and the group's queues are placed as
    the balance wants; and the placement (to see it is unchanged)."""
    owned: list[set[int]] = []
    for out in outs:
        lines = _lines(out)
        if "ready" not in lines:
            return False, ()
        mine: set[int] = set()
        for line in lines:
            word, _, rest = line.partition(" ")
            qs = {int(q) for q in rest.split(",") if q}
            if word == "assigned":
                mine |= qs
            elif word == "revoked":
                mine -= qs
        owned.append(mine)
    placement = tuple(tuple(sorted(m)) for m in owned)
    if balance == "MESSAGE":
        return all(m == set(range(queues)) for m in owned), placement
    counts = Counter(q for m in owned for q in m)
    ok = set(counts) == set(range(queues)) and max(counts.values()) == 1
    ok = ok and sum(1 for m in owned if m) == min(len(outs), queues)
    return ok, placement


def run(server: RedisServer, spec: Spec, rep: int, timeout: float) -> Result:
    res = Result(spec, rep)
    ns = f"bb-{uuid.uuid4().hex[:10]}"
    group = f"g-{spec.scenario}-{spec.balance.lower()}"
    broker = RedisBroker(server.url, namespace=ns)
    broker.create_topic(TOPIC, queue_count=spec.queues)
    total = len(spec.items)
    with tempfile.TemporaryDirectory(prefix="bench-balance-") as tmp:
        work = Path(tmp)
        log = Log(work / "deliveries.log")
        done = work / "done"
        outs = [work / f"m{i}.out" for i in range(len(spec.sleeps))]
        errs = [work / f"m{i}.err" for i in range(len(spec.sleeps))]
        procs = []
        for i, sleep in enumerate(spec.sleeps):
            script = _MEMBER.format(
                root=str(ROOT),
                url=server.url,
                ns=ns,
                session=SESSION_TIMEOUT,
                heartbeat=HEARTBEAT,
                sleep=sleep,
                log=str(log.path) if spec.log else "",
                expected=total,
                done=str(done),
                group=group,
                lanes=spec.lanes,
                cid=f"m{i}",
                balance=spec.balance,
                topic=TOPIC,
            )
            with outs[i].open("wb") as out, errs[i].open("wb") as err:
                procs.append(subprocess.Popen([sys.executable, "-c", script], stdout=out, stderr=err))
        try:
            # every member ready and the queues placed, unchanged for 1.5 s
            deadline = time.monotonic() + 90
            stable_since, last = 0.0, None
            while True:
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError("a member exited: " + " | ".join(e.read_text()[-1500:] for e in errs))
                if time.monotonic() > deadline:
                    raise RuntimeError(f"members did not settle: {[_lines(o) for o in outs]}")
                ok, placement = settled(outs, spec.balance, spec.queues)
                now = time.monotonic()
                if not ok or placement != last:
                    stable_since, last = now, placement
                elif now - stable_since >= 1.5:
                    break
                time.sleep(0.05)
            # one send_batch: one SEND script per queue, pipelined, so every
            # message is there at once and the send does not pace the run
            broker.send_batch(TOPIC, spec.items)
            pids = [p.pid for p in procs] + ([server.pid] if server.pid else [])
            cpu0 = [cpu_seconds(p) for p in pids]
            busy0 = machine_busy()
            t0 = time.monotonic()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if spec.log:
                    log.read()
                    if len(log.done) >= total:
                        break
                elif done.exists():
                    break
                time.sleep(0.1)
            else:
                res.problems.append(f"not done within {timeout:g} s")
            wall = time.monotonic() - t0
            cpu1 = [cpu_seconds(p) for p in pids]
            busy = machine_busy() - busy0
            used = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
            res.cores = {"members": sum(used[: len(procs)]) / wall}
            if server.pid:
                res.cores["redis"] = used[-1] / wall
            res.cores["other"] = max(0.0, busy - sum(used)) / wall
            if spec.log:
                time.sleep(0.3)  # duplicates still running
                log.read()
            else:  # the group's committed positions reach the end (copied every heartbeat)
                end = time.monotonic() + 4 * HEARTBEAT + 2
                while True:
                    short = [
                        q.queue_id
                        for q in broker.queues(TOPIC)
                        if (c := broker.committed(group, q)) is None or c.offset != broker.max_offset(q)
                    ]
                    if not short or time.monotonic() > end:
                        break
                    time.sleep(0.2)
                if short:
                    res.problems.append(f"queues not committed to their end: {short}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
            broker.close()
        warnings = [line for e in errs for line in _lines(e) if "WARNING" in line or "ERROR" in line]
        if warnings:
            res.problems.append(f"{len(warnings)} warning line(s), first: {warnings[0][:300]}")
        if spec.log:
            rows = log.rows
            if rows:
                first, last_end = min(r[4] for r in rows), max(r[5] for r in rows)
                res.seconds = (last_end - first) / 1e9
            by_pid = Counter(r[0] for r in rows)
            res.per_member = [by_pid.get(p.pid, 0) for p in procs]
            res.check = verdict(rows, spec)
            if not res.check.startswith("ok"):
                res.problems.append(res.check)
            if spec.scenario == "unequal":
                # the window both members delivered in: from the later first start to the earlier last end
                starts = [min((r[4] for r in rows if r[0] == p.pid), default=0) for p in procs]
                ends = [max((r[5] for r in rows if r[0] == p.pid), default=0) for p in procs]
                lo, hi = max(starts), min(ends)
                res.both = [sum(1 for r in rows if r[0] == p.pid and lo <= r[4] and r[5] <= hi) for p in procs]
        elif done.exists():
            a, b = (int(x) for x in done.read_text().split())
            res.seconds = (b - a) / 1e9
            res.per_member = [total]
        if res.seconds > 0:
            res.rate = total / res.seconds
    return res


def verdict(rows: list[Row], spec: Spec) -> str:
    """Loss, per-key order, cross-process overlaps and duplicates."""
    stored = len(spec.items)
    delivered = {(r[1], r[2]) for r in rows}
    lost = stored - len(delivered)
    inv = inversions(rows, set())
    ovl = overlaps(rows, set())
    dups = len(rows) - len(delivered)
    ok = "ok" if lost == inv == ovl == 0 else "FAILED"
    return f"{ok}: lost {lost}, inversions {inv}, overlaps {ovl}, duplicates {dups}"


# -- workloads ----------------------------------------------------------------------


def uniform_items(n: int, keys: int, seed: int) -> list[Any]:
    rng = random.Random(seed)
    return [(b"%d" % i, f"k{rng.randrange(keys)}") for i in range(n)]


def hot_items(n: int, seed: int, hot_share: float = 0.8) -> list[Any]:
    """80 % on 400 keys of queue 0, 20 % on 400 keys over queues 1-7."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if rng.random() < hot_share:
            key, q = f"h{rng.randrange(400)}", 0
        else:
            j = rng.randrange(400)
            key, q = f"c{j}", 1 + j % 7
        out.append({"body": b"%d" % i, "keys": key, "queue_id": q})
    return out


# -- tables ----------------------------------------------------------------------


def cores(r: Result) -> str:
    return " / ".join(f"{v:.2f}" for v in r.cores.values())


def scale_table(results: list[Result], repeat: int) -> str:
    lines = [
        "| balance | members | "
        + " | ".join(f"rep {i + 1} msg/s" for i in range(repeat))
        + " | median msg/s | ratio to 1 member (per rep) | median ratio | deliveries per member (last rep) "
        "| cores members / redis / other (last rep) |",
        "|---|---:|" + "---:|" * repeat + "---:|---|---:|---|---|",
    ]
    for bal in ("QUEUE", "MESSAGE"):
        for m in (1, 2, 4):
            rs = sorted((r for r in results if r.spec.balance == bal and len(r.spec.sleeps) == m), key=lambda r: r.rep)
            base = {r.rep: r.rate for r in results if r.spec.balance == bal and len(r.spec.sleeps) == 1}
            ratios = [r.rate / base[r.rep] for r in rs if base.get(r.rep)]
            lines.append(
                f"| {bal.lower()} | {m} | "
                + " | ".join(f"{r.rate:,.0f}" for r in rs)
                + f" | {statistics.median(r.rate for r in rs):,.0f} | "
                + ", ".join(f"{x:.2f}" for x in ratios)
                + f" | {statistics.median(ratios):.2f} | {rs[-1].per_member} | {cores(rs[-1])} |"
            )
    return "\n".join(lines)


def pair_table(results: list[Result], repeat: int) -> str:
    lines = [
        "| balance | "
        + " | ".join(f"rep {i + 1} msg/s" for i in range(repeat))
        + " | median msg/s | deliveries per member (last rep) | cores members / redis / other (last rep) |",
        "|---|" + "---:|" * repeat + "---:|---|---|",
    ]
    by = {}
    for bal in ("QUEUE", "MESSAGE"):
        rs = sorted((r for r in results if r.spec.balance == bal), key=lambda r: r.rep)
        by[bal] = {r.rep: r.rate for r in rs}
        lines.append(
            f"| {bal.lower()} | "
            + " | ".join(f"{r.rate:,.0f}" for r in rs)
            + f" | {statistics.median(r.rate for r in rs):,.0f} | {rs[-1].per_member} | {cores(rs[-1])} |"
        )
    ratios = [by["MESSAGE"][i] / by["QUEUE"][i] for i in sorted(by["QUEUE"]) if by["QUEUE"][i] and i in by["MESSAGE"]]
    lines.append(
        "| message / queue | " + " | ".join(f"{x:.2f}" for x in ratios) + f" | {statistics.median(ratios):.2f} | | |"
    )
    return "\n".join(lines)


def unequal_table(results: list[Result]) -> str:
    lines = [
        "| rep | msg/s | deliveries slow (4 ms) | fast (1 ms) | fast / slow | while both ran: slow | fast "
        "| fast / slow | cores members / redis / other |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        s, f = r.per_member
        bs, bf = r.both or [0, 0]
        lines.append(
            f"| {r.rep + 1} | {r.rate:,.0f} | {s:,} | {f:,} | {f / s if s else float('nan'):.2f} | {bs:,} | {bf:,} "
            f"| {bf / bs if bs else float('nan'):.2f} | {cores(r)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, of " + ",".join(SCENARIOS))
    ap.add_argument("--repeat", type=int, default=2, help="repetitions of each alternation (default 2)")
    ap.add_argument("--messages", type=float, default=1.0, help="scale factor of every message count (default 1)")
    ap.add_argument("--timeout", type=float, default=300.0, help="longest consumption of one run, seconds")
    ap.add_argument("--seed", type=int, default=28)
    args = ap.parse_args(argv)
    scenarios = args.scenarios.split(",")
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        ap.error(f"unknown scenarios {sorted(unknown)}")

    def n(x: int) -> int:
        return max(1, round(x * args.messages))

    failed = False
    with RedisServer(appendonly=False) as server:
        print(f"redis-server pid {server.pid} at {server.url}; {os.cpu_count()} CPUs", flush=True)
        for scenario in scenarios:
            results: list[Result] = []
            specs: list[Spec] = []
            if scenario == "scale":
                items = uniform_items(n(8000), 400, args.seed)
                specs = [Spec("scale", bal, 1, [0.010] * m, items) for m in (1, 2, 4) for bal in ("QUEUE", "MESSAGE")]
            elif scenario == "hot":
                items = hot_items(n(8000), args.seed)
                specs = [Spec("hot", bal, 8, [0.010] * 4, items) for bal in ("QUEUE", "MESSAGE")]
            elif scenario == "unequal":
                specs = [Spec("unequal", "MESSAGE", 1, [0.004, 0.001], uniform_items(n(30_000), 400, args.seed))]
            elif scenario == "cost":
                items = uniform_items(n(300_000), 400, args.seed)
                specs = [Spec("cost", bal, 4, [0.0], items, log=False) for bal in ("QUEUE", "MESSAGE")]
            print(f"\n## {scenario}: {len(specs[0].items):,} messages per run", flush=True)
            for rep in range(args.repeat):
                for spec in specs:  # A B A B ...
                    r = run(server, spec, rep, args.timeout)
                    results.append(r)
                    failed |= bool(r.problems)
                    print(
                        f"rep {rep + 1} {scenario} {spec.balance.lower()} members {len(spec.sleeps)}: "
                        f"{r.rate:,.0f} msg/s over {r.seconds:.2f} s; per member {r.per_member}; "
                        f"cores members/redis/other {cores(r)}; {r.check or '-'}"
                        + (f"; both ran: {r.both}" if r.both else "")
                        + (f"  PROBLEMS: {'; '.join(r.problems)}" if r.problems else ""),
                        flush=True,
                    )
            print()
            if scenario == "scale":
                print(scale_table(results, args.repeat))
            elif scenario in ("hot", "cost"):
                print(pair_table(results, args.repeat))
            else:
                print(unequal_table(results))
            print(flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
