"""Three lite_push member processes of one group on the Kafka source, one
killed with SIGKILL mid-run: its partitions move to the survivors after its
session expires, nothing is lost, each key's messages stay in order and no
key runs in two processes at once.  The broker is librdkafka's mock cluster,
started here on 127.0.0.1 and stopped by its PID."""

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
from pathlib import Path

from helpers import wait_until

from lite_push.sources.kafka import KafkaBroker
from lite_push.sources.kafka.mock_cluster import MockKafkaCluster

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from fault_suite import overlaps_by_member  # noqa: E402  (benchmarks/ is put on sys.path above)

#: The members' session: the mock rebalances in (session - 1 s) per phase.
SESSION = 2.0

_MEMBER = textwrap.dedent(
    """
    import os, sys, time, logging
    sys.path.insert(0, {root!r})
    logging.basicConfig(level=logging.WARNING)
    from lite_push import ConsumerConfig, LitePushConsumer
    from lite_push.sources import ConsumeFromWhere
    from lite_push.sources.kafka import KafkaBroker
    broker = KafkaBroker({bootstrap!r}, session_timeout={session!r})
    log = os.open({log!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    pid = os.getpid()
    def listener(msgs):
        for m in msgs:
            start = time.time_ns()
            time.sleep(0.004)  # slow enough that the others join before one member is half done
            line = f"{{pid}} {{m.queue_id}} {{m.queue_offset}} {{m.keys}} {{start}} {{time.time_ns()}}\\n"
            os.write(log, line.encode())
    consumer = LitePushConsumer(
        ConsumerConfig(group="g", lanes=4, commit_interval=0.05, poll_timeout=0.02, revoke_timeout=1.0),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, client_id={cid!r}),
        listener=listener)
    consumer.subscribe("T")
    consumer.start()
    time.sleep(600)
    """
)


def _read_log(path: Path) -> list[tuple[int, int, int, str, int, int]]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 6:
                rows.append((int(parts[0]), int(parts[1]), int(parts[2]), parts[3], int(parts[4]), int(parts[5])))
    return rows


def _lost_to_expiry(stderrs: Iterable[str]) -> set[int]:
    """Partitions a member reported lost because its session expired."""
    lost: set[int] = set()
    for err in stderrs:
        for listed in re.findall(r"lost \[([^\]]*)\] \(its session expired\)", err):
            lost.update(int(q) for q in re.findall(r"#(\d+)'", listed))
    return lost


def test_three_members_one_killed_its_partitions_move_and_keys_stay_ordered(tmp_path):
    with MockKafkaCluster() as cluster:
        broker = KafkaBroker(cluster.bootstrap, topic_creator=cluster.create_topic)
        queues = broker.create_topic("T", 8)
        total = 12_000
        broker.send_batch("T", [(b"x", f"k{i % 300}") for i in range(total)])
        ends = {q.queue_id: broker.watermarks(q)[1] for q in queues}
        assert sum(ends.values()) == total
        log = tmp_path / "deliveries.log"
        root = str(Path(__file__).resolve().parents[1])
        procs = [
            subprocess.Popen(
                [sys.executable, "-c",
                 _MEMBER.format(root=root, bootstrap=cluster.bootstrap, session=SESSION, log=str(log), cid=f"m{i}")],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )  # fmt: skip
            for i in range(3)
        ]
        try:
            # all three members consuming (each has its share of the partitions)
            assert wait_until(
                lambda: len({r[0] for r in _read_log(log)}) == 3 or any(p.poll() is not None for p in procs),
                timeout=60,
            )
            assert all(p.poll() is None for p in procs), [
                p.stderr.read().decode()[-2000:] for p in procs if p.poll() is not None  # type: ignore[union-attr]
            ]
            rows = _read_log(log)
            assert len(rows) < total // 2  # killed mid-run
            busiest = max({r[0] for r in rows}, key=lambda pid: sum(1 for r in rows if r[0] == pid))
            victim = next(p for p in procs if p.pid == busiest)
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(10)
            killed_at = time.time_ns()
            assert wait_until(lambda: len({(q, o) for _, q, o, _, _, _ in _read_log(log)}) == total, timeout=90)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
                    p.wait(10)
            broker.close()
    rows = _read_log(log)
    errs = {p.pid: p.stderr.read().decode(errors="replace") for p in procs if p is not victim}  # type: ignore[union-attr]
    expired = _lost_to_expiry(errs.values())
    # every message processed at least once
    assert {(q, o) for _, q, o, _, _, _ in rows} == {(q, o) for q, end in ends.items() for o in range(end)}
    # each key's first deliveries in offset order, never overlapping, across processes
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
    # over all deliveries (duplicates too), no key ran in two processes at
    # once, except a call in progress when the machine froze a whole
    # survivor past its session (it reports the loss)
    overlaps = overlaps_by_member(rows, set())
    stalled = {pid for pid, err in errs.items() if _lost_to_expiry([err])}
    assert all(pid in stalled for pid in overlaps), overlaps
    # duplicates only from the partitions the killed member owned, after the kill
    victim_queues = {q for pid, q, *_ in rows if pid == victim.pid}
    seen: dict[tuple[int, int], int] = {}
    for _pid, q, o, *_rest in rows:
        seen[(q, o)] = seen.get((q, o), 0) + 1
    dups = {qo for qo, n in seen.items() if n > 1 and qo[0] not in expired}
    assert {q for q, _ in dups} <= victim_queues, (victim.pid, victim_queues, sorted(dups)[:10])
    # the partitions it held at the kill were consumed again within the
    # session timeout, the mock's two rebalance phases and slack
    held = {q for pid, q, o, k, s, e in rows if pid == victim.pid and e > killed_at - 500_000_000}
    assert held
    for q in held:
        later = [s for pid, qq, o, k, s, e in rows if qq == q and pid != victim.pid and s > killed_at]
        if later:
            assert min(later) - killed_at < 15_000_000_000, (q, (min(later) - killed_at) / 1e9)
