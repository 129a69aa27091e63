"""The embedded broker: the source contract (in memory and durable), plus what
only the embedded broker does (queue selection, storage, crash recovery,
session timeouts)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import wait_for

from lite_push import (
    ConfigError,
    LitePushError,
    ManualClock,
    MessageExt,
    MessageQueue,
    MessageTooLargeError,
    OffsetAndMetadata,
    SourceClosedError,
    UnknownTopicError,
)
from lite_push._kernels.router import java_hash, lane_of
from lite_push.sources import ConsumeFromWhere, EmbeddedBroker, EmbeddedPullConsumer, PullSource
from lite_push.sources.embedded.files import HEADER, TRAILER
from lite_push.testing import (
    OwnershipLog,
    SkewedClock,
    SourceContract,
    SourceHarness,
    offsets,
    poll_messages,
    poll_topic,
    split,
    wait_assigned,
)

ROOT = Path(__file__).resolve().parents[1]
FIRST = ConsumeFromWhere.FIRST_OFFSET


class EmbeddedHarness(SourceHarness):
    def __init__(self, path: Path | None = None, **kw: object) -> None:
        self.clock = SkewedClock()
        self.broker = EmbeddedBroker(path, clock=self.clock, **kw)  # type: ignore[arg-type]
        self.consumers: list[EmbeddedPullConsumer] = []

    def create_topic(self, topic: str, queue_count: int) -> list[MessageQueue]:
        return self.broker.create_topic(topic, queue_count)

    def send(self, topic, body, *, keys=None, tags=None, queue_id=None, properties=None):  # type: ignore[no-untyped-def]
        r = self.broker.send(topic, body, keys=keys, tags=tags, queue_id=queue_id, properties=properties)
        return r.queue, r.offset

    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def consumer(self, group, *, consume_from=FIRST, consume_timestamp=None, client_id=None) -> PullSource:  # type: ignore[no-untyped-def]
        c = self.broker.pull_consumer(
            group, consume_from=consume_from, consume_timestamp=consume_timestamp, client_id=client_id
        )
        self.consumers.append(c)
        return c

    def close(self) -> None:
        for c in self.consumers:
            c.close()
        self.broker.close()


@pytest.fixture(params=["memory", "durable"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EmbeddedHarness]:
    h = EmbeddedHarness(tmp_path / "broker" if request.param == "durable" else None)
    yield h
    h.close()


class TestEmbeddedContract(SourceContract):
    pass


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker()
    yield b
    b.close()


# -- topics and sending -------------------------------------------------------


def test_create_topic_rules(broker: EmbeddedBroker) -> None:
    qs = broker.create_topic("T", 3)
    assert qs == [MessageQueue("T", "embedded", i) for i in range(3)]
    assert broker.create_topic("T", 3) == qs  # idempotent
    with pytest.raises(ValueError, match="queue_count"):
        broker.create_topic("T", 4)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="queue_count"):
            broker.create_topic("U", bad)
    broker.create_topic("A", 1)
    assert broker.topics() == ["A", "T"]
    assert broker.queues("T") == qs
    with pytest.raises(UnknownTopicError):
        broker.queues("nope")
    with pytest.raises(UnknownTopicError):
        broker.send("nope", b"x")
    with pytest.raises(ValueError):
        broker.create_topic("../etc", 1)


def test_send_selects_the_queue_by_java_hash_of_keys(broker: EmbeddedBroker) -> None:
    broker.create_topic("T", 8)
    # hand-known Java String.hashCode values
    assert java_hash("Aa") == java_hash("BB") == 2112
    assert java_hash("polygenelubricants") == -(2**31)
    assert broker.send("T", b"x", keys="Aa").queue.queue_id == 2112 % 8 == 0
    assert broker.send("T", b"x", keys="BB").queue.queue_id == 0
    assert broker.send("T", b"x", keys="polygenelubricants").queue.queue_id == 0  # floorMod, not abs
    for key in ["order-1", "order-2", "user:42", "ключ", "键", "emoji-😀", "a" * 100]:
        assert broker.send("T", b"x", keys=key).queue.queue_id == lane_of(key, 8)
    broker.create_topic("Seven", 7)
    assert broker.send("Seven", b"x", keys="polygenelubricants").queue.queue_id == (-(2**31)) % 7 == 5
    results = broker.send_batch("Seven", [(b"x", f"k{i}") for i in range(50)])
    assert [r.queue.queue_id for r in results] == [lane_of(f"k{i}", 7) for i in range(50)]


def test_keyless_messages_go_round_robin_and_queue_id_overrides(broker: EmbeddedBroker) -> None:
    broker.create_topic("T", 4)
    ids = [broker.send("T", b"x").queue.queue_id for _ in range(8)]
    assert ids == [0, 1, 2, 3, 0, 1, 2, 3]
    ids = [broker.send("T", b"x", keys="").queue.queue_id for _ in range(4)]  # empty keys: no key
    assert ids == [0, 1, 2, 3]
    assert broker.send("T", b"x", keys="Aa", queue_id=3).queue.queue_id == 3
    for bad in (4, -1, "1", 1.0):
        with pytest.raises(ValueError, match="queue_id"):
            broker.send("T", b"x", queue_id=bad)  # type: ignore[arg-type]


def test_offsets_are_consecutive_and_messages_carry_their_fields() -> None:
    b = EmbeddedBroker(broker_name="b7")
    try:
        (q0,) = b.create_topic("T", 1)
        t0 = time.time() * 1000
        r = b.send("T", b"body", keys="k", tags="TagA", properties={"a": "1"})
        results = b.send_batch("T", [b"p", (b"q", "k2"), {"body": b"r", "tags": "X", "properties": {"x": "y"}}])
        assert [r.offset] + [x.offset for x in results] == [0, 1, 2, 3]
        assert results.last_offsets() == {q0: 3}
        assert b.max_offset(q0) == 4 and b.min_offset(q0) == 0
        msgs = b.messages(q0)
        assert [m.queue_offset for m in msgs] == [0, 1, 2, 3]
        m = msgs[0]
        assert (m.topic, m.queue_id, m.body, m.keys, m.tags, m.properties) == ("T", 0, b"body", "k", "TagA", {"a": "1"})
        assert m.broker_name == "b7" and m.queue == q0
        assert m.msg_id == r.msg_id and len({x.msg_id for x in msgs}) == 4
        assert t0 - 1000 <= m.born_timestamp <= m.store_timestamp <= time.time() * 1000 + 1000
        assert [x.store_timestamp for x in msgs] == sorted(x.store_timestamp for x in msgs)
        assert (msgs[3].tags, msgs[3].properties, msgs[1].keys, msgs[1].properties) == ("X", {"x": "y"}, None, {})
    finally:
        b.close()


def test_body_rules() -> None:
    b = EmbeddedBroker(max_message_size=10)
    try:
        (q0,) = b.create_topic("T", 1)
        b.send("T", b"x" * 10)
        with pytest.raises(MessageTooLargeError) as info:
            b.send("T", b"x" * 11)
        assert (info.value.size, info.value.limit) == (11, 10)
        for bad in ("text", bytearray(b"x"), memoryview(b"x"), None, 5):
            with pytest.raises(TypeError):
                b.send("T", bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            b.send("T", b"x", keys=5)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            b.send("T", b"x", properties={"a": 1})  # type: ignore[dict-item]
        # a bad item anywhere in a batch stores nothing
        with pytest.raises(MessageTooLargeError):
            b.send_batch("T", [b"ok", b"ok", b"x" * 11, b"ok"])
        with pytest.raises(TypeError):
            b.send_batch("T", [b"ok", "not bytes"])
        with pytest.raises(TypeError):
            b.send_batch("T", [(b"a", "k", "extra")])
        with pytest.raises(TypeError):
            b.send_batch("T", [{"body": b"a", "color": "red"}])
        assert b.max_offset(q0) == 1
    finally:
        b.close()


def test_send_batch_of_a_million_messages(broker: EmbeddedBroker) -> None:
    queues = broker.create_topic("T", 8)
    n = 1_000_000
    results = broker.send_batch("T", [b"0123456789abcdef"] * n)
    assert len(results) == n
    assert [broker.max_offset(q) for q in queues] == [n // 8] * 8
    assert results[-1].offset == n // 8 - 1 and results[-1].queue == queues[7]
    assert broker.messages(queues[3], 1000, 1001)[0].queue_offset == 1000


def test_concurrent_senders_keep_offsets_consecutive_and_key_order(broker: EmbeddedBroker) -> None:
    queues = broker.create_topic("T", 4)

    def sender(t: int) -> None:
        for i in range(0, 2000, 50):
            broker.send_batch("T", [(b"%d:%d" % (t, i + j), f"t{t}-k{(i + j) % 7}") for j in range(50)])
        for i in range(200):
            broker.send("T", b"%d:%d" % (t, 2000 + i), keys=f"t{t}-k{i % 7}")

    threads = [threading.Thread(target=sender, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    total = 0
    for q in queues:
        msgs = broker.messages(q)
        total += len(msgs)
        assert [m.queue_offset for m in msgs] == list(range(len(msgs)))
        last: dict[str, int] = {}
        for m in msgs:
            seq = int(m.body.split(b":")[1])
            assert last.get(m.keys, -1) < seq  # per key, in send order
            last[m.keys] = seq  # type: ignore[index]
    assert total == 4 * 2200


# -- polling details ------------------------------------------------------------


def test_poll_rotates_the_first_queue(broker: EmbeddedBroker) -> None:
    queues = broker.create_topic("T", 4)
    broker.send_batch("T", [{"body": b"x", "queue_id": i % 4} for i in range(40)])
    c = broker.pull_consumer("g", consume_from=FIRST)
    c.subscribe("T")
    firsts = []
    for _ in range(4):
        batches = c.poll(1.0, 1)
        assert {b.queue for b in batches} == set(queues)
        firsts.append(batches[0].queue)
    assert len(set(firsts)) == 4
    c.close()


def test_tag_filter_scan_is_bounded(broker: EmbeddedBroker) -> None:
    (q0,) = broker.create_topic("T", 1)
    broker.send_batch("T", [{"body": b"c", "tags": "TagC"} for _ in range(5000)])
    broker.send("T", b"a", tags="TagA")
    c = broker.pull_consumer("g", consume_from=FIRST)
    c.subscribe("T", "TagA")
    (first,) = c.poll(1.0, 32)
    assert first.messages == [] and 0 < first.next_offset <= 4 * 32 + 256
    got = [first]
    while c.position(q0) < 5001:
        got += c.poll(1.0, 32)
    assert [(m.queue_offset, m.body) for b in got for m in b.messages] == [(5000, b"a")]
    c.subscribe("T", "*")  # changing the expression applies to owned queues
    broker.send("T", b"z", tags="TagZ")
    assert [m.body for b in c.poll(1.0) for m in b.messages] == [b"z"]
    c.close()


def test_start_position_is_fixed_when_the_group_first_owns_the_queue(broker: EmbeddedBroker) -> None:
    (q0,) = broker.create_topic("T", 1)
    broker.send_batch("T", [b"old"] * 5)
    a = broker.pull_consumer("g")  # LAST_OFFSET
    a.subscribe("T")
    assert a.poll(0.1) == [] and a.position(q0) == 5
    a.close()  # never committed
    broker.send_batch("T", [b"new"] * 3)
    b = broker.pull_consumer("g")
    b.subscribe("T")
    got = poll_messages(b, 3)
    assert offsets(got)[q0] == [5, 6, 7]  # not 8: the group owned the queue from offset 5
    b.close()


def test_client_ids_are_unique_per_group(broker: EmbeddedBroker) -> None:
    broker.create_topic("T", 1)
    a = broker.pull_consumer("g", client_id="same")
    with pytest.raises(ValueError, match="same"):
        broker.pull_consumer("g", client_id="same")
    broker.pull_consumer("other", client_id="same").close()
    a.close()
    broker.pull_consumer("g", client_id="same").close()  # free again after close
    c1, c2 = broker.pull_consumer("g"), broker.pull_consumer("g")
    assert c1.client_id < c2.client_id  # generated ids sort in creation order
    c1.close()
    c2.close()


def test_custom_allocation_strategy(broker: EmbeddedBroker) -> None:
    queues = broker.create_topic("T", 4)

    class FirstTakesAll:
        name = "FIRST_TAKES_ALL"

        def __call__(self, group, cid, mq_all, cid_all):  # type: ignore[no-untyped-def]
            return sorted(mq_all) if cid == min(cid_all) else []

    a = broker.pull_consumer("g", client_id="a", allocate=FirstTakesAll())
    b = broker.pull_consumer("g", client_id="b", allocate=FirstTakesAll())
    a.subscribe("T")
    b.subscribe("T")
    split(a, b, (4, 0))
    assert a.assignment() == frozenset(queues)
    a.close()
    b.close()


def test_a_raising_listener_does_not_block_the_hand_off(
    broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    broker.create_topic("T", 2)

    class Boom:
        def on_revoked(self, queues):  # type: ignore[no-untyped-def]
            raise RuntimeError("boom")

        def on_assigned(self, queues):  # type: ignore[no-untyped-def]
            raise RuntimeError("boom")

    a = broker.pull_consumer("g", client_id="a")
    a.set_rebalance_listener(Boom())  # type: ignore[arg-type]
    a.subscribe("T")
    with caplog.at_level(logging.ERROR, logger="lite_push.sources.embedded"):
        assert a.poll(0.05) == [] and len(a.assignment()) == 2
        b = broker.pull_consumer("g", client_id="b")
        b.subscribe("T")
        split(a, b, (1, 1))
    assert sum("boom" in r.getMessage() or "raised" in r.getMessage() for r in caplog.records) >= 2
    a.close()
    b.close()


# -- liveness -------------------------------------------------------------------


def test_session_timeout_releases_a_silent_members_queues() -> None:
    clock = ManualClock(1000.0)
    broker = EmbeddedBroker(clock=clock, session_timeout=10.0)
    try:
        queues = broker.create_topic("T", 8)
        log = OwnershipLog()
        a = broker.pull_consumer("g", client_id="a", consume_from=FIRST)
        b = broker.pull_consumer("g", client_id="b", consume_from=FIRST)
        a.set_rebalance_listener(log.listener("a", a, commit=False))
        b.set_rebalance_listener(log.listener("b", b, commit=False))
        a.subscribe("T")
        b.subscribe("T")
        split(a, b)
        # both keep polling: nobody expires however much time passes
        for _ in range(5):
            clock.advance(6)
            a.poll(0)
            b.poll(0)
        assert (len(a.assignment()), len(b.assignment())) == (4, 4)
        # a goes silent
        clock.advance(11)
        b.poll(0)
        assert b.assignment() == frozenset(queues)  # took a's queues from the broker
        assert a.assignment() == frozenset(queues[:4])  # a has not noticed yet
        a.commit({queues[0]: 5})  # ignored: not a's any more
        assert b.committed(queues[0]) is None
        b.commit({queues[0]: 2})
        a.poll(0)  # a notices: on_revoked, rejoins
        assert log.index("revoked", "a", queues[0]) >= 0
        assert b.committed(queues[0]) == OffsetAndMetadata(2)
        broker.send_batch("T", [{"body": b"%d" % i, "queue_id": 0} for i in range(10)])
        b.poll(0)  # b hands q0-q3 back (its target changed when a rejoined)
        got = a.poll(0)
        assert a.assignment() == frozenset(queues[:4]) and len(b.assignment()) == 4
        assert offsets(got)[queues[0]] == list(range(2, 10))  # from b's commit
        # the one overlap a liveness rule must allow: b took the queues while
        # the silent a still believed it owned them (a's commits were fenced)
        assert sorted(log.violations) == sorted(f"b got {q} while a owned it" for q in queues[:4])
    finally:
        broker.close()


def test_broker_close_closes_its_consumers(broker: EmbeddedBroker) -> None:
    (q0,) = broker.create_topic("T", 1)
    c = broker.pull_consumer("g")
    c.subscribe("T")
    result: list[object] = []

    def blocked() -> None:
        try:
            c.poll(10)
        except SourceClosedError as e:
            result.append(e)

    t = threading.Thread(target=blocked)
    t.start()

    def waiting_in_poll() -> bool:
        frame = sys._current_frames().get(t.ident)  # type: ignore[arg-type]
        stack = "".join(traceback.format_stack(frame)) if frame is not None else ""
        return "in poll" in stack and "self._cond.wait(wait)" in stack

    # the poll is blocked, waiting for messages (not yet to start, nor done)
    wait_for(waiting_in_poll, 10, "the poll to block in its wait for messages")
    broker.close()
    t.join(5)  # woken: a poll(10) left alone would still wait
    assert not t.is_alive() and len(result) == 1
    with pytest.raises(SourceClosedError):
        c.assignment()
    with pytest.raises(SourceClosedError):
        broker.send("T", b"x")
    with pytest.raises(SourceClosedError):
        broker.pull_consumer("g")
    broker.close()  # idempotent


# -- durability -----------------------------------------------------------------


def test_durable_reopen_restores_messages_and_committed_offsets(tmp_path: Path) -> None:
    b = EmbeddedBroker(tmp_path, broker_name="b1")
    q0, q1, q2 = b.create_topic("T", 3)
    (u0,) = b.create_topic("U", 1)
    b.send("T", b"", keys="k1", tags="A", properties={"p": "v", "ü": "ß"}, queue_id=0)
    b.send("T", os.urandom(200_000), queue_id=2)
    b.send_batch("T", [(b"m%d" % i, f"k{i}") for i in range(100)] + [{"body": b"d", "tags": "Z", "queue_id": 1}])
    b.send("U", b"u")
    c = b.pull_consumer("g", consume_from=FIRST)
    c.subscribe("T")
    c.poll(0.1)
    c.commit({q0: OffsetAndMetadata(3, "meta"), q1: 2})
    before = {q: b.messages(q) for q in (q0, q1, q2, u0)}
    c.close()
    b.close()

    b2 = EmbeddedBroker(tmp_path, broker_name="b1")
    try:
        assert b2.topics() == ["T", "U"]
        for q, msgs in before.items():
            assert b2.messages(q) == msgs  # every field, timestamps and ids included
        probe = b2.pull_consumer("g")
        assert probe.committed(q0) == OffsetAndMetadata(3, "meta")
        assert probe.committed(q1) == OffsetAndMetadata(2, "")
        assert probe.committed(q2) is None
        probe.subscribe("T")
        got = offsets(probe.poll(0))
        assert (got[q0][0], got[q1][0]) == (3, 2)
        assert b2.send("T", b"next", queue_id=0).offset == len(before[q0])
    finally:
        b2.close()


def test_fsync_mode_and_generator_batches(tmp_path: Path) -> None:
    b = EmbeddedBroker(tmp_path, fsync=True)
    (q0,) = b.create_topic("T", 1)
    results = b.send_batch("T", ((b"%d" % i, None) for i in range(10)))
    assert [r.offset for r in results] == list(range(10))
    c = b.pull_consumer("g")
    c.subscribe("T")
    c.poll(0)
    c.commit({q0: 4})
    b.close()
    b2 = EmbeddedBroker(tmp_path)
    assert [m.body for m in b2.messages(q0)] == [b"%d" % i for i in range(10)]
    assert b2.pull_consumer("g").committed(q0) == OffsetAndMetadata(4)
    b2.close()


def test_a_durable_directory_is_opened_by_one_broker_at_a_time(tmp_path: Path) -> None:
    b = EmbeddedBroker(tmp_path)
    try:
        with pytest.raises(LitePushError, match="already open"):
            EmbeddedBroker(tmp_path)
    finally:
        b.close()
    EmbeddedBroker(tmp_path).close()


def _record_starts(data: bytes) -> list[int]:
    starts, pos = [], 0
    while pos < len(data):
        _magic, meta_len, body_len, _o, _b, _s = HEADER.unpack_from(data, pos)
        starts.append(pos)
        pos += HEADER.size + meta_len + body_len + TRAILER.size
    return starts


@pytest.mark.parametrize("damage", ["partial_header", "partial_record", "garbage", "bad_crc", "wrong_offset"])
def test_a_torn_tail_is_truncated_on_reopen(tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    b = EmbeddedBroker(tmp_path)
    (q0,) = b.create_topic("T", 1)
    for i in range(10):
        b.send("T", b"body-%d" % i, keys=f"k{i}")
    b.close()
    path = tmp_path / "T" / "0.log"
    data = path.read_bytes()
    starts = _record_starts(data)
    last = data[starts[-1] :]
    keep, size = 10, len(data)
    if damage == "partial_header":
        path.write_bytes(data + last[:10])
    elif damage == "partial_record":
        path.write_bytes(data + last[:-3])
    elif damage == "garbage":
        path.write_bytes(data + b"\xde\xad\xbe\xef" * 20)
    elif damage == "bad_crc":
        path.write_bytes(data[:-8] + bytes([data[-8] ^ 0xFF]) + data[-7:])
        keep, size = 9, starts[-1]
    else:  # a whole valid record, repeated: its offset is not the next one
        path.write_bytes(data + last)
    with caplog.at_level(logging.WARNING, logger="lite_push.sources.embedded"):
        b2 = EmbeddedBroker(tmp_path)
    assert any("truncating" in r.getMessage() for r in caplog.records)
    assert path.stat().st_size == size
    msgs = b2.messages(q0)
    assert [m.body for m in msgs] == [b"body-%d" % i for i in range(keep)]
    assert b2.send("T", b"after").offset == keep
    b2.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lite_push.sources.embedded"):
        b3 = EmbeddedBroker(tmp_path)
    assert not caplog.records
    assert [m.body for m in b3.messages(q0)][-1] == b"after" and b3.max_offset(q0) == keep + 1
    b3.close()


_CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    from lite_push.sources.embedded import EmbeddedBroker
    broker = EmbeddedBroker({path!r})
    broker.create_topic("T", 4)
    i = 0
    while True:
        res = broker.send_batch("T", [(b"%d-%d-" % (i, j) + b"x" * 300, "k%d" % (j % 13)) for j in range(100)])
        print(i, " ".join("%d:%d" % (q.queue_id, o) for q, o in sorted(res.last_offsets().items())), flush=True)
        i += 1
    """
)


