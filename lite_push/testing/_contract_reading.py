"""The contract suite, part 1: subscribing, polling, pausing and seeking,
committing, tag filters, and what a closed source does."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import pytest

from .._errors import NotSubscribedError, SourceClosedError, UnknownTopicError
from .._types import MessageQueue, OffsetAndMetadata, PollBatch
from ._harness import SourceHarness
from ._polling import (
    assert_contiguous,
    count_of,
    halves,
    offsets,
    poll_messages,
    poll_until,
    split,
    wait_assigned,
)

__all__ = ["ReadingContract"]


class ReadingContract:
    """What one member reads and stores (see :class:`~lite_push.testing.SourceContract`)."""

    # subscription

    def test_subscribe_unknown_topic_raises(self, harness: SourceHarness) -> None:
        c = harness.consumer("g")
        with pytest.raises(UnknownTopicError):
            c.subscribe("no-such-topic")

    @pytest.mark.parametrize("expression", ["", "   ", "A ||", "|| B", "A || || B", "A | B"])
    def test_subscribe_malformed_expression_raises(self, harness: SourceHarness, expression: str) -> None:
        harness.create_topic("T", 1)
        c = harness.consumer("g")
        with pytest.raises(ValueError) as info:
            c.subscribe("T", expression)
        assert expression.strip() in str(info.value)

    # polling

    def test_poll_returns_batches_in_offset_order(self, harness: SourceHarness) -> None:
        q0, q1 = harness.create_topic("T", 2)
        sent: dict[tuple[int, int], bytes] = {}
        for i in range(50):
            q, off = harness.send("T", b"a%d" % i, queue_id=0)
            sent[(q.queue_id, off)] = b"a%d" % i
        for i in range(10):
            q, off = harness.send("T", b"b%d" % i, queue_id=1)
            sent[(q.queue_id, off)] = b"b%d" % i
        c = harness.consumer("g")
        c.subscribe("T")
        batches = poll_messages(c, 60, max_per_queue=16)
        assert count_of(batches) == 60
        assert all(len(b.messages) <= 16 for b in batches)
        assert all(b.queue in (q0, q1) for b in batches)
        assert offsets(batches) == {q0: list(range(50)), q1: list(range(10))}
        assert_contiguous(batches, {q0: 0, q1: 0})
        for b in batches:
            assert b.next_offset == b.messages[-1].queue_offset + 1
            for m in b.messages:
                assert m.queue == b.queue and m.topic == "T"
                assert m.body == sent[(m.queue_id, m.queue_offset)]
        assert c.position(q0) == 50 and c.position(q1) == 10

    def test_batches_are_contiguous_across_polls_while_sending(self, harness: SourceHarness) -> None:
        queues = harness.create_topic("T", 3)
        c = harness.consumer("g")
        c.subscribe("T")
        wait_assigned(c, 3)
        batches: list[PollBatch] = []
        total = 0
        for round_ in range(10):
            for i in range(25):
                harness.send("T", b"r%d-%d" % (round_, i), keys=f"k{i}")
                total += 1
            batches.extend(c.poll(0.05, 7))
        batches.extend(poll_messages(c, total - count_of(batches), max_per_queue=7))
        assert count_of(batches) == total
        assert_contiguous(batches, {q: 0 for q in queues})
        for _q, offs in offsets(batches).items():
            assert offs == list(range(len(offs)))

    def test_poll_nowait_reads_on_where_poll_left_off(self, harness: SourceHarness) -> None:
        """``poll_nowait`` (the event loop's read) returns what ``poll``
        would, without waiting: batches of at most ``max_per_queue``, in
        offset order, contiguous with those of ``poll``; ``None`` only when
        a ``poll`` must run first (then it reads on where both left off)."""
        queues = harness.create_topic("T", 2)
        for i in range(60):
            harness.send("T", b"m%d" % i, queue_id=i % 2)
        c = harness.consumer("g")
        c.subscribe("T")
        got = wait_assigned(c, 2)
        deadline = time.monotonic() + 10
        while count_of(got) < 60 and time.monotonic() < deadline:
            batches = c.poll_nowait(5)
            if batches is None:
                got += c.poll(0.05, 5)
                continue
            assert all(len(b.messages) <= 5 for b in batches)
            assert len({b.queue for b in batches}) == len(batches), "two batches of one queue in one poll"
            got += batches
            if not batches:
                time.sleep(0.01)  # records may still be on their way (a source behind a network)
        assert count_of(got) == 60
        assert_contiguous(got, {q: 0 for q in queues})
        assert offsets(got) == {q: list(range(30)) for q in queues}

    @pytest.mark.parametrize("seed", range(3))
    def test_a_read_sent_ahead_never_passes_a_pause_a_seek_or_a_poll(self, harness: SourceHarness, seed: int) -> None:
        """``prefetch`` starts the next ``poll_nowait``'s read; whatever
        runs in between (pauses, resumes, seeks, sends, a ``poll``), every
        batch still starts where its queue's reading stands, no paused
        queue's batch comes, and in the end every message is read.  Each
        case once, then a seeded random run of those steps (two queues,
        small reads)."""
        rng = random.Random(seed)
        queues = harness.create_topic("T", 2)
        end = dict.fromkeys(queues, 0)
        for i in range(40):
            q, off = harness.send("T", b"m%d" % i, queue_id=i % 2)
            end[q] = off + 1
        c = harness.consumer("g")
        c.subscribe("T")
        got = wait_assigned(c, 2)
        expect = dict.fromkeys(queues, 0)
        paused: set[MessageQueue] = set()

        def check(batches: list[PollBatch]) -> None:
            for b in batches:
                assert b.queue not in paused, f"step {step}: a batch of paused {b.queue}"
                assert [m.queue_offset for m in b.messages] == list(range(expect[b.queue], b.next_offset)), (
                    f"step {step}: {b.queue} read from {b.messages[0].queue_offset}, expected {expect[b.queue]}"
                )
                expect[b.queue] = b.next_offset

        # Each case once, then a random run.
        plan = [
            ("prefetch", 0),
            ("pause", 0),
            ("nowait", 0),
            ("resume", 0),
            ("prefetch", 0),
            ("seek", 1),
            ("nowait", 0),
            ("prefetch", 0),
            ("poll", 0),
            ("nowait", 0),
            ("prefetch", 0),
            ("send", 1),
            ("nowait", 0),
        ]
        ops = ["prefetch", "prefetch", "nowait", "nowait", "poll", "pause", "resume", "seek", "send"]
        plan += [(rng.choice(ops), rng.randrange(2)) for _ in range(60)]
        step = -1
        check(got)
        for step, (op, qi) in enumerate(plan):
            q = queues[qi]
            if op == "prefetch":
                c.prefetch(rng.choice([3, 3, 3, 5]))
            elif op == "nowait":
                read = c.poll_nowait(3)
                check(c.poll(0.05, 3) if read is None else read)
            elif op == "poll":
                check(c.poll(0.02, 3))
            elif op == "pause":
                c.pause([q])
                paused.add(q)
            elif op == "resume":
                c.resume([q])
                paused.discard(q)
            elif op == "seek":
                to = rng.randrange(0, expect[q] + 1)
                c.seek(q, to)
                expect[q] = to
            else:
                qq, off = harness.send("T", b"s%d" % step, queue_id=q.queue_id)
                end[qq] = off + 1
        c.resume(queues)
        paused.clear()
        step = len(plan)
        deadline = time.monotonic() + 10
        while expect != end and time.monotonic() < deadline:
            c.prefetch(4)
            read = c.poll_nowait(4)
            check(c.poll(0.05, 4) if read is None else read)
        assert expect == end

    def test_poll_timeout_is_respected(self, harness: SourceHarness) -> None:
        harness.create_topic("T", 2)
        c = harness.consumer("g")
        c.subscribe("T")
        wait_assigned(c, 2)
        t0 = time.monotonic()
        assert c.poll(0.3) == []
        assert time.monotonic() - t0 < 1.3
        t0 = time.monotonic()
        assert c.poll(0) == []
        assert time.monotonic() - t0 < 1.0

    def test_poll_returns_when_a_message_arrives(self, harness: SourceHarness) -> None:
        harness.create_topic("T", 1)
        c = harness.consumer("g")
        c.subscribe("T")
        wait_assigned(c, 1)
        timer = threading.Timer(0.2, lambda: harness.send("T", b"late"))
        timer.start()
        try:
            t0 = time.monotonic()
            got = poll_messages(c, 1, poll_timeout=10.0, timeout=10.0)
            assert time.monotonic() - t0 < 5.0
            assert [m.body for b in got for m in b.messages] == [b"late"]
        finally:
            timer.cancel()
            timer.join()

    def test_wakeup_from_another_thread_unblocks_poll(self, harness: SourceHarness) -> None:
        harness.create_topic("T", 2)
        c = harness.consumer("g")
        c.subscribe("T")
        wait_assigned(c, 2)
        timer = threading.Timer(0.2, c.wakeup)
        timer.start()
        try:
            t0 = time.monotonic()
            assert c.poll(10) == []
            assert time.monotonic() - t0 < 5.0
        finally:
            timer.cancel()
            timer.join()

    def test_wakeup_before_poll_makes_the_next_poll_return(self, harness: SourceHarness) -> None:
        harness.create_topic("T", 1)
        c = harness.consumer("g")
        c.subscribe("T")
        wait_assigned(c, 1)
        c.wakeup()
        t0 = time.monotonic()
        assert c.poll(10) == []
        assert time.monotonic() - t0 < 5.0
        # consumed: the poll after it is a normal one
        harness.send("T", b"m")
        got = poll_messages(c, 1, timeout=5.0, poll_timeout=5.0)
        assert count_of(got) == 1

    # flow control and positions

    def test_pause_and_resume(self, harness: SourceHarness) -> None:
        q0, q1 = harness.create_topic("T", 2)
        other = harness.create_topic("Other", 1)[0]
        c = harness.consumer("g")
        c.subscribe("T")
        wait_assigned(c, 2)
        c.pause([q0, other])  # a queue not owned is ignored
        assert c.paused() == frozenset({q0})
        for i in range(5):
            harness.send("T", b"p%d" % i, queue_id=0)
            harness.send("T", b"r%d" % i, queue_id=1)
        got = poll_until(c, lambda got: count_of(got) >= 5, timeout=2.0)
        got += poll_until(c, lambda _: False, timeout=0.3)
        assert {b.queue for b in got} == {q1}
        assert c.position(q0) == 0
        c.resume([q0, other])
        c.resume([q0])  # not paused any more: ignored
        assert c.paused() == frozenset()
        got = poll_messages(c, 5)
        assert offsets(got) == {q0: [0, 1, 2, 3, 4]}

    def test_seek_and_position(self, harness: SourceHarness) -> None:
        (q0,) = harness.create_topic("T", 1)
        other = harness.create_topic("Other", 1)[0]
        for i in range(10):
            harness.send("T", b"%d" % i)
        c = harness.consumer("g")
        c.subscribe("T")
        assert count_of(poll_messages(c, 10)) == 10
        assert c.position(q0) == 10
        c.seek(q0, 3)
        assert c.position(q0) == 3
        got = poll_messages(c, 7)
        assert offsets(got)[q0] == list(range(3, 10))
        c.seek(q0, 1000)
        assert c.position(q0) == 10  # clamped to the end
        c.seek(q0, -5)
        assert c.position(q0) == 0  # clamped to the start
        assert offsets(poll_messages(c, 10))[q0] == list(range(10))
        with pytest.raises(NotSubscribedError):
            c.seek(other, 0)
        with pytest.raises(NotSubscribedError):
            c.position(other)

    # offsets

    def test_commit_and_committed(self, harness: SourceHarness) -> None:
        q0, q1 = harness.create_topic("T", 2)
        c = harness.consumer("g")
        c.subscribe("T")
        wait_assigned(c, 2)
        assert c.committed(q0) is None
        c.commit({q0: OffsetAndMetadata(5, "meta-1")})
        assert c.committed(q0) == OffsetAndMetadata(5, "meta-1")
        c.commit({q0: 7, q1: OffsetAndMetadata(0, "")})
        assert c.committed(q0) == OffsetAndMetadata(7, "")
        assert c.committed(q1) == OffsetAndMetadata(0, "")
        # the group's store: readable by any consumer of the group, not others
        peer = harness.consumer("g")
        assert peer.committed(q0) == OffsetAndMetadata(7, "")
        stranger = harness.consumer("other-group")
        assert stranger.committed(q0) is None

    def test_commit_of_a_queue_not_owned_is_ignored(self, harness: SourceHarness) -> None:
        queues = harness.create_topic("T", 8)
        a = harness.consumer("g", client_id="member-a")
        b = harness.consumer("g", client_id="member-b")
        a.subscribe("T")
        b.subscribe("T")
        split(a, b)
        q7 = halves(harness, a, b, queues)[1][-1]
        a.commit({q7: 99})
        assert b.committed(q7) is None
        b.commit({q7: 3})
        a.commit({q7: OffsetAndMetadata(42, "late")})
        assert b.committed(q7) == OffsetAndMetadata(3, "")
        assert a.committed(q7) == OffsetAndMetadata(3, "")

    # tags

    def test_tag_filter_skips_messages_and_advances_next_offset(self, harness: SourceHarness) -> None:
        q0, q1 = harness.create_topic("T", 2)
        for tag in ["TagA", "TagC", "TagB", None, "TagC", "TagA"]:
            harness.send("T", (tag or "none").encode(), tags=tag, queue_id=0)
        for _ in range(5):
            harness.send("T", b"c", tags="TagC", queue_id=1)
        c = harness.consumer("g")
        c.subscribe("T", "  TagA ||TagB  ")
        got = poll_until(c, lambda _: bool(c.assignment()) and c.position(q0) == 6 and c.position(q1) == 5)
        assert c.position(q0) == 6 and c.position(q1) == 5
        assert offsets(got).get(q0) == [0, 2, 5]
        assert not offsets(got).get(q1)
        assert all(m.tags in ("TagA", "TagB") for b in got for m in b.messages)
        assert_contiguous(got, {q0: 0, q1: 0})
        assert max(b.next_offset for b in got if b.queue == q0) == 6
        assert max(b.next_offset for b in got if b.queue == q1) == 5

    # close

    def test_methods_after_close_raise(self, harness: SourceHarness) -> None:
        (q0,) = harness.create_topic("T", 1)
        c = harness.consumer("g")
        c.subscribe("T")
        wait_assigned(c, 1)
        c.close()
        c.close()  # idempotent
        c.wakeup()  # allowed
        calls: list[Callable[[], object]] = [
            lambda: c.subscribe("T"),
            lambda: c.set_rebalance_listener(None),
            lambda: c.poll(0),
            lambda: c.poll(1.0),
            c.assignment,
            lambda: c.pause([q0]),
            lambda: c.resume([q0]),
            c.paused,
            lambda: c.seek(q0, 0),
            lambda: c.position(q0),
            lambda: c.commit({q0: 1}),
            lambda: c.committed(q0),
            lambda: c.send_back([]),
            lambda: c.send_to_dlq([]),
        ]
        for call in calls:
            with pytest.raises(SourceClosedError):
                call()
