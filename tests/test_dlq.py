"""lite_push.dlq: parsing dead letters, listing them, resending them."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from lite_push import ManualClock, MessageExt
from lite_push.dlq import DeadLetter, Sender, dead_letters, resend, user_properties
from lite_push.sources import ConsumeFromWhere, EmbeddedBroker, EmbeddedPullConsumer
from lite_push.testing import poll_topic

FIRST = ConsumeFromWhere.FIRST_OFFSET
USER = {"user": "u1", "trace": "t-9"}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=["memory", "durable"])
def broker(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker(tmp_path if request.param == "durable" else None, clock=clock)
    yield b
    b.close()


def _failed(broker: EmbeddedBroker) -> tuple[EmbeddedPullConsumer, MessageExt]:
    """A consumer of group g on T (2 queues) and the message it failed on."""
    broker.create_topic("T", 2)
    broker.send("T", b"order-42", keys="k42", tags="Orders", properties=USER, queue_id=1)
    c = broker.pull_consumer("g", consume_from=FIRST)
    c.subscribe("T")
    (m,) = poll_topic(c, "T", 1)
    return c, m


def test_a_dead_letter_is_parsed(broker: EmbeddedBroker) -> None:
    c, m = _failed(broker)
    assert c.send_to_dlq([(m, "max reconsume times exceeded", "ValueError: boom")]) == [None]
    (dl,) = dead_letters(broker, "g")
    assert isinstance(dl, DeadLetter)
    assert dl.message.topic == "%DLQ%g" and dl.message.body == b"order-42"
    assert (dl.group, dl.reason, dl.exception) == ("g", "max reconsume times exceeded", "ValueError: boom")
    assert (dl.origin_topic, dl.origin_queue_id, dl.origin_offset, dl.origin_msg_id) == ("T", 1, 0, m.msg_id)
    assert dl.reconsume_times == 0
    assert DeadLetter.from_message(dl.message) == dl
    assert hash(dl) == hash(DeadLetter.from_message(dl.message))  # frozen and hashable
    with pytest.raises(AttributeError):
        dl.reason = "other"  # type: ignore[misc]


def test_a_dead_letter_after_retries_keeps_its_first_origin(broker: EmbeddedBroker, clock: ManualClock) -> None:
    c, m = _failed(broker)
    c.subscribe("%RETRY%g")
    assert c.send_back([(m, 1)]) == [None]
    clock.advance(1.0)
    (r,) = poll_topic(c, "%RETRY%g", 1)
    assert c.send_to_dlq([(r, "gave up", "")]) == [None]
    (dl,) = dead_letters(broker, "g")
    assert (dl.origin_topic, dl.origin_queue_id, dl.origin_offset, dl.origin_msg_id) == ("T", 1, 0, m.msg_id)
    assert (dl.reconsume_times, dl.exception) == (1, "")


def test_resend_round_trip(broker: EmbeddedBroker) -> None:
    c, m = _failed(broker)
    assert c.send_to_dlq([(m, "bad", "KeyError: 'x'")]) == [None]
    (dl,) = dead_letters(broker, "g")
    result = resend(broker, dl)
    assert (result.queue.topic, result.queue.queue_id, result.offset) == ("T", 1, 1)  # same key: same queue
    (again,) = poll_topic(c, "T", 1)  # consumed again, as a new message
    assert (again.queue_offset, again.msg_id) == (1, result.msg_id)
    assert (again.body, again.keys, again.tags) == (m.body, m.keys, m.tags)
    assert again.properties == USER  # the user's properties, no bookkeeping
    assert again.reconsume_times == 0
    # the DLQ message itself works too; the dead letter stays in the DLQ
    assert resend(broker, dl.message).offset == 2
    assert len(dead_letters(broker, "g")) == 1


def test_user_properties_strip_the_bookkeeping(broker: EmbeddedBroker) -> None:
    c, m = _failed(broker)
    c.send_to_dlq([(m, "r", "e")])
    (dl,) = dead_letters(broker, "g")
    assert set(dl.message.properties) > set(USER)
    assert user_properties(dl.message) == USER


def test_a_message_that_is_not_a_dead_letter_is_refused(broker: EmbeddedBroker) -> None:
    _c, m = _failed(broker)
    with pytest.raises(ValueError, match="DLQ_GROUP"):
        DeadLetter.from_message(m)
    with pytest.raises(ValueError, match="DLQ_GROUP"):
        resend(broker, m)
    props = {"DLQ_GROUP": "g", "DLQ_REASON": "r", "ORIGIN_TOPIC": "T", "ORIGIN_QUEUE_ID": "0", "ORIGIN_MESSAGE_ID": "x"}
    with pytest.raises(ValueError, match="ORIGIN_OFFSET.*missing"):
        DeadLetter.from_message(MessageExt("%DLQ%g", 0, 0, b"", properties=props))
    with pytest.raises(ValueError, match="ORIGIN_OFFSET.*integer"):
        DeadLetter.from_message(MessageExt("%DLQ%g", 0, 0, b"", properties={**props, "ORIGIN_OFFSET": "seven"}))
    ok = {**props, "ORIGIN_OFFSET": "7"}
    dl = DeadLetter.from_message(MessageExt("%DLQ%g", 0, 0, b"", reconsume_times=4, properties=ok))
    assert (dl.exception, dl.reconsume_times, dl.origin_offset) == ("", 4, 7)  # defaults without the optional ones


def test_dead_letters_of_a_group_without_any(broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture) -> None:
    assert dead_letters(broker, "nobody") == []
    c, m = _failed(broker)
    c.send_to_dlq([(m, "r1", ""), (m, "r2", "")])
    broker.send("%DLQ%g", b"by hand")  # not a dead letter: skipped with a warning
    c.send_to_dlq([(m, "r3", "")])
    with caplog.at_level(logging.WARNING, logger="lite_push.dlq"):
        assert [d.reason for d in dead_letters(broker, "g")] == ["r1", "r2", "r3"]
    assert "DLQ_GROUP" in caplog.text
    assert [d.reason for d in dead_letters(broker, "g", start=1, stop=2)] == ["r2"]


def test_the_broker_is_a_sender(broker: EmbeddedBroker) -> None:
    """The broker keeps :class:`Sender`'s contract, not just its method's
    name: ``send(topic, body, keys, tags, properties)``, by position or by
    name, stores the message and returns where it is."""
    broker.create_topic("T", 2)
    sender: Sender = broker
    by_name = sender.send("T", b"a", keys="k1", tags="Orders", properties=USER)
    by_position = sender.send("T", b"b", "k1", "Orders", USER)
    bare = sender.send("T", b"c")
    for result, body, keys, tags, props in (
        (by_name, b"a", "k1", "Orders", USER),
        (by_position, b"b", "k1", "Orders", USER),
        (bare, b"c", None, None, {}),
    ):
        (m,) = broker.messages(result.queue, result.offset, result.offset + 1)
        assert (m.topic, m.queue_id, m.queue_offset, m.msg_id) == (
            "T",
            result.queue.queue_id,
            result.offset,
            result.msg_id,
        )
        assert (m.body, m.keys, m.tags, m.properties) == (body, keys, tags, props)
    # one key, one queue: the second send is stored right after the first
    assert (by_position.queue, by_position.offset) == (by_name.queue, by_name.offset + 1)
