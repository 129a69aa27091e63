"""Fenced delivery (issue 16.1): a lane starts no listener call for a queue
whose ownership is not certain, so a member that stopped renewing its session
never runs a key at the same time as the member that took its queues over."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

import pytest
from executors import EX
from helpers import Recorder, assert_offsets_increase, wait_for, wait_until

from lite_push import ConsumerConfig, LitePushConsumer, MessageQueue
from lite_push._errors import ConfigError
from lite_push.sources import ConsumeFromWhere
from lite_push.sources.embedded import EmbeddedBroker, EmbeddedPullConsumer


class FreezablePull(EmbeddedPullConsumer):
    """A member whose pull thread can be frozen (it blocks in ``poll``: no
    heartbeats, no commits) while its lanes go on with what they hold: a
    member stalled past its session, as far as the group can tell."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.freeze = threading.Event()
        self.thaw = threading.Event()
        #: Fencing switched off (shows what the test catches without it).
        self.unfenced = False

    def poll(self, timeout: float, max_per_queue: int = 32):  # type: ignore[no-untyped-def]
        if self.freeze.is_set():
            self.thaw.wait(30)
            self.freeze.clear()
        return super().poll(timeout, max_per_queue)

    def owned_for(self) -> dict[MessageQueue, float]:
        return {} if self.unfenced else super().owned_for()


def _run_freeze(unfenced: bool) -> Recorder:
    """Two members share 4 queues (40 keys); A's pull thread freezes for 2.5 s (its
    session is 1 s) while its lanes hold seconds of work; B evicts A and
    replays A's queues from the last commit; A thaws, finds its queues gone
    and rejoins.  Returns the shared recorder (per-key overlaps, order)."""
    broker = EmbeddedBroker(session_timeout=1.0)
    broker.create_topic("T", queue_count=4)
    total = 8000
    broker.send_batch("T", [(b"x", f"k{i % 40}") for i in range(total)])
    rec = Recorder(delay=0.003)
    # Java lanes: each lane holds a share of A's 20 keys and seconds of work
    # when A freezes.  (Placed by load, keys placed in the burst after the
    # startup rebalance can pile onto one lane, leaving A's other lanes idle
    # within half a second, so the unfenced run below may not overlap.)
    cfg = dict(group="g", lanes=5, poll_timeout=0.02, commit_interval=0.05, revoke_timeout=0.3, fence_margin=0.2)
    cfg.update(lane_placement="java")
    # Lanes of 1,000 messages: B's lanes take A's old queues' keys in among
    # its own queue's backlog, not behind all of it (with a lane taking a
    # whole 4,096-message dispatch, B may reach A's keys only after A's
    # lanes have drained them, and the unfenced run below need not overlap).
    cfg.update(pull_threshold_for_queue=4000, lane_capacity=1000)
    src_a = FreezablePull(broker, "g", consume_from=ConsumeFromWhere.FIRST_OFFSET, client_id="a")
    src_a.unfenced = unfenced
    src_b = broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, client_id="b")
    a = EX.consumer(EX.config(**cfg), source=src_a, listener=rec)
    b = EX.consumer(EX.config(**cfg), source=src_b, listener=rec)
    a.subscribe("T")
    b.subscribe("T")
    try:
        with a, b:
            assert wait_until(lambda: len(a.stats().in_flight) == 2 and rec.count() > 200, timeout=30)
            src_a.freeze.set()
            time.sleep(2.5)
            src_a.thaw.set()
            done = {(q, o) for _, q, o in rec.seen}
            assert wait_until(lambda: len(done | {(q, o) for _, q, o in list(rec.seen)}) == total, timeout=60)
    finally:
        broker.close()
    return rec


def test_a_frozen_member_stops_at_its_fence_and_no_key_runs_twice_at_once(executor):
    rec = _run_freeze(unfenced=False)
    assert rec.overlaps == []  # never one key in two members' listeners at once
    assert len({(q, o) for _, q, o in rec.seen}) == 8000  # nothing lost
    assert_offsets_increase(rec.order, first_only=True)


@pytest.mark.parametrize("executor", ["thread"], indirect=True)
def test_without_the_fence_the_frozen_member_overlaps_the_new_owner(executor):
    """The same run with fencing off: the test above can fail."""
    rec = _run_freeze(unfenced=True)
    assert rec.overlaps


