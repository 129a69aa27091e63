"""Flow control: in-flight work stays bounded under any backlog."""

from __future__ import annotations

import threading
import time

import psutil
import pytest
from executors import EX
from helpers import PollCounter, wait_for, wait_until

from lite_push import ConsumeFromWhere, ConsumerConfig, EmbeddedBroker

pytestmark = pytest.mark.usefixtures("executor")


def _consumer(broker, listener, **cfg):
    consumer = EX.consumer(
        ConsumerConfig(group="g", poll_timeout=0.02, commit_interval=0.2, **cfg),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener,
    )
    consumer.subscribe("T")
    return consumer


@pytest.mark.slow
def test_flood_of_one_million_keeps_in_flight_bounded_and_memory_flat():
    broker = EmbeddedBroker()
    queues, total = 4, 1_000_000
    broker.create_topic("T", queue_count=queues)
    broker.send_batch("T", ((b"x" * 16, f"k{i % 5000}") for i in range(total)))
    threshold, pull = 1000, 32

    def slow(msgs):
        time.sleep(0.0002)

    consumer = _consumer(broker, slow, lanes=8, pull_threshold_for_queue=threshold, pull_batch_size=pull)
    proc = psutil.Process()
    samples = []
    with consumer:
        t_end = time.monotonic() + 4.0
        rss_start = None
        while time.monotonic() < t_end:
            st = consumer.stats()
            samples.append((sum(st.in_flight.values()), max(st.in_flight.values(), default=0), len(st.paused)))
            if rss_start is None and time.monotonic() > t_end - 3.0:
                rss_start = proc.memory_info().rss
            time.sleep(0.01)
        rss_end = proc.memory_info().rss
        consumed = consumer.stats().consumed
    assert consumed > 1000  # it made progress
    assert consumed < total  # and the backlog was really a backlog
    per_queue_max = max(s[1] for s in samples)
    # never more than one poll batch above the threshold (the pause is applied
    # right after the batch that crossed it)
    assert per_queue_max <= threshold + pull, per_queue_max
    assert max(s[0] for s in samples) <= queues * (threshold + pull)
    assert any(s[2] > 0 for s in samples), "no queue was ever paused"
    # near the threshold most of the time: flow control, not starvation
    assert sum(1 for s in samples if s[0] >= queues * threshold * 0.4) > len(samples) * 0.5
    assert rss_end - rss_start < 30 * 1024 * 1024, (rss_start, rss_end)


def test_byte_threshold_pauses_queue():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    broker.send_batch("T", ((b"y" * 1000, f"k{i}") for i in range(500)))
    gate = threading.Event()
    consumer = _consumer(
        broker,
        lambda msgs: None if gate.wait(20) else None,
        lanes=2,
        pull_threshold_size_for_queue=10_000,
        pull_batch_size=4,
    )
    polls = PollCounter(consumer._source)
    with consumer:
        assert wait_until(lambda: len(consumer.stats().paused) == 1)
        polls.turns(5)  # the pull thread goes on, and polls no more of the paused queue
        st = consumer.stats()
        assert max(st.in_flight_bytes.values()) <= 10_000 + 4 * 1000
        gate.set()
        assert wait_until(lambda: consumer.stats().consumed == 500)
        assert wait_until(lambda: len(consumer.stats().paused) == 0)


def test_span_threshold_pauses_queue_behind_a_slow_message():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    broker.send_batch("T", ((b"z", f"k{i}") for i in range(2000)))
    release = threading.Event()

    def listener(msgs):
        if msgs[0].queue_offset == 0:
            release.wait(20)

    consumer = _consumer(broker, listener, lanes=8, max_span=100, pull_batch_size=10)
    q = broker.queues("T")[0]
    polls = PollCounter(consumer._source)
    with consumer:
        assert wait_until(lambda: q in consumer.stats().paused)

        # the rest is done: every lane idle but the one in offset 0's call
        # (what queued behind it waits there), and the pull thread goes on
        # without polling more
        def the_rest_done() -> bool:
            busy = [i for i, b in enumerate(consumer._readings.counters.busy) if b]
            depths = consumer.stats().lane_depths
            return len(busy) == 1 and all(d == 0 for i, d in enumerate(depths) if i != busy[0])

        busy = consumer._readings.counters.busy
        wait_for(the_rest_done, 30, lambda: f"idle lanes but 0's: {busy} {consumer.stats()}")
        polls.turns(5)
        # the queue stopped near offset 100 although the rest is done
        assert consumer.stats().consumed <= 100 + 10
        release.set()
        assert wait_until(lambda: consumer.stats().consumed == 2000)


def test_queue_paused_by_span_is_woken_not_left_to_the_poll_timeout():
    # The pull thread waits in poll() for up to poll_timeout (here 60 s) while
    # its only queue is paused; the lane that brings the queue under *every*
    # low-water mark (messages, bytes, span) must wake it.  (A wake-up on the message count alone
    # fired while the span was still high, and the queue then sat paused for
    # a whole poll timeout with every lane idle.)
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    broker.send_batch("T", ((b"z" * 100, f"k{i}") for i in range(1000)))
    release = threading.Event()

    def listener(msgs):
        if msgs[0].queue_offset == 0:
            release.wait(20)

    consumer = EX.consumer(
        ConsumerConfig(group="g", poll_timeout=60.0, lanes=8, pull_batch_size=10, max_span=100),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener,
    )
    consumer.subscribe("T")
    q = broker.queues("T")[0]
    with consumer:
        assert wait_until(lambda: q in consumer.stats().paused)
        # the other messages finish: the count falls under its low-water
        # mark while offset 0 still holds the span
        assert wait_until(lambda: consumer.stats().in_flight[q] <= 20)
        release.set()
        assert wait_until(lambda: consumer.stats().consumed == 1000, timeout=15.0), consumer.stats()


def test_full_lane_pauses_queue_instead_of_blocking_the_pull_thread():
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=2)
    # every message on one key: one lane gets all the work
    broker.send_batch("T", ((b"w", "hot") for _ in range(3000)))
    gate = threading.Event()
    consumer = _consumer(
        broker,
        lambda msgs: None if gate.wait(20) else None,
        lanes=4,
        lane_capacity=50,
        pull_batch_size=20,
        pull_threshold_for_queue=100_000,
    )
    polls = PollCounter(consumer._source)
    with consumer:
        assert wait_until(lambda: len(consumer.stats().paused) >= 1)
        polls.turns(5)  # the pull thread is alive and polling (not blocked on the lane)
        st = consumer.stats()
        # a dispatch stops at lane_capacity (plus the poll that crossed it)
        # and is checked whole: at most twice the capacity plus one poll
        assert max(st.lane_depths) <= 2 * 50 + 2 * 20, st.lane_depths
        # and what the lane took (running) is bounded the same way
        assert sum(st.in_flight.values()) <= 2 * (2 * 50 + 2 * 20), st.in_flight
        # the pull thread is alive and polling (not blocked on the lane)
        assert consumer.stats().polling
        gate.set()
        assert wait_until(lambda: consumer.stats().consumed == 3000)
