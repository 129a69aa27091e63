"""The key-affinity runtime on the embedded broker: ordering, concurrency,
commit safety, retries and shutdown; every test on each executor (threads,
asyncio, asyncio on uvloop: see ``executors.py``)."""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback

import pytest
from executors import EX
from helpers import PollCounter, Recorder, assert_offsets_increase, commit_pass, wait_consumed, wait_for, wait_until

from lite_push import (
    ConfigError,
    ConsumeFromWhere,
    ConsumeMode,
    ConsumerConfig,
    ConsumeResult,
    EmbeddedBroker,
    LitePushConsumer,
    LitePushError,
    ManualClock,
    MessageExt,
)
from lite_push._kernels.router import lane_of

pytestmark = pytest.mark.usefixtures("executor")


def make(broker, listener, group="g", topic="T", **cfg):
    cfg.setdefault("commit_interval", 0.05)
    cfg.setdefault("poll_timeout", 0.02)
    consumer = EX.consumer(
        ConsumerConfig(group=group, **cfg),
        source=broker.pull_consumer(group, consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener,
    )
    consumer.subscribe(topic)
    return consumer


def produce(broker, topic, n, keys, queue_count=4, start=0):
    broker.create_topic(topic, queue_count=queue_count)
    for i in range(start, start + n):
        broker.send(topic, body=f"m{i}".encode(), keys=None if keys is None else f"k{i % keys}")


@pytest.mark.parametrize("lanes", [1, 7, 32])
def test_key_orderly_same_key_never_concurrent_and_in_offset_order(lanes):
    broker = EmbeddedBroker()
    produce(broker, "T", 4000, keys=150)
    rec = Recorder(jitter=0.0004)
    with make(broker, rec, lanes=lanes, pull_batch_size=16) as consumer:
        wait_consumed(consumer, 4000)
    assert rec.overlaps == []
    assert_offsets_increase(rec.order)
    assert len(rec.seen) == 4000 and len(set(rec.seen)) == 4000


def test_concurrency_is_not_capped_by_queue_count():
    # One queue, 16 lanes: 16 keys on 16 different lanes must all be in the
    # listener at once (the barrier only opens when all 16 arrive).
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    keys, lanes_used = [], set()
    i = 0
    while len(keys) < 16:
        k = f"acct-{i}"
        i += 1
        if lane_of(k, 16) not in lanes_used:
            lanes_used.add(lane_of(k, 16))
            keys.append(k)
    for k in keys:
        broker.send("T", body=b"x", keys=k)
    barrier = threading.Barrier(16, timeout=20)
    broken = []

    def listener(msgs):
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            broken.append(msgs[0].keys)

    with make(broker, listener, lanes=16) as consumer:
        wait_consumed(consumer, 16)
    assert broken == []


def test_keyless_messages_keep_queue_order():
    broker = EmbeddedBroker()
    produce(broker, "T", 3000, keys=None, queue_count=3)
    rec = Recorder(jitter=0.0002, key_of=lambda m: m.queue_id)
    with make(broker, rec, lanes=16) as consumer:
        wait_consumed(consumer, 3000)
    assert rec.overlaps == []
    assert_offsets_increase(rec.order)
    assert sorted(len(v) for v in rec.order.values()) == [1000, 1000, 1000]


def test_concurrently_spreads_one_key_over_lanes():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    for _ in range(8):
        broker.send("T", body=b"x", keys="same-key")
    barrier = threading.Barrier(8, timeout=20)
    broken = []

    def listener(msgs):
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            broken.append(1)

    with make(broker, listener, lanes=8, mode=ConsumeMode.CONCURRENTLY) as consumer:
        wait_consumed(consumer, 8)
    assert broken == []


def test_concurrently_consumes_everything_once():
    broker = EmbeddedBroker()
    produce(broker, "T", 5000, keys=10)
    rec = Recorder(jitter=0.0002)
    with make(broker, rec, lanes=12, mode=ConsumeMode.CONCURRENTLY) as consumer:
        wait_consumed(consumer, 5000)
    assert len(rec.seen) == 5000 and len(set(rec.seen)) == 5000


@pytest.mark.parametrize("mode", [ConsumeMode.KEY_ORDERLY, ConsumeMode.CONCURRENTLY])
def test_commit_never_passes_a_message_in_the_listener_or_waiting_in_a_lane(mode):
    # Offset 5 of queue 0 is held in the listener while every other message
    # finishes.  Messages behind it in its lane wait; the rest complete.  The
    # committed offset must stop at exactly 5 until it is released.
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    for i in range(300):
        broker.send("T", body=b"x", keys=f"k{i % 40}")
    release = threading.Event()
    held = threading.Event()

    def listener(msgs):
        for m in msgs:
            if m.queue_offset == 5:
                held.set()
                assert release.wait(30)

    source_view = broker.pull_consumer("g")  # not subscribed: reads the group's offsets only
    consumer = make(broker, listener, lanes=8, mode=mode)
    q = broker.queues("T")[0]
    with consumer:
        assert held.wait(10)
        # everything not behind offset 5 in its lane finishes
        assert wait_until(lambda: sum(consumer.stats().in_flight.values()) < 300 and consumer.stats().consumed > 200)
        commit_pass(consumer, [q])  # a commit after that: still at 5
        assert consumer.stats().committed[q] == 5
        committed = source_view.committed(q)
        assert committed is not None and committed.offset == 5
        release.set()
        wait_consumed(consumer, 300)
        assert wait_until(lambda: consumer.stats().committed[q] == 300)
    source_view.close()


def test_listener_failure_is_retried_and_not_committed_until_success():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=2)
    for i in range(200):
        broker.send("T", body=b"x", keys=f"k{i % 20}")
    attempts: dict[tuple[int, int], list[int]] = {}
    lock = threading.Lock()
    ok_after = threading.Event()

    def listener(msgs):
        m = msgs[0]
        with lock:
            attempts.setdefault((m.queue_id, m.queue_offset), []).append(m.reconsume_times)
        if m.queue_offset == 3 and not ok_after.is_set():
            raise RuntimeError("boom")
        if m.queue_offset == 7 and m.reconsume_times < 2:
            return ConsumeResult.RETRY_LATER
        return None

    consumer = make(broker, listener, lanes=4, suspend_ms=10, max_reconsume_times=-1)
    with consumer:
        assert wait_until(lambda: len(attempts.get((0, 3), [])) >= 3 and len(attempts.get((1, 3), [])) >= 3)
        commit_pass(consumer, broker.queues("T"))  # a commit after the retries
        for q in broker.queues("T"):
            assert consumer.stats().committed[q] <= 3
        ok_after.set()
        wait_consumed(consumer, 200)
        assert wait_until(lambda: all(v == 100 for v in consumer.stats().committed.values()))
        assert consumer.stats().retried >= 6
    for qid in (0, 1):
        assert attempts[(qid, 7)] == [0, 1, 2]  # reconsume_times grows per retry
        assert attempts[(qid, 3)][:3] == [0, 1, 2]
    # the message after a failed one, same key, ran only after the retry succeeded
    assert all(len(v) == 1 for (q, off), v in attempts.items() if off not in (3, 7))


