"""Each data-path step built alone, with only the collaborators it uses.

No consumer is constructed here: every test makes the few parts one step
takes (a real embedded-broker source where it talks to a source, real
ProcessQueues and Lanes, a ManualClock) and drives the step by hand, the way
a newcomer would to change or test it.  The whole consumer is tested
elsewhere; these pin down each part's own contract.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from dataclasses import replace
from typing import NamedTuple

import pytest

from lite_push import (
    ConsumeFromWhere,
    ConsumeMode,
    ConsumerConfig,
    ConsumeResult,
    EmbeddedBroker,
    MessageExt,
    MessageQueue,
    PollBatch,
)
from lite_push._clock import ManualClock
from lite_push._errors import NonRetryableError
from lite_push._exec.async_executor import AsyncExecutor
from lite_push._exec.queue_orderly import QueueOrderlyService
from lite_push._exec.thread_executor import ThreadExecutor
from lite_push._kernels.router import KeyRouter
from lite_push._lanes.call_gate import CallGate
from lite_push._lanes.failures import FailurePolicy, Outbox, SendItem, Verdict
from lite_push._lanes.handback import Handback
from lite_push._lanes.lane_failures import LaneFailures
from lite_push._lanes.lanes import Lane
from lite_push._lanes.parked_keys import ParkedKeys
from lite_push._lanes.rate_limit import RateLimiter
from lite_push._lanes.steps import FENCED, PAUSE, Steps
from lite_push._lanes.worker import LaneWorker
from lite_push._pull.assignment import AppHooks, Assignment
from lite_push._pull.broker_locks import LOCK_RETRY_INTERVAL, BrokerLocks
from lite_push._pull.commit_schedule import CommitSchedule
from lite_push._pull.committer import Committer
from lite_push._pull.dispatch import Dispatcher, placement_limit
from lite_push._pull.failure_sender import FailureSender
from lite_push._pull.flow_control import FlowControl, low_water
from lite_push._pull.intake import Intake
from lite_push._pull.key_pauses import KeyPauseChange, KeyPauses, KeyPauseSync
from lite_push._pull.loop import PullLoop
from lite_push._pull.poll_sync import PollSync
from lite_push._pull.queue_opener import QueueOpener
from lite_push._pull.revoke_drain import RevokeDrain
from lite_push._pull.upkeep import Upkeep
from lite_push._state.offset_map import decode
from lite_push._state.process_queue import ProcessQueue
from lite_push._state.shared import MAX_SEGMENT, AppPauses, Counters, FailureLatch
from lite_push._state.timer import PURGE, DelayedSendBack, DueKey, LocalRetry, RetryTimer
from lite_push.sources import EmbeddedPullConsumer, PullSource, RebalanceListener, dlq_topic

MQ = MessageQueue("T", "embedded", 0)
MQ1 = MessageQueue("T", "embedded", 1)


def _msg(offset: int, key: str | None = "k", queue: MessageQueue = MQ) -> MessageExt:
    return MessageExt(queue.topic, queue.queue_id, offset, b"x", keys=key)


def _pq(queue: MessageQueue = MQ, start: int = 0, cfg: ConsumerConfig | None = None) -> ProcessQueue:
    return ProcessQueue(
        queue,
        next_offset=start,
        keyless_lane=0,
        resume_at=low_water(cfg or ConsumerConfig(group="g")),
        wake=lambda: None,
    )


def _tracked(pq: ProcessQueue, msgs: list[MessageExt]) -> list[MessageExt]:
    pq.add_batch(msgs, msgs[-1].queue_offset + 1)
    pq.owned_until = float("inf")
    return msgs


class _Owner(RebalanceListener):
    """Takes what the source assigns (no consumer around it)."""

    def __init__(self) -> None:
        self.queues: set[MessageQueue] = set()

    def on_assigned(self, queues: Collection[MessageQueue]) -> None:
        self.queues |= set(queues)

    def on_revoked(self, queues: Collection[MessageQueue]) -> None:
        self.queues -= set(queues)


def _member(broker: EmbeddedBroker, listener: RebalanceListener | None = None) -> EmbeddedPullConsumer:
    """A source that owns both queues of T (one poll runs the rebalance)."""
    source = broker.pull_consumer("g")
    source.set_rebalance_listener(listener or _Owner())
    source.subscribe("T")
    source.poll(0.0)
    assert source.assignment() == {MQ, MQ1}
    return source


# -- the failure policy --------------------------------------------------------------


def test_failure_policy_classifies_once_for_every_path() -> None:
    keyed = FailurePolicy(keyed=True, max_reconsume_times=2, retry_start_level=3)
    plain = FailurePolicy(keyed=False, max_reconsume_times=2, retry_start_level=3)
    raised = keyed.classify(ValueError("bad"), None)
    assert (
        not raised.dead_now and raised.reason == "listener raised ValueError: bad" and "ValueError" in raised.exception
    )
    assert keyed.classify(NonRetryableError("no"), None).dead_now
    assert keyed.classify(None, ConsumeResult.DLQ_NOW).dead_now
    assert keyed.classify(None, ConsumeResult.RETRY_LATER).reason == "listener returned RETRY_LATER"
    odd = keyed.classify(None, 42)
    assert not odd.dead_now and "treated as RETRY_LATER" in odd.reason
    first, used_up = _msg(0), replace(_msg(1), reconsume_times=2)
    assert keyed.verdict(first, raised) is Verdict.PARK
    assert plain.verdict(first, raised) is Verdict.SEND_BACK
    assert keyed.verdict(used_up, raised) is Verdict.DEAD_LETTER  # retries used up
    assert plain.verdict(first, keyed.classify(None, ConsumeResult.DLQ_NOW)) is Verdict.DEAD_LETTER
    unlimited = FailurePolicy(keyed=True, max_reconsume_times=-1, retry_start_level=1)
    assert unlimited.verdict(used_up, raised) is Verdict.PARK
    back = plain.send_back(_pq(), used_up, raised)
    assert (back.dead_letter, back.delay_level, back.reason) == (False, 5, raised.reason)
    assert plain.dead_letter(_pq(), first, raised).dead_letter


# -- the timer and its kinds of work ---------------------------------------------------


def test_the_timer_sorts_due_work_by_kind_and_wakes_only_for_a_new_earliest() -> None:
    wakes: list[int] = []
    timer = RetryTimer(lambda: wakes.append(1))
    pq, other = _pq(), _pq(MQ1)
    item = SendItem(pq, _msg(3), False, "r", "", 1)
    timer.add(10.0, DueKey(2, "a", 1))
    timer.add(5.0, LocalRetry(other, _msg(1, queue=MQ1)))
    timer.add(7.0, DelayedSendBack(item))
    timer.add(20.0, DueKey(0, "b", 2))
    assert len(wakes) == 2  # 10.0, then 5.0 became the earliest; 7.0 and 20.0 did not
    fired = timer.fire(10.0)
    assert list(fired.per_lane) == [2] and [w.key for w in fired.per_lane[2] if isinstance(w, DueKey)] == ["a"]
    assert [(r.pq, r.message.queue_offset) for r in fired.local] == [(other, 1)]
    assert fired.delayed == [item]
    assert timer.next_due() == 20.0 and len(timer) == 1


def test_a_revoke_takes_only_the_pull_threads_work_of_its_queues() -> None:
    timer = RetryTimer(lambda: None)
    pq, other = _pq(), _pq(MQ1)
    timer.add(1.0, LocalRetry(pq, _msg(1)))
    timer.add(2.0, DelayedSendBack(SendItem(pq, _msg(2), False, "r")))
    timer.add(3.0, LocalRetry(other, _msg(5, queue=MQ1)))
    timer.add(4.0, DueKey(0, "k", 1))  # a lane's: its lane purges it
    taken = timer.take_waiting({pq})
    assert sorted(m.queue_offset for _, m in taken) == [1, 2]
    assert len(timer) == 2 and timer.next_due() == 3.0


# -- a lane's call gate ------------------------------------------------------------------


def _drive_checks(gen: Iterator[list[MessageExt]], on_wait: object = None) -> tuple[list[list[MessageExt]], bool]:
    """Run a gate check to its answer, recording what it yielded."""
    yielded: list[list[MessageExt]] = []
    try:
        while True:
            yielded.append(next(gen))
            if callable(on_wait):
                on_wait()
    except StopIteration as stop:
        return yielded, bool(stop.value)


def test_the_call_gate_waits_at_the_fence_and_skips_a_dropped_queue() -> None:
    clock = ManualClock()
    abort = threading.Event()
    gate = CallGate(0, group="g", clock=clock, abort=abort)
    pq = _pq()
    pq.owned_until = clock.monotonic() + 1.0
    assert _drive_checks(gate.may_call(pq, 1)) == ([], True)
    clock.advance(2.0)  # past the fence: wait until a heartbeat moves it

    def renew() -> None:
        pq.owned_until = clock.monotonic() + 5.0

    yielded, ok = _drive_checks(gate.may_call(pq, 1), renew)
    assert yielded == [FENCED] and yielded[0] is FENCED and ok
    clock.advance(10.0)
    yielded, ok = _drive_checks(gate.may_call(pq, 1), pq.drop)
    assert yielded[0] is FENCED and not ok  # the loss confirmed: skip
    abort.set()
    assert _drive_checks(gate.may_call(_pq(), 1)) == ([], False)


def test_the_call_gate_paces_calls_at_max_rate() -> None:
    clock = ManualClock()
    gate = CallGate(0, group="g", clock=clock, abort=threading.Event(), limiter=RateLimiter(10.0, clock.monotonic))
    pq = _pq()
    pq.owned_until = float("inf")
    pauses = 0
    for _ in range(20):
        yielded, ok = _drive_checks(gate.may_call(pq, 1))
        assert ok
        if yielded:
            assert yielded == [PAUSE] and yielded[0] is PAUSE and gate.pause_until > clock.monotonic()
            pauses += 1
            clock.advance(gate.pause_until - clock.monotonic())
    assert pauses >= 15  # a tenth of a second of burst, then 10 per second


# -- a lane's parked keys ----------------------------------------------------------------


def test_parked_keys_hold_a_keys_later_messages_and_ignore_stale_timer_entries() -> None:
    clock = ManualClock()
    timer = RetryTimer(lambda: None)
    counters = Counters(1)
    keys = ParkedKeys(
        0, timer=timer, generations=itertools.count(1), counters=counters, monotonic=clock.monotonic, suspend=0.5
    )
    pq = _pq()
    failure = FailurePolicy(True, max_reconsume_times=3, retry_start_level=1).classify(ValueError("x"), None)
    keys.park(pq, _msg(0, "a"), failure)
    assert keys.queue_behind(pq, _msg(1, "a")) and not keys.queue_behind(pq, _msg(2, "b"))
    assert keys.key(pq, _msg(3, None)) == MQ  # keyless: its queue waits together
    assert counters.parked == [2]
    fired = timer.fire(clock.monotonic() + 0.5)
    (due,) = fired.per_lane[0]
    assert isinstance(due, DueKey) and due.key == "a"
    assert keys.take("a", due.gen + 1) is None  # stale generation
    p = keys.take("a", due.gen)
    assert p is not None and [m.queue_offset for _, m in p.items] == [0, 1] and not keys.keys


def test_parked_keys_purge_only_dropped_queues() -> None:
    keys = ParkedKeys(
        0,
        timer=RetryTimer(lambda: None),
        generations=itertools.count(1),
        counters=Counters(1),
        monotonic=lambda: 0.0,
        suspend=1,
    )
    kept, gone = _pq(), _pq(MQ1)
    failure = FailurePolicy(True, max_reconsume_times=3, retry_start_level=1).classify(ValueError("x"), None)
    keys.park(kept, _msg(0, "a"), failure)
    keys.park(gone, _msg(0, "b", MQ1), failure)
    gone.drop()
    assert [(pq.queue, m.keys) for pq, m in keys.purge()] == [(MQ1, "b")]
    assert list(keys.keys) == ["a"]


# -- the lane worker -----------------------------------------------------------------------


def _lane_worker(
    lane: Lane, clock: ManualClock, *, parked: ParkedKeys, policy: FailurePolicy, outbox: Outbox, counters: Counters
) -> LaneWorker:
    """Lane ``lane``'s worker, with its gate, hand-back and failures."""
    i = lane.index
    back = Handback(i, counters=counters, outbox=outbox, policy=policy)
    latch = FailureLatch(lambda: None)
    return LaneWorker(
        lane,
        gate=CallGate(i, group="g", clock=clock, abort=threading.Event()),
        parked=parked,
        back=back,
        failures=LaneFailures(i, group="g", policy=policy, parked=parked, back=back, counters=counters, latch=latch),
    )


