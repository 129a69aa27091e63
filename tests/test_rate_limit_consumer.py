"""Rate limits on a running consumer, on each executor, under real concurrency.

Nothing here asserts speed.  The tests assert upper bounds (no more calls
than ``max_rate`` allows over the whole run; no two calls of a key closer
than ``key_min_interval``, less a margin for the moment between the
consumer's clock reading and the listener's), that a lane holding a paced
key runs its other keys meanwhile, that nothing is lost or reordered, and
that a rate-limited consumer still stops at its shutdown deadline.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict

import pytest
from executors import EX
from helpers import assert_offsets_increase, wait_until

from lite_push import ConsumeFromWhere, ConsumeMode, EmbeddedBroker, MessageExt
from lite_push._lanes.rate_limit import BURST_SECONDS

pytestmark = pytest.mark.usefixtures("executor")


class Calls:
    """A listener recording when each message's call started (monotonic)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.starts: list[tuple[float, str, int, int]] = []  # (t, key, queue, offset)
        self.delay = delay

    def __call__(self, msgs: list[MessageExt]) -> None:
        t = time.monotonic()
        with self.lock:
            self.starts += [(t, m.keys, m.queue_id, m.queue_offset) for m in msgs]
        if self.delay:
            time.sleep(self.delay)

    def count(self) -> int:
        with self.lock:
            return len(self.starts)

    def order(self) -> dict[object, list[tuple[int, int]]]:
        out: dict[object, list[tuple[int, int]]] = defaultdict(list)
        for _, k, q, o in sorted(self.starts):
            out[k].append((q, o))
        return out


def _broker(messages: list[tuple[str, int]]) -> EmbeddedBroker:
    """A topic of 4 queues with ``messages`` as (key, count) runs, interleaved."""
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=4)
    items = []
    left = dict(messages)
    while left:
        for key in list(left):
            items.append({"body": b"x", "keys": key})
            left[key] -= 1
            if not left[key]:
                del left[key]
    broker.send_batch("T", items)
    return broker


@pytest.mark.parametrize("mode", [ConsumeMode.KEY_ORDERLY, ConsumeMode.CONCURRENTLY, ConsumeMode.QUEUE_ORDERLY])
def test_max_rate_bounds_the_calls_of_the_whole_consumer(mode: ConsumeMode) -> None:
    if EX.is_async and mode is ConsumeMode.QUEUE_ORDERLY:
        pytest.skip("QUEUE_ORDERLY (the baseline) runs on threads only")
    rate = 400.0
    n = 600  # unlimited, 16 lanes do this in a few milliseconds; at 400/s it takes 1.5 s
    broker = _broker([(f"k{i}", 6) for i in range(100)])
    calls = Calls()
    consumer = EX.consumer(
        EX.config(group="g", mode=mode, lanes=16, max_rate=rate),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=calls,
    )
    consumer.subscribe("T", "*")
    with consumer:
        assert wait_until(lambda: calls.count() >= n, timeout=60)
        st_ = consumer.stats()
    times = sorted(t for t, *_ in calls.starts)
    burst = math.ceil(rate * BURST_SECONDS)
    # every start is at or after its slot, and the slots are 1/rate apart
    # (after a burst): a whole run cannot hold more than this
    assert len(times) <= rate * (times[-1] - times[0]) + burst + 2, (len(times), times[-1] - times[0])
    assert st_.rate_limit_delayed > 0 and st_.rate_limit_wait_seconds > 0
    if mode is not ConsumeMode.CONCURRENTLY:
        assert_offsets_increase(calls.order())
    assert sorted((q, o) for _, _, q, o in calls.starts) == sorted(
        (q.queue_id, o) for q in broker.queues("T") for o in range(broker.max_offset(q))
    )


@pytest.mark.parametrize("drain", [False, True], ids=["stop", "drain"])
def test_a_rate_limited_consumer_stops_at_its_deadline_and_loses_nothing(drain: bool) -> None:
    """Lanes waiting for their turn do not hold a shutdown up, and what they
    did not run stays uncommitted: the next consumer of the group gets it.
    A stop lets the backlog go at once (a clean stop); a drain works at it
    until the deadline passes."""
    broker = _broker([(f"k{i}", 10) for i in range(40)])
    calls = Calls()
    consumer = EX.consumer(
        EX.config(group="g", lanes=8, max_rate=50.0, commit_interval=0.2, drain_on_shutdown=drain),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=calls,
    )
    consumer.subscribe("T", "*")
    consumer.start()
    assert wait_until(lambda: calls.count() >= 20, timeout=30)
    t0 = time.monotonic()
    drained = consumer.shutdown(timeout=0.3)
    assert time.monotonic() - t0 < 10.0  # not the 8 s the backlog needs at 50/s
    assert drained is not drain
    assert consumer.stop_report.unfinished > 0
    first = {(q, o) for _, _, q, o in calls.starts}
    assert len(first) < 400
    rest = Calls()
    again = EX.consumer(
        EX.config(group="g", lanes=8),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=rest,
    )
    again.subscribe("T", "*")
    with again:
        assert wait_until(lambda: first | {(q, o) for _, _, q, o in list(rest.starts)} >= _all(broker), timeout=30)
    assert first | {(q, o) for _, _, q, o in rest.starts} == _all(broker)