def test_retry_waits_suspend_ms_on_the_injected_clock():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    broker.send("T", body=b"x", keys="a")
    clock = ManualClock()
    times: list[float] = []

    def listener(msgs):
        times.append(clock.monotonic())
        if len(times) < 3:
            raise ValueError("not yet")

    consumer = EX.consumer(
        ConsumerConfig(group="g", suspend_ms=1500, poll_timeout=0.02),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener,
        clock=clock,
    )
    consumer.subscribe("T")
    polls = PollCounter(consumer._source)

    def scheduled():
        due = consumer.stats().next_retry_due
        return due is not None and due > clock.monotonic()

    with consumer:
        for n in (1, 2):
            assert wait_until(lambda n=n: len(times) == n and scheduled())
            clock.advance(1.4)  # not yet due: the pull thread goes round, no retry
            polls.turns(3)
            assert len(times) == n and scheduled()
            clock.advance(0.1)
            assert wait_until(lambda n=n: len(times) == n + 1)
        wait_consumed(consumer, 1)
    assert len(times) == 3
    assert times[1] - times[0] >= 1.5 and times[2] - times[1] >= 1.5


def test_invalid_listener_result_is_a_retry():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    broker.send("T", body=b"x", keys="a")
    results = iter(["weird", True, None])
    calls = []

    def listener(msgs):
        calls.append(1)
        return next(results)

    with make(broker, listener, suspend_ms=0) as consumer:
        wait_consumed(consumer, 1)
    assert len(calls) == 3


