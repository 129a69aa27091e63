"""The parts the sources share, each built alone -- no broker, no consumer:
the BROADCASTING model over a member's owned queues and its offsets file,
the owned queues themselves, and the checks and queue choice of
``send_batch`` items."""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from pathlib import Path

import pytest

from lite_push import (
    ConfigError,
    LitePushError,
    MessageModel,
    MessageQueue,
    MessageTooLargeError,
    NotSubscribedError,
    OffsetAndMetadata,
    SourceClosedError,
)
from lite_push._kernels.router import lane_of
from lite_push.sources import ConsumeFromWhere, RebalanceListener
from lite_push.sources._member_model import Broadcasting
from lite_push.sources._owned import OwnedQueues
from lite_push.sources._sending import RoundRobin, checked_items
from lite_push.sources.local_offsets import LocalOffsetStore

Q = [MessageQueue("T", "b", i) for i in range(3)]
U = MessageQueue("U", "b", 0)


@dataclass
class Reader:
    """An owned queue's state, as small as a source's can be."""

    mq: MessageQueue
    pos: int
    paused: bool = False


class Log:
    """A stored log: each queue's range and the store time of each offset."""

    def __init__(self) -> None:
        # T#0 holds offsets 10..19 stored at 1000, 1010, ...; T#1 and T#2 are
        # empty at 5 and 0; U#0 holds 0..2
        self.times = {Q[0]: [1000 + 10 * i for i in range(10)], Q[1]: [], Q[2]: [], U: [1, 2, 3]}
        self.ranges = {Q[0]: (10, 20), Q[1]: (5, 5), Q[2]: (0, 0), U: (0, 3)}
        self.searched: list[tuple[MessageQueue, int, int, int]] = []

    def stored_range(self, queue: MessageQueue) -> tuple[int, int]:
        return self.ranges[queue]

    def first_stored_at(self, queue: MessageQueue, lo: int, hi: int, timestamp: int) -> int:
        self.searched.append((queue, lo, hi, timestamp))
        return lo + bisect.bisect_left(self.times[queue], timestamp)


class Listener(RebalanceListener):
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[MessageQueue]]] = []

    def on_assigned(self, queues):  # type: ignore[no-untyped-def]
        self.calls.append(("assigned", list(queues)))

    def on_revoked(self, queues):  # type: ignore[no-untyped-def]
        self.calls.append(("revoked", list(queues)))


def _committed_before(path: Path, offsets: dict[MessageQueue, OffsetAndMetadata]) -> None:
    earlier = LocalOffsetStore(path, broker_name="b", group="g")
    earlier.commit(offsets)
    earlier.close()


def _broadcasting(
    path: Path, consume_from: ConsumeFromWhere = ConsumeFromWhere.FIRST_OFFSET, consume_timestamp: int | None = None
) -> tuple[Broadcasting[Reader], OwnedQueues[Reader], Log, LocalOffsetStore, Listener]:
    owned = OwnedQueues[Reader]("g", "member-a", "member-a")
    owned.listener = listener = Listener()
    log = Log()
    store = LocalOffsetStore(path, broker_name="b", group="g")
    topics = {"T": Q, "U": [U]}
    model = Broadcasting(owned, store, log, topics.__getitem__, Reader, consume_from, consume_timestamp)
    return model, owned, log, store, listener


