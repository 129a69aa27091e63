"""Issue 30, point 4: a stream entry lite_push did not write (a raw
``XADD``) does not break its queue.

Sends after it succeed (offsets stay unique and increasing: they continue
above its id), a consumer dead-letters it with a reason naming it and one
ERROR line naming its queue and id, every lite_push message is consumed
exactly once in key order, and the commit passes it, on both balances;
messages above the jump of offsets a ``*`` id makes wait until the runtime
finished those below (its offset tracker never spans the jump).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator

import pytest
import redis
from helpers import PollCounter, Recorder, assert_offsets_increase, wait_for

from lite_push import Balance, ConsumerConfig, LitePushConsumer, ManualClock, MessageQueue, dlq
from lite_push.sources import ConsumeFromWhere
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis.codec import decode
from lite_push.sources.redis.gaps import GAP_LIMIT, take_within
from lite_push.sources.redis.reading import QueueReader, read_into
from lite_push.sources.redis_server import RedisServer

BALANCES = [Balance.QUEUE, Balance.MESSAGE]


@pytest.fixture
def broker(redis_server: RedisServer) -> Iterator[RedisBroker]:
    b = RedisBroker(
        redis_server.url, namespace=f"fe-{uuid.uuid4().hex[:10]}", session_timeout=5.0, heartbeat_interval=0.5
    )
    yield b
    b.close()


def _consumer(broker: RedisBroker, listener: object, balance: Balance) -> tuple[LitePushConsumer, PollCounter]:
    source = broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, balance=balance)
    consumer = LitePushConsumer(
        ConsumerConfig(group="g", lanes=4, poll_timeout=0.02, commit_interval=0.05, revoke_timeout=1.0),
        source=source,
        listener=listener,  # type: ignore[arg-type]
    )
    consumer.subscribe("T")
    return consumer, PollCounter(source)


def _committed(broker: RedisBroker, q: MessageQueue) -> int:
    c = broker.committed("g", q)
    return -1 if c is None else c.offset


def _top_ms(broker: RedisBroker) -> int:
    last = broker.client.xinfo_stream(broker.queue_key("T", 0, "log"))["last-generated-id"]
    return int(last.split(b"-")[0])


def _server_ms(broker: RedisBroker) -> int:
    seconds, micros = broker.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _send(broker: RedisBroker, tag: str, n: int = 6) -> list[int]:
    return [r.offset for r in broker.send_batch("T", [(f"{tag}{i}".encode(), f"k{i % 3}") for i in range(n)])]


def _malformed_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and "malformed" in r.getMessage()]


@pytest.mark.parametrize("balance", BALANCES, ids=lambda b: b.name)
def test_foreign_entries_are_dead_lettered_once_and_every_message_runs_once_in_order(
    broker: RedisBroker, balance: Balance, caplog: pytest.LogCaptureFixture
) -> None:
    broker.create_topic("T", 1)
    q = broker.queues("T")[0]
    log = broker.queue_key("T", 0, "log")
    client = broker.client
    offsets = _send(broker, "a")
    star = client.xadd(log, {"field": "value"}).decode()  # an id the stream assigns: the time in ms
    offsets += _send(broker, "b")  # used to fail: "ID ... equal or smaller than the target stream top item"
    explicit = f"{_top_ms(broker)}-1"  # lite_push's fields, but a sequence part of 1
    client.xadd(log, {"b": b"x", "m": b'{"bt":1,"k":"k0"}', "s": b"1"}, id=explicit)
    offsets += _send(broker, "c")
    assert offsets == sorted(offsets) and len(set(offsets)) == 18
    assert offsets[6] > int(star.split("-")[0]) - 1  # above the foreign entry
    rec = Recorder()
    consumer, _ = _consumer(broker, rec, balance)
    with caplog.at_level(logging.ERROR), consumer:
        wait_for(lambda: rec.count() >= 18, 30, lambda: f"18 messages, got {rec.count()}")
        # while it runs; once the server's clock is past the top id, so the
        # entry gets "<ms>-0" (an id "<top>-N": test_an_entry_added_after_the_last_one_read_...)
        wait_for(lambda: _server_ms(broker) > _top_ms(broker), 5, "the server clock past the top id")
        late = client.xadd(log, {"only": "one field"}).decode()
        offsets += _send(broker, "d")
        wait_for(lambda: rec.count() >= 24, 30, lambda: f"24 messages, got {rec.count()}")
        end = broker.max_offset(q)
        assert end == offsets[-1] + 1
        wait_for(lambda: _committed(broker, q) == end, 30, "the commit past every entry")
        assert consumer.stats().failure is None
    assert sorted(o for _, _, o in rec.seen) == offsets  # every message exactly once
    assert rec.overlaps == []
    assert_offsets_increase(rec.order)
    letters = dlq.dead_letters(broker, "g")
    reasons = sorted(d.reason for d in letters)
    assert len(letters) == 3
    for eid in (star, explicit, late):
        assert sum(eid in r for r in reasons) == 1, (eid, reasons)
    assert any("sequence part is not 0" in r and explicit in r for r in reasons)
    assert any("fields field, not b, m, s" in r and star in r for r in reasons)
    errors = _malformed_errors(caplog)
    assert len(errors) == 3, errors  # one line per entry, no repeats per poll
    for eid in (star, explicit, late):
        assert sum(eid in e and str(q) in e for e in errors) == 1, (eid, errors)


def test_a_read_goes_on_after_the_last_entry_it_took_even_one_after_where_a_tag_filter_stopped() -> None:
    """The next read starts just after the last entry the read took: with a
    tag filter that stopped at ``max_per_queue`` messages, a foreign
    ``<ms>-N`` entry right after the last message (same offset) is taken
    (dead-lettered) now, and not read again."""
    mq = MessageQueue("T", "ns", 0)
    st = QueueReader(mq, "log", 0, frozenset({"A"}))
    assert st.start() == "1-0"

    def entry(eid: str, tag: str = "A") -> tuple[bytes, list[bytes]]:
        return eid.encode(), [b"b", b"x", b"m", b'{"bt":1,"k":"k","t":"' + tag.encode() + b'"}', b"s", b"1"]

    stored: list[str] = []
    out: list[object] = []
    entries = [entry("1-0"), entry("2-0", "B"), entry("3-0"), entry("3-4"), entry("4-0")]
    read_into(out, [st], [entries], 2, "ns", {mq: st}, lambda bad: stored.extend(r for _, r in bad))  # type: ignore[arg-type]
    assert [m.queue_offset for b in out for m in b.messages] == [0, 2]  # type: ignore[attr-defined]
    assert st.pos == 3 and st.after == "3-4" and st.start() == "(3-4"
    assert len(stored) == 1 and "3-4" in stored[0]
    st.restart(7)  # a seek starts afresh at the offset's own id
    assert st.after is None and st.start() == "8-0"


@pytest.mark.parametrize("balance", BALANCES, ids=lambda b: b.name)
def test_an_entry_added_after_the_last_one_read_with_its_millisecond_is_read_not_passed_over(
    broker: RedisBroker, balance: Balance, caplog: pytest.LogCaptureFixture
) -> None:
    """A consumer that read the top entry ``<ms>-0`` next reads just after
    it, so an entry added later as ``<ms>-N`` (a raw ``XADD`` with that id,
    or ``*`` within that millisecond: it sorts between the top and the next
    offset's id) is dead-lettered with its reason, once, and the messages
    sent after it run, each once."""
    broker.create_topic("T", 1)
    q = broker.queues("T")[0]
    log = broker.queue_key("T", 0, "log")
    offsets = _send(broker, "a")
    rec = Recorder()
    consumer, polls = _consumer(broker, rec, balance)
    with caplog.at_level(logging.ERROR), consumer:
        wait_for(lambda: rec.count() >= 6, 30, lambda: f"6 messages, got {rec.count()}")
        polls.turns(3)  # it has read past the top entry and polled again
        late = [f"{_top_ms(broker)}-{n}" for n in (1, 7)]
        broker.client.xadd(log, {"b": b"x", "m": b'{"bt":1,"k":"k0"}', "s": b"1"}, id=late[0])
        broker.client.xadd(log, {"only": "one field"}, id=late[1])
        offsets += _send(broker, "b")
        wait_for(lambda: rec.count() >= 12, 30, lambda: f"12 messages, got {rec.count()}")
        end = broker.max_offset(q)
        wait_for(lambda: _committed(broker, q) == end, 30, "the commit past every entry")
        polls.turns(3)
        assert consumer.stats().failure is None
    assert sorted(o for _, _, o in rec.seen) == offsets  # every message exactly once
    assert_offsets_increase(rec.order)
    reasons = sorted(d.reason for d in dlq.dead_letters(broker, "g"))
    assert len(reasons) == 2, reasons
    for eid in late:
        assert sum(eid in r for r in reasons) == 1, (eid, reasons)
    assert len(_malformed_errors(caplog)) == 2


@pytest.mark.parametrize("balance", BALANCES, ids=lambda b: b.name)
def test_messages_above_a_jump_wait_until_those_below_are_finished(broker: RedisBroker, balance: Balance) -> None:
    """The messages below a foreign ``*`` entry are in the listener when
    the messages above it arrive: those wait (the runtime's offset tracker
    would otherwise have to span about 1.8e12 offsets) and run once the
    ones below finished; nothing fails."""
    broker.create_topic("T", 1)
    q = broker.queues("T")[0]
    release = threading.Event()
    entered = threading.Event()
    rec = Recorder()

    def listener(msgs):  # type: ignore[no-untyped-def]
        rec(msgs)
        if msgs[0].body.startswith(b"a"):
            entered.set()
            release.wait(30)

    consumer, polls = _consumer(broker, listener, balance)
    with consumer:
        below = [r.offset for r in broker.send_batch("T", [(f"a{i}".encode(), f"a{i}") for i in range(4)])]
        assert entered.wait(30)
        broker.client.xadd(broker.queue_key("T", 0, "log"), {"field": "value"})
        above = [r.offset for r in broker.send_batch("T", [(f"b{i}".encode(), f"b{i}") for i in range(4)])]
        assert above[0] - below[-1] > GAP_LIMIT
        polls.turns(5)
        assert not any(o in above for _, _, o in rec.seen)  # other keys, yet they wait: below is unfinished
        release.set()
        wait_for(lambda: rec.count() == 8, 30, lambda: f"8 messages, got {rec.count()}")
        wait_for(lambda: _committed(broker, q) == above[-1] + 1, 30, "the commit past the jump")
        assert consumer.stats().failure is None
    assert sorted(o for _, _, o in rec.seen) == below + above


def test_sends_of_every_kind_go_above_a_foreign_entry(broker: RedisBroker) -> None:
    """SEND (send_batch, dead letters) and MOVE_DUE (due retries) after a
    foreign entry in their stream; max_offset sees the entry before any
    send moved seq past it."""
    clock = ManualClock(start=1_000.0)
    b = RedisBroker(broker.client, namespace=f"fe-{uuid.uuid4().hex[:10]}", clock=clock)
    b.create_topic("T", 1)
    q = b.queues("T")[0]
    b.send("T", b"x", keys="k")
    foreign = b.client.xadd(b.queue_key("T", 0, "log"), {"f": "v"})
    assert b.max_offset(q) == int(foreign.split(b"-")[0])  # past the foreign entry's offset
    assert b.send("T", b"y", keys="k").offset == int(foreign.split(b"-")[0])
    # a due retry moved into a retry stream holding a foreign entry
    assert b.retries.store_retries("g", [(b.messages(q)[0], 1)]) == [None]
    b.create_topic("%RETRY%g", 1)
    retry = b.queues("%RETRY%g")[0]
    b.client.xadd(b.queue_key("%RETRY%g", 0, "log"), {"f": "v"})
    clock.advance(3600)
    assert b.deliver_due("g") == 1
    assert [m.body for m in b.messages(retry)] == [b"x"]
    # a dead letter into a dead-letter stream holding one
    b.create_topic("%DLQ%g", 1)
    b.client.xadd(b.queue_key("%DLQ%g", 0, "log"), {"f": "v"})
    assert b.retries.store_dead_letters("g", [(b.messages(q)[0], "why", "")]) == [None]
    assert len(b.messages(b.queues("%DLQ%g")[0])) == 1


def test_an_id_past_2_to_the_53_is_refused_with_an_error_naming_the_stream(broker: RedisBroker) -> None:
    broker.create_topic("T", 1)
    log = broker.queue_key("T", 0, "log")
    broker.client.xadd(log, {"f": "v"}, id=f"{1 << 53}-0")
    with pytest.raises(redis.ResponseError, match=f"stream {log} holds id {1 << 53}-0"):
        broker.send("T", b"x")


def test_a_time_search_passes_over_a_gap(broker: RedisBroker) -> None:
    broker.create_topic("T", 1)
    q = broker.queues("T")[0]
    before = _send(broker, "a", 3)
    broker.client.xadd(broker.queue_key("T", 0, "log"), {"f": "v"})
    after = _send(broker, "b", 3)
    stored = [m.store_timestamp for m in broker.messages(q)]
    lo, hi = broker.min_offset(q), broker.max_offset(q)
    assert broker.catalog.first_stored_at(q, lo, hi, stored[0]) == before[0]
    assert broker.catalog.first_stored_at(q, lo, hi, stored[-1] + 1) == hi
    found = broker.catalog.first_stored_at(q, lo, hi, stored[3])
    assert found <= after[0] and all(s < stored[3] for s in stored[: 3 if found > before[-1] else 0])


def test_decode_tells_an_id_with_a_sequence_part_apart() -> None:
    q = MessageQueue("T", "ns", 0)
    good = [b"b", b"x", b"m", b'{"bt":1}', b"s", b"2"]
    bad: list = []
    msgs = decode("ns", q, [(b"4-0", good), (b"4-1", good), (b"6-0", good)], bad)
    assert [m.queue_offset for m in msgs] == [3, 5]  # not 3, 4, 5 as three consecutive entries would be
    assert [(m.queue_offset, r) for m, r in bad] == [
        (
            3,
            "malformed entry 4-1: not written by lite_push: its id's sequence part is not 0 (lite_push writes "
            "<offset+1>-0)",
        ),
    ]
    bad.clear()
    decode("ns", q, [(b"7-0", [b"field", b"value"])], bad)
    assert bad[0][1] == "malformed entry 7-0: fields field, not b, m, s (not written by lite_push?)"


@pytest.mark.parametrize(
    ("offsets", "low", "high", "n"),
    [
        ([5, 6, 7], None, None, 3),
        ([5, 6, 5 + GAP_LIMIT + 1], None, None, 2),  # the jump is cut off
        ([5 + GAP_LIMIT + 1], 5, None, 0),  # far from what is unfinished: nothing yet
        ([5 + GAP_LIMIT], 5, 9, 1),
        ([1, 2], 10 + GAP_LIMIT, 10 + GAP_LIMIT, 0),  # late offsets far below
        ([], 1, 2, 0),
    ],
)
def test_take_within(offsets: list[int], low: int | None, high: int | None, n: int) -> None:
    assert take_within(offsets, low, high) == n


def test_a_foreign_entry_too_big_for_a_dead_letter_is_dead_lettered_without_its_body(broker: RedisBroker) -> None:
    small = RedisBroker(broker.client, namespace=f"fe-{uuid.uuid4().hex[:10]}", max_message_size=16)
    small.create_topic("T", 1)
    small.client.xadd(small.queue_key("T", 0, "log"), {"b": b"x" * 100})
    small.send("T", b"ok", keys="k")
    c = small.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET)
    c.subscribe("T")
    got = []
    assert wait_for_batches(c, got)
    assert [m.body for m in got] == [b"ok"]
    (letter,) = dlq.dead_letters(small, "g")
    assert letter.message.body == b"" and "its body of 100 bytes, over max_message_size, left out" in letter.reason
    c.close()


def wait_for_batches(c: object, got: list) -> bool:
    for _ in range(200):
        for b in c.poll(0.05):  # type: ignore[attr-defined]
            got.extend(b.messages)
        if got:
            return True
    return False