@pytest.mark.parametrize("drain", [False, True], ids=["stop", "drain"])
def test_shutdown_commits_what_finished_and_the_rest_comes_back(drain):
    """A stop lets the calls in flight finish and commits; by default what
    was never started is let go and a second run gets it (nothing lost);
    with drain_on_shutdown everything routed is processed first."""
    broker = EmbeddedBroker()
    produce(broker, "T", 2000, keys=50)
    rec = Recorder(jitter=0.002)
    consumer = make(broker, rec, lanes=8, commit_interval=3600.0, drain_on_shutdown=drain)
    consumer.start()
    assert wait_until(lambda: rec.count() > 100)
    assert consumer.shutdown(timeout=30.0) is True
    report = consumer.stop_report
    assert report is not None and report.clean and report.committed
    assert (report.unfinished == 0) if drain else (report.unfinished + rec.count() <= 2000)
    check = broker.pull_consumer("g")
    for q in broker.queues("T"):
        done = {off for (_t, qid, off) in rec.seen if qid == q.queue_id}
        committed = check.committed(q)
        at = committed.offset if committed else 0
        assert set(range(at)) <= done  # the commit never passes an unfinished message
        (qstop,) = [s for s in report.queues if s.queue == q]
        assert qstop.committed == (committed.offset if committed else None) and qstop.taken
        if drain:  # everything routed was processed, and committed at shutdown
            assert done == set(range(at))
    check.close()
    first = set(rec.seen)
    rest = Recorder()
    with make(broker, rest, lanes=8):
        every = {("T", q.queue_id, o) for q in broker.queues("T") for o in range(broker.max_offset(q))}
        assert len(every) == 2000
        assert wait_until(lambda: first | set(rest.seen) >= every)
    assert rest.overlaps == [] and rec.overlaps == []
    assert_offsets_increase(rest.order)


def test_shutdown_deadline_leaves_stuck_work_uncommitted(caplog):
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    for i in range(20):
        broker.send("T", body=b"x", keys=f"k{i}")
    stuck = threading.Event()
    release = threading.Event()
    finished: set[int] = set()

    def listener(msgs):
        if msgs[0].queue_offset == 4:
            stuck.set()
            release.wait(10)
            return ConsumeResult.RETRY_LATER  # (if it ever gets here) not finished
        finished.add(msgs[0].queue_offset)
        return None

    consumer = make(broker, listener, lanes=2, commit_interval=3600.0)
    consumer.start()
    assert stuck.wait(10)
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger="lite_push"):
        assert consumer.shutdown(timeout=0.3) is False
    assert time.monotonic() - t0 < 5
    release.set()
    # what the log says of it adds up: the one call given up, no "0 queued messages unprocessed"
    said = [r.getMessage() for r in caplog.records]
    assert any("1 listener call(s) still running when the stop gave up" in m for m in said), said
    assert not any(" 0 " in m and "unprocessed" in m for m in said), said
    report = consumer.stop_report
    assert report is not None and report.abandoned == 1 and not report.finished and report.committed
    assert "1 listener call given up at the deadline" in report.summary()
    check = broker.pull_consumer("g")
    committed = check.committed(broker.queues("T")[0])
    # nothing at or past the stuck message was committed ...
    assert committed is None or committed.offset <= 4
    check.close()
    # ... so a new consumer of the group gets it again
    unfinished = set(range(20)) - finished
    assert 4 in unfinished
    again = []
    with make(broker, lambda msgs: again.extend(m.queue_offset for m in msgs), lanes=2):
        # every message the first consumer's listener did not finish: the
        # stuck one and what its lane still held
        assert wait_until(lambda: unfinished <= set(again))
    assert min(again) <= 4


def test_lane_tasks_block_without_polling_when_idle():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    if EX.is_async:
        pytest.skip("lane threads only; idle lane coroutines await a future (test_async_executor)")
    consumer = make(broker, lambda msgs: None, lanes=4)
    with consumer:
        lanes = [t for t in threading.enumerate() if t.name.startswith("lite-push-lane-g-")]
        assert len(lanes) == 4

        def stacks() -> list[str]:
            frames = sys._current_frames()
            return ["".join(traceback.format_stack(frames[t.ident])) for t in lanes if t.ident in frames]

        # all four at once blocked on their lane's signal, not sleeping in a polling loop
        wait_for(
            lambda: sum("self._signal.acquire()" in s for s in stacks()) == 4,
            10,
            lambda: "every lane thread blocked in acquire():\n" + "\n".join(stacks()),
        )


def test_start_and_subscribe_errors():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    consumer = EX.consumer(ConsumerConfig(group="g"), source=broker.pull_consumer("g"), listener=lambda m: None)
    with pytest.raises(LitePushError, match="subscribe"):
        consumer.start()
    consumer.subscribe("T")
    consumer.start()
    with pytest.raises(LitePushError, match="already started"):
        consumer.start()
    with pytest.raises(LitePushError, match="before start"):
        consumer.subscribe("T")
    assert consumer.shutdown(timeout=5)


