"""Failure handling: key parking, retries on the consumer's clock, the
dead-letter queue, send-back to the retry topic, and the offset map that
lets a queue flow past a parked key."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from executors import EX
from helpers import PollCounter, commit_pass, read_offset_log, wait_for, wait_until

from lite_push import (
    ConsumeFromWhere,
    ConsumeMode,
    ConsumerConfig,
    ConsumeResult,
    EmbeddedBroker,
    ManualClock,
    MessageExt,
    NonRetryableError,
)
from lite_push._state.offset_map import decode
from lite_push.codec import json_body, to_json


class Log:
    """Records every listener attempt: (key, offset, reconsume_times, ok)."""

    def __init__(self, fail=lambda m: False):
        self.lock = threading.Lock()
        self.attempts: list[tuple[str | None, int, int, bool]] = []
        self.fail = fail
        self.active: set[object] = set()
        self.overlaps: list[object] = []

    def __call__(self, msgs: list[MessageExt]):
        with self.lock:
            for m in msgs:
                if m.keys in self.active:
                    self.overlaps.append(m.keys)
                self.active.add(m.keys)
        try:
            result = None
            for m in msgs:
                bad = self.fail(m)
                with self.lock:
                    self.attempts.append((m.keys, m.queue_offset, m.reconsume_times, not bad))
                if bad:
                    if isinstance(bad, BaseException):
                        raise bad
                    result = bad if isinstance(bad, ConsumeResult) else ConsumeResult.RETRY_LATER
            return result
        finally:
            with self.lock:
                for m in msgs:
                    self.active.discard(m.keys)

    def of(self, key):
        with self.lock:
            return [a for a in self.attempts if a[0] == key]

    def ok_count(self, pred=lambda a: True):
        with self.lock:
            return sum(1 for a in self.attempts if a[3] and pred(a))


pytestmark = pytest.mark.usefixtures("executor")


def _consumer(broker, listener, clock=None, topic="T", **cfg):
    cfg.setdefault("poll_timeout", 0.02)
    cfg.setdefault("commit_interval", 0.05)
    consumer = EX.consumer(
        ConsumerConfig(group="g", **cfg),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener,
        clock=clock,
    )
    consumer.subscribe(topic)
    return consumer


def _retry_scheduled(consumer, clock) -> bool:
    """A parked key's retry is on the timer, due after the clock's now (so
    advancing the clock now will fire it)."""
    due = consumer.stats().next_retry_due
    return due is not None and due > clock.monotonic()


def _dlq(broker, group="g"):
    if "%DLQ%" + group not in broker.topics():
        return []
    return [m for q in broker.queues("%DLQ%" + group) for m in broker.messages(q)]


def test_poison_key_is_parked_while_its_lane_and_queue_flow_then_dead_lettered_in_order():
    # One queue, 1,000 healthy keys and one poisoned key whose first message
    # always fails; 5,000 messages, most of them behind the poison (more than
    # RocketMQ's 2000 span).  4 lanes: ~250 keys share the poison's lane.
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    items = []
    poison_offsets = []
    for i in range(5000):
        if i % 1000 == 10:
            poison_offsets.append(i)
            items.append((b"p", "POISON"))
        else:
            items.append((b"h", f"k{i % 1000}"))
    broker.send_batch("T", items)
    first = poison_offsets[0]
    log = Log(fail=lambda m: ValueError("bad account") if m.queue_offset == first else False)
    clock = ManualClock()
    consumer = _consumer(broker, log, clock, lanes=4, max_reconsume_times=2, suspend_ms=1000)
    polls = PollCounter(consumer._source)
    q = broker.queues("T")[0]
    healthy = 5000 - len(poison_offsets)
    with consumer:
        # the clock does not move: the poison waits, everything else finishes
        assert wait_until(lambda: log.ok_count(lambda a: a[0] != "POISON") == healthy)
        # a lane completes a segment after its last listener call returned: wait for that
        assert wait_until(lambda: consumer.stats().in_flight[q] == len(poison_offsets))
        st = consumer.stats()
        assert st.parked == len(poison_offsets)  # the failed head and the 4 behind it
        assert log.of("POISON") == [("POISON", first, 0, False)]
        # real time passes, clock time does not: no retry.  The retry is due
        # suspend_ms after the failure on the consumer's clock (not the real
        # one), and the pull thread, which fires due retries, goes round its
        # loop without firing it
        due = consumer.stats().next_retry_due
        assert due is not None and clock.monotonic() < due <= clock.monotonic() + 1.0
        polls.turns(3)
        assert consumer.stats().next_retry_due == due
        assert log.of("POISON") == [("POISON", first, 0, False)]
        # the commit is pinned at the poison, with the finished offsets above it in the map
        clock.advance(0.1)  # past commit_interval, not yet the retry
        assert wait_until(lambda: consumer.stats().committed[q] == first)
        assert log.of("POISON") == [("POISON", first, 0, False)]
        committed = broker.committed("g", q)
        fin = decode(committed.metadata, committed.offset)
        assert fin is not None and fin.end == 5000
        assert all((o in fin) == (o not in poison_offsets) for o in range(first, 5000))
        # two retries on the clock, then the dead-letter queue; the key moves on
        for attempt in (1, 2):
            assert wait_until(lambda: _retry_scheduled(consumer, clock))
            clock.advance(1.0)
            assert wait_until(lambda attempt=attempt: len(log.of("POISON")) >= attempt + 1), log.of("POISON")
        assert wait_until(lambda: consumer.stats().dead_lettered == 1)
        assert wait_until(lambda: log.ok_count(lambda a: a[0] == "POISON") == len(poison_offsets) - 1)
        clock.advance(0.1)
        assert wait_until(lambda: consumer.stats().committed[q] == 5000)
        assert consumer.stats().parked == 0
    attempts = log.of("POISON")
    assert [(o, r, ok) for _, o, r, ok in attempts] == [(first, 0, False), (first, 1, False), (first, 2, False)] + [
        (o, 0, True) for o in poison_offsets[1:]
    ]
    assert log.overlaps == []
    dead = _dlq(broker)
    assert len(dead) == 1
    d = dead[0]
    assert d.body == b"p" and d.keys == "POISON"
    assert d.properties["DLQ_REASON"] == "listener raised ValueError: bad account"
    assert "ValueError: bad account" in d.properties["DLQ_EXCEPTION"]
    assert d.properties["ORIGIN_OFFSET"] == str(first)
    assert int(d.properties["RECONSUME_TIME"]) == 2


def test_keyless_failure_parks_its_queue_order_not_the_lane():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    broker.send_batch("T", [(b"0", None), (b"1", "a"), (b"2", None), (b"3", "b")])
    log = Log(fail=lambda m: m.body == b"0" and m.reconsume_times == 0)
    clock = ManualClock()
    with _consumer(broker, log, clock, lanes=1, suspend_ms=500) as consumer:
        assert wait_until(lambda: log.ok_count() == 2)  # the keyed ones, on the same lane
        assert sorted(a[1] for a in log.attempts if a[3]) == [1, 3]
        assert wait_until(lambda: _retry_scheduled(consumer, clock))
        clock.advance(0.5)
        assert wait_until(lambda: log.ok_count() == 4)
    assert broker.committed("g", broker.queues("T")[0]).offset == 4  # the final commit
    keyless = [(o, r) for k, o, r, ok in log.attempts if k is None]
    assert keyless == [(0, 0), (0, 1), (2, 0)]  # queue order kept for keyless messages


@pytest.mark.parametrize("how", ["raise", "result"])
def test_non_retryable_goes_to_the_dlq_at_once(how):
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=2)
    broker.send_batch("T", [(b"x%d" % i, f"k{i % 7}") for i in range(100)])

    def fail(m):
        if m.queue_offset % 10 == 3:
            return NonRetryableError("unknown account") if how == "raise" else ConsumeResult.DLQ_NOW
        return False

    log = Log(fail)
    with _consumer(broker, log, ManualClock(), lanes=4) as consumer:
        bad = sum(1 for q in broker.queues("T") for m in broker.messages(q) if m.queue_offset % 10 == 3)
        assert wait_until(lambda: consumer.stats().dead_lettered == bad)
        assert wait_until(lambda: log.ok_count() == 100 - bad)
    assert sum(broker.committed("g", q).offset for q in broker.queues("T")) == 100
    assert all(r == 0 for _, _, r, _ in log.attempts)  # one attempt each
    dead = _dlq(broker)
    assert len(dead) == bad
    reason = "listener raised NonRetryableError: unknown account" if how == "raise" else "listener returned DLQ_NOW"
    assert {m.properties["DLQ_REASON"] for m in dead} == {reason}


def test_bad_json_is_retried_then_dead_lettered_with_the_reason():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    broker.send("T", to_json({"amount": 5}), keys="a")
    broker.send("T", b"{not json", keys="a")
    broker.send("T", to_json({"amount": 7}), keys="a")
    seen = []

    def listener(msgs):
        for m in msgs:
            seen.append(json_body(m)["amount"])

    clock = ManualClock()
    with _consumer(broker, listener, clock, lanes=2, max_reconsume_times=1, suspend_ms=100) as consumer:
        assert wait_until(lambda: consumer.stats().parked == 2 and _retry_scheduled(consumer, clock))
        clock.advance(0.1)
        assert wait_until(lambda: consumer.stats().dead_lettered == 1)
        assert wait_until(lambda: seen == [5, 7])
    (d,) = _dlq(broker)
    assert d.body == b"{not json"
    assert d.properties["DLQ_REASON"].startswith(
        "listener raised MessageDecodeError: cannot decode the body of T#0 offset 1"
    )


def test_unlimited_retries_never_dead_letter():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    broker.send("T", b"x", keys="a")
    log = Log(fail=lambda m: m.reconsume_times < 30)
    clock = ManualClock()
    with _consumer(broker, log, clock, lanes=1, max_reconsume_times=-1, suspend_ms=10) as consumer:
        for i in range(1, 31):
            assert wait_until(lambda i=i: len(log.attempts) == i and _retry_scheduled(consumer, clock))
            clock.advance(0.01)
        assert wait_until(lambda: len(log.attempts) == 31)
        assert wait_until(lambda: consumer.stats().consumed == 1)
        assert consumer.stats().dead_lettered == 0
    assert [r for _, _, r, _ in log.attempts] == list(range(31))


def test_queue_orderly_waits_whole_queue_then_dead_letters():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(50)])
    log = Log(fail=lambda m: m.queue_offset == 0)
    with _consumer(broker, log, mode=ConsumeMode.QUEUE_ORDERLY, max_reconsume_times=2, suspend_ms=20) as consumer:
        assert wait_until(lambda: consumer.stats().dead_lettered == 1)
        assert wait_until(lambda: consumer.stats().consumed == 49)
    # the baseline ran nothing else of the queue before the poison was dead-lettered
    assert [(o, r) for _, o, r, _ in log.attempts[:3]] == [(0, 0), (0, 1), (0, 2)]
    assert [o for _, o, _, _ in log.attempts[3:]] == list(range(1, 50))
    assert len(_dlq(broker)) == 1


def test_concurrently_sends_back_with_delay_levels_and_loses_nothing():
    clock = ManualClock(start=1_700_000_000.0)
    broker = EmbeddedBroker(clock=clock)
    broker.create_topic("T", queue_count=2)
    total = 300
    broker.send_batch("T", [(b"%d" % i, f"k{i}") for i in range(total)])
    rng = random.Random(7)
    fails = {i: rng.choice([0, 0, 1, 2, 3]) for i in range(total)}  # attempts that fail per message
    deliveries: dict[int, list[tuple[int, float]]] = defaultdict(list)
    lock = threading.Lock()

    def listener(msgs):
        for m in msgs:
            i = int(m.body)
            with lock:
                deliveries[i].append((m.reconsume_times, clock.time()))
            if m.reconsume_times < fails[i]:
                raise RuntimeError(f"transient {i}")

    consumer = _consumer(broker, listener, clock, mode=ConsumeMode.CONCURRENTLY, lanes=8, max_reconsume_times=2)
    levels = broker.delay_levels
    with consumer:
        # level 3 (10 s) for the first retry, 4 (30 s) for the second
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with lock:
                done = sum(1 for i in range(total) if deliveries[i] and (deliveries[i][-1][0] >= min(fails[i], 2)))
            if done == total and consumer.stats().sent_back == sum(min(f, 2) for f in fails.values()):
                break
            clock.advance(1.0)
            time.sleep(0.01)
        assert wait_until(lambda: consumer.stats().dead_lettered == sum(1 for f in fails.values() if f == 3))
        assert wait_until(lambda: sum(v for q, v in consumer.stats().committed.items() if q.topic == "T") == total)
    for i in range(total):
        times = deliveries[i]
        assert [r for r, _ in times] == list(range(min(fails[i], 2) + 1)), (i, times)
        for (r0, t0), (_, t1) in itertools.pairwise(times):
            assert t1 - t0 >= levels[3 - 1 + r0] - 1e-6, (i, times)  # never before its level's delay
    dead = _dlq(broker)
    assert sorted(int(m.body) for m in dead) == sorted(i for i, f in fails.items() if f == 3)


def test_send_back_failure_retries_locally_and_keeps_the_offset_uncommitted():
    clock = ManualClock()
    broker = EmbeddedBroker(clock=clock)
    broker.create_topic("T", queue_count=1)
    broker.send_batch("T", [(b"%d" % i, f"k{i}") for i in range(10)])
    attempts = []

    def listener(msgs):
        for m in msgs:
            attempts.append((int(m.body), m.reconsume_times))
            if int(m.body) == 4 and m.reconsume_times == 0:
                raise RuntimeError("boom")

    source = broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET)
    refused = []

    def failing_send_back(items):
        refused.extend(items)
        return [ConnectionError("broker down")] * len(items)

    source.send_back = failing_send_back  # type: ignore[method-assign]
    consumer = EX.consumer(
        ConsumerConfig(
            group="g", mode=ConsumeMode.CONCURRENTLY, lanes=2, poll_timeout=0.02, commit_interval=0.05, suspend_ms=500
        ),
        source=source,
        listener=listener,
        clock=clock,
    )
    consumer.subscribe("T")
    q = broker.queues("T")[0]
    with consumer:
        assert wait_until(lambda: len(refused) == 1)
        clock.advance(0.1)  # a commit, not yet the local retry
        assert wait_until(lambda: consumer.stats().committed.get(q) == 4)
        clock.advance(0.1)  # another commit interval, still not the local retry (0.5 s)
        commit_pass(consumer, [q])
        assert consumer.stats().committed[q] == 4  # never past the message whose send-back failed
        clock.advance(0.5)
        assert wait_until(lambda: (4, 1) in attempts)
        clock.advance(0.1)
        assert wait_until(lambda: consumer.stats().committed[q] == 10)
    assert sorted(attempts) == sorted([(i, 0) for i in range(10)] + [(4, 1)])


def test_shutdown_leaves_parked_messages_unfinished_and_the_restart_skips_what_finished(tmp_path):
    broker = EmbeddedBroker(path=tmp_path)
    broker.create_topic("T", queue_count=1)
    broker.send_batch("T", [(b"x", "P" if i in (3, 50) else f"k{i}") for i in range(200)])
    log = Log(fail=lambda m: m.keys == "P")
    clock = ManualClock()
    with _consumer(broker, log, clock, lanes=4, suspend_ms=60_000) as consumer:
        assert wait_until(lambda: log.ok_count() == 198)
        assert wait_until(lambda: consumer.stats().parked == 2)  # the lanes park after the failed calls return
    broker.close()

    broker = EmbeddedBroker(path=tmp_path)
    log2 = Log()
    with _consumer(broker, log2, lanes=4) as consumer:
        assert wait_until(lambda: log2.ok_count() == 2)
        q = broker.queues("T")[0]
        assert wait_until(lambda: consumer.stats().committed[q] == 200)
    # only the two parked messages ran again: the offset map skipped the rest
    assert sorted(o for _, o, _, _ in log2.attempts) == [3, 50]
    broker.close()


_CHILD = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {root!r})
    from lite_push import ConsumeFromWhere, ConsumerConfig, EmbeddedBroker, LitePushConsumer
    broker = EmbeddedBroker(path={path!r})
    log = os.open({log!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    def listener(msgs):
        for m in msgs:
            if m.keys.startswith("P"):
                raise RuntimeError("poisoned")  # parked for a minute: still parked at the kill
            os.write(log, f"{{m.queue_id}} {{m.queue_offset}}\\n".encode())
    consumer = LitePushConsumer(
        ConsumerConfig(group="g", lanes=8, commit_interval=0.02, poll_timeout=0.02, suspend_ms=60_000),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener)
    consumer.subscribe("T")
    consumer.start()
    time.sleep(600)
    """
)