def test_broadcasting_owns_every_queue_of_its_topics_from_the_file_else_consume_from(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    _committed_before(path, {Q[0]: OffsetAndMetadata(15, "m")})  # a previous run committed T#0
    model, owned, log, store, listener = _broadcasting(path)
    assert model.message_model is MessageModel.BROADCASTING and model.offset_store is store
    assert not model.stale() and model.refresh() is False and owned.states == {}

    model.subscribe("T")
    assert model.stale()
    assert model.refresh() is True
    # T#0 from the file; T#1 and T#2 from FIRST_OFFSET (their first stored offset)
    assert {q: st.pos for q, st in owned.states.items()} == {Q[0]: 15, Q[1]: 5, Q[2]: 0}
    assert [st.mq for st in owned.active] == Q
    assert listener.calls == [("assigned", Q)]
    # the starts taken from consume_from are in the file at once (a restart starts there too)
    assert store.get(Q[1]) == OffsetAndMetadata(5) and store.get(Q[0]) == OffsetAndMetadata(15, "m")
    assert not model.stale() and model.refresh() is False and len(listener.calls) == 1

    model.subscribe("U")  # a second topic: only its queues are new
    assert model.refresh() is True
    assert listener.calls[-1] == ("assigned", [U]) and set(owned.states) == {*Q, U}
    model.close()
    assert store.closed


def test_broadcasting_starts_a_queue_without_offset_at_last_offset_or_at_a_time(tmp_path: Path) -> None:
    model, owned, _, _, _ = _broadcasting(tmp_path / "last.json", ConsumeFromWhere.LAST_OFFSET)
    model.subscribe("T")
    model.refresh()
    assert {q: st.pos for q, st in owned.states.items()} == {Q[0]: 20, Q[1]: 5, Q[2]: 0}
    model.close()

    model, owned, log, _, _ = _broadcasting(tmp_path / "time.json", ConsumeFromWhere.TIMESTAMP, 1035)
    model.subscribe("T")
    model.refresh()
    assert owned.states[Q[0]].pos == 14  # the first message stored at or after 1035 (1040)
    assert (Q[0], 10, 20, 1035) in log.searched
    model.close()


def test_a_file_offset_outside_the_stored_range_is_clamped(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    _committed_before(path, {Q[0]: OffsetAndMetadata(3), Q[1]: OffsetAndMetadata(99)})
    model, owned, _, _, _ = _broadcasting(path)
    model.subscribe("T")
    model.refresh()
    assert owned.states[Q[0]].pos == 10 and owned.states[Q[1]].pos == 5
    model.close()


def test_broadcasting_commits_only_its_own_queues_and_holds_every_lock(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    model, owned, _, store, _ = _broadcasting(path)
    model.subscribe("T")
    model.refresh()
    model.commit({Q[0]: OffsetAndMetadata(17, "map"), U: OffsetAndMetadata(2)})  # U is not owned
    assert model.committed(Q[0]) == OffsetAndMetadata(17, "map") and model.committed(U) is None
    assert model.lock([Q[0], U], 30.0) == frozenset({Q[0], U})  # nobody else reads "its" copy
    model.unlock([Q[0]])
    assert model.owned_for() == {} and model.session_timeout is None  # no sessions: no fence
    refused = model.send_back([(object(), 1), (object(), 2)])  # type: ignore[list-item]
    assert len(refused) == 2 and all(isinstance(e, LitePushError) and "BROADCASTING" in str(e) for e in refused)
    with pytest.raises(ConfigError, match="offset_file"):  # the file is the member's alone
        LocalOffsetStore(path, broker_name="b", group="g")
    model.close()
    again = LocalOffsetStore(path, broker_name="b", group="g")  # closing released it
    assert again.get(Q[0]) == OffsetAndMetadata(17, "map") and again.get(U) is None
    again.close()


def test_a_closed_member_takes_no_queues(tmp_path: Path) -> None:
    model, owned, _, _, listener = _broadcasting(tmp_path / "g.json")
    model.subscribe("T")
    owned.closed = True
    assert model.refresh() is False and owned.states == {} and listener.calls == []
    with pytest.raises(SourceClosedError, match="member-a"):
        owned.check_open()
    model.close()


# -- the owned queues ------------------------------------------------------------


def test_owned_queues_pause_resume_and_tell_the_listener(caplog: pytest.LogCaptureFixture) -> None:
    owned = OwnedQueues[Reader]("g", "member-a", "<member-a>")
    assert owned.add(Reader(q, 0) for q in reversed(Q)) == list(reversed(Q))
    assert [st.mq for st in owned.active] == Q  # in queue order
    owned.pause([Q[1], U])  # U is not owned: ignored
    assert owned.paused() == {Q[1]} and [st.mq for st in owned.active] == [Q[0], Q[2]]
    owned.resume([Q[1]])
    assert owned.paused() == frozenset() and len(owned.active) == 3
    owned.drop([Q[0]])
    assert [st.mq for st in owned.active] == Q[1:]
    with pytest.raises(NotSubscribedError, match="member-a"):
        owned.get(Q[0])

    class Raising(RebalanceListener):
        def on_assigned(self, queues):  # type: ignore[no-untyped-def]
            raise RuntimeError("listener bug")

    owned.listener = Raising()
    with caplog.at_level(logging.ERROR):
        owned.notify("on_assigned", [Q[0]])  # logged, never raised
    assert "on_assigned" in caplog.text and "<member-a>" in caplog.text


# -- send_batch items --------------------------------------------------------------


def test_items_go_to_their_queue_id_their_key_s_queue_or_round_robin() -> None:
    rr = RoundRobin()
    items = [b"a", (b"b", "k1"), {"body": b"c", "queue_id": 3}, b"d", {"body": b"e", "keys": "k1", "tags": "t"}]
    got = list(checked_items(items, "T", 4, 10, rr))
    assert [(body, q) for body, _, _, _, q in got] == [
        (b"a", 0),
        (b"b", lane_of("k1", 4)),
        (b"c", 3),
        (b"d", 1),
        (b"e", lane_of("k1", 4)),
    ]
    assert got[4][1:4] == ("k1", "t", {}) and rr.next == 2
    assert [q for *_, q in checked_items([b"x", b"y"], "T", 4, 10, rr)] == [2, 3]  # the next batch goes on
    # a batch with a bad item: nothing is taken, and the round robin stays where it was
    with pytest.raises(MessageTooLargeError):
        list(checked_items([b"x", b"y" * 11], "T", 4, 10, rr))
    assert rr.next == 4
    # without a round robin, the broker chooses (Kafka's partitioner)
    assert [q for *_, q in checked_items([(b"x", "k"), b"y", {"body": b"z", "queue_id": 1}], "T", 4, 10)] == [
        None,
        None,
        1,
    ]


@pytest.mark.parametrize(
    ("item", "error", "match"),
    [
        ("text", TypeError, "got str"),
        ((b"x", "k", "extra"), TypeError, "3-tuple"),
        ((b"x", 7), TypeError, "keys must be str"),
        ({"body": b"x", "queue_id": 4}, ValueError, "queue_id"),
        ({"body": b"x", "queue_id": 0, "keys": 7}, TypeError, "keys must be str"),
        ({"body": "x"}, TypeError, "body must be bytes"),
        ({"body": b"x", "colour": "red"}, TypeError, "take only"),
        ({"body": b"x", "properties": {"a": 1}}, TypeError, "str to str"),
    ],
)
def test_a_bad_item_is_refused_naming_what_is_wrong(item: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        list(checked_items([b"fine", item], "T", 4, 100, RoundRobin()))
