"""The lite_push runtime on the Redis Streams source, in one process: key
order, no loss, exact commits, parking with the offset map, and two members
sharing the queues."""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from helpers import Recorder, assert_offsets_increase, wait_for, wait_until
from member_runs import check_kill_run, lost_to_expiry, run_three_and_kill

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
    with _consumer(broker, lambda msgs: second.extend(m.queue_offset for m in msgs), "c2", lanes=8) as consumer:
        assert wait_until(lambda: set(second) == poison, timeout=30)
        # committed to the end: everything finished, nothing more to deliver
        end = broker.max_offset(q)
        wait_for(lambda: consumer.stats().committed.get(q) == end, 30, lambda: f"a commit at {end}: {consumer.stats()}")
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


def test_three_processes_one_killed_its_queues_move_and_keys_stay_ordered(server, tmp_path):
    ns = f"p-{uuid.uuid4().hex[:12]}"
    broker = RedisBroker(server.url, namespace=ns)
    broker.create_topic("T", queue_count=8)
    total = 12_000
    broker.send_batch("T", [(b"x", f"k{i % 300}") for i in range(total)])
    source_lines = (
        "from lite_push.sources import ConsumeFromWhere\n"
        "from lite_push.sources.redis import RedisBroker\n"
        f"broker = RedisBroker({server.url!r}, namespace={ns!r}, session_timeout=2.0, heartbeat_interval=0.3)\n"
        'source = broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, client_id="{cid}")\n'
    )
    run = run_three_and_kill(source_lines, tmp_path / "deliveries.log", total)
    stored = {(q.queue_id, o) for q in broker.queues("T") for o in range(broker_max(server, ns, q))}
    broker.close()
    # its queues were consumed again within the session timeout (2 s) plus slack
    check_kill_run(run, stored)


def test_cross_process_overlaps() -> None:
    rows = [(1, 0, 0, "a", 0, 10), (2, 0, 0, "a", 5, 12), (2, 0, 1, "b", 0, 3), (1, 0, 1, "b", 3, 4)]
    assert overlaps_by_member(rows, set()) == {1: 1}


def test_queues_lost_to_expiry() -> None:
    err = "group 'g': 'm1' lost ['T@redis#4', 'T@redis#7'] (its session expired)\nother line ['T@redis#2']\n"
    assert lost_to_expiry([err, ""]) == {4, 7}


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