def _worker(
    mode: ConsumeMode, clock: ManualClock, timer: RetryTimer, outbox: Outbox, counters: Counters | None = None
) -> LaneWorker:
    counters = Counters(1) if counters is None else counters
    keys = ParkedKeys(
        0, timer=timer, generations=itertools.count(1), counters=counters, monotonic=clock.monotonic, suspend=1.0
    )
    policy = FailurePolicy(mode is ConsumeMode.KEY_ORDERLY, max_reconsume_times=2, retry_start_level=1)
    return _lane_worker(Lane(0, lambda: None), clock, parked=keys, policy=policy, outbox=outbox, counters=counters)


def _run(steps: Steps, listener: Callable[[list[MessageExt]], object]) -> list[int]:
    """Drive steps as an executor would; return the offsets called."""
    called: list[int] = []
    try:
        chunk = next(steps)
        while True:
            called += [m.queue_offset for m in chunk]
            try:
                outcome: tuple[BaseException | None, object] = (None, listener(chunk))
            except Exception as e:
                outcome = (e, None)
            chunk = steps.send(outcome)
    except StopIteration:
        return called


def test_a_lane_worker_parks_a_failed_key_while_its_other_keys_run() -> None:
    clock = ManualClock()
    timer = RetryTimer(lambda: None)
    worker = _worker(ConsumeMode.KEY_ORDERLY, clock, timer, Outbox(lambda: None))
    pq = _pq()
    msgs = _tracked(pq, [_msg(0, "a"), _msg(1, "b"), _msg(2, "a"), _msg(3, "c")])

    def listener(chunk: list[MessageExt]) -> None:
        pass  # the first attempt of offset 0 failed on the hot path (failed_at); the rest succeed

    assert worker.segment_steps(pq, msgs) is None  # nothing parked: the executor's hot path
    steps = worker.failed_at(pq, msgs, 0, ValueError("first attempt"), None)
    assert _run(steps, listener) == [1, 3]  # "a" parked, its offset 2 behind it; b and c ran
    assert pq.commit_point()[0] == 0  # never past the parked head
    finished = decode(pq.commit_point()[1], 0)
    assert finished is not None and finished.finished_count() == 2  # b and c, above the parked head
    fired = timer.fire(clock.monotonic() + 1.0)
    assert _run(worker.due_steps(fired.per_lane[0]), listener) == [0, 2]  # the head, then what waited, in order
    assert pq.commit_point()[0] == 4 and not worker.parked


