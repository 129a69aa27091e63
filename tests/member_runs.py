"""Three member processes of one group, one killed with SIGKILL mid-run:
the run and its checks, shared by the sources that have real members
(Redis, Kafka).

Each member is ``python -c <script>``: the script's first lines make the
source (``source_lines``, which define ``source``), the rest is the same for
every source: a listener that sleeps a little per message and appends
``pid queue offset key start_ns end_ns`` to a shared log, and a consumer of
group ``g`` on topic ``T`` with four lanes.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from helpers import wait_until

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from fault_suite import overlaps_by_member  # noqa: E402  (benchmarks/ is put on sys.path above)

__all__ = ["KillRun", "check_kill_run", "lost_to_expiry", "read_log", "run_three_and_kill"]

Row = tuple[int, int, int, str, int, int]

_MEMBER = """
import os, sys, time, logging
sys.path.insert(0, {root!r})
logging.basicConfig(level=logging.WARNING)
from lite_push import ConsumerConfig, LitePushConsumer
{source_lines}
log = os.open({log!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
pid = os.getpid()
def listener(msgs):
    for m in msgs:
        start = time.time_ns()
        time.sleep({sleep!r})
        line = f"{{pid}} {{m.queue_id}} {{m.queue_offset}} {{m.keys}} {{start}} {{time.time_ns()}}\\n"
        os.write(log, line.encode())
consumer = LitePushConsumer(
    ConsumerConfig(group="g", lanes=4, commit_interval=0.05, poll_timeout=0.02, revoke_timeout=1.0),
    source=source, listener=listener)
consumer.subscribe("T")
consumer.start()
time.sleep(600)
"""


def read_log(path: Path) -> list[Row]:
    """The deliveries the members logged (a torn last line is ignored)."""
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 6:
                rows.append((int(parts[0]), int(parts[1]), int(parts[2]), parts[3], int(parts[4]), int(parts[5])))
    return rows


def lost_to_expiry(stderrs: Iterable[str]) -> set[int]:
    """Queue ids a member reported lost because its session expired (the
    sources' warning ``lost ['T@...#4', ...] (its session expired)``)."""
    lost: set[int] = set()
    for err in stderrs:
        for listed in re.findall(r"lost \[([^\]]*)\] \(its session expired\)", err):
            lost.update(int(q) for q in re.findall(r"#(\d+)'", listed))
    return lost


@dataclass
class KillRun:
    rows: list[Row]
    victim: int
    killed_at: int
    #: The survivors' stderr, by PID.
    errs: dict[int, str]


def run_three_and_kill(source_lines: str, log: Path, total: int, *, sleep: float = 0.002) -> KillRun:
    """Start three members (``source_lines`` with ``{cid}`` for the member's
    client id), wait until all three deliver, SIGKILL the busiest of those
    delivering at that moment, wait until every one of ``total`` messages
    was delivered, stop the others."""
    root = str(Path(__file__).resolve().parents[1])
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                textwrap.dedent(_MEMBER).format(
                    root=root, log=str(log), sleep=sleep, source_lines=source_lines.format(cid=f"m{i}")
                ),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for i in range(3)
    ]
    try:
        # all three members consuming (each has its share of the queues)
        assert wait_until(
            lambda: len({r[0] for r in read_log(log)}) == 3 or any(p.poll() is not None for p in procs), timeout=60
        )
        assert all(p.poll() is None for p in procs), [
            p.stderr.read().decode()[-2000:]
            for p in procs
            if p.poll() is not None  # type: ignore[union-attr]
        ]
        # The victim is the busiest of the members delivering right now (a
        # call ended in the last 0.25 s): the busiest so far may be between
        # queues in a rebalance, and then it held nothing to hand over.
        deadline = time.monotonic() + 30
        while True:
            rows = read_log(log)
            recent = {r[0] for r in rows if r[5] > time.time_ns() - 250_000_000}
            if recent or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert recent, "no member was delivering"
        assert len(rows) < total // 2  # killed mid-run
        busiest = max(recent, key=lambda pid: sum(1 for r in rows if r[0] == pid))
        victim = next(p for p in procs if p.pid == busiest)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
        killed_at = time.time_ns()
        if not wait_until(lambda: len({(q, o) for _, q, o, _, _, _ in read_log(log)}) == total, timeout=90):
            raise AssertionError(_stalled(read_log(log), total, victim.pid, killed_at, procs))
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(10)
    errs = {p.pid: p.stderr.read().decode(errors="replace") for p in procs if p is not victim}  # type: ignore[union-attr]
    return KillRun(read_log(log), victim.pid, killed_at, errs)


def _stalled(rows: list[Row], total: int, victim: int, killed_at: int, procs: list[subprocess.Popen[bytes]]) -> str:
    """Why a run did not finish: per queue, the highest offset delivered and
    who delivered last, and how long ago; the survivors' stderr tails."""
    now = time.time_ns()
    done = len({(q, o) for _, q, o, *_ in rows})
    lines = [f"{done} of {total} delivered; victim {victim}, killed {(now - killed_at) / 1e9:.1f} s ago"]
    by_queue: dict[int, list[Row]] = {}
    for r in rows:
        by_queue.setdefault(r[1], []).append(r)
    for q in sorted(by_queue):
        last = max(by_queue[q], key=lambda r: r[5])
        lines.append(
            f"  queue {q}: {len({r[2] for r in by_queue[q]})} offsets, max {max(r[2] for r in by_queue[q])}, "
            f"last by {last[0]} {(now - last[5]) / 1e9:.1f} s ago"
        )
    for p in procs:
        if p.pid != victim and p.poll() is None:
            p.terminate()
            try:
                _, err = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
            lines.append(f"  member {p.pid} stderr: {err.decode(errors='replace')[-3000:]}")
    return "\n".join(lines)


def check_kill_run(run: KillRun, stored: set[tuple[int, int]], *, resume_within: float = 15.0) -> None:
    """What a kill must not break: every stored ``(queue, offset)`` was
    delivered; each key's first deliveries came in offset order and never
    overlapped, across processes; no key ran in two processes at once
    (except a survivor the machine stalled past its session, which says so);
    duplicates only of the killed member's queues; and the queues it held
    at the kill were consumed again within ``resume_within`` seconds."""
    rows, victim, killed_at = run.rows, run.victim, run.killed_at
    expired = lost_to_expiry(run.errs.values())
    assert {(q, o) for _, q, o, _, _, _ in rows} == stored
    first: dict[tuple[int, int], tuple[int, str, int, int]] = {}
    for pid, q, o, k, s, e in sorted(rows, key=lambda r: r[4]):
        first.setdefault((q, o), (pid, k, s, e))
    by_key: dict[str, list[tuple[int, int, int, int]]] = {}
    for (q, o), (_pid, k, s, e) in first.items():
        by_key.setdefault(k, []).append((q, o, s, e))
    for k, items in by_key.items():
        items.sort()
        for (_, _, _s1, e1), (_, _, s2, _e2) in itertools.pairwise(items):
            assert e1 <= s2, k
    # Over all deliveries (duplicates too) no key ran in two processes at
    # once: the fence stops a member before its session lapses.  The one
    # exception no client can prevent: a call in progress when the machine
    # froze a whole survivor past its session (one per lane of a member
    # that reported the loss).
    overlaps = overlaps_by_member(rows, set())
    stalled = {pid for pid, err in run.errs.items() if lost_to_expiry([err])}
    assert all(pid in stalled for pid in overlaps), overlaps
    assert all(n <= 4 for n in overlaps.values()), overlaps
    victim_queues = {q for pid, q, *_ in rows if pid == victim}
    assert victim_queues
    seen: dict[tuple[int, int], int] = {}
    for _pid, q, o, *_rest in rows:
        seen[(q, o)] = seen.get((q, o), 0) + 1
    dups = {qo for qo, n in seen.items() if n > 1 and qo[0] not in expired}
    # who ran a duplicated queue's duplicates, and when (seconds after the kill)
    when = {(q, o): (pid, round((s - killed_at) / 1e9, 2)) for pid, q, o, k, s, e in rows if (q, o) in dups}
    where = {q: sorted(v for (qq, _), v in when.items() if qq == q)[:6] for q in {q for q, _ in dups}}
    assert {q for q, _ in dups} <= victim_queues, (victim, victim_queues, where)
    assert all(s >= killed_at - 5_000_000_000 for pid, q, o, k, s, e in rows if (q, o) in dups and pid != victim), where
    # the queues it held at the kill (it delivered on them in its last 0.5 s)
    held = {q for pid, q, o, k, s, e in rows if pid == victim and e > killed_at - 500_000_000}
    assert held
    for q in held:
        later = [s for pid, qq, o, k, s, e in rows if qq == q and pid != victim and s > killed_at]
        if not later:  # nothing of q ran after the kill: the victim had finished all of it
            assert all(any(r[0] == victim and r[1] == q and r[2] == o for r in rows) for qq, o in seen if qq == q)
            continue
        assert min(later) - killed_at < resume_within * 1e9, (q, (min(later) - killed_at) / 1e9)
