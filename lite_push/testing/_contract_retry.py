"""The contract suite, part 4: failed messages go back with a delay to the
group's retry topic, or at once to its dead-letter topic, keeping where
they first came from."""

from __future__ import annotations

import pytest

from .._errors import UnknownTopicError
from .._types import MessageExt
from ..sources import PullSource, dlq_topic, retry_topic
from ._harness import SourceHarness
from ._polling import poll_topic, wait_assigned

__all__ = ["RetryContract"]


class RetryContract:
    """Retry and dead-letter topics (see :class:`~lite_push.testing.SourceContract`)."""

    # failures: retry and dead-letter topics

    def test_delay_levels_are_positive_seconds(self, harness: SourceHarness) -> None:
        levels = harness.consumer("g").delay_levels
        assert isinstance(levels, tuple) and levels
        assert all(isinstance(d, float) and d > 0 for d in levels)

    def test_send_back_is_visible_in_the_retry_topic_only_after_its_delay(self, harness: SourceHarness) -> None:
        c, m = _consume_one(harness)
        levels = c.delay_levels
        level = next((i + 1 for i, d in enumerate(levels) if d >= 5.0), len(levels))
        delay = levels[level - 1]
        retry = retry_topic("g")
        assert c.send_back([(m, level)]) == [None]
        c.subscribe(retry)
        if c.delayed_delivery:  # else the source stores it at once (the runtime held it for its delay)
            assert poll_topic(c, retry, 0, timeout=0.3) == []
            harness.advance_clock(delay - 2.0)
            assert poll_topic(c, retry, 0, timeout=0.3) == []
            harness.advance_clock(2.5)
        (copy,) = poll_topic(c, retry, 1)
        assert (copy.topic, copy.queue_id, copy.queue_offset) == (retry, 0, 0)
        assert (copy.body, copy.keys, copy.tags) == (m.body, m.keys, m.tags)
        assert copy.reconsume_times == 1
        _assert_origin(copy, m)
        assert copy.properties["RECONSUME_TIME"] == "1"
        assert copy.properties.items() >= m.properties.items()  # the user's properties
        assert not {"REAL_TOPIC", "TIMER_DELIVER_MS", "DLQ_REASON"} & set(copy.properties)
        assert m.reconsume_times == 0 and "RECONSUME_TIME" not in m.properties  # the original is untouched
        assert poll_topic(c, retry, 0, timeout=0.3) == []  # delivered once

    def test_send_back_clamps_high_levels_and_reports_errors_per_item(self, harness: SourceHarness) -> None:
        c, m = _consume_one(harness)
        levels = c.delay_levels
        retry = retry_topic("g")
        c.subscribe(retry)
        results = c.send_back([(m, 0), (m, len(levels) + 7), (m, -3), ("not a message", 1)])  # type: ignore[list-item]
        assert len(results) == 4
        assert isinstance(results[0], ValueError) and isinstance(results[2], ValueError)
        assert results[1] is None
        assert isinstance(results[3], Exception)
        if c.delayed_delivery:
            harness.advance_clock(max(levels[-1] - 2.0, 0.0))
            assert poll_topic(c, retry, 0, timeout=0.3) == []  # not a shorter level
            harness.advance_clock(2.5)
        (copy,) = poll_topic(c, retry, 1)
        assert copy.reconsume_times == 1
        assert poll_topic(c, retry, 0, timeout=0.3) == []  # the failed items stored nothing
        assert c.send_back([]) == []

    def test_send_to_dlq_stores_at_once_with_the_reason(self, harness: SourceHarness) -> None:
        c, m = _consume_one(harness)
        results = c.send_to_dlq([(m, "max reconsume times exceeded", "ValueError: boom"), (m, "undecodable", "")])
        assert results == [None, None]
        assert c.send_to_dlq([("not a message", "r", "")]) != [None]  # type: ignore[list-item]
        reader = harness.consumer("ops")
        reader.subscribe(dlq_topic("g"))
        d1, d2 = poll_topic(reader, dlq_topic("g"), 2)
        assert (d1.topic, d1.queue_id, d1.queue_offset, d2.queue_offset) == (dlq_topic("g"), 0, 0, 1)
        for d in (d1, d2):
            assert (d.body, d.keys, d.tags) == (m.body, m.keys, m.tags)
            assert d.properties.items() >= m.properties.items()
            assert d.properties["DLQ_GROUP"] == "g"
            assert d.properties["RECONSUME_TIME"] == "0" and d.reconsume_times == 0
            _assert_origin(d, m)
        reasons = [(d.properties["DLQ_REASON"], d.properties["DLQ_EXCEPTION"]) for d in (d1, d2)]
        assert reasons == [("max reconsume times exceeded", "ValueError: boom"), ("undecodable", "")]
        assert poll_topic(reader, dlq_topic("g"), 0, timeout=0.3) == []  # the bad item stored nothing

    def test_a_dead_letter_reader_reads_the_group_dlq_by_offset(self, harness: SourceHarness) -> None:
        """A source that offers :meth:`PullSource.dead_letter_reader` (needed
        by ``dead_letter_order="key"``) reads its group's dead-letter topic
        by offset, without joining a group; one without it returns None."""
        c, m = _consume_one(harness)
        reader = c.dead_letter_reader()
        if reader is None:
            pytest.skip("the source reads no dead letters back (dead_letter_order='key' refuses it)")
        with pytest.raises(UnknownTopicError):
            reader.queues(dlq_topic("g"))  # nothing dead-lettered yet
        assert c.send_to_dlq([(m, "r1", ""), (m, "r2", ""), (m, "r3", "")]) == [None, None, None]
        (q,) = reader.queues(dlq_topic("g"))
        assert [d.properties["DLQ_REASON"] for d in reader.messages(q)] == ["r1", "r2", "r3"]
        assert [d.queue_offset for d in reader.messages(q, 1, 3)] == [1, 2]
        assert reader.messages(q, 3, 10) == [] and reader.messages(q, 2, 2) == []

    def test_the_first_origin_is_kept_across_retries_and_into_the_dlq(self, harness: SourceHarness) -> None:
        c, m = _consume_one(harness)
        first = c.delay_levels[0]
        retry = retry_topic("g")
        c.subscribe(retry)
        assert c.send_back([(m, 1)]) == [None]
        harness.advance_clock(first + 0.5)
        (r1,) = poll_topic(c, retry, 1)
        assert c.send_back([(r1, 1)]) == [None]
        harness.advance_clock(first + 0.5)
        (r2,) = poll_topic(c, retry, 1)
        assert (r1.queue_offset, r2.queue_offset) == (0, 1)
        assert (r1.reconsume_times, r2.reconsume_times) == (1, 2)
        assert r2.properties["RECONSUME_TIME"] == "2"
        _assert_origin(r2, m)  # not r1's position in the retry topic
        assert c.send_to_dlq([(r2, "gave up", "")]) == [None]
        reader = harness.consumer("ops")
        reader.subscribe(dlq_topic("g"))
        (d,) = poll_topic(reader, dlq_topic("g"), 1)
        assert d.reconsume_times == 2 and d.properties["RECONSUME_TIME"] == "2"
        _assert_origin(d, m)

    def test_retry_and_dlq_topics_can_be_subscribed_before_they_exist(self, harness: SourceHarness) -> None:
        c = harness.consumer("g")
        c.subscribe(retry_topic("g"))
        reader = harness.consumer("ops")
        reader.subscribe(dlq_topic("g"))
        wait_assigned(c, 1)
        wait_assigned(reader, 1)
        ((retry_q,), (dlq_q,)) = (c.assignment(), reader.assignment())
        assert (retry_q.topic, retry_q.queue_id, dlq_q.topic, dlq_q.queue_id) == (
            retry_topic("g"),
            0,
            dlq_topic("g"),
            0,
        )
        harness.create_topic("T", 1)
        harness.send("T", b"payload")
        c.subscribe("T")
        (m,) = poll_topic(c, "T", 1)
        assert c.send_to_dlq([(m, "r", "")]) == [None]
        (d,) = poll_topic(reader, dlq_topic("g"), 1)
        assert d.body == b"payload"
        assert c.send_back([(m, 1)]) == [None]
        harness.advance_clock(c.delay_levels[0] + 0.5)
        (r,) = poll_topic(c, retry_topic("g"), 1)
        assert (r.body, r.reconsume_times) == (b"payload", 1)
        with pytest.raises(UnknownTopicError):
            c.subscribe("%RETRY%")  # no group name: not a retry topic


def _consume_one(harness: SourceHarness, group: str = "g") -> tuple[PullSource, MessageExt]:
    """Send one message with keys, tags and properties to a new topic ``T``
    and poll it with a new member of ``group``; return both."""
    harness.create_topic("T", 1)
    harness.send("T", b"payload", keys="order-1", tags="TagA", properties={"user": "u1", "trace": "t-9"})
    c = harness.consumer(group)
    c.subscribe("T")
    (m,) = poll_topic(c, "T", 1)
    return c, m


def _assert_origin(copy: MessageExt, original: MessageExt) -> None:
    p = copy.properties
    assert (p["ORIGIN_TOPIC"], p["RETRY_TOPIC"]) == (original.topic, original.topic)
    assert (p["ORIGIN_QUEUE_ID"], p["ORIGIN_OFFSET"]) == (str(original.queue_id), str(original.queue_offset))
    assert p["ORIGIN_MESSAGE_ID"] == original.msg_id