def test_a_lane_worker_sends_back_and_dead_letters_by_the_policy() -> None:
    clock = ManualClock()
    handed: list[SendItem] = []
    outbox = Outbox(lambda: handed.extend(outbox.take()))
    worker = _worker(ConsumeMode.CONCURRENTLY, clock, RetryTimer(lambda: None), outbox)
    pq = _pq()
    msgs = _tracked(pq, [_msg(0, "a"), _msg(1, "a")])
    steps = worker.failed_at(pq, msgs, 0, NonRetryableError("poison"), None)
    assert _run(steps, lambda chunk: ConsumeResult.RETRY_LATER) == [1]
    assert [(it.message.queue_offset, it.dead_letter) for it in handed] == [(0, True), (1, False)]
    assert handed[1].delay_level == 1 and pq.commit_point()[0] == 0  # complete only once stored


def test_a_lane_worker_purges_a_revoked_queues_parked_messages() -> None:
    clock = ManualClock()
    worker = _worker(ConsumeMode.KEY_ORDERLY, clock, RetryTimer(lambda: None), Outbox(lambda: None))
    pq = _pq()
    msgs = _tracked(pq, [_msg(0, "a"), _msg(1, "a")])
    _run(worker.failed_at(pq, msgs, 0, ValueError("x"), None), lambda chunk: None)
    assert worker.parked
    pq.drop()
    assert _run(worker.due_steps([PURGE]), lambda chunk: None) == [] and not worker.parked


