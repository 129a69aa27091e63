"""The BROADCASTING message model: every member reads every queue and keeps
its own offsets in a local orjson file, written atomically; on the embedded
broker and on Redis, at the source level and under the runtime."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from helpers import Recorder, assert_offsets_increase, wait_until

from lite_push import (
    ConfigError,
    ConsumeMode,
    ConsumerConfig,
    LitePushConsumer,
    ManualClock,
    MessageModel,
    OffsetAndMetadata,
)
from lite_push.sources import ConsumeFromWhere, EmbeddedBroker, retry_topic
from lite_push.sources.local_offsets import LocalOffsetStore, OffsetFileError, default_offset_file
from lite_push.sources.redis import RedisBroker

BROADCASTING = MessageModel.BROADCASTING
FIRST = ConsumeFromWhere.FIRST_OFFSET


# -- the offsets file ------------------------------------------------------------


def _q(broker, topic="T", i=0):  # type: ignore[no-untyped-def]
    return broker.queues(topic)[i]


def test_offsets_file_round_trip_is_atomic_and_locked(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "g.json"
    with EmbeddedBroker() as broker:
        q0, q1 = broker.create_topic("T", 2)
        store = LocalOffsetStore(path, broker_name=broker.broker_name, group="g")
        assert store.get(q0) is None
        store.commit({q0: OffsetAndMetadata(5, "m"), q1: OffsetAndMetadata(7)})
        store.commit({q0: OffsetAndMetadata(6, "")})
        doc = orjson.loads(path.read_bytes())
        assert doc["offsets"] == {"T#0": [6, ""], "T#1": [7, ""]}
        assert doc["group"] == "g" and doc["broker"] == broker.broker_name
        assert sorted(p.name for p in path.parent.iterdir()) == ["g.json", "g.json.lock"]  # no temp file left
        # a second consumer of the same file is refused, naming the field
        with pytest.raises(ConfigError, match="offset_file.*in use"):
            LocalOffsetStore(path, broker_name=broker.broker_name, group="g")
        store.close()
        again = LocalOffsetStore(path, broker_name=broker.broker_name, group="g")
        assert again.get(q0) == OffsetAndMetadata(6, "") and again.get(q1) == OffsetAndMetadata(7)
        again.close()


def test_a_failed_write_keeps_the_previous_offsets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "g.json"
    with EmbeddedBroker() as broker:
        (q0,) = broker.create_topic("T", 1)
        store = LocalOffsetStore(path, broker_name=broker.broker_name, group="g")
        store.commit({q0: OffsetAndMetadata(3)})

        def crash(src: object, dst: object) -> None:
            raise OSError("disk full")

        monkeypatch.setattr(os, "replace", crash)
        with pytest.raises(OSError, match="disk full"):
            store.commit({q0: OffsetAndMetadata(9)})
        monkeypatch.undo()
        assert store.get(q0) == OffsetAndMetadata(3)  # memory matches the file
        assert orjson.loads(path.read_bytes())["offsets"] == {"T#0": [3, ""]}
        store.commit({q0: OffsetAndMetadata(9)})  # the next commit writes it
        store.close()
        assert LocalOffsetStore(path, broker_name=broker.broker_name, group="g").get(q0) == OffsetAndMetadata(9)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b'{"format": 1, "broker": "b", "group": "g", "offs', "damaged"),
        (b'{"format": 2, "broker": "b", "group": "g", "offsets": {}}', "damaged"),
        (b'{"format": 1, "broker": "b", "group": "g", "offsets": {"T#0": [-1, ""]}}', "damaged"),
        (b'{"format": 1, "broker": "b", "group": "other", "offsets": {}}', "belongs to"),
    ],
)
def test_a_damaged_or_foreign_offsets_file_is_refused_not_guessed(tmp_path: Path, content: bytes, match: str) -> None:
    path = tmp_path / "g.json"
    path.write_bytes(content)
    with pytest.raises(OffsetFileError, match=match):
        LocalOffsetStore(path, broker_name="b", group="g")
    LocalOffsetStore(tmp_path / "fine.json", broker_name="b", group="g").close()
    path.unlink()
    LocalOffsetStore(path, broker_name="b", group="g").close()  # the refused store released its lock


def test_default_offset_file_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITE_PUSH_OFFSET_DIR", str(tmp_path))
    assert default_offset_file("b/x", "g 1") == tmp_path / "b_x" / "g_1.json"


# -- sources ---------------------------------------------------------------------


@pytest.fixture(params=["embedded", "redis"])
def broker(request: pytest.FixtureRequest) -> Iterator[EmbeddedBroker | RedisBroker]:
    if request.param == "embedded":
        b: EmbeddedBroker | RedisBroker = EmbeddedBroker()
    else:
        server = request.getfixturevalue("redis_server")
        b = RedisBroker(server.url, namespace=f"b-{uuid.uuid4().hex[:12]}", session_timeout=5.0, heartbeat_interval=0.5)
    yield b
    b.close()


def _drain(source, expect: int, timeout: float = 10.0) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
    got: list[tuple[int, int]] = []

    def more() -> bool:
        for batch in source.poll(0.05, 64):
            got.extend((m.queue_id, m.queue_offset) for m in batch.messages)
        return len(got) >= expect

    assert wait_until(more, timeout=timeout, interval=0), f"{len(got)} of {expect}"
    return got


def test_every_broadcasting_member_reads_every_queue_with_its_own_offsets(broker, tmp_path: Path) -> None:
    queues = broker.create_topic("T", 4)
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(40)])
    a = broker.pull_consumer("g", consume_from=FIRST, message_model=BROADCASTING, offset_file=tmp_path / "a.json")
    b = broker.pull_consumer("g", consume_from=FIRST, message_model=BROADCASTING, offset_file=tmp_path / "b.json")
    assigned: list[object] = []

    class Listener:
        def on_assigned(self, qs: object) -> None:
            assigned.append(sorted(qs))  # type: ignore[call-overload]

        def on_revoked(self, qs: object) -> None:
            raise AssertionError("a broadcasting member never loses a queue")

    a.set_rebalance_listener(Listener())  # type: ignore[arg-type]
    a.subscribe("T")
    b.subscribe("T")
    assert a.message_model is BROADCASTING
    got_a, got_b = _drain(a, 40), _drain(b, 40)
    everything = sorted((q.queue_id, o) for q in queues for o in range(broker.max_offset(q)))
    assert sorted(got_a) == sorted(got_b) == everything
    assert a.assignment() == b.assignment() == frozenset(queues)
    assert assigned == [sorted(queues)]
    # commits go to the member's own file, never to the broker's group offsets
    a.commit({queues[0]: OffsetAndMetadata(4, "map"), queues[1]: 2})
    assert a.committed(queues[0]) == OffsetAndMetadata(4, "map")
    assert b.committed(queues[0]) == OffsetAndMetadata(0)  # its start, stored at assignment
    assert broker.committed("g", queues[0]) is None
    assert orjson.loads((tmp_path / "a.json").read_bytes())["offsets"]["T#0"] == [4, "map"]
    # no locks to wait for, no retry topic
    assert a.lock(queues, 60.0) == b.lock(queues, 60.0) == frozenset(queues)
    msg = broker.messages(queues[0])[0]
    (err,) = a.send_back([(msg, 1)])
    assert err is not None and "BROADCASTING" in str(err)
    (ok,) = a.send_to_dlq([(msg, "bad", "")])
    assert ok is None
    a.close()
    b.close()


def test_a_restarted_broadcasting_member_resumes_from_its_file(broker, tmp_path: Path) -> None:
    (q,) = broker.create_topic("T", 1)
    broker.send_batch("T", [(b"x", None) for _ in range(10)])
    path = tmp_path / "m.json"
    a = broker.pull_consumer("g", message_model=BROADCASTING, offset_file=path)  # LAST_OFFSET
    a.subscribe("T")
    assert a.poll(0.05) == []
    assert a.position(q) == 10  # the end at the first start, stored in the file at once
    a.close()
    broker.send_batch("T", [(b"y", None) for _ in range(5)])
    b = broker.pull_consumer("g", message_model=BROADCASTING, offset_file=path)
    b.subscribe("T")
    assert sorted(o for _, o in _drain(b, 5)) == list(range(10, 15))  # nothing sent while it was down is lost
    b.commit({q: 13})
    b.close()
    c = broker.pull_consumer("g", message_model=BROADCASTING, offset_file=path)
    c.subscribe("T")
    assert sorted(o for _, o in _drain(c, 2)) == [13, 14]
    c.close()


def test_broadcasting_members_do_not_disturb_the_clustering_group(broker, tmp_path: Path) -> None:
    queues = broker.create_topic("T", 4)
    cl = broker.pull_consumer("g", consume_from=FIRST)
    cl.subscribe("T")
    cl.poll(0.05)
    bc = broker.pull_consumer("g", message_model=BROADCASTING, offset_file=tmp_path / "b.json")
    bc.subscribe("T")
    bc.poll(0.05)
    cl.poll(0.05)
    assert cl.assignment() == bc.assignment() == frozenset(queues)  # not a member of the group's rebalance
    cl.close()
    bc.close()


def test_bad_broadcasting_settings_raise_at_construction(broker, tmp_path: Path) -> None:
    broker.create_topic("T", 1)
    with pytest.raises(ConfigError, match="offset_file"):
        broker.pull_consumer("g", offset_file=tmp_path / "x.json")  # CLUSTERING keeps offsets in the broker
    with pytest.raises(ConfigError, match="message_model"):
        broker.pull_consumer("g", message_model="BROADCASTING")  # type: ignore[arg-type]
    first = broker.pull_consumer("g", message_model=BROADCASTING, offset_file=tmp_path / "x.json")
    with pytest.raises(ConfigError, match="offset_file"):
        broker.pull_consumer("g", message_model=BROADCASTING, offset_file=tmp_path / "x.json")
    first.close()
    broker.pull_consumer("g", message_model=BROADCASTING, offset_file=tmp_path / "x.json").close()


# -- the runtime -------------------------------------------------------------------


def _runtime(broker, listener, path: Path, clock=None, **cfg):  # type: ignore[no-untyped-def]
    cfg.setdefault("poll_timeout", 0.02)
    cfg.setdefault("commit_interval", 0.05)
    consumer = LitePushConsumer(
        ConsumerConfig(group="g", **cfg),
        source=broker.pull_consumer("g", consume_from=FIRST, message_model=BROADCASTING, offset_file=path),
        listener=listener,
        clock=clock,
    )
    consumer.subscribe("T")
    return consumer


def test_two_broadcasting_runtimes_each_consume_everything_in_key_order(broker, tmp_path: Path) -> None:
    queues = broker.create_topic("T", 4)
    total = 2000
    broker.send_batch("T", [(b"x", f"k{i % 60}") for i in range(total)])
    recs = [Recorder(jitter=0.0002), Recorder(jitter=0.0002)]
    consumers = [_runtime(broker, r, tmp_path / f"{i}.json", lanes=8) for i, r in enumerate(recs)]
    for c in consumers:
        c.start()
    try:
        for r in recs:
            assert wait_until(lambda r=r: len(set(r.seen)) == total, timeout=60)
        for c in consumers:
            assert wait_until(lambda c=c: sum(c.stats().committed.get(q, 0) for q in queues) == total)
    finally:
        for c in consumers:
            c.shutdown()
    for i, r in enumerate(recs):
        assert r.overlaps == []
        assert_offsets_increase(r.order)
        assert len(r.seen) == total  # each member once
        offsets = orjson.loads((tmp_path / f"{i}.json").read_bytes())["offsets"]
        assert sum(v[0] for v in offsets.values()) == total
    for q in queues:
        assert broker.committed("g", q) is None


def test_a_broadcasting_runtime_stopped_mid_run_resumes_without_loss(broker, tmp_path: Path) -> None:
    queues = broker.create_topic("T", 2)
    total = 3000
    broker.send_batch("T", [(b"x", f"k{i % 40}") for i in range(total)])
    path = tmp_path / "m.json"
    first = Recorder(jitter=0.001)
    with _runtime(broker, first, path, lanes=4, pull_threshold_for_queue=100):
        assert wait_until(lambda: first.count() > 300, timeout=30)
    assert first.count() < total
    committed = {k: v[0] for k, v in orjson.loads(path.read_bytes())["offsets"].items()}
    second = Recorder()
    with _runtime(broker, second, path, lanes=4) as c2:
        assert wait_until(lambda: sum(c2.stats().committed.get(q, 0) for q in queues) == total, timeout=60)
    seen = set(first.seen) | set(second.seen)
    assert seen == {("T", q.queue_id, o) for q in queues for o in range(total) if o < broker.max_offset(q)}
    # the second run started exactly at the first one's committed offsets
    # (skipping what the offset map says was finished above them)
    for q in queues:
        start = committed[f"T#{q.queue_id}"]
        assert all(o >= start for _, qid, o in second.seen if qid == q.queue_id)
    assert second.overlaps == []
    assert_offsets_increase(second.order)


def test_a_broadcasting_concurrently_failure_is_retried_by_the_member_not_sent_back(broker, tmp_path: Path) -> None:
    (q,) = broker.create_topic("T", 1)
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(20)])
    clock = ManualClock()
    attempts: dict[int, int] = {}
    lock = threading.Lock()

    def listener(msgs):  # type: ignore[no-untyped-def]
        with lock:
            for m in msgs:
                attempts[m.queue_offset] = attempts.get(m.queue_offset, 0) + 1
        if any(m.queue_offset == 7 and m.reconsume_times < 2 for m in msgs):
            raise RuntimeError("try again")

    def scheduled(c) -> bool:  # type: ignore[no-untyped-def]
        due = c.stats().next_retry_due  # the local retry is on the timer, due after now
        return due is not None and due > clock.monotonic()

    with _runtime(broker, listener, tmp_path / "m.json", clock, lanes=4, mode=ConsumeMode.CONCURRENTLY) as c:
        assert wait_until(lambda: len(attempts) == 20)
        assert wait_until(lambda: c.stats().retried == 1 and c.stats().consumed == 19)
        clock.advance(0.1)  # a commit, not the retry
        assert wait_until(lambda: c.stats().committed.get(q, 0) == 7)  # the failed message holds it back
        assert wait_until(lambda: scheduled(c))
        clock.advance(10.0)  # retry_start_level 3 = 10 s on the default levels
        assert wait_until(lambda: attempts[7] == 2 and c.stats().retried == 2)
        assert wait_until(lambda: scheduled(c))  # the pull thread took the failure (else the advance comes first)
        clock.advance(30.0)  # level 4
        assert wait_until(lambda: attempts[7] == 3)
        clock.advance(0.1)
        assert wait_until(lambda: c.stats().committed.get(q, 0) == 20)
        assert c.stats().sent_back == 0
    assert attempts == {i: 3 if i == 7 else 1 for i in range(20)}
    assert retry_topic("g") not in broker.topics()  # nothing went through the group's retry topic
