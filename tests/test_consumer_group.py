"""Several consumers of one group, rebalance hand-off, and restarts of a
durable broker (clean and ``kill -9``)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from helpers import Recorder, assert_offsets_increase, read_offset_log, wait_until
from prometheus_client import CollectorRegistry

from lite_push import ConsumeFromWhere, ConsumerConfig, EmbeddedBroker, LitePushConsumer, MessageQueue

ROOT = Path(__file__).resolve().parents[1]


def _consumer(broker, listener, client_id, **cfg):
    cfg.setdefault("commit_interval", 0.05)
    cfg.setdefault("poll_timeout", 0.02)
    consumer = LitePushConsumer(
        ConsumerConfig(group="g", **cfg),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, client_id=client_id),
        listener=listener,
    )
    consumer.subscribe("T")
    return consumer


def test_members_join_and_leave_without_breaking_key_order():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=8)
    total = 6000
    rec = Recorder(jitter=0.0003)
    stop = threading.Event()

    def producer():
        for i in range(total):
            broker.send("T", body=b"x", keys=f"k{i % 300}")
            if i % 200 == 0:
                time.sleep(0.01)
            if stop.is_set():
                return

    a = _consumer(broker, rec, "c1", lanes=8)
    b = _consumer(broker, rec, "c2", lanes=8)
    c = _consumer(broker, rec, "c3", lanes=8)
    t = threading.Thread(target=producer)
    a.start()
    t.start()
    try:
        assert wait_until(lambda: rec.count() > 800)
        b.start()  # join: queues move from a to b
        assert wait_until(lambda: len(b.stats().committed) > 0)
        c.start()
        assert wait_until(lambda: len(c.stats().committed) > 0)
        assert wait_until(lambda: rec.count() > 3500)
        assert a.shutdown(timeout=10)  # leave: its queues move to b and c
        t.join(30)
        assert wait_until(lambda: len({s for s in rec.seen}) == total, timeout=60)
    finally:
        stop.set()
        for cons in (a, b, c):
            cons.shutdown(timeout=10)
    assert rec.overlaps == [], rec.overlaps[:5]  # never concurrent, across members
    assert_offsets_increase(rec.order, first_only=True)
    assert len(set(rec.seen)) == total


def test_durable_broker_resumes_from_committed_offsets_after_clean_shutdown(tmp_path):
    broker = EmbeddedBroker(path=tmp_path)
    broker.create_topic("T", queue_count=3)
    for i in range(1500):
        broker.send("T", body=b"x", keys=f"k{i % 50}")
    rec1 = Recorder()

    def first(msgs):
        # offset 250 of every queue fails until the shutdown: its lane stops
        # there, the other lanes finish everything they hold
        if msgs[0].queue_offset == 250:
            raise RuntimeError("stop here")
        rec1(msgs)

    cons = _consumer(broker, first, "c1", lanes=4, suspend_ms=20, max_reconsume_times=-1)
    cons.start()
    last = [-1]

    def settled():
        n = rec1.count()
        done, last[0] = n == last[0], n
        return done and n > 0

    assert wait_until(settled, interval=0.3)
    cons.shutdown(timeout=0.5)
    broker.close()

    broker2 = EmbeddedBroker(path=tmp_path)
    probe = broker2.pull_consumer("g")
    committed, ends = {}, {}
    for q in broker2.queues("T"):
        c = probe.committed(q)
        committed[q.queue_id] = c.offset if c else 0
        ends[q.queue_id] = broker2.max_offset(q)
    probe.close()
    done1 = set(rec1.seen)
    for qid, off in committed.items():
        # the committed offset never passes an unfinished message ...
        assert all(("T", qid, o) in done1 for o in range(off))
        # ... and never passes the one that kept failing
        assert off <= 250
    assert sum(committed.values()) > 0
    rec2 = Recorder()
    cons2 = _consumer(broker2, rec2, "c1", lanes=4)
    with cons2:
        assert wait_until(lambda: len(done1 | set(rec2.seen)) == 1500)
    broker2.close()
    for qid, off in committed.items():
        offs = sorted(o for (_t, q, o) in rec2.seen if q == qid)
        # resumed exactly at the committed offset: nothing below it again
        assert not offs or offs[0] == off
        assert offs or off == ends[qid]
    assert len(done1 | set(rec2.seen)) == 1500


_CHILD = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {root!r})
    from lite_push import ConsumeFromWhere, ConsumerConfig, EmbeddedBroker, LitePushConsumer
    broker = EmbeddedBroker(path={path!r})
    log = os.open({log!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    def listener(msgs):
        time.sleep(0.0005)
        for m in msgs:
            os.write(log, f"{{m.queue_id}} {{m.queue_offset}}\\n".encode())
    consumer = LitePushConsumer(
        ConsumerConfig(group="g", lanes=8, commit_interval=0.02, poll_timeout=0.02),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener)
    consumer.subscribe("T")
    consumer.start()
    time.sleep(600)
    """
)