def test_a_lane_worker_holds_a_paused_key_while_its_other_keys_run_and_its_resume_runs_it_in_order() -> None:
    clock = ManualClock()
    handed: list[SendItem] = []
    outbox = Outbox(lambda: handed.extend(outbox.take()))
    counters = Counters(1)
    worker = _worker(ConsumeMode.KEY_ORDERLY, clock, RetryTimer(lambda: None), outbox, counters)
    pq = _pq()
    paused = frozenset({"a"})
    assert _run(worker.due_steps([KeyPauseChange(paused, paused, frozenset())]), lambda chunk: None) == []
    assert worker.parked  # PAUSE_MARK: every segment goes the slow way, though "a" has no message here yet
    assert worker.segment_steps(pq, []) is not None
    msgs = _tracked(pq, [_msg(0, "a"), _msg(1, "b"), _msg(2, "a"), _msg(3, "c")])
    steps = worker.segment_steps(pq, msgs)
    assert steps is not None and _run(steps, lambda chunk: None) == [1, 3]
    assert counters.parked == [2] and counters.key_paused == [2] and pq.commit_point()[0] == 0
    resume = KeyPauseChange(frozenset(), frozenset(), paused)
    assert _run(worker.due_steps([resume]), lambda chunk: None) == [0, 2]  # in order, one per call
    assert not worker.parked and counters.parked == [0] and counters.key_paused == [0]
    assert pq.commit_point()[0] == 4 and not handed


def test_a_resumed_key_in_concurrently_sends_a_failure_back_and_goes_on() -> None:
    clock = ManualClock()
    handed: list[SendItem] = []
    outbox = Outbox(lambda: handed.extend(outbox.take()))
    worker = _worker(ConsumeMode.CONCURRENTLY, clock, RetryTimer(lambda: None), outbox)
    pq = _pq()
    paused = frozenset({"a"})
    _run(worker.due_steps([KeyPauseChange(paused, paused, frozenset())]), lambda chunk: None)
    steps = worker.segment_steps(pq, _tracked(pq, [_msg(0, "a"), _msg(1, "a"), _msg(2, "a")]))
    assert steps is not None and _run(steps, lambda chunk: None) == []
    resume = [KeyPauseChange(frozenset(), frozenset(), paused)]
    fail_first = lambda chunk: ConsumeResult.RETRY_LATER if chunk[0].queue_offset == 0 else None  # noqa: E731
    assert _run(worker.due_steps(resume), fail_first) == [0, 1, 2]  # not parked: sent back, the rest goes on
    assert [(it.message.queue_offset, it.dead_letter) for it in handed] == [(0, False)] and not worker.parked


def test_parked_keys_hold_a_retry_of_a_paused_key_until_its_resume() -> None:
    clock = ManualClock()
    timer = RetryTimer(lambda: None)
    counters = Counters(1)
    keys = ParkedKeys(
        0, timer=timer, generations=itertools.count(1), counters=counters, monotonic=clock.monotonic, suspend=0.5
    )
    pq, gone = _pq(), _pq(MQ1)
    failure = FailurePolicy(True, max_reconsume_times=3, retry_start_level=1).classify(ValueError("x"), None)
    keys.park(pq, _msg(0, "a"), failure)  # a retry, on the timer
    assert keys.apply_pauses(frozenset({"a", "b"}), frozenset({"a", "b"}), frozenset()) == []
    assert counters.key_paused == [1]  # the retry's head now waits for the application too
    assert keys.queue_behind(gone, _msg(0, "b", MQ1)) and counters.key_paused == [2]  # "b" parked on its first
    (due,) = timer.fire(clock.monotonic() + 0.5).per_lane[0]
    assert isinstance(due, DueKey) and keys.take("a", due.gen) is None  # due, but paused: it stays
    gone.drop()
    assert [m.keys for _, m in keys.purge()] == ["b"] and "b" in keys.keys  # purged, still paused
    assert counters.key_paused == [1] and counters.parked == [1]
    (run,) = keys.apply_pauses(frozenset({"b"}), frozenset(), frozenset({"a"}))
    assert run[0] == "a" and keys.take(*run) is not None  # its timer came: the resume runs it at once
    assert keys.apply_pauses(frozenset(), frozenset(), frozenset({"b"})) == [("b", keys.keys["b"].gen)]
    keys.take("b", keys.keys["b"].gen)
    assert not keys.keys and counters.key_paused == [0]


