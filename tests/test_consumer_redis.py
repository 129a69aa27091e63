"""The lite_push runtime on the Redis Streams source, in one process: key
order, no loss, exact commits, parking with the offset map, and two members
sharing the queues."""

from __future__ import annotations

import itertools
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import redis
from helpers import Recorder, assert_offsets_increase, wait_until

from lite_push import ConsumeMode, ConsumerConfig, LitePushConsumer, ManualClock
from lite_push.sources import ConsumeFromWhere
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer

# the fault suite's measures (benchmarks/ imports flat, as test_fault_suite does)
BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from fault_suite import overlaps_by_member  # noqa: E402  (benchmarks/ is put on sys.path above)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(appendonly=False) as s:
        yield s


@pytest.fixture
def broker(server: RedisServer) -> Iterator[RedisBroker]:
    b = RedisBroker(server.url, namespace=f"c-{uuid.uuid4().hex[:12]}", session_timeout=5.0, heartbeat_interval=0.5)
    yield b
    b.close()


def _consumer(broker, listener, client_id, clock=None, **cfg):
    cfg.setdefault("poll_timeout", 0.02)
    cfg.setdefault("commit_interval", 0.05)
    cfg.setdefault("revoke_timeout", 3.0)  # + fence_margin inside the 5 s session
    consumer = LitePushConsumer(
        ConsumerConfig(group="g", **cfg),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, client_id=client_id),
        listener=listener,
        clock=clock,
    )
    consumer.subscribe("T")
    return consumer


@pytest.mark.parametrize("mode", [ConsumeMode.KEY_ORDERLY, ConsumeMode.QUEUE_ORDERLY])
def test_runtime_on_redis_keeps_key_order_and_commits_everything(broker, mode):
    broker.create_topic("T", queue_count=4)
    total = 3000
    broker.send_batch("T", [(b"x", f"k{i % 97}") for i in range(total)])
    rec = Recorder(jitter=0.0002)
    with _consumer(broker, rec, "c1", lanes=16, mode=mode) as consumer:
        assert wait_until(lambda: consumer.stats().consumed == total, timeout=60)
    assert rec.overlaps == []
    assert_offsets_increase(rec.order)
    assert len(set(rec.seen)) == total
    assert sum(broker.committed("g", q).offset for q in broker.queues("T")) == total


def test_parked_key_on_redis_commits_the_offset_map_and_the_next_member_replays_only_it(broker):
    broker.create_topic("T", queue_count=1)
    broker.send_batch("T", [(b"x", "P" if i % 100 == 5 else f"k{i}") for i in range(1000)])
    poison = {i for i in range(1000) if i % 100 == 5}
    done: list[int] = []
    lock = threading.Lock()

    def first(msgs):
        for m in msgs:
            if m.keys == "P":
                raise RuntimeError("poisoned")
            with lock:
                done.append(m.queue_offset)

    clock = ManualClock()
    with _consumer(broker, first, "c1", clock, lanes=8, suspend_ms=60_000) as consumer:
        assert wait_until(lambda: len(done) == 1000 - len(poison), timeout=30)
        clock.advance(0.1)  # a commit, not the retry
        q = broker.queues("T")[0]
        assert wait_until(lambda: consumer.stats().committed[q] == 5)
    c = broker.committed("g", q)
    assert c is not None and c.offset == 5 and c.metadata
    second: list[int] = []
    with _consumer(broker, lambda msgs: second.extend(m.queue_offset for m in msgs), "c2", lanes=8):
        assert wait_until(lambda: set(second) == poison, timeout=30)
        time.sleep(0.2)
    assert sorted(second) == sorted(poison)  # the offset map skipped everything that had finished


