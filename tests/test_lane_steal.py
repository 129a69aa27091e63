"""No key waits behind another key's slow call (issue 29, point 1).

A lane whose listener call has run longer than ``steal_after`` has the keys
queued behind it moved to other lanes, whole and in offset order; the key
of the call stays, and so do the keys parked in that lane.  The stealer is
tested alone (a lane and a task held by hand), then in real consumers on
every executor: the issue's hung-key scenario (on the injected clock, and
once with moving switched off, where it must fail), and a Hypothesis test
of random call times, hangs, failures and parked keys under real
concurrency.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict, deque
from typing import Any

import pytest
from executors import EX
from helpers import wait_for, wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lite_push import ConfigError, ConsumeFromWhere, ConsumeMode, ConsumerConfig, EmbeddedBroker, ManualClock
from lite_push._kernels.router_py import KeyRouter
from lite_push._lanes.lanes import Lane
from lite_push._pull.dispatch import Dispatcher
from lite_push._pull.lane_steal import LaneStealer
from lite_push._state.process_queue import ProcessQueue
from lite_push._state.shared import Counters
from lite_push._types import MessageExt, MessageQueue

pytestmark = pytest.mark.usefixtures("executor")

Q = MessageQueue("T", "embedded", 0)
RNG = random.Random(29)


def _msg(offset: int, key: str | None) -> MessageExt:
    return MessageExt("T", 0, offset, b"", keys=key)


class _Stage:
    """One stuck lane (0) of three, its task held by hand, and a stealer."""

    def __init__(self, keys: list[str | None], parked: tuple[str, ...] = ()) -> None:
        self.router = KeyRouter(3)
        self.lanes = [Lane(i, lambda: None) for i in range(3)]
        self.released: deque[tuple[int, list[MessageExt]]] = deque()
        self.counters = Counters(3)
        self.parked: list[dict[Any, Any]] = [{k: None for k in parked}, {}, {}]
        self.pq = ProcessQueue(
            Q, next_offset=0, keyless_lane=0, resume_at=(10**6, 1 << 40, 1 << 30, 1 << 30), wake=lambda: None
        )
        self.msgs = [_msg(i, k) for i, k in enumerate(keys)]
        self.pq.add_batch(self.msgs, len(self.msgs))
        segs, counts = self.router.route([(self.pq, self.msgs, 0)])
        dispatcher = Dispatcher(
            self.lanes, {}, lane_capacity=1000, flush=lambda: None, router=self.router, released=self.released
        )
        self.stealer = LaneStealer(
            self.lanes, dispatcher=dispatcher, parked=self.parked, counters=self.counters, group="g", wake=lambda: None
        )
        self.segments = segs

    def put_on_lane0(self, messages: list[MessageExt]) -> None:
        """Route ``messages`` pinned to lane 0 (every other lane stalled)."""
        for i in (1, 2):
            self.router.stall(i)
        segs, counts = self.router.route([(self.pq, messages, 0)])
        for i in (1, 2):
            self.router.unstall(i)
        assert segs[1] is None and segs[2] is None
        self.lanes[0].put(segs[0] or [], counts[0])


def test_the_stealer_moves_every_other_key_whole_and_in_order_and_finishes_what_ran() -> None:
    # Lane 0's task took one segment [a0 b1 a2 h3 b4 c5 p6 -7 c8] and is in
    # the call of h3 ("h" hangs) on the hot path: a0 b1 a2 ran, unreleased.
    keys = ["a", "b", "a", "h", "b", "c", "p", None, "c"]
    st_ = _Stage([], parked=("p",))
    msgs = [_msg(i, k) for i, k in enumerate(keys)]
    st_.pq.add_batch(msgs, len(msgs))
    st_.put_on_lane0(msgs)
    lane = st_.lanes[0]
    taken = lane.take()
    assert taken is not None
    lane.hand, lane.seg, lane.done = taken[0], taken[0][0][1], None
    seg = lane.seg
    assert seg is not None
    later = [_msg(9, "b"), _msg(10, "h"), _msg(11, "d")]  # queued behind, not taken
    st_.pq.add_batch(later, 12)
    st_.put_on_lane0(later)
    call = ([msgs[3]], 0.0)
    lane.call = call
    assert st_.stealer.steal(0, call) == 5  # b4 c5 c8, then b9 d11
    # The task's segment ends at its call; what ran before it was finished for it.
    assert [m.queue_offset for m in seg] == [3]
    assert lane.moving and lane.cut == 3
    assert st_.pq.snapshot()[0] == 12 - 3  # a0 b1 a2 completed
    assert st_.counters.consumed[0] == 3
    # What stays is queued in order: the parked key's, the keyless one, the hung key's.
    assert [m.queue_offset for _, ms in lane.drain() for m in ms] == [6, 7, 10]
    moved = [(i, m.keys, m.queue_offset) for i, ln in enumerate(st_.lanes) if i for _, ms in ln.drain() for m in ms]
    by_key: dict[str | None, list[int]] = defaultdict(list)
    lane_of: dict[str | None, set[int]] = defaultdict(set)
    for i, k, off in moved:
        by_key[k].append(off)
        lane_of[k].add(i)
    assert by_key == {"b": [4, 9], "c": [5, 8], "d": [11]}  # whole keys, in offset order
    assert all(len(v) == 1 for v in lane_of.values())  # each on one lane
    assert st_.router.lane_of_key("b") != 0 and st_.router.lane_of_key("a") is None
    assert st_.router.stalled == frozenset({0})
    assert st_.counters.steals == 1 and st_.counters.stolen == 5
    # The call returns: the task settles (its index moves back by the cut).
    lane.call = None
    assert lane.settle() == 3 and not lane.moving
    st_.stealer.run()  # the call ended: the lane takes new keys again
    assert st_.router.stalled == frozenset()


def test_the_slow_path_hands_over_its_finished_messages_and_keeps_its_segment_start() -> None:
    st_ = _Stage([])
    msgs = [_msg(i, k) for i, k in enumerate(["a", "x", "a"])]
    st_.pq.add_batch(msgs, 3)
    st_.put_on_lane0(msgs)
    lane = st_.lanes[0]
    taken = lane.take()
    assert taken is not None
    done = [msgs[0]]  # the slow path's successes so far
    lane.hand, lane.seg, lane.done = taken[0], taken[0][0][1], done
    call = ([msgs[1]], 0.0)
    lane.call = call
    assert st_.stealer.steal(0, call) == 1
    assert done == [] and lane.cut == 0  # completed for the task; the slow path's index is its own
    assert [m.queue_offset for m in taken[0][0][1]] == [0, 1]
    assert st_.pq.snapshot()[0] == 2


def test_a_due_keys_call_leaves_every_taken_segment_free_to_move() -> None:
    st_ = _Stage([])
    msgs = [_msg(i, k) for i, k in enumerate(["a", "b"])]
    st_.pq.add_batch(msgs, 2)
    st_.put_on_lane0(msgs)
    lane = st_.lanes[0]
    taken = lane.take()
    assert taken is not None
    lane.hand, lane.seg, lane.done = taken[0], None, None  # running a parked key's retry
    call = ([_msg(99, "p")], 0.0)
    lane.call = call
    assert st_.stealer.steal(0, call) == 2
    assert taken[0] == []


def test_nothing_moves_once_the_call_has_returned() -> None:
    st_ = _Stage([])
    msgs = [_msg(0, "a"), _msg(1, "b")]
    st_.pq.add_batch(msgs, 2)
    st_.put_on_lane0(msgs)
    lane = st_.lanes[0]
    call = ([msgs[0]], 0.0)
    lane.call = None  # returned before the stealer came
    assert st_.stealer.steal(0, call) == 0
    assert not lane.moving and lane.depth == 2 and st_.router.stalled == frozenset()


def test_a_task_returning_while_the_stealer_works_waits_for_it() -> None:
    """The hand-shake under real threads: a task that finishes its call
    while a stealer holds it settles before it goes on, and sees the cut."""
    for _ in range(200):
        st_ = _Stage([])
        msgs = [_msg(i, "h" if i == 1 else f"k{i}") for i in range(6)]
        st_.pq.add_batch(msgs, 6)
        st_.put_on_lane0(msgs)
        lane = st_.lanes[0]
        taken = lane.take()
        assert taken is not None
        lane.hand, lane.seg, lane.done = taken[0], taken[0][0][1], None
        call = ([msgs[1]], 0.0)
        lane.call = call
        seen: list[int] = []
        go = threading.Event()

        def task(lane: Lane, go: threading.Event, seen: list[int]) -> None:
            go.wait()
            time.sleep(RNG.random() * 0.0005)
            lane.call = None
            seen.append(lane.settle() if lane.moving else 0)

        t = threading.Thread(target=task, args=(lane, go, seen))
        t.start()
        go.set()
        moved = st_.stealer.steal(0, call)
        t.join()
        seg = taken[0][0][1]
        if moved:  # held in time: the task took the cut
            assert seen == [1] and [m.queue_offset for m in seg] == [1]
        else:  # the call had returned: nothing changed
            assert seen == [0] and len(seg) == 6


# -- real consumers -------------------------------------------------------------------


def _hung_scenario(steal_after: float | str | None, patience: float) -> tuple[int, int, list[str]]:
    """The issue's scenario on the injected clock: 4 lanes, key ``hung``
    blocks; 600 messages of 60 other keys follow.  Returns (ran, total,
    per-key order problems) once the other keys ran or went quiet."""
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=2)
    clock = ManualClock()
    release = threading.Event()
    lock = threading.Lock()
    ran: dict[str, list[int]] = defaultdict(list)
    started = threading.Event()

    def listener(msgs: list[MessageExt]) -> None:
        for m in msgs:
            if m.keys == "hung":
                started.set()
                release.wait(60)
            with lock:
                ran[m.keys or ""].append(m.queue_offset)

    consumer = EX.consumer(
        ConsumerConfig(group="g", lanes=4, steal_after=steal_after, poll_timeout=0.02),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener,
        clock=clock,
    )
    consumer.subscribe("T")
    total = 600
    with consumer:
        broker.send("T", b"x", keys="hung")
        wait_for(started.is_set, 10, "the hung call")
        for i in range(total):
            broker.send("T", b"x", keys=f"k{i % 60}")

        def others() -> int:
            with lock:
                return sum(len(v) for k, v in ran.items() if k != "hung")

        # Everything that is not behind the hung call runs; then time passes.
        last = -1
        while others() != last:
            last = others()
            time.sleep(0.3)
        clock.advance(2.0)
        wait_until(lambda: others() == total, patience)
        done = others()
        problems = [k for k, offs in ran.items() if offs != sorted(offs) or len(offs) != len(set(offs))]
        release.set()
        wait_for(lambda: others() == total and len(ran["hung"]) == 1, 30, "everything, once released")
    return done, total, problems


def test_no_key_waits_behind_a_hung_call() -> None:
    done, total, problems = _hung_scenario(1.0, 20.0)
    assert done == total  # every other key ran while the call hung
    assert problems == []


def test_the_hung_call_test_fails_with_moving_switched_off() -> None:
    """The same scenario with ``steal_after=None``: keys queued behind the
    hung call wait for it (the test above would fail)."""
    done, total, problems = _hung_scenario(None, 1.0)
    assert done < total
    assert problems == []


# -- Hypothesis: random call times, hangs, failures, parked keys --------------------

#: What one message's calls do: ok, a few ms of sleep, fail once, or hang
#: until the test lets it go.
ACTIONS = st.sampled_from(["ok", "ok", "ok", "sleep", "fail", "hang"])


@st.composite
def _cases(draw: st.DrawFn) -> tuple[int, list[tuple[str | None, str]]]:
    lanes = draw(st.integers(2, 5))
    keys = [f"k{i}" for i in range(draw(st.integers(2, 12)))] + [None]
    msgs = []
    hangs = 0
    for _ in range(draw(st.integers(10, 80))):
        key = draw(st.sampled_from(keys))
        action = draw(ACTIONS)
        if action == "hang" and (hangs >= lanes - 1 or key is None):
            action = "sleep"  # fewer hangs than lanes: somewhere for the others to go
        hangs += action == "hang"
        msgs.append((key, action))
    return lanes, msgs


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_cases())
def test_random_calls_hangs_and_failures_keep_every_key_in_order(
    case: tuple[int, list[tuple[str | None, str]]],
) -> None:
    lanes, plan = case
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=2)
    for key, action in plan:
        broker.send("T", action.encode(), keys=key)
    release = threading.Event()
    lock = threading.Lock()
    active: set[str] = set()
    overlaps: list[str] = []
    attempts: dict[tuple[int, int], int] = defaultdict(int)
    succeeded: dict[str, list[tuple[int, int]]] = defaultdict(list)
    early: list[tuple[str, tuple[int, int]]] = []  # a message run before an earlier one of its key succeeded
    rng = random.Random(len(plan))

    def key_of(m: MessageExt) -> str:
        return m.keys or f"#queue{m.queue_id}"  # keyless messages keep their queue's order

    sent: dict[str, list[tuple[int, int]]] = defaultdict(list)

    def listener(msgs: list[MessageExt]) -> None:
        m = msgs[0]
        k, pos = key_of(m), (m.queue_id, m.queue_offset)
        with lock:
            if k in active:
                overlaps.append(k)
            active.add(k)
            attempts[pos] += 1
            n = attempts[pos]
            if [p for p in sent[k] if p < pos and p not in succeeded[k]]:
                early.append((k, pos))
        try:
            action = m.body.decode()
            if action == "hang":
                release.wait(60)
            elif action == "sleep":
                time.sleep(rng.random() * 0.01)
            elif action == "fail" and n == 1:
                raise RuntimeError("first attempt fails")
            with lock:
                succeeded[k].append(pos)
        finally:
            with lock:
                active.discard(k)

    for q in broker.queues("T"):
        for m in broker.messages(q):
            sent[key_of(m)].append((m.queue_id, m.queue_offset))
    clean = {k for k, ps in sent.items() if not k.startswith("#")} - {
        key_of(m) for q in broker.queues("T") for m in broker.messages(q) if m.body in (b"fail", b"hang")
    }
    consumer = EX.consumer(
        ConsumerConfig(
            group="g", lanes=lanes, steal_after=0.05, suspend_ms=10, poll_timeout=0.02, commit_interval=0.05
        ),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener,
    )
    consumer.subscribe("T")
    with consumer:
        # While the hangs hold their lanes, every key that neither hangs nor
        # failed (nothing of it in flight or parked) runs to its end.
        wait_for(
            lambda: all(len(succeeded[k]) == len(sent[k]) for k in clean),
            30,
            lambda: f"clean keys done; missing {[k for k in clean if len(succeeded[k]) != len(sent[k])]}",
        )
        release.set()
        wait_for(lambda: all(len(succeeded[k]) == len(v) for k, v in sent.items()), 30, "every message")
        wait_for(
            lambda: all(c == len(broker.messages(q)) for q, c in consumer.stats().committed.items()),
            30,
            "the commit at the end",
        )
    assert overlaps == []
    assert early == []
    for k, ps in sent.items():
        assert succeeded[k] == ps, k  # each once, in offset order


def test_bad_settings_are_named() -> None:
    for bad in ("soon", 0, -1.0, float("nan"), True):
        with pytest.raises(ConfigError, match="steal_after"):
            ConsumerConfig(group="g", steal_after=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="steal_after.*CONCURRENTLY"):
        ConsumerConfig(group="g", mode=ConsumeMode.CONCURRENTLY, steal_after=2.0)
    with pytest.raises(ConfigError, match="steal_after.*'hash'"):
        ConsumerConfig(group="g", lane_placement="hash", steal_after=2.0)
    for bad in (0, -5, "60"):
        with pytest.raises(ConfigError, match="slow_call_warning"):
            ConsumerConfig(group="g", slow_call_warning=bad)  # type: ignore[arg-type]
    assert not ConsumerConfig(group="g", mode=ConsumeMode.CONCURRENTLY).steals  # "auto": off where keys cannot move
    assert not ConsumerConfig(group="g", steal_after=None).steals
    assert ConsumerConfig(group="g").steals
