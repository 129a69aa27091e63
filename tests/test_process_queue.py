"""A ProcessQueue, its committer and the pull loop's tracking with late
batches: a message-grain source redelivers to this member, below what it
already polled, messages another member did not finish.  They are tracked
and dispatched like the others, the commit point moves down until they
finish (and the lower offset is committed), and they count as no filtered
offsets."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from lite_push import ConsumerConfig, MessageExt, MessageQueue
from lite_push._pull.committer import Committer
from lite_push._pull.flow_control import low_water
from lite_push._pull.intake import Intake
from lite_push._state.offset_map import decode
from lite_push._state.process_queue import ProcessQueue
from lite_push._state.shared import Counters
from lite_push._types import OffsetAndMetadata, PollBatch
from lite_push.sources import Balance

MQ = MessageQueue("T", "redis", 0)


def _msgs(*offsets: int) -> list[MessageExt]:
    return [MessageExt(MQ.topic, MQ.queue_id, o, b"x" * 10, keys=f"k{o}", broker_name=MQ.broker_name) for o in offsets]


def _pq(start: int = 0) -> ProcessQueue:
    return ProcessQueue(
        MQ, next_offset=start, keyless_lane=0, resume_at=low_water(ConsumerConfig(group="g")), wake=lambda: None
    )


class _RecordingSource:
    """The one method the committer calls: every commit, in order."""

    def __init__(self) -> None:
        self.commits: list[dict[MessageQueue, OffsetAndMetadata]] = []

    def commit(self, offsets: dict[MessageQueue, OffsetAndMetadata]) -> None:
        self.commits.append(dict(offsets))


def test_a_late_batch_is_tracked_and_its_commit_offset_moves_down_then_up() -> None:
    pq = _pq()
    source = _RecordingSource()
    committer = Committer(source, owned={MQ: pq}, group="g")  # type: ignore[arg-type]
    first = _msgs(*range(10))
    pq.add_batch(first, 10)
    pq.complete(first)
    committer.commit_all()
    assert source.commits[-1] == {MQ: OffsetAndMetadata(10, "")} and pq.last_committed == 10

    late = _msgs(3, 5, 10, 11)  # 3 and 5 redelivered, 10 and 11 new
    assert pq.add_batch(late, 12) == (4, 40, 12 - 3, pq.snapshot()[3])
    assert pq.next_offset == 12
    offset, offset_map = pq.commit_point()
    assert offset == 3
    finished = decode(offset_map, 3)
    assert finished is not None and [o for o in range(3, 12) if o in finished] == [4, 6, 7, 8, 9]
    committer.commit_all()  # lower than the last commit: passed to the source all the same
    assert source.commits[-1] == {MQ: OffsetAndMetadata(3, offset_map)} and pq.last_committed == 3

    pq.complete(late[:1])
    committer.commit_all()
    assert source.commits[-1][MQ].offset == 5
    pq.complete(late[1:])
    committer.commit_all()
    assert source.commits[-1] == {MQ: OffsetAndMetadata(12, "")} and pq.last_committed == 12
    assert pq.snapshot() == (0, 0, 0, pq.snapshot()[3])
    committer.commit_all()  # nothing changed: no commit
    assert len(source.commits) == 4


def test_a_late_batch_below_everything_in_flight_leaves_next_offset_and_commits_lower() -> None:
    pq = _pq(100)
    source = _RecordingSource()
    committer = Committer(source, owned={MQ: pq}, group="g")  # type: ignore[arg-type]
    pq.add_batch(_msgs(100, 101), 102)  # left in flight
    committer.commit_all()
    assert pq.last_committed == 100
    old = _msgs(40)
    pq.add_batch(old, 41)  # the batch's own next_offset is below the queue's: it stays 102
    assert pq.next_offset == 102 and pq.commit_point()[0] == 40
    committer.commit_all()
    assert source.commits[-1][MQ].offset == 40
    pq.complete(old)
    committer.commit_all()
    assert source.commits[-1][MQ].offset == 100


def _intake(owned: dict[MessageQueue, ProcessQueue], counters: Counters, dispatched: list[list[MessageExt]]) -> Intake:
    """The pull side's intake alone: the dispatcher records what it is
    given; nothing is over a threshold; no poll has more."""
    dispatcher = SimpleNamespace(add=lambda pq, msgs: dispatched.append(list(msgs)), route_pending=lambda: None)
    flow = SimpleNamespace(over_threshold=lambda *_: False)
    sync: Any = SimpleNamespace(turn=lambda: None, polled=lambda: None)
    source: Any = SimpleNamespace(balance=Balance.QUEUE)  # a source that counts its gaps as filtered
    return Intake(
        ConsumerConfig(group="g"),
        source=source,
        owned=owned,
        dispatcher=dispatcher,  # type: ignore[arg-type]
        flow=flow,  # type: ignore[arg-type]
        queue_counters=counters.queues,  # type: ignore[arg-type]
        sync=sync,
    )


def _none() -> list[PollBatch]:
    return []


def test_the_pull_loop_tracks_late_messages_and_counts_them_as_no_filtered_offsets() -> None:
    pq = _pq()
    counters = Counters(1)
    dispatched: list[list[MessageExt]] = []
    intake = _intake({MQ: pq}, counters, dispatched)
    first = _msgs(0, 1, 2, 3, 4)
    intake.turn([PollBatch(MQ, first, 8)], _none)  # 5, 6, 7 filtered
    assert counters.queues[MQ].filtered == 3
    pq.complete(first)

    mixed = _msgs(2, 3, 8, 9)  # two late, two new; 10 and 11 filtered
    intake.turn([PollBatch(MQ, mixed, 12)], _none)
    assert counters.queues[MQ].filtered == 3 + 2
    late = _msgs(6)  # a late batch whose next_offset is its own: nothing filtered
    intake.turn([PollBatch(MQ, late, 7)], _none)
    assert counters.queues[MQ].filtered == 5 and counters.queues[MQ].polled == 10
    assert [[m.queue_offset for m in d] for d in dispatched] == [[0, 1, 2, 3, 4], [2, 3, 8, 9], [6]]
    assert pq.next_offset == 12 and pq.commit_point()[0] == 2 and pq.snapshot()[0] == 5