def _all(broker: EmbeddedBroker) -> set[tuple[int, int]]:
    return {(q.queue_id, o) for q in broker.queues("T") for o in range(broker.max_offset(q))}


#: Margin for the moment between the consumer's clock reading (when it lets
#: a call start) and the listener's own (a thread switch, a pool hand-off).
MARGIN = 0.05


@pytest.mark.parametrize("placement", ["load", "hash"])
def test_no_two_calls_of_a_key_start_closer_than_its_interval(placement: str) -> None:
    interval = 0.2
    keys = [("hot", 6), ("warm", 3)] + [(f"k{i}", 1) for i in range(50)]
    broker = _broker(keys)
    calls = Calls(delay=0.001)
    consumer = EX.consumer(
        EX.config(group="g", lanes=4, key_min_interval=interval, lane_placement=placement),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=calls,
    )
    consumer.subscribe("T", "*")
    with consumer:
        assert wait_until(lambda: calls.count() >= sum(n for _, n in keys), timeout=60)
        st_ = consumer.stats()
    by_key: dict[str, list[float]] = defaultdict(list)
    for t, k, _, _ in sorted(calls.starts):
        by_key[k].append(t)
    for k, ts in by_key.items():
        gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
        assert all(g >= interval - MARGIN for g in gaps), (k, gaps)
    assert len(by_key["hot"]) == 6
    assert st_.key_interval_holds >= 5 + 2  # hot waited 5 times, warm twice (at least)
    assert_offsets_increase(calls.order())
    assert {(q, o) for _, _, q, o in calls.starts} == _all(broker)


def test_a_held_key_does_not_hold_its_lane_up() -> None:
    """One lane: while "hot" waits for its interval, every other key runs."""
    interval = 1.0
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    broker.send_batch("T", [{"body": b"x", "keys": "hot"}] * 3 + [{"body": b"x", "keys": f"k{i}"} for i in range(30)])
    calls = Calls()
    consumer = EX.consumer(
        EX.config(group="g", lanes=1, key_min_interval=interval),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=calls,
    )
    consumer.subscribe("T", "*")
    with consumer:
        assert wait_until(lambda: calls.count() >= 33, timeout=30)
    ordered = [k for _, k, _, _ in sorted(calls.starts)]
    # the 30 others ran right after hot's first call, before its second
    assert ordered[0] == "hot" and ordered.index("hot", 1) == 31, ordered
    assert ordered[32] == "hot"
    hot = [t for t, k, _, _ in sorted(calls.starts) if k == "hot"]
    assert hot[1] - hot[0] >= interval - MARGIN and hot[2] - hot[1] >= interval - MARGIN


def test_a_failed_key_keeps_its_interval_and_its_retries() -> None:
    """A retry (suspend_ms) shorter than the interval still waits for it,
    and a paced key's messages are not counted as retried."""
    interval = 0.4
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    broker.send_batch("T", [{"body": str(i).encode(), "keys": "a"} for i in range(3)])
    starts: list[tuple[float, bytes, int]] = []
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> None:
        with lock:
            starts.extend((time.monotonic(), m.body, m.reconsume_times) for m in msgs)
        if msgs[0].body == b"1" and msgs[0].reconsume_times == 0:
            raise RuntimeError("first attempt of 1 fails")

    consumer = EX.consumer(
        EX.config(group="g", lanes=2, key_min_interval=interval, suspend_ms=10),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener,
    )
    consumer.subscribe("T", "*")
    with consumer:
        assert wait_until(lambda: consumer.stats().consumed == 3, timeout=30)
        st_ = consumer.stats()
    assert [(b, r) for _, b, r in starts] == [(b"0", 0), (b"1", 0), (b"1", 1), (b"2", 0)]
    gaps = [b[0] - a[0] for a, b in zip(starts, starts[1:], strict=False)]
    assert all(g >= interval - MARGIN for g in gaps), gaps
    assert st_.retried == 1
    assert st_.parked == 0
