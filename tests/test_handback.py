"""Handback alone: what one lane gives back.  A completed message lets the
commit pass it and is counted; a skipped one keeps the commit behind it; a
hand-off reaches the outbox with the held keys' dead letters gathered before
it, in order; every message the lane is done with is released to the
router, once."""

from __future__ import annotations

from typing import Any

from lite_push import ConsumerConfig, MessageExt, MessageQueue
from lite_push._lanes.failures import Outbox, SendItem
from lite_push._lanes.handback import Handback
from lite_push._pull.flow_control import low_water
from lite_push._state.process_queue import ProcessQueue
from lite_push._state.shared import Counters

MQ = MessageQueue("T", "embedded", 0)


def _msgs(*offsets: int, key: str = "k") -> list[MessageExt]:
    return [MessageExt(MQ.topic, MQ.queue_id, o, b"x", keys=key) for o in offsets]


class _Holds:
    """A failure policy whose held keys are ``keys``: a message of one of
    them follows it into the dead-letter queue."""

    held = None  # no HeldKeys of its own: ``behind`` answers

    def __init__(self, *keys: str) -> None:
        self.keys = set(keys)

    def behind(self, pq: ProcessQueue, m: MessageExt) -> SendItem | None:
        return SendItem(pq, m, True, "held", behind=True) if m.keys in self.keys else None


def _handback(policy: Any) -> tuple[Handback, ProcessQueue, Outbox, Counters, list[tuple[int, list[MessageExt]]]]:
    pq = ProcessQueue(
        MQ, next_offset=0, keyless_lane=0, resume_at=low_water(ConsumerConfig(group="g")), wake=lambda: None
    )
    pq.add_batch(_msgs(0, 1, 2, 3, 4, 5), 6)
    outbox = Outbox(lambda: None)
    counters = Counters(2)
    released: list[tuple[int, list[MessageExt]]] = []
    back = Handback(1, counters=counters, outbox=outbox, policy=policy, release=released.append)
    return back, pq, outbox, counters, released


def test_completed_messages_let_the_commit_pass_and_are_counted() -> None:
    back, pq, _, counters, released = _handback(_Holds())
    msgs = _msgs(0, 1)
    back.complete(pq, msgs)
    assert pq.commit_point()[0] == 2 and counters.consumed == [0, 2]
    assert released == [(1, msgs)]


def test_a_skipped_message_keeps_the_commit_behind_it() -> None:
    back, pq, _, counters, released = _handback(_Holds())
    back.skip(pq, _msgs(0))
    back.complete(pq, _msgs(1, 2))
    assert pq.commit_point()[0] == 0 and counters.consumed == [0, 2]
    assert [len(ms) for _, ms in released] == [1, 2]


def test_held_keys_dead_letters_go_first_with_the_next_hand_off() -> None:
    back, pq, outbox, _, released = _handback(_Holds("h"))
    held = _msgs(3, key="h")[0]
    assert back.hold_behind(pq, held) and not back.hold_behind(pq, _msgs(4)[0])
    assert not outbox  # gathered, not handed off yet
    failed = SendItem(pq, _msgs(5)[0], False, "boom")
    back.hand_off([failed])
    assert [(it.message.queue_offset, it.behind) for it in outbox.take()] == [(3, True), (5, False)]
    assert [m.queue_offset for _, ms in released for m in ms] == [3, 5]
    back.flush()
    assert not outbox  # nothing left to flush


def test_a_flush_hands_off_what_was_gathered_and_a_stop_takes_it_back() -> None:
    back, pq, outbox, _, _ = _handback(_Holds("h"))
    a, b = _msgs(2, 3, key="h")
    back.hold_behind(pq, a)
    back.flush()
    assert [it.message for it in outbox.take()] == [a]
    back.hold_behind(pq, b)
    assert back.take_gathered() == [(pq, b)] and back.take_gathered() == []
    back.hand_off([])
    assert outbox.take() == []  # taken back: never stored