def test_the_key_pause_sync_hands_every_lane_each_change_once() -> None:
    lanes = [Lane(i, lambda: None) for i in range(3)]
    flushes: list[int] = []
    dispatcher = Dispatcher(lanes, {}, lane_capacity=100, flush=lambda: flushes.append(1))
    pauses = KeyPauses("g")
    sync = KeyPauseSync(pauses, dispatcher=dispatcher, lanes=len(lanes))

    def handed() -> list[tuple[frozenset[object], frozenset[object], frozenset[object]]]:
        out = []
        for lane in lanes:
            taken = lane.take()  # something is queued: it does not block
            assert taken is not None
            (work,) = taken[1]
            assert isinstance(work, KeyPauseChange)
            out.append((work.paused, work.added, work.removed))
        return out

    sync.apply()
    assert not flushes and all(lane.depth == 0 for lane in lanes)  # nothing paused: nothing handed
    pauses.pause(["a", "b"])
    pauses.resume(["b"])
    pauses.pause(["c"])
    sync.apply()
    sync.apply()  # unchanged since: nothing more
    assert handed() == [({"a", "c"}, {"a", "c"}, frozenset())] * 3 and flushes == [1]
    pauses.resume(["a", "c"])
    pauses.pause(["a"])
    pauses.resume(["a"])  # a pause and a resume it never saw cancel out
    sync.apply()
    assert handed() == [(frozenset(), frozenset(), {"a", "c"})] * 3 and flushes == [1, 1]
    with pytest.raises(TypeError, match="keys: "):
        pauses.pause("a")
    assert pauses.keys == frozenset()


# -- the dispatcher ------------------------------------------------------------------------


def test_the_dispatcher_keeps_a_key_on_one_lane_and_blocks_an_overfilled_one() -> None:
    lanes = [Lane(i, lambda: None) for i in range(4)]
    released: deque[tuple[int, list[MessageExt]]] = deque()
    flushes: list[int] = []
    pq = _pq()
    dispatcher = Dispatcher(
        lanes,
        {MQ: pq},
        lane_capacity=6,
        flush=lambda: flushes.append(1),
        router=KeyRouter(4, "load", None, MAX_SEGMENT),
        released=released,
    )
    msgs = [_msg(i, f"k{i % 3}") for i in range(9)] + [_msg(9 + i, "hot") for i in range(8)]
    dispatcher.add(pq, msgs[:5])
    dispatcher.add(pq, msgs[5:])  # one group per queue: joined
    dispatcher.route_pending()
    assert flushes == [1]
    where: dict[str | None, set[int]] = {}
    for lane in lanes:
        taken = lane.take() if lane.depth else None
        for _, seg in taken[0] if taken else []:
            for m in seg:
                where.setdefault(m.keys, set()).add(lane.index)
    assert all(len(v) == 1 for v in where.values()) and set(where) == {"k0", "k1", "k2", "hot"}
    assert pq.snapshot()[0] == 0  # nothing tracked here: the pull loop tracks, the dispatcher routes
    dispatcher.route_pending()
    assert flushes == [1]  # nothing pending: no put, no flush


def test_new_keys_get_lanes_of_their_own_until_keys_outnumber_the_lanes_then_the_admitted_ones() -> None:
    assert placement_limit(2, 0, 8) == placement_limit(2, 7, 8) == 8
    assert placement_limit(2, 8, 8) == placement_limit(2, 50, 8) == 2
    lanes = [Lane(i, lambda: None) for i in range(8)]
    released: deque[tuple[int, list[MessageExt]]] = deque()
    pq = _pq()
    dispatcher = Dispatcher(
        lanes,
        {MQ: pq},
        lane_capacity=100,
        flush=lambda: None,
        router=KeyRouter(8, "load", None, MAX_SEGMENT),
        released=released,
        lane_limit=lambda: 2,
    )
    offsets = itertools.count()

    def placed(keys: list[str]) -> dict[str, tuple[int, MessageExt]]:
        dispatcher.add(pq, [_msg(next(offsets), k) for k in keys])
        dispatcher.route_pending()
        out: dict[str, tuple[int, MessageExt]] = {}
        for lane in lanes:
            taken = lane.take() if lane.depth else None
            for _, seg in taken[0] if taken else []:
                for m in seg:
                    out[str(m.keys)] = (lane.index, m)
        return out

    # no key has work: eight new keys on eight lanes, though admission runs two
    first = placed([f"k{i}" for i in range(8)])
    assert sorted(lane for lane, _ in first.values()) == list(range(8))
    # eight keys with work on eight lanes: a new key goes to an admitted lane
    second = placed(["new"])
    assert second["new"][0] in (0, 1)
    # all done: new keys have lanes of their own again
    for lane, m in [*first.values(), *second.values()]:
        released.append((lane, [m]))
    third = placed(["a", "b", "c"])
    assert sorted(lane for lane, _ in third.values()) == [0, 1, 2]
    fourth = placed([f"x{i}" for i in range(5)])
    assert sorted(lane for lane, _ in fourth.values()) == [3, 4, 5, 6, 7]
    # as many keys with work as lanes: the admitted lanes only
    fifth = placed(["late"])
    assert fifth["late"][0] in (0, 1)


def test_the_dispatcher_round_robins_and_retries_locally() -> None:
    lanes = [Lane(i, lambda: None) for i in range(3)]
    pq, gone = _pq(), _pq(MQ1)
    dispatcher = Dispatcher(lanes, {MQ: pq}, lane_capacity=100, flush=lambda: None)
    dispatcher.add(pq, [_msg(i) for i in range(6)])
    dispatcher.route_pending()
    assert [lane.depth for lane in lanes] == [2, 2, 2]
    _tracked(gone, [_msg(0, queue=MQ1)])
    dispatcher.retry_locally([LocalRetry(pq, _msg(7)), LocalRetry(gone, _msg(0, queue=MQ1))])
    assert sum(lane.depth for lane in lanes) == 7  # the revoked queue's retry is skipped
    put = [m for lane in lanes for _, seg in (lane.take() or ([], []))[0] for m in seg if m.queue_offset == 7]
    assert [m.reconsume_times for m in put] == [1]