def test_kill_9_loses_no_acknowledged_message(tmp_path: Path) -> None:
    path = tmp_path / "broker"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD.format(root=str(ROOT), path=str(path))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(child.stdout), daemon=True)  # type: ignore[arg-type]
    try:
        reader.start()
        deadline = time.monotonic() + 30
        while len(lines) < 40 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert child.poll() is None, child.stderr.read()  # type: ignore[union-attr]
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        reader.join(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        child.stdout.close()  # type: ignore[union-attr]
        child.stderr.close()  # type: ignore[union-attr]
    complete = [ln for ln in lines if ln.endswith("\n")]
    assert len(complete) >= 40
    acked: dict[int, int] = {}
    last_batch = -1
    for ln in complete:
        batch, *pairs = ln.split()
        last_batch = int(batch)
        for pair in pairs:
            qid, off = map(int, pair.split(":"))
            acked[qid] = max(acked.get(qid, -1), off)

    b = EmbeddedBroker(path)
    try:
        per_batch: dict[int, int] = {}
        for q in b.queues("T"):
            msgs = b.messages(q)
            assert len(msgs) > acked.get(q.queue_id, -1)  # every acknowledged offset is there
            last_seq: dict[str, tuple[int, int]] = {}
            for off, m in enumerate(msgs):
                assert m.queue_offset == off  # consecutive
                i, j, rest = m.body.split(b"-", 2)
                assert rest == b"x" * 300  # intact
                assert m.keys == f"k{int(j) % 13}" and q.queue_id == lane_of(m.keys, 4)
                seq = (int(i), int(j))
                assert last_seq.get(m.keys, (-1, -1)) < seq  # per key in send order
                last_seq[m.keys] = seq
                per_batch[int(i)] = per_batch.get(int(i), 0) + 1
        for i in range(last_batch + 1):
            assert per_batch.get(i) == 100, (i, per_batch.get(i))  # acknowledged batches are whole
    finally:
        b.close()


# -- retries, dead letters, delayed delivery --------------------------------------

SCHEDULE = "SCHEDULE_TOPIC_XXXX"


def _one(broker: EmbeddedBroker, group: str = "g", **send: object) -> tuple[EmbeddedPullConsumer, MessageExt]:
    """A consumer of ``group`` on a new topic T and the one message it polled."""
    broker.create_topic("T", 1)
    broker.send("T", b"payload", **send)  # type: ignore[arg-type]
    c = broker.pull_consumer(group, consume_from=FIRST)
    c.subscribe("T")
    (m,) = poll_topic(c, "T", 1)
    return c, m


@pytest.mark.parametrize(
    "levels",
    [(), [0], [1, -2], [float("inf")], [float("nan")], ["1"], [True], "15", 5, None],
)
def test_delay_levels_are_validated(levels: object) -> None:
    with pytest.raises(ConfigError, match="delay_levels") as info:
        EmbeddedBroker(delay_levels=levels)  # type: ignore[arg-type]
    assert info.value.field == "delay_levels"


def test_delay_levels_default_and_custom() -> None:
    with EmbeddedBroker() as b:
        assert b.delay_levels == (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800)
        assert b.pull_consumer("g").delay_levels == b.delay_levels
    clock = ManualClock()
    with EmbeddedBroker(clock=clock, delay_levels=[0.5, 2]) as b:
        assert b.delay_levels == (0.5, 2.0)
        c, m = _one(b)
        assert c.send_back([(m, 1), (m, 9)]) == [None, None]  # 9: clamped to 2 s
        clock.advance(0.5)
        assert b.deliver_due() == 1
        clock.advance(1.49)
        assert b.deliver_due() == 0
        clock.advance(0.01)
        assert b.deliver_due() == 1
        assert b.deliver_due() == 0


def test_a_clock_needs_monotonic_and_time() -> None:
    class MonotonicOnly:
        def monotonic(self) -> float:
            return 0.0

    with pytest.raises(ConfigError, match="clock"):
        EmbeddedBroker(clock=MonotonicOnly())  # type: ignore[arg-type]


def test_internal_names_are_reserved(broker: EmbeddedBroker) -> None:
    c, m = _one(broker)
    assert c.send_back([(m, 3)]) == [None]
    assert broker.topics() == ["%RETRY%g", "T"]  # the schedule topic is not listed
    assert len(broker.queues(SCHEDULE)) == 16  # one queue per level, readable by tools
    assert [x.body for x in broker.messages(broker.queues(SCHEDULE)[2])] == [b"payload"]
    with pytest.raises(UnknownTopicError):
        broker.pull_consumer("x").subscribe(SCHEDULE)
    with pytest.raises(ValueError, match="internal"):
        broker.send(SCHEDULE, b"x")
    with pytest.raises(ValueError, match="internal"):
        broker.create_topic(SCHEDULE, 16)
    with pytest.raises(ConfigError, match="group"):
        broker.pull_consumer("%SCHEDULE%")
    with pytest.raises(ConfigError, match="queue_count"):
        broker.create_topic("%DLQ%other", 4)
    assert broker.create_topic("%DLQ%other", 1) == [MessageQueue("%DLQ%other", "embedded", 0)]
    assert broker.create_topic("%RETRY%g", 1) == broker.queues("%RETRY%g")  # idempotent


def test_reconsume_times_is_the_reconsume_time_property(tmp_path: Path) -> None:
    b = EmbeddedBroker(tmp_path)
    (q0,) = b.create_topic("T", 1)
    b.send("T", b"a", properties={"RECONSUME_TIME": "3"})
    b.send("T", b"b")
    with pytest.raises(ValueError, match="RECONSUME_TIME"):
        b.send("T", b"c", properties={"RECONSUME_TIME": "-1"})
    before = [m.reconsume_times for m in b.messages(q0)]
    assert before == [3, 0]
    b.close()
    with EmbeddedBroker(tmp_path) as b2:
        assert [m.reconsume_times for m in b2.messages(q0)] == before


def test_a_waiting_poll_wakes_up_when_a_retry_is_due() -> None:
    with EmbeddedBroker(delay_levels=[0.3]) as b:  # the real clock
        c, m = _one(b)
        c.subscribe("%RETRY%g")
        wait_assigned(c, 2)
        t0 = time.monotonic()
        assert c.send_back([(m, 1)]) == [None]
        batches = c.poll(20.0)  # its wait slice is 10 s: bounded by the due time
        elapsed = time.monotonic() - t0
        assert [x.body for bt in batches for x in bt.messages] == [b"payload"]
        assert 0.25 <= elapsed < 5.0


def test_another_groups_poll_delivers_and_wakes_the_retry_consumer() -> None:
    with EmbeddedBroker(delay_levels=[0.3]) as b:
        c, m = _one(b)
        c.subscribe("%RETRY%g")
        wait_assigned(c, 2)
        other = b.pull_consumer("other", consume_from=FIRST)
        other.subscribe("T")
        got: list[MessageExt] = []
        t = threading.Thread(target=lambda: got.extend(poll_topic(c, "%RETRY%g", 1, timeout=10.0)))
        t.start()
        assert c.send_back([(m, 1)]) == [None]
        t.join(10)
        assert [x.reconsume_times for x in got] == [1]


def test_deliver_due_moves_big_backlogs_in_chunks() -> None:
    clock = ManualClock()
    with EmbeddedBroker(clock=clock) as b:
        c, m = _one(b)
        n = 10_000  # more than one delivery chunk
        assert c.send_back([(m, 1)] * n) == [None] * n
        assert b.deliver_due() == 0
        clock.advance(1.0)
        assert b.deliver_due() == n
        (rq,) = b.queues("%RETRY%g")
        assert b.max_offset(rq) == n and b.deliver_due() == 0


def test_a_failed_store_fails_every_item_of_the_batch(broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    c, m = _one(broker)

    def broken(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(broker.log, "append_locked", broken)
    results = c.send_back([(m, 1), (m, 0), (m, 2)])
    assert isinstance(results[0], OSError) and isinstance(results[2], OSError)
    assert isinstance(results[1], ValueError)
    assert all(isinstance(r, OSError) for r in c.send_to_dlq([(m, "r", ""), (m, "r", "")]))


def test_a_failed_delivery_does_not_break_polls(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    with EmbeddedBroker(clock=clock) as b:
        c, m = _one(b)
        c.subscribe("%RETRY%g")
        assert c.send_back([(m, 1)]) == [None]
        clock.advance(1.0)
        real = b.log.append_locked

        def broken(*args: object) -> None:
            raise OSError("disk full")

        monkeypatch.setattr(b.log, "append_locked", broken)
        (rq,) = b.queues("%RETRY%g")
        with caplog.at_level(logging.ERROR):
            assert c.poll(0) == []  # logged, not raised
        assert "delayed retries failed" in caplog.text
        monkeypatch.setattr(b.log, "append_locked", real)
        assert c.poll(0) == [] and b.max_offset(rq) == 0  # backs off: not tried again at once
        clock.advance(1.0)
        (r,) = poll_topic(c, "%RETRY%g", 1)
        assert r.reconsume_times == 1


def test_durable_restart_keeps_scheduled_retries(tmp_path: Path) -> None:
    clock = ManualClock()
    b = EmbeddedBroker(tmp_path, clock=clock)
    c, m = _one(b, keys="k", tags="A", properties={"user": "1"})
    assert c.send_back([(m, 1)]) == [None]  # due in 1 s
    assert c.send_back([(m, 3)]) == [None]  # due in 10 s
    clock.advance(1.0)
    assert b.deliver_due() == 1
    (rq,) = b.queues("%RETRY%g")
    first = b.messages(rq)
    assert [x.reconsume_times for x in first] == [1]
    b.close()

    b2 = EmbeddedBroker(tmp_path, clock=clock)
    try:
        assert b2.messages(rq) == first  # reconsume_times restored from RECONSUME_TIME
        assert b2.deliver_due() == 0  # the 1 s one was moved before: not again
        clock.advance(8.9)
        assert b2.deliver_due() == 0  # the 10 s one is not due yet
        c2 = b2.pull_consumer("g", consume_from=FIRST)
        c2.subscribe("%RETRY%g")
        assert len(poll_topic(c2, "%RETRY%g", 1)) == 1  # the one moved before the restart
        clock.advance(0.1)
        (r,) = poll_topic(c2, "%RETRY%g", 1)  # a poll delivers it
        assert (r.queue_offset, r.body, r.keys, r.tags, r.reconsume_times) == (1, b"payload", "k", "A", 1)
        assert r.properties["user"] == "1" and r.properties["ORIGIN_OFFSET"] == "0"
        assert "TIMER_DELIVER_MS" not in r.properties
        assert c2.send_back([(r, 1)]) == [None]
        assert c2.send_to_dlq([(r, "gave up", "boom")]) == [None]
    finally:
        b2.close()

    with EmbeddedBroker(tmp_path, clock=clock) as b3:
        assert [x.reconsume_times for x in b3.messages(rq)] == [1, 1]
        clock.advance(1.0)
        assert b3.deliver_due() == 1
        assert [x.reconsume_times for x in b3.messages(rq)] == [1, 1, 2]
        (d,) = b3.messages(b3.queues("%DLQ%g")[0])
        assert (d.reconsume_times, d.properties["DLQ_REASON"], d.properties["DLQ_EXCEPTION"]) == (1, "gave up", "boom")


def test_reopening_with_more_or_fewer_delay_levels(tmp_path: Path) -> None:
    clock = ManualClock()
    b = EmbeddedBroker(tmp_path, clock=clock, delay_levels=[1, 2])
    c, m = _one(b)
    assert c.send_back([(m, 2)]) == [None]
    b.close()
    with EmbeddedBroker(tmp_path, clock=clock, delay_levels=[1, 2, 3]) as b2:
        assert len(b2.queues(SCHEDULE)) == 3  # grown
        c2 = b2.pull_consumer("g", consume_from=FIRST)
        c2.subscribe("T")
        (m2,) = poll_topic(c2, "T", 1)
        assert c2.send_back([(m2, 3)]) == [None]
    with EmbeddedBroker(tmp_path, clock=clock, delay_levels=[1]) as b3:
        assert len(b3.queues(SCHEDULE)) == 3  # kept: its messages are still delivered
        clock.advance(2.0)
        assert b3.deliver_due() == 1
        clock.advance(1.0)
        assert b3.deliver_due() == 1


@pytest.mark.parametrize("damage", ["bad_crc", "garbage_between", "bad_header"])
def test_damage_in_the_middle_skips_only_the_damaged_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    """Issue 16.3: a damaged record with whole records after it is skipped
    (ERROR, counted in ``unreadable``); nothing after it is truncated, and a
    consumer goes on past it."""
    b = EmbeddedBroker(tmp_path)
    (q0,) = b.create_topic("T", 1)
    for i in range(10):
        b.send("T", b"body-%d" % i, keys=f"k{i}")
    b.close()
    path = tmp_path / "T" / "0.log"
    data = path.read_bytes()
    starts = _record_starts(data)
    s4, s5 = starts[4], starts[5]
    lost: list[int] = [4]
    if damage == "bad_crc":  # a flipped bit in record 4's body
        path.write_bytes(data[: s5 - 6] + bytes([data[s5 - 6] ^ 0x01]) + data[s5 - 5 :])
    elif damage == "garbage_between":  # bytes inserted between records 4 and 5: nothing is lost
        path.write_bytes(data[:s5] + b"\xde\xad\xbe\xef" * 7 + data[s5:])
        lost = []
    else:  # record 4's header overwritten
        path.write_bytes(data[:s4] + b"\x00" * 8 + data[s4 + 8 :])
    with caplog.at_level(logging.WARNING, logger="lite_push.sources.embedded"):
        b2 = EmbeddedBroker(tmp_path)
    assert not any("truncating" in r.getMessage() for r in caplog.records)
    if lost:
        assert any(r.levelno == logging.ERROR and "offset(s) 4..4" in r.getMessage() for r in caplog.records)
        assert b2.unreadable == {q0: frozenset(lost)}
    else:
        assert b2.unreadable == {}
    assert b2.max_offset(q0) == 10
    assert b2.send("T", b"after").offset == 10
    c = b2.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET)
    c.subscribe("T")
    got: list[bytes] = []
    next_offset = 0
    for _ in range(20):
        for batch in c.poll(0.05, max_per_queue=3):
            got += [m.body for m in batch.messages]
            next_offset = batch.next_offset
    assert got == [b"body-%d" % i for i in range(10) if i not in lost] + [b"after"]
    assert next_offset == 11  # the commit can pass the lost record
    c.close()
    b2.close()