def test_two_members_share_the_queues_without_breaking_key_order(broker):
    broker.create_topic("T", queue_count=8)
    total = 4000
    broker.send_batch("T", [(b"x", f"k{i % 200}") for i in range(total)])
    rec = Recorder(jitter=0.0003)
    a = _consumer(broker, rec, "c1", lanes=8)
    b = _consumer(broker, rec, "c2", lanes=8)
    with a:
        assert wait_until(lambda: rec.count() > 500, timeout=30)
        with b:  # joins mid-run: queues move from a to b after a drained and committed them
            assert wait_until(lambda: len(set(rec.seen)) == total, timeout=60)
            assert len(b.stats().committed) > 0
    assert rec.overlaps == []
    assert_offsets_increase(rec.order, first_only=True)


_MEMBER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {root!r})
    from lite_push import ConsumerConfig, LitePushConsumer
    from lite_push.sources import ConsumeFromWhere
    from lite_push.sources.redis import RedisBroker
    broker = RedisBroker({url!r}, namespace={ns!r}, session_timeout=2.0, heartbeat_interval=0.3)
    log = os.open({log!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    pid = os.getpid()
    def listener(msgs):
        for m in msgs:
            start = time.time_ns()
            time.sleep(0.002)
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


def test_three_processes_one_killed_its_queues_move_and_keys_stay_ordered(server, tmp_path):
    ns = f"p-{uuid.uuid4().hex[:12]}"
    broker = RedisBroker(server.url, namespace=ns)
    broker.create_topic("T", queue_count=8)
    total = 12_000
    broker.send_batch("T", [(b"x", f"k{i % 300}") for i in range(total)])
    log = tmp_path / "deliveries.log"
    root = str(Path(__file__).resolve().parents[1])
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _MEMBER.format(root=root, url=server.url, ns=ns, log=str(log), cid=f"m{i}")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for i in range(3)
    ]
    try:
        # all three members consuming (each has its share of the queues)
        assert wait_until(
            lambda: len({r[0] for r in _read_log(log)}) == 3 or any(p.poll() is not None for p in procs), timeout=60
        )
        assert all(p.poll() is None for p in procs), [
            p.stderr.read().decode()[-2000:] for p in procs if p.poll() is not None
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
    rows = _read_log(log)
    broker.close()
    # A survivor the machine stalled for longer than the session timeout lost
    # its queues too (it says so): duplicates there are at-least-once, not a
    # failed hand-off.
    errs = {p.pid: p.stderr.read().decode(errors="replace") for p in procs if p is not victim}
    expired = _queues_lost_to_expiry(errs.values())
    # every message processed at least once
    assert {(q, o) for _, q, o, _, _, _ in rows} == {
        (q.queue_id, o) for q in broker.queues("T") for o in range(broker_max(server, ns, q))
    }
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
    # and over all deliveries (duplicates too), no key ever ran in two
    # processes at once: the fence stops a member before its session lapses.
    # The one exception no client can prevent: a call in progress when the
    # machine froze a whole survivor past its session (one per lane of a
    # member that reported the loss).
    overlaps = overlaps_by_member(rows, set())
    stalled = {pid for pid, err in errs.items() if _queues_lost_to_expiry([err])}
    assert all(pid in stalled for pid in overlaps), overlaps
    assert all(n <= 4 for n in overlaps.values()), overlaps
    # duplicates only from the queues the killed process owned, after the kill
    victim_queues = {q for pid, q, *_ in rows if pid == victim.pid}
    assert victim_queues
    seen: dict[tuple[int, int], int] = {}
    for _pid, q, o, *_rest in rows:
        seen[(q, o)] = seen.get((q, o), 0) + 1
    dups = {qo for qo, n in seen.items() if n > 1 and qo[0] not in expired}
    where = {
        q: sorted(
            {(pid, round((s - killed_at) / 1e9, 2)) for pid, qq, o, k, s, e in rows if qq == q and (qq, o) in dups}
        )[:6]
        for q in {q for q, _ in dups}
    }
    assert {q for q, _ in dups} <= victim_queues, (victim.pid, victim_queues, where)
    assert all(s >= killed_at - 5_000_000_000 for pid, q, o, k, s, e in rows if (q, o) in dups and pid != victim.pid), (
        where
    )
    # its queues were consumed again within the session timeout (2 s) plus slack
    # the queues it held at the kill (it delivered on them in its last 0.5 s)
    # were consumed again by the others within the session timeout (2 s) plus slack
    held = {q for pid, q, o, k, s, e in rows if pid == victim.pid and e > killed_at - 500_000_000}
    assert held
    for q in held:
        if not any(pid != victim.pid and qq == q and s > killed_at for pid, qq, o, k, s, e in rows):
            # nothing of q ran after the kill: the victim had finished all of it
            assert all(any(r[0] == victim.pid and r[1] == q and r[2] == o for r in rows) for qq, o in seen if qq == q)
            continue
        resumed = min(s for pid, qq, o, k, s, e in rows if qq == q and pid != victim.pid and s > killed_at)
        assert resumed - killed_at < 15_000_000_000, (q, (resumed - killed_at) / 1e9)


def test_cross_process_overlaps() -> None:
    rows = [(1, 0, 0, "a", 0, 10), (2, 0, 0, "a", 5, 12), (2, 0, 1, "b", 0, 3), (1, 0, 1, "b", 3, 4)]
    assert overlaps_by_member(rows, set()) == {1: 1}


def _queues_lost_to_expiry(stderrs: Iterable[str]) -> set[int]:
    """Queue ids a member reported lost because its session expired
    (``RedisPullConsumer``'s warning)."""
    lost: set[int] = set()
    for err in stderrs:
        for listed in re.findall(r"lost \[([^\]]*)\] \(its session expired\)", err):
            lost.update(int(q) for q in re.findall(r"#(\d+)'", listed))
    return lost


def test_queues_lost_to_expiry() -> None:
    err = "group 'g': 'm1' lost ['T@redis#4', 'T@redis#7'] (its session expired)\nother line ['T@redis#2']\n"
    assert _queues_lost_to_expiry([err, ""]) == {4, 7}


def broker_max(server: RedisServer, ns: str, q) -> int:
    b = RedisBroker(server.url, namespace=ns)
    try:
        return b.max_offset(q)
    finally:
        b.close()


def test_redis_restarted_mid_run_consumption_resumes_and_nothing_is_lost(tmp_path, caplog):
    # kill -9 the server while the runtime consumes and commits; with the AOF
    # fsynced on every write, everything acknowledged before the kill is there
    # after the restart on the same port
    caplog.set_level(logging.DEBUG, logger="lite_push")
    with RedisServer(data_dir=tmp_path / "redis", appendonly=True) as server:
        broker = RedisBroker(server.url, namespace="restart", session_timeout=5.0, heartbeat_interval=0.5)
        broker.create_topic("T", queue_count=4)
        half = 2000
        broker.send_batch("T", [(b"x", f"k{i % 50}") for i in range(half)])
        rec = Recorder(jitter=0.01)
        # at most 4 x 50 messages buffered: most of the run waits in Redis
        consumer = _consumer(broker, rec, "c1", lanes=4, pull_threshold_for_queue=50)
        with consumer:
            assert wait_until(lambda: rec.count() > 300, timeout=30)
            assert rec.count() < half  # mid-run
            server.kill()
            down_at = rec.count()
            time.sleep(1.5)  # polls, commits and heartbeats fail; lanes finish what they hold
            server.start()
            assert rec.count() < half  # the rest waited in Redis
            assert down_at <= rec.count()
            broker.send_batch("T", [(b"y", f"k{i % 50}") for i in range(half)])
            assert wait_until(lambda: len(set(rec.seen)) == 2 * half, timeout=60)
            queues = broker.queues("T")
            assert wait_until(lambda: sum(consumer.stats().committed.get(q, 0) for q in queues) == 2 * half, timeout=30)
        assert sum(broker.committed("g", q).offset for q in queues) == 2 * half
        assert {(q.queue_id, o) for q in queues for o in range(broker.max_offset(q))} == {
            (qid, o) for _, qid, o in rec.seen
        }
        broker.close()
    assert rec.overlaps == []
    assert_offsets_increase(rec.order, first_only=True)
    # the outage was logged once per episode: one warning for the lost
    # connection (the source) and at most one per failing call of the
    # runtime, not one per poll or per commit
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("connection lost" in w for w in warnings) == 1, warnings
    assert sum(w.startswith("commit failed") for w in warnings) <= 1, warnings
    assert sum("poll failed" in w for w in warnings) <= 1, warnings


@pytest.fixture
def cluster_broker(redis_cluster) -> Iterator[RedisBroker]:
    client = redis.RedisCluster.from_url(redis_cluster.url)
    b = RedisBroker(client, namespace=f"c-{uuid.uuid4().hex[:12]}", session_timeout=5.0, heartbeat_interval=0.5)
    yield b
    b.close()
    client.close()


def test_runtime_on_a_redis_cluster_produces_and_consumes_in_key_order(cluster_broker):
    broker = cluster_broker
    queues = broker.create_topic("T", queue_count=6)
    slots = {broker.client.keyslot(broker.queue_key("T", q.queue_id, "log")) for q in queues}
    owners = {broker.client.nodes_manager.get_node_from_slot(s).port for s in slots}
    assert len(owners) > 1  # the queues really are spread over the masters
    total = 3000
    broker.send_batch("T", [(b"x", f"k{i % 120}") for i in range(total)])
    rec = Recorder(jitter=0.0002)
    a = _consumer(broker, rec, "c1", lanes=8)
    b = _consumer(broker, rec, "c2", lanes=8)
    with a, b:
        assert wait_until(lambda: len(set(rec.seen)) == total, timeout=60)
        assert wait_until(
            lambda: sum(c.stats().committed.get(q, 0) for c in (a, b) for q in queues) == total, timeout=30
        )
    assert rec.overlaps == []
    assert_offsets_increase(rec.order, first_only=True)
    assert sum(broker.committed("g", q).offset for q in queues) == total


def _inject(broker: RedisBroker, topic: str, qid: int, fields: dict[bytes, bytes]) -> int:
    """Append an entry lite_push did not write (as a foreign producer or a
    bad migration would) at the queue's next offset; return the offset."""
    client = broker.conn.client
    off = int(client.incr(broker.queue_key(topic, qid, "seq"))) - 1
    client.xadd(broker.queue_key(topic, qid, "log"), fields, id=f"{off + 1}-0")
    return off


def test_malformed_entries_go_to_the_dlq_and_the_member_goes_on(broker):
    """Issue 16.3: entries the source cannot decode are dead-lettered with
    the reason; every good message runs, in key order, and the commit
    passes the bad ones."""
    from lite_push import dlq

    broker.create_topic("T", queue_count=2)
    bad = {
        b"missing meta": {b"b": b"no-meta", b"s": b"1"},
        b"not json": {b"b": b"bad-json", b"m": b"{not json", b"s": b"1"},
        b"no body": {b"m": b"{}", b"s": b"1"},
        b"bad stored": {b"b": b"bad-s", b"m": b"{}", b"s": b"yesterday"},
    }
    expected_bad = set()
    good = 0
    for _round in range(5):
        broker.send_batch("T", [(b"ok", f"k{i % 7}") for i in range(20)])
        good += 20
        for j, fields in enumerate(bad.values()):
            expected_bad.add((j % 2, _inject(broker, "T", j % 2, fields)))
    rec = Recorder()
    with _consumer(broker, rec, "c1", lanes=4) as consumer:
        assert wait_until(lambda: rec.count() == good, timeout=30)
        ends = {q: broker.max_offset(q) for q in broker.queues("T")}
        assert wait_until(lambda: all(consumer.stats().committed.get(q) == e for q, e in ends.items()), timeout=30)
    assert rec.overlaps == []
    assert_offsets_increase(rec.order)
    letters = dlq.dead_letters(broker, "g")
    assert {(d.origin_queue_id, d.origin_offset) for d in letters} == expected_bad
    assert all(d.reason.startswith("malformed entry") for d in letters)
