"""QUEUE_ORDERLY, the baseline: RocketMQ's orderly consumer with its three
locks.  Its concurrency is capped by the queue count; a failure suspends the
whole queue; a queue is consumed only while its broker lock is held."""

from __future__ import annotations

import threading
import time

from helpers import PollCounter, Recorder, assert_offsets_increase, wait_consumed, wait_for, wait_until

from lite_push import (
    ConsumeFromWhere,
    ConsumeMode,
    ConsumerConfig,
    ConsumeResult,
    EmbeddedBroker,
    LitePushConsumer,
    MessageQueue,
)


def _make(broker, listener, **cfg):
    cfg.setdefault("commit_interval", 0.05)
    cfg.setdefault("poll_timeout", 0.02)
    consumer = LitePushConsumer(
        ConsumerConfig(group="g", mode=ConsumeMode.QUEUE_ORDERLY, **cfg),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener,
    )
    consumer.subscribe("T")
    return consumer


class Concurrency:
    def __init__(self, delay: float) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0
        self.delay = delay

    def __call__(self, msgs):
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        time.sleep(self.delay)
        with self.lock:
            self.now -= 1


def test_concurrency_is_capped_by_the_queue_count_not_the_threads():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=3)
    broker.send_batch("T", ((b"x", f"k{i}") for i in range(600)))
    probe = Concurrency(0.002)
    with _make(broker, probe, consume_thread_min=20, consume_thread_max=20) as consumer:
        wait_consumed(consumer, 600)
    assert probe.peak == 3  # 20 threads, 600 keys, 3 queues: 3 at a time


def test_each_queue_runs_in_offset_order_one_message_at_a_time():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=4)
    broker.send_batch("T", ((b"x", f"k{i % 97}") for i in range(2000)))
    rec = Recorder(jitter=0.0002, key_of=lambda m: m.queue_id)
    with _make(broker, rec, max_continuous_consume=0.01) as consumer:  # yields often
        wait_consumed(consumer, 2000)
    assert rec.overlaps == []
    assert_offsets_increase(rec.order)
    assert len(set(rec.seen)) == 2000


def test_a_failure_suspends_the_whole_queue():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=2)
    for i in range(40):
        broker.send("T", body=b"x", keys=f"k{i}", queue_id=i % 2)
    fail_until = time.monotonic() + 0.5
    seen: list[tuple[int, int, float]] = []
    lock = threading.Lock()

    def listener(msgs):
        m = msgs[0]
        with lock:
            seen.append((m.queue_id, m.queue_offset, time.monotonic()))
        if m.queue_id == 0 and m.queue_offset == 3 and time.monotonic() < fail_until:
            return ConsumeResult.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return None

    with _make(broker, listener, suspend_ms=100) as consumer:
        wait_consumed(consumer, 40)
        assert consumer.stats().retried >= 2
    q0 = [(off, t) for q, off, t in seen if q == 0]
    first_ok = max(t for off, t in q0 if off == 3)
    # nothing after offset 3 of queue 0 ran before offset 3 finally succeeded ...
    assert all(t >= first_ok for off, t in q0 if off > 3)
    # ... while queue 1 finished meanwhile
    q1_done = max(t for q, off, t in seen if q == 1)
    assert q1_done < first_ok


def test_a_queue_is_consumed_only_while_its_broker_lock_is_held():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=2)
    q0, q1 = broker.queues("T")
    other = broker.pull_consumer("g", client_id="other-member")
    assert other.lock([q0], 60.0) == frozenset({q0})
    for i in range(20):
        broker.send("T", body=b"x", keys=f"k{i}", queue_id=i % 2)
    rec = Recorder()
    consumer = _make(broker, rec)
    source = consumer._source
    refused: list[frozenset[MessageQueue]] = []
    lock = source.lock

    def recording_lock(queues, lease):  # type: ignore[no-untyped-def]
        got = lock(queues, lease)
        refused.append(frozenset(queues) - got)
        return got

    source.lock = recording_lock
    polls = PollCounter(source)
    with consumer:
        assert wait_until(lambda: rec.count() == 10)
        # the consumer asked for q0's lock and was refused, then asked again
        # (a second later) and was refused again: a whole retry cycle of the
        # lock, with consume requests retrying meanwhile, and the pull thread
        # goes on
        wait_for(lambda: sum(q0 in r for r in refused) >= 2, 10, lambda: f"two refused locks of q0: {refused}")
        polls.turns(2)
        assert {q for (_t, q, _o) in rec.seen} == {1}  # q0 waits for its lock
        other.unlock([q0])
        wait_consumed(consumer, 20)  # taken on the next retry
    other.close()


def test_shutdown_commits_and_releases_the_locks():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=2)
    broker.send_batch("T", ((b"x", f"k{i}") for i in range(200)))
    consumer = _make(broker, lambda msgs: None, commit_interval=3600.0)
    consumer.start()
    wait_consumed(consumer, 200)
    assert consumer.shutdown(timeout=10)
    probe = broker.pull_consumer("g", client_id="probe")
    assert sorted(probe.committed(q).offset for q in broker.queues("T")) == sorted(
        broker.max_offset(q) for q in broker.queues("T")
    )
    assert probe.lock(broker.queues("T"), 60.0) == frozenset(broker.queues("T"))
    probe.close()