# -- the committer, flow control, the failure sender, assignment -----------------------------


def test_the_committer_commits_the_lowest_unfinished_offset_with_its_map(broker: EmbeddedBroker) -> None:
    source = _member(broker)
    pq = _pq(MQ, 0)
    msgs = _tracked(pq, [_msg(i) for i in range(5)])
    pq.complete([msgs[0], msgs[2], msgs[3]])
    Committer(source, owned={MQ: pq}, group="g").commit_all()
    committed = source.committed(MQ)
    assert committed is not None and committed.offset == 1
    finished = decode(committed.metadata, 1)
    assert finished is not None and finished.finished_count() == 2
    source.close()


def test_flow_control_pauses_over_a_threshold_and_never_resumes_an_app_pause(broker: EmbeddedBroker) -> None:
    source = _member(broker)
    cfg = ConsumerConfig(group="g", pull_threshold_for_queue=4)
    pq, other = _pq(MQ, cfg=cfg), _pq(MQ1, cfg=cfg)
    pauses = AppPauses()
    counters = Counters(1)
    flow = FlowControl(
        cfg,
        source=source,
        owned={MQ: pq, MQ1: other},
        lanes=[Lane(0, lambda: None)],
        counters=counters.queues,
        app_pauses=pauses,
    )
    msgs = _tracked(pq, [_msg(i) for i in range(6)])
    pauses.pause([MQ1])
    flow.apply()
    assert source.paused() == {MQ, MQ1} and counters.queues[MQ].pauses == 1
    pq.complete(msgs)
    flow.apply()
    assert source.paused() == {MQ1}  # resumed below half the threshold; the application's pause holds
    pauses.resume([MQ1])
    flow.apply()
    assert source.paused() == set()
    source.close()


def test_the_failure_sender_completes_an_offset_only_once_stored(broker: EmbeddedBroker) -> None:
    source = _member(broker)
    outbox = Outbox(lambda: None)
    timer = RetryTimer(lambda: None)
    counters = Counters(1)
    sender = FailureSender(source, outbox=outbox, timer=timer, counters=counters, group="g", suspend_ms=100)
    pq = _pq()
    msgs = _tracked(pq, [_msg(0), _msg(1)])
    outbox.put([SendItem(pq, msgs[0], True, "poison", "trace"), SendItem(pq, msgs[1], False, "again", "", 1)])
    assert sender.pending
    sender.send(0.0)
    assert not sender.pending and pq.commit_point()[0] == 2
    assert (counters.dead_lettered, counters.sent_back) == (1, 1)
    dlq = broker.queues(dlq_topic("g"))
    assert [m.keys for q in dlq for m in broker.messages(q)] == ["k"]
    source.close()


def test_assignment_drains_commits_and_only_then_gives_a_queue_up(broker: EmbeddedBroker) -> None:
    cfg = ConsumerConfig(group="g", lanes=2, revoke_timeout=0.5)
    clock = ManualClock()
    owned: dict[MessageQueue, ProcessQueue] = {}
    counters = Counters(2)
    timer = RetryTimer(lambda: None)
    lanes = [Lane(i, lambda: None) for i in range(2)]
    source = broker.pull_consumer("g")
    committer = Committer(source, owned=owned, group="g")
    sender = FailureSender(
        source, outbox=Outbox(lambda: None), timer=timer, counters=counters, group="g", suspend_ms=100
    )
    dispatcher = Dispatcher(lanes, owned, lane_capacity=100, flush=lambda: None)
    seen: list[tuple[str, list[MessageQueue]]] = []
    assignment = Assignment(
        cfg,
        owned=owned,
        counters=counters,
        opener=QueueOpener(cfg, source=source, lanes=2),
        drain=RevokeDrain(
            cfg, clock=clock, counters=counters, timer=timer, dispatcher=dispatcher, committer=committer, sender=sender
        ),
        hooks=AppHooks(
            on_assigned=lambda qs: seen.append(("assigned", qs)), on_revoked=lambda qs: seen.append(("revoked", qs))
        ),
    )
    source.set_rebalance_listener(assignment)
    source.subscribe("T")
    source.poll(0.0)
    assert set(owned) == {MQ, MQ1} and seen == [("assigned", [MQ, MQ1])]
    pq = owned[MQ]
    msgs = _tracked(pq, [_msg(0), _msg(1)])
    timer.add(5.0, LocalRetry(pq, msgs[1]))
    pq.complete([msgs[0]])
    assignment.on_revoked([MQ])  # msgs[1] waits on the timer: left to the next owner, uncommitted
    committed = source.committed(MQ)
    assert committed is not None and committed.offset == 1
    assert MQ not in owned and pq.dropped and len(timer) == 0
    assert seen[-1] == ("revoked", [MQ])
    source.close()