def _commit_gap(offsets_file: Path, ends: dict[int, int], parked: set[tuple[int, int]]) -> str | None:
    """What group g's commits of topic T in a durable broker's
    ``offsets.json`` (read while another process runs the broker) still
    miss: each queue's commit must stop at its first ``parked`` offset with
    every other offset below ``ends[queue_id]`` finished in the map.
    ``None`` when nothing is missing."""
    try:
        queues = json.loads(offsets_file.read_bytes())["groups"]["g"]["T"]
    except (OSError, ValueError, KeyError) as e:
        return f"no commit of g on T yet ({e!r})"
    for qid, end in ends.items():
        entry = queues.get(str(qid))
        first = min(o for q, o in parked if q == qid)
        if entry is None or entry["offset"] != first:
            return f"queue {qid}: committed {entry}, not {first}"
        fin = decode(entry["metadata"], first)
        missing = [o for o in range(first + 1, end) if (qid, o) not in parked and (fin is None or o not in fin)]
        if missing:
            return f"queue {qid}: {len(missing)} finished offsets not in the map, e.g. {missing[:5]}"
    return None


def test_kill_9_with_parked_messages_loses_none_and_replays_only_the_unfinished(tmp_path):
    if EX.is_async:
        pytest.skip("the killed child runs the thread executor; once is enough")
    data, log = tmp_path / "broker", tmp_path / "done.log"
    broker = EmbeddedBroker(path=data)
    broker.create_topic("T", queue_count=2)
    total = 6000
    keys = [f"P{(i // 400) % 5}" if i % 400 == 7 else f"k{i % 700}" for i in range(total)]
    results = broker.send_batch("T", [(b"x", k) for k in keys])
    every = {(r.queue.queue_id, r.offset): k for r, k in zip(results, keys, strict=True)}
    poison = {qo for qo, k in every.items() if k.startswith("P")}
    broker.close()
    root = Path(__file__).resolve().parents[1]
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD.format(root=str(root), path=str(data), log=str(log))],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert wait_until(
            lambda: len(read_offset_log(log)) == total - len(poison) or child.poll() is not None, timeout=60
        )
        assert child.poll() is None, child.stderr.read().decode()
        # the child's last commit covers all it finished: at each queue's
        # first parked offset, every other offset above it in the map
        ends = {qid: 1 + max(o for q, o in every if q == qid) for qid in (0, 1)}
        offsets = data / "offsets.json"
        wait_for(
            lambda: _commit_gap(offsets, ends, poison) is None or child.poll() is not None,
            30,
            lambda: f"the child's commit of all it finished: {_commit_gap(offsets, ends, poison)}",
        )
        assert child.poll() is None, child.stderr.read().decode()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    first = read_offset_log(log)
    assert len(first) == len(set(first)) == total - len(poison)

    broker = EmbeddedBroker(path=data)
    assert {qid for qid, _ in poison} == {0, 1}
    for q in broker.queues("T"):  # committed at the first parked offset, the map above it
        c = broker.committed("g", q)
        assert c is not None and c.metadata
        assert c.offset == min(o for qid, o in poison if qid == q.queue_id)
    second: list[tuple[int, int]] = []
    lock = threading.Lock()

    def listener(msgs):
        with lock:
            second.extend((m.queue_id, m.queue_offset) for m in msgs)

    with _consumer(broker, listener, lanes=8) as consumer:
        assert wait_until(lambda: poison <= set(second), timeout=30)
        # everything finished and committed: nothing more can be delivered
        ends = {q: broker.max_offset(q) for q in broker.queues("T")}
        wait_for(lambda: consumer.stats().committed == ends, 30, lambda: f"commits at {ends}: {consumer.stats()}")
    broker.close()
    # no parked message lost, and only they ran again: nothing finished before the kill
    assert set(second) == poison, (sorted(set(second) - poison)[:10], sorted(poison - set(second))[:10])
    assert len(second) == len(poison)