def test_kill_9_loses_nothing_committed_and_skips_nothing_uncommitted(tmp_path):
    data = tmp_path / "broker"
    log = tmp_path / "done.log"
    broker = EmbeddedBroker(path=data)
    broker.create_topic("T", queue_count=4)
    total = 20000
    broker.send_batch("T", ((b"p", f"k{i % 500}") for i in range(total)))
    broker.close()

    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD.format(root=str(ROOT), path=str(data), log=str(log))],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert wait_until(lambda: len(read_offset_log(log)) > 4000 or child.poll() is not None, timeout=60)
        assert child.poll() is None, child.stderr.read().decode()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    first = read_offset_log(log)
    assert 4000 < len(first) < total

    broker = EmbeddedBroker(path=data)
    done = set(first)
    probe = broker.pull_consumer("g")
    committed = {}
    ends = {q.queue_id: broker.max_offset(q) for q in broker.queues("T")}
    for q in broker.queues("T"):
        c = probe.committed(q)
        committed[q.queue_id] = c.offset if c else 0
        # nothing committed was unfinished: every offset below it was processed
        missing = [o for o in range(committed[q.queue_id]) if (q.queue_id, o) not in done]
        assert missing == [], (q, missing[:10])
    probe.close()
    assert sum(committed.values()) > 0

    rec = Recorder()
    cons = _consumer(broker, rec, "c9", lanes=8)
    with cons:
        assert wait_until(lambda: len(done | set((q, o) for _t, q, o in rec.seen)) == total, timeout=60)
    broker.close()
    second = [(q, o) for _t, q, o in rec.seen]
    # the restart began exactly at the committed offsets: nothing below them
    # again, nothing uncommitted skipped
    for qid, off in committed.items():
        offs = sorted(o for q, o in second if q == qid)
        assert (offs and offs[0] == off) or (not offs and off == ends[qid]), (qid, off, offs[:3])
    assert len(done | set(second)) == total


def _lanes_used(lanes: int, warn: bool, caplog) -> set[int]:  # type: ignore[no-untyped-def]
    import logging

    caplog.clear()
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=8)
    broker.send_batch("T", [(b"x", f"key-{i}") for i in range(4000)])  # the hash selector picks the queue
    used: set[int] = set()
    lock = threading.Lock()

    def listener(msgs):  # type: ignore[no-untyped-def]
        with lock:
            used.add(int(threading.current_thread().name.rsplit("-", 1)[1]))

    other = broker.pull_consumer("g", client_id="c0")  # owns q0-q3 (Averagely), consumes nothing
    other.subscribe("T")
    with caplog.at_level(logging.WARNING, logger="lite_push"):
        with _consumer(broker, listener, "c1", lanes=lanes, lane_placement="java") as c:  # owns q4-q7
            mine = sum(broker.max_offset(q) for q in broker.queues("T")[4:])
            assert wait_until(lambda: c.stats().consumed == mine, timeout=30)
            assert set(c.stats().committed) == set(broker.queues("T")[4:])
    other.close()
    warned = [r.getMessage() for r in caplog.records if "can reach only" in r.getMessage()]
    assert bool(warned) == warn, warned
    return used


def test_lanes_sharing_a_factor_with_the_queue_count_are_left_idle_and_the_runtime_says_so(caplog):
    # lane_placement="java": 16 lanes, 8 queues, 4 of them owned: queue q's
    # keys reach lanes q and q+8 only (the default placement by load uses
    # every lane: tests/test_placement.py)
    used = _lanes_used(16, True, caplog)
    assert used == {4, 5, 6, 7, 12, 13, 14, 15}
    # 17 lanes (coprime with 8): every lane gets keys, no warning
    assert _lanes_used(17, False, caplog) == set(range(17))