class _LockingSource:
    """Grants the broker lock of queue 0 only; records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[MessageQueue]]] = []

    def lock(self, queues: list[MessageQueue], lease: float) -> frozenset[MessageQueue]:
        self.calls.append(("lock", list(queues)))
        return frozenset(q for q in queues if q.queue_id == 0)

    def unlock(self, queues: list[MessageQueue]) -> None:
        self.calls.append(("unlock", list(queues)))


def test_broker_locks_lock_what_is_gained_renew_and_retry_when_due_and_unlock_what_is_released() -> None:
    cfg = ConsumerConfig(group="g", mode=ConsumeMode.QUEUE_ORDERLY, lock_lease=30.0, lock_renew_interval=10.0)
    clock = ManualClock()
    counters = Counters(1)
    owned: dict[MessageQueue, ProcessQueue] = {}
    orderly = QueueOrderlyService(
        cfg,
        listener=lambda msgs: None,
        abort=threading.Event(),
        clock_monotonic=clock.monotonic,
        dead_letter=lambda items: None,
        policy=FailurePolicy(True, max_reconsume_times=1, retry_start_level=3),
    )
    source = _LockingSource()
    locks = BrokerLocks(cfg, source=source, clock=clock, owned=owned, orderly=orderly, counters=counters)  # type: ignore[arg-type]
    try:
        pq0, pq1 = owned[MQ], owned[MQ1] = _pq(MQ), _pq(MQ1)
        locks.gained([pq0, pq1])
        assert source.calls == [("lock", [MQ, MQ1])] and counters.lock_ok == 1
        assert orderly.unlocked() == [pq1]  # held by another member
        locks.start(clock.monotonic())

        def turn() -> list[object]:
            return [call() for call in locks.turn(clock.monotonic())]

        assert turn() == [] and len(source.calls) == 1  # nothing due yet
        clock.advance(LOCK_RETRY_INTERVAL)
        turn()
        assert source.calls[-1] == ("lock", [MQ1])  # the retry: the queue not locked yet
        clock.advance(10.0)
        turn()
        assert source.calls[-1] == ("lock", [MQ, MQ1])  # the renewal: every lease
        assert counters.lock_ok == 3 and orderly.unlocked() == [pq1]
        clock.advance(30.0)  # the lease ran out, and no renewal came
        assert orderly.unlocked() == [pq0, pq1]
        locks.released([pq0])
        assert source.calls[-1] == ("unlock", [MQ]) and orderly.unlocked() == [pq1]
    finally:
        orderly.close(clock.monotonic)


# -- the pull loop -------------------------------------------------------------------------


class _Loop(NamedTuple):
    loop: PullLoop
    source: PullSource
    owned: dict[MessageQueue, ProcessQueue]
    lanes: list[Lane]
    clock: ManualClock
    committer: Committer
    counters: Counters
    latch: FailureLatch
    stopping: threading.Event


def _pull_loop(broker: EmbeddedBroker) -> _Loop:
    """A pull loop over ``broker``'s topic T, group g, two lanes nobody runs."""
    cfg = ConsumerConfig(group="g", lanes=2, poll_timeout=0.01, commit_interval=0.05)
    clock = ManualClock()
    owned: dict[MessageQueue, ProcessQueue] = {}
    counters = Counters(2)
    timer = RetryTimer(lambda: None)
    latch = FailureLatch(lambda: None)
    stopping = threading.Event()
    lanes = [Lane(i, lambda: None) for i in range(2)]
    source = broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET)
    committer = Committer(source, owned=owned, group="g")
    sender = FailureSender(
        source, outbox=Outbox(source.wakeup), timer=timer, counters=counters, group="g", suspend_ms=100
    )
    released: deque[tuple[int, list[MessageExt]]] = deque()
    dispatcher = Dispatcher(
        lanes,
        owned,
        lane_capacity=1000,
        flush=lambda: None,
        router=KeyRouter(2, "load", None, MAX_SEGMENT),
        released=released,
    )
    assignment = Assignment(
        cfg,
        owned=owned,
        counters=counters,
        opener=QueueOpener(cfg, source=source, lanes=2),
        drain=RevokeDrain(
            cfg, clock=clock, counters=counters, timer=timer, dispatcher=dispatcher, committer=committer, sender=sender
        ),
    )
    source.set_rebalance_listener(assignment)
    source.subscribe("T")
    flow = FlowControl(cfg, source=source, owned=owned, lanes=lanes, counters=counters.queues, app_pauses=AppPauses())
    loop = PullLoop(
        cfg,
        source=source,
        clock=clock,
        timer=timer,
        intake=Intake(
            cfg,
            source=source,
            owned=owned,
            dispatcher=dispatcher,
            flow=flow,
            queue_counters=counters.queues,
            sync=PollSync(source, clock=clock, owned=owned, fence_margin=cfg.fence_margin),
        ),
        upkeep=Upkeep(
            timer,
            dispatcher=dispatcher,
            sender=sender,
            flow=flow,
            commits=CommitSchedule(committer, interval=cfg.commit_interval),
        ),
        latch=latch,
        stopping=stopping,
    )
    return _Loop(loop, source, owned, lanes, clock, committer, counters, latch, stopping)


def test_the_pull_loop_polls_tracks_dispatches_and_commits(broker: EmbeddedBroker) -> None:
    loop, source, owned, lanes, clock, committer, counters, latch, stopping = _pull_loop(broker)
    broker.send_batch("T", [(b"x", f"k{i % 5}") for i in range(40)])
    finished: list[bool] = []
    thread = threading.Thread(target=loop.run, args=(finished.append,))
    thread.start()
    got: list[tuple[ProcessQueue, MessageExt]] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < 40:  # the test is the lanes' task: take, complete
            assert time.monotonic() < deadline, f"only {len(got)} of 40 messages reached the lanes"
            for lane in lanes:
                if lane.depth:
                    taken = lane.take()
                    assert taken is not None
                    for seg_pq, seg in taken[0]:
                        got += [(seg_pq, m) for m in seg]
                        seg_pq.complete(seg)
            clock.advance(0.01)
    finally:
        stopping.set()
        source.wakeup()
        thread.join(10)
    assert finished == [False] and latch.failure is None
    by_key: dict[str | None, list[int]] = {}
    for pq, m in got:
        by_key.setdefault(f"{pq.queue}/{m.keys}", []).append(m.queue_offset)
    assert all(offsets == sorted(offsets) for offsets in by_key.values())
    committer.commit_all()
    committed = {q: source.committed(q) for q in owned}
    assert {q: c.offset for q, c in committed.items() if c is not None} == {q: broker.max_offset(q) for q in owned}
    assert sum(c.polled for c in counters.queues.values()) == 40
    source.close()


