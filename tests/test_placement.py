"""Lane placement by load, end to end: hypothesis drives the real runtime
(random listener delays, so lanes finish in random order; failures that
park keys and dead-letter some messages; a second member joining and
leaving) and every run must keep per-key order and exclusivity and lose
nothing.  The same runs check that a fixed placement does too."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict

from executors import Executor
from helpers import wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lite_push import ConsumeFromWhere, ConsumerConfig, EmbeddedBroker, MessageExt
from lite_push._kernels.router import lane_of

#: Failed attempts after which a message is dead-lettered (the runs use 2).
MAX_RECONSUME = 2


class Probe:
    """The listener: a random pause per call, failures by plan, and a record
    of every call per key in start order, ``(queue, the key's offsets in the
    call, ok)``; a key in two calls at once is recorded in ``overlaps``."""

    def __init__(self, fails: dict[tuple[int, int], int], seed: int, max_delay: float) -> None:
        self.fails = fails
        self.rng = random.Random(seed)
        self.max_delay = max_delay
        self.lock = threading.Lock()
        self.active: set[str | None] = set()
        self.overlaps: list[str | None] = []
        self.attempts: dict[str | None, list[tuple[int, list[int], bool]]] = defaultdict(list)
        self.ok: set[tuple[int, int]] = set()
        self.tries: dict[tuple[int, int], int] = defaultdict(int)

    def __call__(self, msgs: list[MessageExt]) -> None:
        keys = {m.keys for m in msgs}
        with self.lock:
            for k in keys:
                if k in self.active:
                    self.overlaps.append(k)
                self.active.add(k)
            pause = self.rng.random() * self.max_delay
            failed = False
            for m in msgs:  # one failing message fails the whole call
                where = (m.queue_id, m.queue_offset)
                failed |= self.tries[where] < self.fails.get(where, 0)
                self.tries[where] += 1
            calls: dict[str | None, list[int]] = defaultdict(list)
            for m in msgs:
                calls[m.keys].append(m.queue_offset)
            for k, offsets in calls.items():
                self.attempts[k].append((msgs[0].queue_id, offsets, not failed))
        time.sleep(pause)
        with self.lock:
            for k in keys:
                self.active.discard(k)
            if failed:
                raise RuntimeError("planned failure")
            self.ok.update((m.queue_id, m.queue_offset) for m in msgs)


def _dead_letters(broker: EmbeddedBroker) -> set[tuple[int, int]]:
    if "%DLQ%g" not in broker.topics():
        return set()
    return {
        (int(m.properties["ORIGIN_QUEUE_ID"]), int(m.properties["ORIGIN_OFFSET"]))
        for q in broker.queues("%DLQ%g")
        for m in broker.messages(q)
    }


@st.composite
def _runs(draw: st.DrawFn) -> dict[str, object]:
    keys = draw(st.integers(1, 30))
    queues = draw(st.integers(1, 4))
    messages = draw(st.integers(10, 200))
    stream = [draw(st.integers(0, keys - 1)) for _ in range(messages)]
    fails = draw(st.lists(st.tuples(st.integers(0, messages - 1), st.integers(1, MAX_RECONSUME + 1)), max_size=6))
    return {
        "stream": stream,
        "queues": queues,
        "lanes": draw(st.integers(1, 12)),
        "batch_size": draw(st.sampled_from([1, 1, 3])),
        "placement": draw(st.sampled_from(["load", "load", "hash", "java"])),
        "fails": dict(fails),
        "seed": draw(st.integers(0, 2**32)),
        "rebalance": draw(st.sampled_from(["none", "join", "join-leave"])),
    }


def _consumer(ex: Executor, broker: EmbeddedBroker, probe: Probe, client: str, run: dict[str, object]):  # type: ignore[no-untyped-def]
    consumer = ex.consumer(
        ConsumerConfig(
            group="g",
            lanes=run["lanes"],
            batch_size=run["batch_size"],
            lane_placement=run["placement"],
            suspend_ms=5,
            max_reconsume_times=MAX_RECONSUME,
            commit_interval=0.05,
            poll_timeout=0.02,
            revoke_timeout=5.0,
        ),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, client_id=client),
        listener=probe,
    )
    consumer.subscribe("T")
    return consumer


def _check(run: dict[str, object], ex_name: str) -> None:
    stream: list[int] = run["stream"]  # type: ignore[assignment]
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=run["queues"])  # type: ignore[arg-type]
    sent = broker.send_batch("T", [(b"x", f"key-{k}") for k in stream])  # the hash selector picks the queue
    where = [(r.queue.queue_id, r.offset) for r in sent]
    # a doomed message fails every attempt (also after a rebalance delivers
    # it again from scratch), so it is dead-lettered; the others fail at
    # most their planned number of attempts in all
    fails = {where[i]: (n if n <= MAX_RECONSUME else 1 << 30) for i, n in run["fails"].items()}  # type: ignore[attr-defined]
    doomed = {w for w, n in fails.items() if n > MAX_RECONSUME}
    probe = Probe(fails, run["seed"], 0.002)  # type: ignore[arg-type]
    ex = Executor(ex_name)
    second = None
    try:
        with _consumer(ex, broker, probe, "c1", run):
            if run["rebalance"] != "none":
                assert wait_until(lambda: len(probe.ok) >= len(stream) // 3, timeout=60)
                second = _consumer(ex, broker, probe, "c2", run)
                second.start()
                if run["rebalance"] == "join-leave":
                    assert wait_until(lambda: len(probe.ok) >= 2 * len(stream) // 3, timeout=60)
                    second.shutdown()
                    second = None
            done = set(where) - doomed
            assert wait_until(lambda: done <= probe.ok and doomed <= _dead_letters(broker), timeout=60), (
                f"not finished: {sorted(done - probe.ok)[:10]}, "
                f"not dead-lettered: {sorted(doomed - _dead_letters(broker))}"
            )
            if second is not None:
                second.shutdown()
    finally:
        ex.close()
    assert probe.overlaps == []
    assert not probe.ok & doomed and _dead_letters(broker) == doomed
    for key, calls in probe.attempts.items():
        # In start order, a key's calls never go back to a lower offset (a
        # failed message is retried before its key moves on), except to
        # deliver again an offset already finished: succeeded, or failed as
        # often as it may (dead-lettered; a revoke before the dead letter was
        # stored leaves it to the next owner).  Within a call, its messages
        # are in offset order.
        finished: set[int] = set()
        failures: dict[int, int] = defaultdict(int)
        low = -1
        for _, offsets, ok in calls:
            assert offsets == sorted(offsets), f"{key}: a call out of order: {offsets}"
            if offsets[0] not in finished:
                assert offsets[0] >= low, f"{key}: offset {offsets[0]} started after {low} ({calls})"
                low = offsets[0]
            for off in offsets:
                failures[off] += not ok
                if ok or failures[off] > MAX_RECONSUME:
                    finished.add(off)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(run=_runs())
def test_key_order_holds_under_random_completion_failures_and_rebalance_threads(run: dict[str, object]) -> None:
    _check(run, "thread")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(run=_runs())
def test_key_order_holds_under_random_completion_failures_and_rebalance_uvloop(run: dict[str, object]) -> None:
    _check(run, "uvloop")


def test_load_placement_spreads_a_queues_keys_over_every_lane() -> None:
    """Keys the producer hashed into one of 8 queues have Java hashes equal
    mod 8, so with Java placement on 16 lanes they reach 2 lanes (16 /
    gcd(16, 8)); placed by load (or by the mixed hash) they use all 16."""
    keys = [k for k in (f"key-{i}" for i in range(3000)) if lane_of(k, 8) == 0][:300]
    for placement, want in (("load", set(range(16))), ("hash", set(range(16))), ("java", {0, 8})):
        broker = EmbeddedBroker()
        broker.create_topic("T", queue_count=8)
        broker.send_batch("T", [(b"x", keys[i % len(keys)]) for i in range(1500)])
        assert broker.max_offset(broker.queues("T")[0]) == 1500
        used: set[int] = set()
        lock = threading.Lock()

        def listener(msgs: list[MessageExt], used: set[int] = used, lock: threading.Lock = lock) -> None:
            with lock:
                used.add(int(threading.current_thread().name.rsplit("-", 1)[1]))
            time.sleep(0.0002)

        consumer = Executor("thread").consumer(
            ConsumerConfig(group="g", lanes=16, lane_placement=placement, commit_interval=0.05, poll_timeout=0.02),
            source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
            listener=listener,
        )
        consumer.subscribe("T")
        with consumer:
            assert wait_until(lambda c=consumer: c.stats().consumed == 1500, timeout=60)
        assert used == want, placement
