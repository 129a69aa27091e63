"""The contract suite, part 3: where a group without a committed offset
starts, and that a committed offset wins."""

from __future__ import annotations

import datetime
import logging
import time

import pytest

from .._errors import ConfigError
from ..sources import ConsumeFromWhere
from ._harness import SourceHarness
from ._polling import count_of, offsets, poll_messages, wait_assigned

__all__ = ["StartPositionContract"]


class StartPositionContract:
    """Start positions (see :class:`~lite_push.testing.SourceContract`)."""

    # start positions

    def test_new_group_starts_at_last_offset(self, harness: SourceHarness) -> None:
        q0, q1 = harness.create_topic("T", 2)
        for _i in range(5):
            harness.send("T", b"old", queue_id=0)
            harness.send("T", b"old", queue_id=1)
        c = harness.consumer("g-last", consume_from=ConsumeFromWhere.LAST_OFFSET)
        c.subscribe("T")
        assert count_of(wait_assigned(c, 2)) == 0
        assert c.position(q0) == 5 and c.position(q1) == 5
        harness.send("T", b"new", queue_id=0)
        got = poll_messages(c, 1)
        assert [(m.queue_offset, m.body) for b in got for m in b.messages] == [(5, b"new")]

    def test_a_new_group_at_last_offset_says_what_it_skips(
        self, harness: SourceHarness, caplog: pytest.LogCaptureFixture
    ) -> None:
        """One WARNING per topic: the group, the topic, how many stored
        messages the start skips, and how to read them (issue 16.6)."""
        harness.create_topic("T", 2)
        harness.create_topic("U", 1)
        for _i in range(3):
            harness.send("T", b"old", queue_id=0)
            harness.send("T", b"old", queue_id=1)
        with caplog.at_level(logging.WARNING, logger="lite_push"):
            c = harness.consumer("g-new", consume_from=ConsumeFromWhere.LAST_OFFSET)
            c.subscribe("T")
            c.subscribe("U")  # empty: nothing skipped, nothing said
            wait_assigned(c, 3)
        said = [r.getMessage() for r in caplog.records if "starts at LAST_OFFSET" in r.getMessage()]
        assert len(said) == 1, said
        assert "'g-new'" in said[0] and "'T'" in said[0] and " 6 message(s)" in said[0]
        assert "FIRST_OFFSET" in said[0]
        # a group that starts at FIRST_OFFSET, or one with commits, is not warned about
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="lite_push"):
            f = harness.consumer("g-first-2", consume_from=ConsumeFromWhere.FIRST_OFFSET)
            f.subscribe("T")
            wait_assigned(f, 2)
        assert not [r for r in caplog.records if "starts at LAST_OFFSET" in r.getMessage()]

    def test_new_group_starts_at_first_offset(self, harness: SourceHarness) -> None:
        (q0,) = harness.create_topic("T", 1)
        for i in range(5):
            harness.send("T", b"%d" % i)
        c = harness.consumer("g-first", consume_from=ConsumeFromWhere.FIRST_OFFSET)
        c.subscribe("T")
        assert offsets(poll_messages(c, 5))[q0] == [0, 1, 2, 3, 4]

    def test_new_group_starts_at_timestamp(self, harness: SourceHarness) -> None:
        if not harness.finds_offsets_by_time:
            pytest.skip("this broker cannot look offsets up by time")
        (q0,) = harness.create_topic("T", 1)
        for _i in range(3):
            harness.send("T", b"before")
        time.sleep(0.05)
        ts = harness.now_ms()
        time.sleep(0.05)
        for _i in range(2):
            harness.send("T", b"after")
        c = harness.consumer("g-ts", consume_from=ConsumeFromWhere.TIMESTAMP, consume_timestamp=ts)
        c.subscribe("T")
        got = poll_messages(c, 2)
        assert [(m.queue_offset, m.body) for b in got for m in b.messages] == [(3, b"after"), (4, b"after")]
        assert all(m.store_timestamp >= ts for b in got for m in b.messages)

    def test_start_positions_by_word_and_by_datetime(self, harness: SourceHarness) -> None:
        """``consume_from`` takes what the command line's ``--from`` does
        (``"first"``, ``"last"``, any case) and a ``datetime``, meaning the
        :class:`ConsumeFromWhere` member (and its timestamp)."""
        (q0,) = harness.create_topic("T", 1)
        for _i in range(3):
            harness.send("T", b"before")
        first = harness.consumer("g-word-first", consume_from="first")
        first.subscribe("T")
        assert offsets(poll_messages(first, 3))[q0] == [0, 1, 2]
        last = harness.consumer("g-word-last", consume_from="LAST")  # type: ignore[arg-type]  # any case, at run time
        last.subscribe("T")
        wait_assigned(last, 1)
        assert last.position(q0) == 3
        if not harness.finds_offsets_by_time:
            return
        time.sleep(0.05)
        at = datetime.datetime.fromtimestamp(harness.now_ms() / 1000.0, tz=datetime.UTC)
        time.sleep(0.05)
        harness.send("T", b"after")
        since = harness.consumer("g-datetime", consume_from=at)
        since.subscribe("T")
        got = poll_messages(since, 1)
        assert [(m.queue_offset, m.body) for b in got for m in b.messages] == [(3, b"after")]

    def test_a_bad_start_position_names_consume_from(self, harness: SourceHarness) -> None:
        harness.create_topic("T", 1)
        for bad in ("middle", 3, None):
            with pytest.raises(ConfigError, match="consume_from.*'first', 'last', a datetime"):
                harness.consumer("g-bad", consume_from=bad)  # type: ignore[arg-type]

    def test_committed_offset_wins_over_start_position(self, harness: SourceHarness) -> None:
        (q0,) = harness.create_topic("T", 1)
        for i in range(10):
            harness.send("T", b"%d" % i)
        c = harness.consumer("g")
        c.subscribe("T")
        wait_assigned(c, 1)
        c.commit({q0: 4})
        c.close()
        c2 = harness.consumer("g", consume_from=ConsumeFromWhere.LAST_OFFSET)
        c2.subscribe("T")
        assert offsets(poll_messages(c2, 6))[q0] == [4, 5, 6, 7, 8, 9]