def test_the_pull_loop_gathers_no_more_once_every_queue_is_paused(broker: EmbeddedBroker) -> None:
    """After a poll, the loop polls again without waiting while more is
    ready, but not once every owned queue is paused: such a poll could read
    nothing (by message it would cost a round trip for nothing)."""
    loop, source, owned, *_ = _pull_loop(broker)
    gathered: list[int] = []

    def more() -> list[PollBatch]:
        gathered.append(1)
        return []

    def turn(batches: list[PollBatch]) -> None:
        steps = loop.turn(batches, None, more)
        try:
            call = next(steps)
            while True:
                call = steps.send(call())
        except StopIteration:
            pass

    def poll_some() -> list[PollBatch]:
        broker.send_batch("T", [(b"x", f"k{i}") for i in range(4)])
        return source.poll(1.0)

    turn(poll_some())  # the first dispatch goes out at once: no gathering
    turn(poll_some())
    assert gathered == [1]
    for pq in owned.values():
        pq.pause()
    turn(poll_some())
    assert gathered == [1]
    source.close()


# -- the executors -------------------------------------------------------------------------


def _workers(lanes: list[Lane], clock: ManualClock, counters: Counters) -> list[tuple[Lane, LaneWorker]]:
    timer = RetryTimer(lambda: None)
    policy = FailurePolicy(True, max_reconsume_times=2, retry_start_level=1)
    out = []
    for lane in lanes:
        i = lane.index
        keys = ParkedKeys(
            i, timer=timer, generations=itertools.count(1), counters=counters, monotonic=clock.monotonic, suspend=1.0
        )
        worker = _lane_worker(lane, clock, parked=keys, policy=policy, outbox=Outbox(lambda: None), counters=counters)
        out.append((lane, worker))
    return out


def _segments(pq: ProcessQueue, n_lanes: int) -> list[list[tuple[ProcessQueue, list[MessageExt]]]]:
    """40 tracked messages of 8 keys, each key on lane ``key % n_lanes``."""
    msgs = _tracked(pq, [_msg(i, f"k{i % 8}") for i in range(40)])
    per_lane: list[list[MessageExt]] = [[] for _ in range(n_lanes)]
    for m in msgs:
        per_lane[int(m.keys[1:]) % n_lanes].append(m)  # type: ignore[index]
    return [[(pq, ms)] for ms in per_lane]


def test_the_thread_executor_drains_each_lane_in_order_on_its_own_thread() -> None:
    calls: list[tuple[str, int, str | None]] = []
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> None:
        with lock:
            calls.extend((threading.current_thread().name, m.queue_offset, m.keys) for m in msgs)

    executor = ThreadExecutor("g", listener)
    lanes = executor.make_lanes(4, lambda: None)
    counters = Counters(4)
    pq = _pq()
    executor.start(_workers(lanes, ManualClock(), counters))
    for lane, segs in zip(lanes, _segments(pq, 4), strict=True):
        lane.put(segs, sum(len(ms) for _, ms in segs))
    for lane in lanes:
        lane.close()
    assert executor.join(time.monotonic() + 10) and not executor.lanes_alive()
    assert sorted(o for _, o, _ in calls) == list(range(40)) and sum(counters.consumed) == 40
    for key in {k for _, _, k in calls}:
        mine = [(t, o) for t, o, k in calls if k == key]
        assert len({t for t, _ in mine}) == 1 and [o for _, o in mine] == sorted(o for _, o in mine)
    assert pq.commit_point()[0] == 40


def test_the_async_executor_drains_each_lane_in_order_on_one_loop() -> None:
    calls: list[tuple[int, str | None]] = []

    async def listener(msgs: list[MessageExt]) -> None:
        await asyncio.sleep(0)
        calls.extend((m.queue_offset, m.keys) for m in msgs)

    executor = AsyncExecutor("g", listener=listener, block_threshold=5.0)
    lanes = executor.make_lanes(4, lambda: None)
    counters = Counters(4)
    pq = _pq()

    async def main() -> None:
        executor.start(_workers(lanes, ManualClock(), counters))
        for lane, segs in zip(lanes, _segments(pq, 4), strict=True):
            lane.put(segs, sum(len(ms) for _, ms in segs))
        executor.flush()
        for lane in lanes:
            lane.close()
        executor.flush()
        assert await asyncio.to_thread(executor.join, time.monotonic() + 10)  # every lane's task ended

    asyncio.run(asyncio.wait_for(main(), 20))
    executor.close()
    assert sorted(o for o, _ in calls) == list(range(40)) and sum(counters.consumed) == 40
    for key in {k for _, k in calls}:
        offsets = [o for o, k in calls if k == key]
        assert offsets == sorted(offsets)
    assert pq.commit_point()[0] == 40
