"""The fault suite (issue 16.7): lite_push's promise -- per-key order, at
least once, one member per key at a time -- under real faults, with real
processes and a real redis-server.

Scenarios (each repeated ``--runs`` times, fresh server and namespace):

* ``kill9``: three members on Redis; one is killed with ``kill -9`` at a
  random moment.
* ``sigstop``: three members; one is stopped with SIGSTOP for 4 s (its
  session is 2 s), then continued.
* ``redis-kill``: three members; redis-server is killed with ``kill -9``
  and restarted 1 s later on the same port and data (AOF, fsync always).
* ``malformed``: one entry in 40 was not written by lite_push (missing
  fields, unreadable metadata); three members.
* ``listener-exc``: one message in 25 fails its first attempt, each time a
  different way (``ValueError``, a ``BaseException`` subclass,
  ``CancelledError``, ``RuntimeError``, ``RETRY_LATER``); three members.
* ``embedded-kill``: a producer appends to the durable embedded broker and
  is killed with ``kill -9`` mid-append; the broker is reopened.
* ``msg-kill9``, ``msg-sigstop``, ``msg-partition``, ``msg-redis-kill``: the
  group balanced by message (``Balance.MESSAGE``: every member takes part in
  every queue, a key held by one member at a time), with ``kill -9`` of one
  of the three members, SIGSTOP of one for 4 s (session 2 s), a network
  partition of one for 4 s (its traffic goes through a
  :class:`~lite_push.testing.TcpProxy` that stops forwarding, its sockets
  open), and redis-server killed and restarted as above.

Per scenario: runs, messages, lost (a stored good message never processed;
for ``embedded-kill``: a message whose ``send`` returned but is not in the
reopened log), first-delivery inversions per key, cross-member overlaps of a
key (calls of the frozen member in progress across its freeze aside: no
client can stop those), duplicates (deliveries beyond the first: at least
once), and time to recover (from the fault to the first delivery of an
affected queue by a member, or after the restart; balanced by message: until
each key the victim ran in its last 2 s ran again in another member).

    .venv/bin/python benchmarks/fault_suite.py --runs 3
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer
from lite_push.testing import TcpProxy

SCENARIOS = [
    "kill9",
    "sigstop",
    "redis-kill",
    "malformed",
    "listener-exc",
    "embedded-kill",
    "msg-kill9",
    "msg-sigstop",
    "msg-partition",
    "msg-redis-kill",
]

_MEMBER = textwrap.dedent(
    """
    import asyncio, os, sys, time
    sys.path.insert(0, {root!r})
    from lite_push import ConsumeResult, ConsumerConfig, LitePushConsumer
    from lite_push.sources import Balance, ConsumeFromWhere
    from lite_push.sources.redis import RedisBroker
    broker = RedisBroker({url!r}, namespace={ns!r}, session_timeout=2.0, heartbeat_interval=0.3)
    log = os.open({log!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    pid = os.getpid()
    class Boom(BaseException):
        pass
    KINDS = [ValueError, Boom, asyncio.CancelledError, RuntimeError, None]
    def listener(msgs):
        for m in msgs:
            start = time.time_ns()
            time.sleep(0.002)
            fail = {exc} and m.reconsume_times == 0 and m.queue_offset % 25 == 7
            line = f"{{pid}} {{m.queue_id}} {{m.queue_offset}} {{m.keys}} {{start}} {{time.time_ns()}} {{int(fail)}}\\n"
            os.write(log, line.encode())
            if fail:
                kind = KINDS[(m.queue_offset // 25) % len(KINDS)]
                if kind is None:
                    return ConsumeResult.RETRY_LATER
                raise kind("injected")
    consumer = LitePushConsumer(
        ConsumerConfig(group="g", lanes=4, commit_interval=0.05, poll_timeout=0.02, revoke_timeout=1.0,
                       suspend_ms=100),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, client_id={cid!r},
                                    balance=Balance.{balance}),
        listener=listener)
    consumer.subscribe("T")
    # Start together: a member that came up late (spawn and imports on a
    # busy machine) could find the run over.
    open({ready!r}, "w").close()
    while not os.path.exists({go!r}):
        time.sleep(0.005)
    consumer.start()
    time.sleep(600)
    """
)

_PRODUCER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    from lite_push.sources.embedded import EmbeddedBroker
    broker = EmbeddedBroker({path!r})
    broker.create_topic("T", 4)
    i = 0
    while True:
        res = broker.send_batch("T", [(b"%d-%d-" % (i, j) + b"x" * 300, "k%d" % (j % 13)) for j in range(100)])
        print(" ".join("%d:%d" % (q.queue_id, o) for q, o in sorted(res.last_offsets().items())), flush=True)
        i += 1
    """
)

Row = tuple[int, int, int, str, int, int, int]  # pid, queue, offset, key, start ns, end ns, failed


@dataclass
class RunResult:
    messages: int = 0
    lost: int = 0
    inversions: int = 0
    overlaps: int = 0
    duplicates: int = 0
    recovery: float | None = None
    notes: list[str] = field(default_factory=list)


def _read(path: Path) -> list[Row]:
    rows: list[Row] = []
    if path.exists():
        for line in path.read_text().splitlines():
            p = line.split()
            if len(p) == 7:
                rows.append((int(p[0]), int(p[1]), int(p[2]), p[3], int(p[4]), int(p[5]), int(p[6])))
    return rows


def overlaps_by_member(rows: list[Row] | list[tuple[int, int, int, str, int, int]], exempt: set[Row]) -> dict[int, int]:
    """Per member (pid), how many of its calls were still running when
    another member started a call of the same key (``exempt`` calls aside)."""
    by_key: dict[str, list[tuple[int, ...]]] = {}
    for r in rows:
        if r not in exempt:
            by_key.setdefault(r[3], []).append(r)  # type: ignore[arg-type]
    out: dict[int, int] = {}
    for items in by_key.values():
        items.sort(key=lambda r: r[4])
        last_end: dict[int, int] = {}
        for r in items:
            for pid, end in last_end.items():
                if pid != r[0] and end > r[4]:
                    out[pid] = out.get(pid, 0) + 1
            last_end[r[0]] = max(last_end.get(r[0], 0), r[5])
    return out


def overlaps(rows: list[Row], exempt: set[Row]) -> int:
    """Calls of one key by two members at once (``exempt`` calls aside)."""
    return sum(overlaps_by_member(rows, exempt).values())


def inversions(rows: list[Row], exempt: set[Row]) -> int:
    """Per key, successful first deliveries out of offset order: one began
    before the one before it ended (that one ``exempt``: began before)."""
    first: dict[tuple[int, int], Row] = {}
    for r in sorted(rows, key=lambda r: r[4]):
        if not r[6]:
            first.setdefault((r[1], r[2]), r)
    by_key: dict[str, list[Row]] = {}
    for r in first.values():
        by_key.setdefault(r[3], []).append(r)
    n = 0
    for items in by_key.values():
        items.sort(key=lambda r: (r[1], r[2]))
        n += sum(1 for a, b in zip(items, items[1:], strict=False) if (a[4] if a in exempt else a[5]) > b[4])
    return n


def run_redis(scenario: str, messages: int, seed: int) -> RunResult:
    rng = random.Random(seed)
    res = RunResult(messages=messages)
    balance = "MESSAGE" if scenario.startswith("msg-") else "QUEUE"
    scenario = scenario.removeprefix("msg-")
    proxies: list[TcpProxy] = []
    with tempfile.TemporaryDirectory() as tmp, RedisServer() as server:
        ns = f"f-{uuid.uuid4().hex[:10]}"
        broker = RedisBroker(server.url, namespace=ns)
        broker.create_topic("T", queue_count=8)
        bad: set[tuple[int, int]] = set()
        if scenario == "malformed":
            client = broker.conn.client
            kinds = [{b"b": b"x", b"s": b"1"}, {b"b": b"x", b"m": b"{bad", b"s": b"1"}, {b"m": b"{}", b"s": b"1"}]
            for i in range(0, messages, 39):
                broker.send_batch("T", [(b"ok", f"k{(i + j) % 300}") for j in range(min(39, messages - i))])
                q = (i // 39) % 8
                off = int(client.incr(broker.queue_key("T", q, "seq"))) - 1
                client.xadd(broker.queue_key("T", q, "log"), kinds[(i // 39) % 3], id=f"{off + 1}-0")
                bad.add((q, off))
        else:
            broker.send_batch("T", [(b"x", f"k{i % 300}") for i in range(messages)])
        expected = {(q.queue_id, o) for q in broker.queues("T") for o in range(broker.max_offset(q))} - bad
        log = Path(tmp) / "deliveries.log"
        urls = [server.url] * 3
        if scenario == "partition":  # each member talks to Redis through a proxy of its own
            proxies = [TcpProxy("127.0.0.1", server.port).start() for _ in range(3)]
            urls = [f"redis://127.0.0.1:{p.port}" for p in proxies]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _MEMBER.format(
                        root=str(ROOT),
                        url=urls[i],
                        ns=ns,
                        log=str(log),
                        cid=f"m{i}",
                        exc=scenario == "listener-exc",
                        balance=balance,
                        ready=str(Path(tmp) / f"ready-{i}"),
                        go=str(Path(tmp) / "go"),
                    ),
                ],
                stdout=subprocess.DEVNULL,
                stderr=open(Path(tmp) / f"m{i}.err", "wb"),
            )
            for i in range(3)
        ]
        exempt: set[Row] = set()
        try:
            deadline = time.monotonic() + 60
            while not all((Path(tmp) / f"ready-{i}").exists() for i in range(3)) and time.monotonic() < deadline:
                time.sleep(0.01)
            (Path(tmp) / "go").touch()  # the members start together
            while len({r[0] for r in _read(log)}) < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            # A random moment mid-run: once 10-50 % of the messages are done
            # (a moment in time could come after the end of a fast run, or
            # after the victim finished its queues, and then there would be
            # no hand-off to measure).
            target = rng.uniform(0.1, 0.5) * len(expected)
            while len({(r[1], r[2]) for r in _read(log) if not r[6]}) < target and time.monotonic() < deadline:
                time.sleep(0.02)
            fault = time.time_ns()
            victim = rng.choice(procs)
            if scenario == "kill9":
                os.kill(victim.pid, signal.SIGKILL)
            elif scenario == "sigstop":
                os.kill(victim.pid, signal.SIGSTOP)
                time.sleep(4.0)
                cont = time.time_ns()
                os.kill(victim.pid, signal.SIGCONT)
            elif scenario == "partition":
                proxies[procs.index(victim)].partition()
                time.sleep(4.0)
                cont = time.time_ns()
                proxies[procs.index(victim)].heal()
            elif scenario == "redis-kill":
                server.kill()
                time.sleep(1.0)
                server.start()
                fault = time.time_ns()  # recovery counts from the restart
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                done = {(r[1], r[2]) for r in _read(log) if not r[6]}
                if expected <= done:
                    break
                time.sleep(0.05)
            time.sleep(0.3)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait(10)
            for proxy in proxies:
                proxy.close()
            broker.close()
        rows = _read(log)
        if scenario == "sigstop":  # the victim's calls in progress across its freeze
            exempt = {r for r in rows if r[0] == victim.pid and r[4] < cont and r[5] > fault}
            res.notes.append(f"{len(exempt)} call(s) in progress at the freeze")
        ok = [r for r in rows if not r[6]]
        done = {(r[1], r[2]) for r in ok}
        res.lost = len(expected - done)
        res.inversions = inversions(rows, exempt)
        res.overlaps = overlaps(rows, exempt)
        res.duplicates = len(ok) - len(done)
        if scenario in ("kill9", "sigstop", "partition") and balance == "QUEUE":
            held = {r[1] for r in rows if r[0] == victim.pid and fault - 500_000_000 < r[5] <= fault}
            after = [r[4] for r in rows if r[0] != victim.pid and r[1] in held and r[4] > fault]
            res.recovery = (min(after) - fault) / 1e9 if after else None
        elif scenario in ("kill9", "sigstop", "partition"):
            # by message every member works every queue: what moves is the
            # victim's keys (those it ran in its last 2 s before the fault);
            # recovered once every one of them ran again in another member
            keys = {r[3] for r in rows if r[0] == victim.pid and fault - 2_000_000_000 < r[5] <= fault}
            first: dict[str, int] = {}
            for r in rows:
                if r[0] != victim.pid and r[3] in keys and r[4] > fault:
                    first[r[3]] = min(first.get(r[3], r[4]), r[4])
            res.recovery = (max(first.values()) - fault) / 1e9 if first else None
        elif scenario == "redis-kill":  # the members' own word: "Redis connection back after X s"
            errs = " ".join((Path(tmp) / f"m{i}.err").read_text(errors="replace") for i in range(3))
            back = [float(x) for x in re.findall(r"Redis connection back after ([0-9.]+) s", errs)]
            res.recovery = max(back) if back else None
            res.notes.append("recovery: outage each member saw (server down 1 s)")
    return res


def run_embedded_kill(seed: int) -> RunResult:
    from lite_push.sources.embedded import EmbeddedBroker

    rng = random.Random(seed)
    res = RunResult()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "broker"
        child = subprocess.Popen(
            [sys.executable, "-c", _PRODUCER.format(root=str(ROOT), path=str(path))],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert child.stdout is not None
        lines: list[str] = []
        target = rng.randint(20, 80)
        while len(lines) < target:
            line = child.stdout.readline()
            if not line:
                break
            lines.append(line)
        os.kill(child.pid, signal.SIGKILL)
        fault = time.monotonic()
        child.wait(10)
        child.stdout.close()
        acked: dict[int, int] = {}
        for ln in lines:
            for pair in ln.split():
                q, o = map(int, pair.split(":"))
                acked[q] = max(acked.get(q, -1), o)
        b = EmbeddedBroker(path)
        res.recovery = time.monotonic() - fault
        try:
            queues = b.queues("T")
            res.messages = sum(acked.values()) + len(acked)
            res.lost = sum(max(0, acked.get(q.queue_id, -1) + 1 - b.max_offset(q)) for q in queues)
            res.notes.append(f"{sum(b.max_offset(q) for q in queues) - res.messages} unacknowledged kept")
        finally:
            b.close()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--messages", type=int, default=6000)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--seed", type=int, default=16)
    args = ap.parse_args()
    print(
        "| scenario | runs | messages | lost | inversions | overlaps | duplicates | recovery s (median, max) | notes |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    for scenario in args.scenarios.split(","):
        results = [
            run_embedded_kill(args.seed + i)
            if scenario == "embedded-kill"
            else run_redis(scenario, args.messages, args.seed + i)
            for i in range(args.runs)
        ]
        rec = [r.recovery for r in results if r.recovery is not None]
        recovery = f"{statistics.median(rec):.2f}, {max(rec):.2f}" if rec else "-"
        notes = "; ".join(n for r in results for n in r.notes[:1])
        print(
            f"| {scenario} | {len(results)} | {sum(r.messages for r in results)} | {sum(r.lost for r in results)} "
            f"| {sum(r.inversions for r in results)} | {sum(r.overlaps for r in results)} "
            f"| {sum(r.duplicates for r in results)} | {recovery} | {notes} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