def _revoke_with_held_failures(broker: EmbeddedBroker, what: str) -> list[int]:
    """Member A holds a failure in every queue that only its pull thread can
    release (``what``: a dead letter the broker refuses, or a CONCURRENTLY
    send-back the broker refuses, retried locally in a minute); member B
    joins and must get a queue well before A's revoke_timeout (60 s).
    Returns the offset A committed on the queue it gave up."""
    from lite_push import ConsumeMode, ConsumeResult

    refuse = lambda group, items: [OSError("broker refuses")] * len(items)  # noqa: E731
    if what == "dead letter":
        broker.schedule.send_to_dlq = refuse  # type: ignore[method-assign]
        result, mode = ConsumeResult.DLQ_NOW, ConsumeMode.KEY_ORDERLY
    else:
        broker.schedule.send_back = refuse  # type: ignore[method-assign]
        result, mode = ConsumeResult.RETRY_LATER, ConsumeMode.CONCURRENTLY

    def listener(msgs):  # type: ignore[no-untyped-def]
        return result if msgs[0].body == b"bad" else None

    for q in (0, 1):
        broker.send("T", b"bad", keys=f"bad{q}", queue_id=q)
        for i in range(5):
            broker.send("T", b"ok", keys=f"k{q}-{i}", queue_id=q)
    a = _consumer(broker, listener, "a", mode=mode, revoke_timeout=60.0, suspend_ms=60_000)
    with a:
        assert wait_until(lambda: sum(a.stats().in_flight.values()) == 2 and a.stats().consumed == 10), a.stats()
        # B holds its first message until the offset is read: otherwise B
        # may consume the queue and commit past A's offset first
        hold = threading.Event()

        def held(msgs):  # type: ignore[no-untyped-def]
            hold.wait(10)

        b = _consumer(broker, held, "b", mode=mode, revoke_timeout=60.0, suspend_ms=60_000)
        with b:
            assert wait_until(lambda: len(b.stats().in_flight) == 1, timeout=20), "B never got a queue"
            (given,) = b.stats().in_flight
            om = broker.committed("g", given)
            hold.set()
    return [0 if om is None else om.offset]


def test_a_revoke_does_not_wait_for_a_dead_letter_the_broker_refused():
    """Issue 16.4: the revoked queue's unsent dead letter is left to the next
    owner at once (uncommitted), not held until revoke_timeout (60 s here)."""
    with EmbeddedBroker(session_timeout=120.0) as broker:
        broker.create_topic("T", queue_count=2)
        committed = _revoke_with_held_failures(broker, "dead letter")
    assert committed == [0]  # the refused dead letter (offset 0) stays unfinished: not lost


def test_a_revoke_does_not_wait_for_a_local_retry():
    with EmbeddedBroker(session_timeout=120.0) as broker:
        broker.create_topic("T", queue_count=2)
        committed = _revoke_with_held_failures(broker, "send-back")
    assert committed == [0]


def _rebalances(c: LitePushConsumer) -> int:
    snap = c.metrics_snapshot()
    assert snap is not None
    return snap.rebalances


class _HoldAtFailure(logging.Handler):
    """Holds each lane thread that logs a listener's failure (after the lane
    checked that its queue is still owned, before it hands the message to
    the pull thread) until ``go`` is set."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.held = threading.Semaphore(0)
        self.go = threading.Event()

    def handle(self, record: logging.LogRecord) -> bool:  # not emit: Handler.handle holds a lock around it
        if "RETRY_LATER" in record.getMessage():
            self.held.release()
            self.go.wait(30)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        pass


@pytest.mark.parametrize("refused", [False, True], ids=["sent-back", "refused"])
def test_a_failure_handed_off_while_its_queue_is_revoked_does_not_hold_the_revoke(refused: bool) -> None:
    """A listener call fails just before its queue is revoked, and its lane
    hands the message to the pull thread only once the revoke waits for the
    queue to drain: the pull thread, the one waiting, sends it back during
    the wait (or, refused, leaves it to the next owner), so the revoke ends
    at once rather than at revoke_timeout (60 s here)."""
    from lite_push import ConsumeMode, ConsumeResult

    hold = _HoldAtFailure()
    lane_log = logging.getLogger("lite_push._lanes.lane_failures")
    lane_log.addHandler(hold)
    revoked: list[list[MessageQueue]] = []
    try:
        with EmbeddedBroker(session_timeout=120.0) as broker:
            broker.create_topic("T", queue_count=2)
            if refused:
                broker.schedule.send_back = lambda group, items: [OSError("broker refuses")] * len(items)  # type: ignore[method-assign]
            for q in (0, 1):
                broker.send("T", b"bad", keys=f"bad{q}", queue_id=q)
            a = LitePushConsumer(
                ConsumerConfig(
                    group="g",
                    mode=ConsumeMode.CONCURRENTLY,
                    revoke_timeout=60.0,
                    suspend_ms=60_000,
                    commit_interval=0.05,
                    poll_timeout=0.02,
                ),
                source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, client_id="a"),
                listener=lambda msgs: ConsumeResult.RETRY_LATER,
                registry=CollectorRegistry(),  # metrics on: the revoke's start is counted
                on_revoked=revoked.append,
            )
            a.subscribe("T")
            with a:
                for _ in range(2):  # both lanes hold their failure, not yet handed off
                    assert hold.held.acquire(timeout=20)
                b = _consumer(broker, lambda msgs: None, "b", mode=ConsumeMode.CONCURRENTLY)
                with b:
                    assert wait_until(lambda: _rebalances(a) >= 1, timeout=20)  # A's revoke waits
                    hold.go.set()
                    assert wait_until(lambda: bool(revoked), timeout=10), "A's revoke waited for the hand-off"
    finally:
        hold.go.set()
        lane_log.removeHandler(hold)
