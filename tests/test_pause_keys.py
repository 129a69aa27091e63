"""The application's pause of keys: ``consumer.pause_keys(keys)`` /
``resume_keys(keys)``.

A paused key's messages wait, in order, while the lanes go on with the
other keys; they are unfinished meanwhile (the commit stays below the
first of them, the other keys' finished offsets travel in the offset map)
and flow control counts them; a resume runs them in order, each once.
Every test runs on each executor (threads, asyncio, uvloop)."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import defaultdict
from typing import Any

import pytest
from executors import EX
from helpers import PollCounter, commit_pass, wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from lite_push import (
    Balance,
    ConsumeFromWhere,
    ConsumeMode,
    ConsumerConfig,
    EmbeddedBroker,
    LitePushConsumer,
    LitePushError,
    ManualClock,
    MessageExt,
    MessageQueue,
)
from lite_push._kernels.router import lane_of
from lite_push._state.offset_map import decode
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer

pytestmark = pytest.mark.usefixtures("executor")

KEYED = [ConsumeMode.KEY_ORDERLY, ConsumeMode.CONCURRENTLY]


class Watch:
    """A listener that records every start: ``(key, queue id, offset,
    reconsume_times)`` in start order; ``overlaps``: keys ever in the
    listener twice at once; ``lanes[key]``: the threads that ran it."""

    def __init__(self, *, jitter: float = 0.0, seed: int = 0, fail: Any = None) -> None:
        self.lock = threading.Lock()
        self.starts: list[tuple[str | None, int, int, int]] = []
        self.active: set[object] = set()
        self.overlaps: list[object] = []
        self.lanes: dict[object, set[str]] = defaultdict(set)
        self.jitter = jitter
        self.rng = random.Random(seed)
        self.fail = fail
        #: Called with each message before it is recorded (under the lock).
        self.check: Any = None

    def __call__(self, msgs: list[MessageExt]) -> Any:
        with self.lock:
            for k in {m.keys for m in msgs}:  # a call may hold several messages of one key
                if k in self.active:
                    self.overlaps.append(k)
                self.active.add(k)
            for m in msgs:
                if self.check is not None:
                    self.check(m)
                self.starts.append((m.keys, m.queue_id, m.queue_offset, m.reconsume_times))
                self.lanes[m.keys].add(threading.current_thread().name)
            pause = self.rng.random() * self.jitter if self.jitter else 0.0
        try:
            if pause:
                time.sleep(pause)
            if self.fail is not None and any(self.fail(m) for m in msgs):
                raise RuntimeError("listener failed")
            return None
        finally:
            with self.lock:
                for m in msgs:
                    self.active.discard(m.keys)

    def of(self, key: str) -> list[tuple[int, int]]:
        with self.lock:
            return [(q, o) for k, q, o, _ in self.starts if k == key]

    def count(self) -> int:
        with self.lock:
            return len(self.starts)

    def once_each(self) -> set[tuple[int, int]]:
        """The ``(queue id, offset)`` started, asserting each started once."""
        with self.lock:
            ran = [(q, o) for _, q, o, _ in self.starts]
        assert len(ran) == len(set(ran)), sorted(p for p in set(ran) if ran.count(p) > 1)[:10]
        return set(ran)


def _consumer(broker: EmbeddedBroker, listener: Any, *, client_id: str | None = None, **cfg: Any) -> Any:
    cfg.setdefault("poll_timeout", 0.02)
    cfg.setdefault("commit_interval", 0.05)
    clock = cfg.pop("clock", None)
    registry = cfg.pop("registry", None)
    source_kw: dict[str, Any] = {"consume_from": ConsumeFromWhere.FIRST_OFFSET}
    if client_id is not None:
        source_kw["client_id"] = client_id
    consumer = EX.consumer(
        ConsumerConfig(group="g", **cfg),
        source=broker.pull_consumer("g", **source_kw),
        listener=listener,
        clock=clock,
        registry=registry,
    )
    consumer.subscribe("T")
    return consumer


def _in_order(offsets: list[tuple[int, int]]) -> bool:
    """Per queue, increasing offsets."""
    last: dict[int, int] = {}
    for q, o in offsets:
        if o <= last.get(q, -1):
            return False
        last[q] = o
    return True


# -- waiting while the lane's other keys run, then in order -------------------------------


@pytest.mark.parametrize("mode", KEYED, ids=lambda m: m.name)
@pytest.mark.parametrize("lanes", [1, 3])
def test_a_paused_keys_messages_wait_while_its_lanes_other_keys_run_then_run_in_order_once(
    broker: EmbeddedBroker, mode: ConsumeMode, lanes: int
) -> None:
    watch = Watch()
    with _consumer(broker, watch, mode=mode, lanes=lanes) as c:
        polls = PollCounter(c._source)
        broker.send_batch("T", [(b"x", "P" if i % 4 == 0 else f"k{i % 7}") for i in range(40)])
        wait_for(lambda: watch.count() == 40, 30, "the first 40 messages")  # P runs while not paused
        c.pause_keys(["P"])
        assert c.paused_keys() == {"P"}
        held = broker.send_batch("T", [(b"x", "P" if i % 5 == 0 else f"k{i % 7}") for i in range(200)])
        p_sent = [(r.queue.queue_id, r.offset) for i, r in enumerate(held) if i % 5 == 0]
        # the other keys, on the same lanes (one lane: all of them), all run
        wait_for(lambda: watch.count() == 40 + 160, 30, lambda: f"the other keys' 160: {watch.count() - 40}")
        wait_for(lambda: c.stats().paused_key_messages == 40, 30, lambda: f"P's 40 waiting: {c.stats()}")
        polls.turns(5)
        assert not set(watch.of("P")) & set(p_sent)  # nothing of P stored after the pause ran
        st = c.stats()
        assert st.paused_keys == {"P"} and st.paused_key_messages == 40 and st.parked == 40
        wait_for(lambda: sum(c.stats().in_flight.values()) == 40, 10, "only P's 40 unfinished")
        c.resume_keys(["P"])
        assert c.paused_keys() == frozenset()
        wait_for(lambda: watch.count() == 240, 30, lambda: f"P's 40 after the resume: {watch.count() - 200}")
        later = broker.send_batch("T", [(b"x", "P") for _ in range(5)])  # after the resume: they run too
        wait_for(lambda: watch.count() == 245, 30, "P's messages sent after the resume")
        wait_for(lambda: c.stats().paused_key_messages == 0 and c.stats().parked == 0, 10, "no message waiting")
    ran = watch.once_each()
    assert len(ran) == 245
    assert set(p_sent) | {(r.queue.queue_id, r.offset) for r in later} <= ran
    if mode is ConsumeMode.KEY_ORDERLY:
        assert not watch.overlaps
        for key in {k for k, _, _, _ in watch.starts}:
            assert _in_order(watch.of(str(key))), key


def test_pausing_before_start_holds_the_first_dispatch(broker: EmbeddedBroker) -> None:
    broker.send_batch("T", [(b"x", "P" if i % 3 == 0 else f"k{i}") for i in range(30)])
    watch = Watch()
    c = _consumer(broker, watch, lanes=2)
    c.pause_keys(["P", "Q"])
    with c:
        wait_for(lambda: watch.count() == 20, 30, "the 20 messages of the other keys")
        PollCounter(c._source).turns(3)
        assert watch.of("P") == [] and c.stats().paused_key_messages == 10
        c.resume_keys(["P"])
        wait_for(lambda: watch.count() == 30, 30, "P's 10")
        assert c.paused_keys() == {"Q"}
    assert _in_order(watch.of("P")) and len(watch.once_each()) == 30


def test_a_paused_keys_later_messages_come_to_the_lane_that_holds_it(broker: EmbeddedBroker) -> None:
    """The router keeps a key with unreleased messages on its lane, and
    waiting messages are not released: batches of P sent at different times,
    while other keys load the lanes, all wait on one lane and run in order."""
    watch = Watch(jitter=0.002, seed=7)
    with _consumer(broker, watch, lanes=8) as c:
        c.pause_keys(["P"])
        sent = 0
        for round_ in range(6):
            broker.send_batch("T", [(b"x", "P" if i % 10 == round_ else f"k{i}-{round_}") for i in range(60)])
            sent += 60
            wait_for(lambda n=sent: watch.count() >= n * 9 // 10, 30, "the other keys of the round")
        assert watch.of("P") == []
        c.resume_keys(["P"])
        wait_for(lambda: watch.count() == sent, 30, "P's messages")
    p = watch.of("P")
    assert len(p) == 36 and _in_order(p) and not watch.overlaps
    if EX.name == "thread":
        assert len(watch.lanes["P"]) == 1  # one lane thread ran all of P


# -- commits --------------------------------------------------------------------------------


def test_the_commit_stays_below_the_first_waiting_message_and_carries_the_other_keys_offsets() -> None:
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    broker.create_topic("U", queue_count=1)
    q = broker.queues("T")[0]
    paused_at = {10, 50, 90}
    broker.send_batch("T", [(b"x", "P" if i in paused_at else f"k{i}") for i in range(100)])
    watch = Watch()
    c = _consumer(broker, watch, lanes=2)
    c.pause_keys(["P"])
    with c:
        wait_for(lambda: watch.count() == 97, 30, "the other keys' 97 messages")

        def finished_above() -> set[int] | None:
            committed = broker.committed("g", q)
            if committed is None:
                return None
            assert committed.offset <= 10  # never past the first waiting message
            finished = decode(committed.metadata, committed.offset)
            return None if finished is None else {o for o in range(committed.offset, 100) if o in finished}

        expected = set(range(11, 100)) - paused_at
        wait_for(lambda: finished_above() == expected, 30, lambda: f"the offset map of the others: {finished_above()}")
        commit_pass(c, [q])
        assert getattr(broker.committed("g", q), "offset", None) == 10 and finished_above() == expected
        c.resume_keys(["P"])
        wait_for(lambda: watch.count() == 100, 30, "P's 3")
        wait_for(lambda: getattr(broker.committed("g", q), "offset", None) == 100, 30, "the commit at the end")
    assert len(watch.once_each()) == 100
    broker.close()


def test_the_other_queues_commit_as_usual(broker: EmbeddedBroker) -> None:
    p_queue = lane_of("P", 2)
    broker.send_batch("T", [(b"x", "P" if i % 4 == 0 else f"k{i}") for i in range(80)])
    watch = Watch()
    c = _consumer(broker, watch, lanes=2)
    c.pause_keys(["P"])
    with c:
        wait_for(lambda: watch.count() == 60, 30, "the other keys' 60")
        other = broker.queues("T")[1 - p_queue]
        wait_for(
            lambda: getattr(broker.committed("g", other), "offset", None) == broker.max_offset(other),
            30,
            "the queue without P committed to its end",
        )
        c.resume_keys(["P"])
        wait_for(lambda: watch.count() == 80, 30, "P's 20")


# -- flow control ---------------------------------------------------------------------------


def test_a_paused_key_that_piles_up_pauses_its_queue_at_the_source_and_the_resume_drains_it() -> None:
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    q = broker.queues("T")[0]
    total = 3000
    broker.send_batch("T", [(b"x", "P" if i % 10 else f"k{i}") for i in range(total)])  # 90 % P
    watch = Watch()
    threshold = 200
    c = _consumer(broker, watch, lanes=2, pull_threshold_for_queue=threshold, pull_batch_size=32)
    c.pause_keys(["P"])
    with c:
        polls = PollCounter(c._source)
        wait_for(lambda: q in c.stats().paused, 30, "the queue paused at the source")

        def settled() -> bool:  # all that is not P has run: only P's messages are unfinished
            s = c.stats()
            return s.in_flight[q] == s.paused_key_messages > 0

        wait_for(settled, 30, lambda: f"only P's messages unfinished: {c.stats()}")
        before = c.stats().in_flight[q]
        polls.turns(10)
        st = c.stats()
        # bounded: what was polled before the pause (a batch past the threshold), not the 2,700 of P
        assert st.in_flight[q] <= threshold + 32, st.in_flight
        assert st.in_flight[q] == before and q in st.paused  # not growing while paused
        assert st.paused_key_messages == st.in_flight[q] and watch.of("P") == []
        c.resume_keys(["P"])
        wait_for(lambda: watch.count() == total, 60, lambda: f"all {total}: {watch.count()}")
        wait_for(lambda: q not in c.stats().paused, 10, "the queue resumed")
        wait_for(lambda: getattr(broker.committed("g", q), "offset", None) == total, 30, "the commit at the end")
    p = watch.of("P")
    assert len(p) == total * 9 // 10 and _in_order(p)
    assert len(watch.once_each()) == total
    broker.close()


# -- retries, revokes, shutdown ------------------------------------------------------------


def test_a_key_parked_for_a_retry_when_paused_waits_past_its_retry_until_resumed(broker: EmbeddedBroker) -> None:
    clock = ManualClock()
    # P's first message (offset 0 of its queue) fails its first attempt
    watch = Watch(fail=lambda m: m.keys == "P" and m.queue_offset == 0 and m.reconsume_times == 0)
    with _consumer(broker, watch, lanes=1, clock=clock, suspend_ms=1000) as c:
        polls = PollCounter(c._source)
        broker.send_batch("T", [(b"x", "P")] + [(b"x", f"k{i}") for i in range(10)])
        wait_for(lambda: watch.count() == 11 and c.stats().parked == 1, 30, "P failed and parked")
        c.pause_keys(["P"])
        broker.send_batch("T", [(b"x", "P") for _ in range(3)])
        wait_for(lambda: c.stats().paused_key_messages == 4, 10, "P's later 3 behind it, all paused")
        clock.advance(5.0)  # the retry is due, but P is paused
        wait_for(lambda: c.stats().next_retry_due is None, 10, "the retry's timer fired")
        polls.turns(5)
        assert len(watch.of("P")) == 1 and c.stats().paused_key_messages == 4
        c.resume_keys(["P"])  # its retry was due: it runs now, then the 3
        wait_for(lambda: len(watch.of("P")) == 5, 30, lambda: f"P's retry and 3: {watch.of('P')}")
        assert c.stats().parked == 0
    with watch.lock:
        p = [(q, o, r) for k, q, o, r in watch.starts if k == "P"]
    first = p[0]
    assert p[1] == (first[0], first[1], 1)  # the retry, then the others in order
    assert _in_order([(q, o) for q, o, _ in p[1:]])


def test_a_resume_before_the_retry_is_due_leaves_the_key_to_its_timer(broker: EmbeddedBroker) -> None:
    clock = ManualClock()
    watch = Watch(fail=lambda m: m.keys == "P" and m.reconsume_times == 0)
    with _consumer(broker, watch, lanes=1, clock=clock, suspend_ms=1000) as c:
        polls = PollCounter(c._source)
        broker.send("T", b"x", keys="P")
        wait_for(lambda: c.stats().parked == 1, 30, "P parked")
        c.pause_keys(["P"])
        polls.turns(3)
        c.resume_keys(["P"])
        polls.turns(3)
        assert len(watch.of("P")) == 1  # still waiting for its suspend_ms
        clock.advance(1.0)
        wait_for(lambda: len(watch.of("P")) == 2, 30, "the retry when due")


def test_a_revoked_queue_hands_the_waiting_messages_to_the_next_owner_and_the_pause_stays(
    broker: EmbeddedBroker,
) -> None:
    key = next(k for k in (f"P{i}" for i in range(100)) if lane_of(k, 2) == 1)  # in queue 1
    broker.send_batch("T", [(b"x", key if i % 5 == 0 else f"k{i}") for i in range(100)])
    a_watch, b_watch = Watch(), Watch()
    a = _consumer(broker, a_watch, lanes=2, client_id="c1", revoke_timeout=5)
    a.pause_keys([key])
    with a:
        wait_for(lambda: a_watch.count() == 80, 30, "a's other keys")
        assert a.stats().paused_key_messages == 20
        with _consumer(broker, b_watch, lanes=2, client_id="c2", revoke_timeout=5):  # queue 1 moves to b
            wait_for(lambda: len(b_watch.of(key)) == 20, 30, lambda: f"b runs the key: {len(b_watch.of(key))}")
            wait_for(lambda: a.stats().paused_key_messages == 0, 10, "a's waiting messages purged")
            assert a.paused_keys() == {key} and a_watch.of(key) == []
    assert _in_order(b_watch.of(key))


def test_shutdown_leaves_the_waiting_messages_uncommitted_and_a_restart_runs_only_them() -> None:
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=2)
    broker.send_batch("T", [(b"x", "P" if i % 6 == 0 else f"k{i}") for i in range(120)])
    first = Watch()
    c = _consumer(broker, first, lanes=2)
    c.pause_keys(["P"])
    with c:
        wait_for(lambda: first.count() == 100, 30, "the other keys' 100")
    assert first.of("P") == []
    second = Watch()
    with _consumer(broker, second, lanes=2):  # the pause was this process's: gone
        wait_for(lambda: second.count() == 20, 30, "P's 20 again")
    assert {k for k, _, _, _ in second.starts} == {"P"}  # nothing that finished ran again
    assert _in_order(second.of("P"))
    broker.close()


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "error", "text"),
    [
        ("P", TypeError, "not a single str"),
        (b"P", TypeError, "not a single bytes"),
        (42, TypeError, "iterable of str"),
        ([1], TypeError, "must be a str"),
        ([None], TypeError, "must be a str"),
        (["ok", ""], ValueError, "must not be empty"),
    ],
)
def test_bad_keys_are_refused_naming_the_argument_and_change_nothing(
    broker: EmbeddedBroker, keys: Any, error: type[Exception], text: str
) -> None:
    c = _consumer(broker, lambda msgs: None)
    c.pause_keys(["A"])
    for call in (c.pause_keys, c.resume_keys):
        with pytest.raises(error, match=text) as info:
            call(keys)
        assert str(info.value).startswith("keys: ")
    assert c.paused_keys() == {"A"}
    c.shutdown()


def test_queue_orderly_refuses_pausing_keys(broker: EmbeddedBroker) -> None:
    c = _consumer(broker, lambda msgs: None, mode=ConsumeMode.QUEUE_ORDERLY)
    for call in (c.pause_keys, c.resume_keys):
        with pytest.raises(LitePushError, match="QUEUE_ORDERLY.*pause\\(queues\\)"):
            call(["P"])
    assert c.paused_keys() == frozenset()
    c.shutdown()


def test_resuming_keys_not_paused_is_a_no_op_and_pausing_twice_is_one_pause(broker: EmbeddedBroker) -> None:
    watch = Watch()
    with _consumer(broker, watch, lanes=2) as c:
        c.resume_keys(["never"])
        c.pause_keys(["P"])
        c.pause_keys(("P",))
        broker.send_batch("T", [(b"x", "P") for _ in range(4)] + [(b"x", "k")])
        wait_for(lambda: watch.count() == 1, 30, "k")
        c.resume_keys({"P"})
        wait_for(lambda: watch.count() == 5, 30, "P's 4 after one resume")


# -- stats and metrics ---------------------------------------------------------------------


def test_stats_and_metrics_show_the_paused_keys_and_their_waiting_messages(broker: EmbeddedBroker) -> None:
    registry = CollectorRegistry()
    watch = Watch()

    def sample(name: str) -> float:
        for line in generate_latest(registry).decode().splitlines():
            if line.startswith(name + '{group="g"}'):
                return float(line.split()[-1])
        raise AssertionError(f"{name} not exported")

    with _consumer(broker, watch, lanes=2, registry=registry) as c:
        assert sample("lite_push_paused_keys") == 0 and sample("lite_push_paused_key_messages") == 0
        c.pause_keys(["P", "Q"])
        broker.send_batch("T", [(b"x", "P") for _ in range(6)] + [(b"x", f"k{i}") for i in range(4)])
        wait_for(lambda: c.stats().paused_key_messages == 6 and watch.count() == 4, 30, "P's 6 waiting")
        st = c.stats()
        assert st.paused_keys == frozenset({"P", "Q"}) == c.paused_keys()
        assert sample("lite_push_paused_keys") == 2
        assert sample("lite_push_paused_key_messages") == 6
        assert sample("lite_push_parked_messages") == 6
        c.resume_keys(["P", "Q"])
        wait_for(lambda: watch.count() == 10, 30, "P's 6")
        wait_for(lambda: sample("lite_push_paused_key_messages") == 0, 10, "the gauge back at 0")
        assert sample("lite_push_paused_keys") == 0 and c.stats().paused_keys == frozenset()


# -- a group balanced by message (Redis) --------------------------------------------------------


def test_on_a_group_balanced_by_message_a_paused_key_stays_with_its_member(redis_server: RedisServer) -> None:
    """Balance.MESSAGE: a key with unacknowledged messages stays with its
    member, and a paused key's waiting messages are unacknowledged, so no
    other member runs the key while it is paused; the other keys go on (in
    the other member), and after the resume the key runs in offset order."""
    if EX.name != "thread":
        pytest.skip("the members' lanes are threads; the executors are covered above")
    broker = RedisBroker(
        redis_server.url, namespace=f"pk-{uuid.uuid4().hex[:10]}", session_timeout=3.0, heartbeat_interval=0.3
    )
    lock = threading.Lock()
    calls: list[tuple[str, str | None, int]] = []  # member, key, offset: in start order

    def member(name: str) -> LitePushConsumer:
        def listener(msgs: list[MessageExt]) -> None:
            with lock:
                calls.extend((name, m.keys, m.queue_offset) for m in msgs)

        c = LitePushConsumer(
            ConsumerConfig(group="g", lanes=2, poll_timeout=0.02, commit_interval=0.05, revoke_timeout=1.0),
            source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, balance=Balance.MESSAGE),
            listener=listener,
        )
        c.subscribe("T")
        return c

    def ran(key: str | None = None, by: str | None = None) -> list[int]:
        with lock:
            return [o for n, k, o in calls if (key is None or k == key) and (by is None or n == by)]

    broker.create_topic("T", 1)
    q = MessageQueue("T", broker.namespace, 0)
    a, b = member("a"), member("b")
    try:
        a.pause_keys(["P"])
        a.start()
        broker.send_batch("T", [{"body": b"x", "keys": "P"} for _ in range(3)])
        wait_for(lambda: a.stats().paused_key_messages == 3, 20, lambda: f"P held by a: {a.stats()}")
        b.start()  # b joins: it may receive any message of the queue, but not P's: a holds P
        broker.send_batch("T", [{"body": b"x", "keys": "P" if i % 4 == 0 else f"k{i}"} for i in range(80)])
        wait_for(lambda: len(ran()) == 60, 30, lambda: f"the other keys' 60: {len(ran())}")
        assert ran("P") == [] and ran(by="b")  # b ran other keys, and no P
        a.resume_keys(["P"])
        wait_for(lambda: len(ran("P")) == 23, 30, lambda: f"P's 23: {ran('P')}")
        assert ran("P") == sorted(ran("P")) and len(set(ran())) == 83
        for c in (a, b):
            c.shutdown(5)
        assert getattr(broker.committed("g", q), "offset", None) == 83
    finally:
        for c in (a, b):
            c.shutdown(5)
        broker.close()


# -- random pauses and resumes ---------------------------------------------------------------


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**16),
    mode=st.sampled_from(KEYED),
    lanes=st.sampled_from([1, 2, 4]),
    batch_size=st.sampled_from([1, 3]),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("send"), st.integers(1, 60)),
            st.tuples(st.sampled_from(["pause", "resume"]), st.sets(st.integers(0, 7), min_size=1, max_size=4)),
            st.tuples(st.just("sleep"), st.integers(0, 20)),
        ),
        min_size=3,
        max_size=14,
    ),
)
def test_random_pauses_and_resumes_keep_order_hold_what_is_paused_and_run_everything_once(
    seed: int, mode: ConsumeMode, lanes: int, batch_size: int, ops: list[tuple[str, Any]]
) -> None:
    """An application thread sends, pauses and resumes at random while
    messages of 8 keys flow through listeners of random delays: no message
    stored while its key was paused starts before the key's resume was
    asked for; after a final resume of every key, each message ran once,
    and (KEY_ORDERLY) each key in offset order, never two at once."""
    rng = random.Random(seed)
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=2)
    keys = [f"k{i}" for i in range(8)]
    # per key: a count that is odd while the key is paused (as this thread
    # last asked); a message's body is the count when it was sent
    epoch = dict.fromkeys(keys, 0)
    early: list[tuple[str, int, int]] = []
    watch = Watch(jitter=0.003, seed=seed)

    def check(m: MessageExt) -> None:  # under watch.lock
        sent = int(m.body)
        if sent % 2 and epoch[str(m.keys)] == sent:  # sent while paused, and still paused
            early.append((str(m.keys), m.queue_id, m.queue_offset))

    watch.check = check
    sent = 0
    c = _consumer(broker, watch, mode=mode, lanes=lanes, batch_size=batch_size)
    with c:
        for op, arg in ops:
            if op == "send":
                with watch.lock:
                    bodies = {k: str(epoch[k]).encode() for k in keys}
                batch = [rng.choice(keys) for _ in range(arg)]
                broker.send_batch("T", [(bodies[k], k) for k in batch])
                sent += arg
            elif op == "pause":
                chosen = [keys[i] for i in arg]
                c.pause_keys(chosen)
                with watch.lock:  # paused from now on (for what is sent from now on)
                    for k in chosen:
                        if epoch[k] % 2 == 0:
                            epoch[k] += 1
            elif op == "resume":
                chosen = [keys[i] for i in arg]
                with watch.lock:  # from now on their messages may run
                    for k in chosen:
                        if epoch[k] % 2:
                            epoch[k] += 1
                c.resume_keys(chosen)
            else:
                time.sleep(arg / 1000)
        with watch.lock:
            for k in keys:
                if epoch[k] % 2:
                    epoch[k] += 1
        c.resume_keys(keys)
        wait_for(lambda: watch.count() == sent, 60, lambda: f"{sent} messages: {watch.count()} ran")
        wait_for(lambda: c.stats().parked == 0, 10, "nothing waiting")
        assert c.stats().paused_key_messages == 0 and c.paused_keys() == frozenset()
    broker.close()
    assert not early, early[:5]
    assert len(watch.once_each()) == sent
    if mode is ConsumeMode.KEY_ORDERLY:
        assert not watch.overlaps
        for k in keys:
            assert _in_order(watch.of(k)), k