@pytest.mark.parametrize("kind", [list, tuple])
def test_subscribe_takes_a_list_or_tuple_of_topics(kind):
    """``subscribe(["A", "B"])`` consumes both topics, every message once;
    an empty list, or one with a name that is not a str, is refused with
    what is wrong before anything is subscribed."""
    broker = EmbeddedBroker()
    produce(broker, "A", 60, keys=6)
    produce(broker, "B", 40, keys=4)
    rec = Recorder()
    consumer = EX.consumer(
        ConsumerConfig(group="g", commit_interval=0.05, poll_timeout=0.02),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=rec,
    )
    with pytest.raises(ValueError, match="at least one topic"):
        consumer.subscribe(kind())
    with pytest.raises(TypeError, match="got 7 in"):
        consumer.subscribe(kind(["A", 7]))
    with pytest.raises(LitePushError, match="subscribe"):
        consumer.start()  # nothing was subscribed by the refused calls
    consumer.subscribe(kind(["A", "B"]))
    consumer.start()
    try:
        assert wait_until(lambda: rec.count() >= 100)
    finally:
        assert consumer.shutdown(timeout=10)
    assert sorted(t for (t, _q, _off) in rec.seen).count("A") == 60
    assert sorted(t for (t, _q, _off) in rec.seen).count("B") == 40
    assert len(set(rec.seen)) == 100


def test_stats_repr_is_one_summary_line():
    """``repr(consumer.stats())`` is one line that sums the per-queue maps
    up (the fields keep the detail)."""
    broker = EmbeddedBroker()
    produce(broker, "T", 200, keys=20, queue_count=64)
    rec = Recorder()
    consumer = make(broker, rec, lanes=16)
    consumer.start()
    try:
        assert wait_until(lambda: rec.count() >= 200)
        assert wait_until(lambda: consumer.stats().consumed >= 200)
        st = consumer.stats()
    finally:
        assert consumer.shutdown(timeout=10)
    text = repr(st)
    assert "\n" not in text and len(text) < 400, text
    assert "consumed=200" in text and "in 64 queues" in text and "lanes=16" in text, text
    assert len(st.in_flight) == 64  # the detail is still there


def test_listener_must_be_sync_for_thread_executor():
    if EX.is_async:
        pytest.skip("thread executor check (the asyncio one is in test_async_executor)")

    async def handler(msgs):
        return None

    broker = EmbeddedBroker()
    with pytest.raises(ConfigError) as info:
        LitePushConsumer(
            ConsumerConfig(group="g", executor="thread"), source=broker.pull_consumer("g"), listener=handler
        )
    assert info.value.field == "executor"
    # unset, the executor follows the listener (tests/test_listeners.py)
    consumer = LitePushConsumer(ConsumerConfig(group="g"), source=broker.pull_consumer("g"), listener=handler)
    assert consumer.config.executor == "asyncio"
    consumer.shutdown()


def test_key_extractor_routes_by_custom_key_and_survives_errors():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=2)
    for i in range(400):
        broker.send("T", body=f"acct-{i % 7}".encode(), keys=f"ignored-{i}", queue_id=i % 2)

    def extractor(m: MessageExt) -> str:
        if m.queue_offset == 10:
            raise KeyError("bad message")
        return m.body.decode()

    # the message whose key cannot be extracted is routed by its queue
    rec = Recorder(jitter=0.0003, key_of=lambda m: ("bad", m.queue_id) if m.queue_offset == 10 else m.body.decode())
    with make(broker, rec, lanes=16, key_extractor=extractor) as consumer:
        wait_consumed(consumer, 400)
    assert rec.overlaps == []
    assert_offsets_increase(rec.order)


def test_start_after_shutdown_says_so():
    """Issue 41: a consumer that was shut down (started or not) does not
    start again, and the error says why and what to do."""
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    for started in (True, False):
        consumer = make(broker, lambda msgs: None)
        if started:
            consumer.start()
        consumer.shutdown(timeout=5)
        with pytest.raises(LitePushError, match="was shut down and cannot start again: build a new one"):
            consumer.start()


def test_stop_now_on_a_running_consumer_stops_it_at_once():
    """stop_now() is a whole stop, not only a hurry: polling stops, the call
    running is given up after the grace, and shutdown() then returns."""
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    for i in range(10):
        broker.send("T", body=b"x", keys=f"k{i}")
    started, release = threading.Event(), threading.Event()

    def listener(msgs):
        started.set()
        release.wait(30)

    consumer = make(broker, listener, lanes=2)
    consumer.start()
    assert started.wait(10)
    consumer.stop_now()
    # the stop runs by itself (no shutdown() yet), and does not wait for the call
    assert wait_until(lambda: consumer.stop_report is not None, timeout=20)
    assert consumer.shutdown(timeout=60) is False
    release.set()
    report = consumer.stop_report
    assert report is not None and not report.finished and report.abandoned >= 1