def test_offset_map_budget_pauses_the_queue_and_counts_parked_messages():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    broker.send_batch("T", [(b"x", "P" if i % 10 == 0 else f"k{i}") for i in range(3000)])
    log = Log(fail=lambda m: m.keys == "P")
    clock = ManualClock()
    # The thread executor's count threshold and poll size on every executor
    # (asyncio's defaults would take the whole queue in one dispatch).
    cfg = dict(lanes=4, offset_map_max_bytes=400, suspend_ms=60_000, pull_threshold_for_queue=1000, pull_batch_size=32)
    with _consumer(broker, log, clock, **cfg) as consumer:
        q = broker.queues("T")[0]
        assert wait_until(lambda: q in consumer.stats().paused)

        def settled() -> bool:  # all that is not parked has run (a loaded machine may take a while)
            st = consumer.stats()
            return st.parked > 0 and st.in_flight[q] == st.parked

        assert wait_until(settled, timeout=30)  # parked messages count as in flight
        st = consumer.stats()
        # paused by the map's size (a few hundred bytes: a hundred-odd parked
        # offsets spread over ~1,000), long before the count threshold (1000)
        # or the end of the queue
        assert q in st.paused and 0 < st.parked < 300
        assert log.ok_count() + st.parked < 2000


def test_rebalance_hands_parked_messages_to_the_next_owner_without_waiting_for_them():
    from lite_push._kernels.router import lane_of

    poison_key = next(k for k in (f"P{i}" for i in range(100)) if lane_of(k, 2) == 1)  # lives in queue 1
    broker = EmbeddedBroker(session_timeout=60.0)
    broker.create_topic("T", queue_count=2)
    results = broker.send_batch("T", [(b"x", poison_key if i % 50 == 5 else f"k{i}") for i in range(2000)])
    poison = {(r.queue.queue_id, r.offset) for r, i in zip(results, range(2000), strict=True) if i % 50 == 5}
    log_a = Log(fail=lambda m: m.keys == poison_key)
    seen_b: list[tuple[int, int]] = []

    def listener_b(msgs):
        seen_b.extend((m.queue_id, m.queue_offset) for m in msgs)

    def member(listener, client_id, clock=None):
        c = EX.consumer(
            ConsumerConfig(
                group="g", lanes=4, poll_timeout=0.02, commit_interval=0.05, suspend_ms=60_000, revoke_timeout=30
            ),
            source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, client_id=client_id),
            listener=listener,
            clock=clock,
        )
        c.subscribe("T")
        return c

    a = member(log_a, "c1", ManualClock())
    with a:
        assert wait_until(lambda: log_a.ok_count() == 2000 - len(poison))
        assert a.stats().parked == len(poison)
        t0 = time.monotonic()
        # b joins the group here: queue 1 moves to b, and a drops its parked
        # messages (no 30 s revoke wait)
        with member(listener_b, "c2") as b:
            assert wait_until(lambda: set(seen_b) >= poison, timeout=8)
            assert time.monotonic() - t0 < 8
            q1 = broker.queues("T")[1]

            def b_done() -> bool:  # b committed what it owns to the end: it has nothing more to run
                committed = b.stats().committed
                return q1 in committed and all(o == broker.max_offset(q) for q, o in committed.items())

            wait_for(b_done, 30, lambda: f"b to commit its queues to the end: {b.stats()}")
        assert a.stats().parked == 0
    # b ran only what a had not finished: the offset map skipped the rest
    assert sorted(seen_b) == sorted(poison)