class StalledPull(EmbeddedPullConsumer):
    """A member whose ownership is uncertain while ``stalled`` is set (as
    if a heartbeat were overdue), then renewed: nothing is lost."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.stalled = threading.Event()
        #: Times the pull thread asked while ``stalled`` was set.
        self.stalled_answers = 0

    def owned_for(self) -> Mapping[MessageQueue, float]:
        left = super().owned_for()
        if not self.stalled.is_set():
            return left
        self.stalled_answers += 1
        return dict.fromkeys(left, -1.0)


def test_a_lane_waits_at_the_fence_and_goes_on_when_ownership_is_renewed(executor, caplog):
    caplog.set_level(logging.WARNING, logger="lite_push")
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=2)
    src = StalledPull(broker, "g", consume_from=ConsumeFromWhere.FIRST_OFFSET)
    rec = Recorder(delay=0.001)
    c = EX.consumer(EX.config(group="g", lanes=4, poll_timeout=0.02, commit_interval=0.05), source=src, listener=rec)
    c.subscribe("T")

    def fenced_lanes() -> set[int]:
        """Lanes that logged stopping at a fence (each logs once per stop)."""
        return {r.args[1] for r in list(caplog.records) if "stops at" in str(r.msg)}  # type: ignore[index]

    def busy_lanes() -> set[int]:
        """Lanes holding work they took (running it, or waiting to)."""
        return {i for i, busy in enumerate(c._readings.counters.busy) if busy}

    def all_held_at_the_fence() -> bool:
        """Every message polled and taken by a lane, and every lane that took
        some stopped at the fence: from then on no call of them can start
        until the fence moves (a lane that ran past it ends the wait too)."""
        if rec.count() > 200:
            return True
        st = c.stats()
        if sum(st.in_flight.values()) != 200 or any(st.lane_depths):
            return False
        busy = busy_lanes()
        return bool(busy) and busy <= fenced_lanes()

    with c:
        broker.send_batch("T", [(b"x", f"k{i % 50}") for i in range(200)])
        wait_for(lambda: rec.count() == 200, 30, lambda: f"the first 200 calls ({rec.count()} made)")
        assert fenced_lanes() == set()
        src.stalled.set()
        # the pull thread renews the fences into the past: once it asked
        # twice, the first answer was applied (one renewal per poll, in turn)
        wait_for(lambda: src.stalled_answers >= 2, 10, "the pull thread to renew the fences while stalled")
        broker.send_batch("T", [(b"y", f"k{i % 50}") for i in range(200)])
        wait_for(
            all_held_at_the_fence,
            30,
            lambda: f"the lanes to stop at the fence (stats {c.stats()}, busy {busy_lanes()}, fenced {fenced_lanes()})",
        )
        held = rec.count()
        assert held == 200  # polled, but no listener call started past the fence
        assert sum(c.stats().in_flight.values()) == 200  # held, unfinished, uncommitted
        src.stalled.clear()
        wait_for(lambda: rec.count() == 400, 30, lambda: f"the calls held at the fence ({rec.count()} of 400 made)")
        wait_for(lambda: sum(c.stats().in_flight.values()) == 0, 30, lambda: f"nothing in flight ({c.stats()})")
    broker.close()
    assert len(set(rec.seen)) == 400 and rec.overlaps == []
    assert_offsets_increase(rec.order)


def test_revoke_timeout_and_margin_must_fit_inside_the_session():
    broker = EmbeddedBroker(session_timeout=5.0)
    broker.create_topic("T", queue_count=1)
    src = broker.pull_consumer("g")
    with pytest.raises(ConfigError) as e:
        LitePushConsumer(ConsumerConfig(group="g", revoke_timeout=4.6, fence_margin=0.5), src, lambda m: None)
    assert e.value.field == "revoke_timeout"
    assert "revoke_timeout (4.6 s)" in str(e.value) and "session_timeout (5 s)" in str(e.value)
    assert "fence_margin (0.5 s)" in str(e.value)
    LitePushConsumer(ConsumerConfig(group="g", revoke_timeout=4.0, fence_margin=0.5), src, lambda m: None)
    broker.close()
