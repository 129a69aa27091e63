"""Committed offsets and lag show finished work without waiting for the
commit interval.

The pull thread commits every ``commit_interval`` and once more at the
first quiet moment of a spell of work (nothing polled left unfinished).
The consumer runs on a :class:`~lite_push.ManualClock` that these tests move
by hand: a commit seen while the clock stands still is the early one, and
one seen after moving it by ``commit_interval`` is the periodic one.  The
lag is read as the metrics exporter reads it (``metrics_snapshot``).
"""

from __future__ import annotations

import threading

from helpers import wait_until
from prometheus_client import CollectorRegistry

from lite_push import (
    ConsumeFromWhere,
    ConsumerConfig,
    EmbeddedBroker,
    LitePushConsumer,
    ManualClock,
    MessageExt,
    MessageQueue,
)

INTERVAL = 5.0


def _consumer(broker: EmbeddedBroker, clock: ManualClock, listener: object, lanes: int = 4) -> LitePushConsumer:
    consumer = LitePushConsumer(
        ConsumerConfig(group="g", lanes=lanes, poll_timeout=0.02, commit_interval=INTERVAL),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener,  # type: ignore[arg-type]
        clock=clock,
        registry=CollectorRegistry(),
    )
    consumer.subscribe("T")
    return consumer


def _ends(broker: EmbeddedBroker) -> dict[MessageQueue, int]:
    return {q: broker.max_offset(q) for q in broker.queues("T")}


def _lag(consumer: LitePushConsumer) -> dict[MessageQueue, int | None]:
    snap = consumer.metrics_snapshot()
    assert snap is not None
    return {qm.queue: None if qm.end_offset is None else qm.end_offset - qm.committed for qm in snap.queues}


def test_a_backlog_consumed_is_committed_at_the_first_quiet_moment() -> None:
    broker = EmbeddedBroker()
    broker.create_topic("T", 2)
    for i in range(200):
        broker.send("T", b"x", keys=f"k{i % 20}")
    ends = _ends(broker)
    clock = ManualClock()
    start = clock.monotonic()
    consumer = _consumer(broker, clock, lambda msgs: None)
    with consumer:
        assert wait_until(lambda: consumer.stats().consumed == 200, timeout=30)
        # the clock stands still: no interval has passed, yet the backlog's end is committed
        assert wait_until(lambda: dict(consumer.stats().committed) == ends, timeout=10), consumer.stats().committed
        assert clock.monotonic() - start < INTERVAL
        assert _lag(consumer) == dict.fromkeys(ends, 0)
        assert {q: c.offset for q in ends if (c := broker.committed("g", q)) is not None} == ends


def test_the_early_commit_never_passes_unfinished_work_and_comes_once_per_spell() -> None:
    broker = EmbeddedBroker()
    broker.create_topic("T", 2)
    for i in range(40):
        broker.send("T", b"x", keys=f"k{i}")
    slow = broker.send("T", b"x", keys="slow")  # held in its call until released
    for i in range(40):
        broker.send("T", b"x", keys=f"k{i}")
    ends = _ends(broker)
    release = threading.Event()

    def listener(msgs: list[MessageExt]) -> None:
        if any(m.keys == "slow" for m in msgs):
            assert release.wait(30)

    clock = ManualClock()
    consumer = _consumer(broker, clock, listener, lanes=64)  # a lane per key: none waits behind the slow one
    q, other = slow.queue, next(x for x in ends if x != slow.queue)
    with consumer:
        assert wait_until(lambda: consumer.stats().consumed == 80, timeout=30)
        # one message is still in its call: no quiet moment, no early commit
        assert dict(consumer.stats().committed) == dict.fromkeys(ends, 0)
        # the interval: the periodic commit stops at the unfinished message
        clock.advance(INTERVAL)
        assert wait_until(lambda: consumer.stats().committed[other] == ends[other], timeout=10)
        assert consumer.stats().committed[q] == slow.offset
        assert _lag(consumer) == {q: ends[q] - slow.offset, other: 0}
        # it finishes: committed at once, with the clock standing still
        release.set()
        assert wait_until(lambda: dict(consumer.stats().committed) == ends, timeout=10)
        assert _lag(consumer) == dict.fromkeys(ends, 0)
        # the spell's early commit is spent: a new message waits for the interval ...
        sent = broker.send("T", b"x", keys="k1")
        assert wait_until(lambda: consumer.stats().consumed == 82, timeout=10)
        assert not wait_until(lambda: consumer.stats().committed[sent.queue] > ends[sent.queue], timeout=0.5)
        clock.advance(INTERVAL)
        assert wait_until(lambda: consumer.stats().committed[sent.queue] == sent.offset + 1, timeout=10)
        # ... and an interval with nothing to commit arms it again
        clock.advance(INTERVAL)
        t_idle = clock.monotonic()
        assert wait_until(lambda: consumer.stats().committed[sent.queue] == sent.offset + 1, timeout=1)
        later = broker.send("T", b"x", keys="k2")
        assert wait_until(lambda: consumer.stats().committed[later.queue] == later.offset + 1, timeout=10)
        assert clock.monotonic() == t_idle