@pytest.mark.parametrize("seed", range(4))
def test_random_failures_under_concurrency_keep_key_order_and_lose_nothing(seed):
    # Real threads and clock: 16 lanes, 3 queues, 120 keys, random delays,
    # ~10 % of attempts fail (some dead-lettered after 2 retries).  Every
    # key's successes run in offset order, never two at once, and every
    # message ends consumed or dead-lettered.
    rng = random.Random(seed)
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=3)
    total = 3000
    broker.send_batch("T", [(b"%d" % i, f"k{rng.randrange(120)}") for i in range(total)])
    fails = {
        i: (9 if rng.random() < 0.01 else (rng.randrange(1, 3) if rng.random() < 0.08 else 0)) for i in range(total)
    }
    lock = threading.Lock()
    done: dict[str, list[tuple[int, int]]] = defaultdict(list)
    active: set[str] = set()
    overlaps = []
    local = random.Random(seed + 100)

    def listener(msgs):
        m = msgs[0]
        with lock:
            if m.keys in active:
                overlaps.append(m.keys)
            active.add(m.keys)
            pause = local.random() * 0.0005
        try:
            time.sleep(pause)
            if m.reconsume_times < fails[int(m.body)]:
                raise RuntimeError("transient")
            with lock:
                done[m.keys].append((m.queue_id, m.queue_offset))
        finally:
            with lock:
                active.discard(m.keys)

    with _consumer(broker, listener, lanes=16, suspend_ms=5, max_reconsume_times=2) as consumer:
        dead = sum(1 for f in fails.values() if f > 2)
        assert wait_until(
            lambda: consumer.stats().consumed == total - dead and consumer.stats().dead_lettered == dead, timeout=60
        ), consumer.stats()
    assert overlaps == []
    for key, seq in done.items():
        for q in {q for q, _ in seq}:
            offs = [o for qq, o in seq if qq == q]
            assert offs == sorted(offs), key
    assert sum(broker.committed("g", q).offset for q in broker.queues("T")) == total
    assert len(_dlq(broker)) == dead
