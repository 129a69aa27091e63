"""The PullSource contract as a reusable test suite.

A source's test module subclasses :class:`SourceContract` and provides a
``harness`` fixture yielding a :class:`SourceHarness` for that source (fresh
per test; the fixture closes it).  Every test here then runs against it::

    @pytest.fixture
    def harness(tmp_path):
        h = MyHarness(tmp_path)
        yield h
        h.close()

    class TestMySourceContract(SourceContract):
        pass

The suite asserts what ``lite_push/sources/_base.py`` promises, loosely timed
(upper bounds with a second or more of slack), so it holds for an in-process
source and for one behind a network.  Delayed retries are tested by moving
the source's clock (:meth:`SourceHarness.advance_clock`), not by sleeping.
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping

import pytest

from lite_push import (
    MessageExt,
    MessageQueue,
    NotSubscribedError,
    OffsetAndMetadata,
    PollBatch,
    SourceClosedError,
    UnknownTopicError,
)
from lite_push.sources import ConsumeFromWhere, PullSource, RebalanceListener, dlq_topic, retry_topic

FIRST = ConsumeFromWhere.FIRST_OFFSET


class SourceHarness(abc.ABC):
    """What the suite needs from a source implementation."""

    @abc.abstractmethod
    def create_topic(self, topic: str, queue_count: int) -> list[MessageQueue]:
        """Create ``topic``; return its queues sorted."""

    @abc.abstractmethod
    def send(
        self,
        topic: str,
        body: bytes,
        *,
        keys: str | None = None,
        tags: str | None = None,
        queue_id: int | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> tuple[MessageQueue, int]:
        """Store one message (on ``queue_id`` when given); return where."""

    @abc.abstractmethod
    def advance_clock(self, seconds: float) -> None:
        """Move the source's wall clock -- what the delays of
        :meth:`PullSource.send_back` are measured on -- ``seconds`` ahead
        (see :class:`SkewedClock`)."""

    @abc.abstractmethod
    def consumer(
        self,
        group: str,
        *,
        consume_from: ConsumeFromWhere = FIRST,
        consume_timestamp: int | None = None,
        client_id: str | None = None,
    ) -> PullSource:
        """A new, unsubscribed member of ``group`` (closed by :meth:`close`
        if the test did not)."""

    #: The source shares queues out with lite_push's allocation strategy
    #: (AVERAGELY over sorted client ids: "member-a" gets the first half).
    #: False: the broker's assignor decides (Kafka's cooperative-sticky), so
    #: the suite checks only that the members split the queues evenly.
    allocates_by_strategy = True
    #: The broker can find the first offset at or after a time (False:
    #: librdkafka's mock cluster answers ListOffsets by time with -1).
    finds_offsets_by_time = True

    def now_ms(self) -> int:
        """The source's clock for store timestamps, in ms."""
        return time.time_ns() // 1_000_000

    @abc.abstractmethod
    def close(self) -> None:
        """Close everything the harness made."""


# -- helpers ------------------------------------------------------------------


class SkewedClock:
    """Real time, except that :meth:`advance` moves the wall clock
    (``time()``) ahead: delayed messages fall due without sleeping, while
    ``monotonic()`` (session timeouts, lock leases) stays real, so the rest
    of the suite runs as on the system clock."""

    def __init__(self) -> None:
        self._skew = 0.0

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time() + self._skew

    def advance(self, seconds: float) -> None:
        self._skew += seconds


def poll_until(
    consumer: PullSource,
    done: Callable[[list[PollBatch]], bool],
    *,
    timeout: float = 5.0,
    poll_timeout: float = 0.05,
    max_per_queue: int = 32,
) -> list[PollBatch]:
    """Poll until ``done(all batches so far)`` or ``timeout``; return the
    batches (the caller asserts on them)."""
    got: list[PollBatch] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batches = consumer.poll(poll_timeout, max_per_queue)
        assert len({b.queue for b in batches}) == len(batches), "two batches of one queue in one poll"
        got.extend(batches)
        if done(got):
            break
    return got


def split(a: PullSource, b: PullSource, sizes: tuple[int, int] = (4, 4), timeout: float = 5.0) -> None:
    """Poll both members (from this thread) until they own ``sizes`` queues."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (len(a.assignment()), len(b.assignment())) == sizes:
            return
        a.poll(0.02)
        b.poll(0.02)
    assert (len(a.assignment()), len(b.assignment())) == sizes


def halves(
    harness: SourceHarness, a: PullSource, b: PullSource, queues: list[MessageQueue]
) -> tuple[list[MessageQueue], list[MessageQueue]]:
    """The queues ``a`` and ``b`` own after an even split: checked to be
    ``queues[:4]`` and ``queues[4:]`` for a source that allocates with
    AVERAGELY, else only to be disjoint halves of ``queues``."""
    if not harness.allocates_by_strategy:  # a sticky assignor may move queues in more than one step
        split(a, b, (len(queues) // 2, len(queues) // 2))
    mine_a, mine_b = sorted(a.assignment()), sorted(b.assignment())
    if harness.allocates_by_strategy:
        assert (mine_a, mine_b) == (queues[:4], queues[4:])
    else:
        assert len(mine_a) == len(mine_b) == len(queues) // 2 and sorted(mine_a + mine_b) == queues
    return mine_a, mine_b


def count_of(batches: Iterable[PollBatch]) -> int:
    return sum(len(b.messages) for b in batches)


def poll_messages(consumer: PullSource, n: int, **kw: float) -> list[PollBatch]:
    return poll_until(consumer, lambda got: count_of(got) >= n, **kw)  # type: ignore[arg-type]


def wait_assigned(consumer: PullSource, n: int, timeout: float = 5.0) -> list[PollBatch]:
    """Poll until ``consumer`` owns ``n`` queues; return what it polled."""
    got = poll_until(consumer, lambda _: len(consumer.assignment()) == n, timeout=timeout)
    assert len(consumer.assignment()) == n, f"owns {sorted(consumer.assignment())}, expected {n} queues"
    return got


def messages_of(batches: Iterable[PollBatch], topic: str) -> list[MessageExt]:
    """The messages of ``topic`` in ``batches``, in the order polled."""
    return [m for b in batches if b.queue.topic == topic for m in b.messages]


def poll_topic(consumer: PullSource, topic: str, n: int, timeout: float = 5.0) -> list[MessageExt]:
    """Poll until ``n`` messages of ``topic`` came (or ``timeout``); return
    them (``n=0``: poll for the whole ``timeout`` and return what came)."""
    got = poll_until(consumer, lambda got: n > 0 and len(messages_of(got, topic)) >= n, timeout=timeout)
    return messages_of(got, topic)


def offsets(batches: Iterable[PollBatch]) -> dict[MessageQueue, list[int]]:
    out: dict[MessageQueue, list[int]] = defaultdict(list)
    for b in batches:
        out[b.queue].extend(m.queue_offset for m in b.messages)
    return out


def assert_contiguous(batches: Iterable[PollBatch], start: dict[MessageQueue, int] | None = None) -> None:
    """Per queue: each batch's messages lie in [previous next_offset,
    next_offset), in increasing order, and next_offset never goes back."""
    pos: dict[MessageQueue, int] = dict(start or {})
    for b in batches:
        prev = pos.get(b.queue)
        offs = [m.queue_offset for m in b.messages]
        assert offs == sorted(offs), offs
        if prev is not None:
            assert b.next_offset >= prev
            assert all(prev <= o < b.next_offset for o in offs), (b.queue, prev, offs, b.next_offset)
        if offs:
            assert b.next_offset >= offs[-1] + 1
        pos[b.queue] = b.next_offset


class OwnershipLog:
    """Shared by the listeners of several members: records every event and
    every moment two members owned one queue."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owner: dict[MessageQueue, str] = {}
        self.events: list[tuple[str, str, tuple[MessageQueue, ...]]] = []
        self.violations: list[str] = []

    def listener(self, name: str, consumer: PullSource, *, commit: bool = True) -> RebalanceListener:
        log = self

        class _Listener(RebalanceListener):
            def on_assigned(self, queues: Collection[MessageQueue]) -> None:
                with log.lock:
                    for q in queues:
                        if q in log.owner:
                            log.violations.append(f"{name} got {q} while {log.owner[q]} owned it")
                        log.owner[q] = name
                    log.events.append(("assigned", name, tuple(sorted(queues))))

            def on_revoked(self, queues: Collection[MessageQueue]) -> None:
                if commit:
                    consumer.commit({q: consumer.position(q) for q in queues})
                log.released(name, queues, "revoked")

        return _Listener()

    def released(self, name: str, queues: Iterable[MessageQueue], what: str) -> None:
        queues = tuple(sorted(queues))
        with self.lock:
            for q in queues:
                if self.owner.get(q) == name:
                    del self.owner[q]
            self.events.append((what, name, queues))

    def owned_by(self, name: str) -> set[MessageQueue]:
        with self.lock:
            return {q for q, n in self.owner.items() if n == name}

    def index(self, what: str, name: str, q: MessageQueue, after: int = -1) -> int:
        with self.lock:
            for i, (w, n, qs) in enumerate(self.events):
                if i > after and w == what and n == name and q in qs:
                    return i
        return -1


def leave(consumer: PullSource, log: OwnershipLog | None, name: str) -> None:
    """What a runtime does to leave: commit the positions, then close."""
    owned = consumer.assignment()
    consumer.commit({q: consumer.position(q) for q in owned})
    if log is not None:
        log.released(name, owned, "closed")
    consumer.close()


# -- the suite ----------------------------------------------------------------


class SourceContract:
    """Tests every PullSource must pass; needs a ``harness`` fixture."""

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
        got = poll_until(c, lambda _: c.assignment() and c.position(q0) == 6 and c.position(q1) == 5)
        assert c.position(q0) == 6 and c.position(q1) == 5
        assert offsets(got).get(q0) == [0, 2, 5]
        assert not offsets(got).get(q1)
        assert all(m.tags in ("TagA", "TagB") for b in got for m in b.messages)
        assert_contiguous(got, {q0: 0, q1: 0})
        assert max(b.next_offset for b in got if b.queue == q0) == 6
        assert max(b.next_offset for b in got if b.queue == q1) == 5

    # groups and rebalance

    def test_two_members_split_the_queues_and_read_everything_once(self, harness: SourceHarness) -> None:
        queues = harness.create_topic("T", 8)
        log = OwnershipLog()
        a = harness.consumer("g", client_id="member-a")
        b = harness.consumer("g", client_id="member-b")
        a.set_rebalance_listener(log.listener("a", a))
        b.set_rebalance_listener(log.listener("b", b))
        a.subscribe("T")
        b.subscribe("T")
        total = 400
        for i in range(total):
            harness.send("T", b"%d" % i, keys=f"key-{i}")
        got_a: list[PollBatch] = []
        got_b: list[PollBatch] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and count_of(got_a) + count_of(got_b) < total:
            got_a += a.poll(0.02)
            got_b += b.poll(0.02)
        assert count_of(got_a) + count_of(got_b) == total
        halves(harness, a, b, queues)
        seen = [(m.queue_id, m.queue_offset) for batch in got_a + got_b for m in batch.messages]
        assert len(seen) == len(set(seen)) == total
        assert log.violations == []

    def test_rebalance_hands_queues_over_on_join_and_leave(self, harness: SourceHarness) -> None:
        queues = harness.create_topic("T", 8)
        log = OwnershipLog()
        seen: list[tuple[int, int]] = []
        seen_lock = threading.Lock()
        errors: list[BaseException] = []
        sent = 0

        def send_round(n_per_queue: int) -> None:
            nonlocal sent
            for i in range(n_per_queue):
                for q in queues:
                    harness.send("T", b"%d" % i, queue_id=q.queue_id)
                    sent += 1

        def member(consumer: PullSource, name: str, stop: threading.Event) -> None:
            try:
                while not stop.is_set():
                    for batch in consumer.poll(0.05, 16):
                        with seen_lock:
                            seen.extend((m.queue_id, m.queue_offset) for m in batch.messages)
                leave(consumer, log, name)
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        def all_seen() -> bool:
            with seen_lock:
                return len(seen) >= sent

        a = harness.consumer("g", client_id="member-a")
        b = harness.consumer("g", client_id="member-b")
        a.set_rebalance_listener(log.listener("a", a))
        b.set_rebalance_listener(log.listener("b", b))
        stop_a, stop_b = threading.Event(), threading.Event()
        a.subscribe("T")
        ta = threading.Thread(target=member, args=(a, "a", stop_a), daemon=True)
        tb = threading.Thread(target=member, args=(b, "b", stop_b), daemon=True)
        ta.start()
        try:
            send_round(20)
            assert _wait(lambda: len(log.owned_by("a")) == 8), log.events
            b.subscribe("T")  # join
            tb.start()
            assert _wait(lambda: len(log.owned_by("a")) == len(log.owned_by("b")) == 4), log.events
            kept, moved = sorted(log.owned_by("a")), sorted(log.owned_by("b"))
            if harness.allocates_by_strategy:
                assert (kept, moved) == (queues[:4], queues[4:])
            send_round(20)
            assert _wait(all_seen), (len(seen), sent)
            stop_b.set()  # leave
            tb.join(10)
            assert _wait(lambda: len(log.owned_by("a")) == 8), log.events
            send_round(20)
            assert _wait(all_seen), (len(seen), sent)
        finally:
            stop_a.set()
            stop_b.set()
            ta.join(10)
            if tb.is_alive() or tb.ident is not None:
                tb.join(10)
        assert errors == []
        assert log.violations == []
        # on join, a released q4-q7 (after its on_revoked) before b got them;
        # on leave, b released them before a got them back
        for q in moved:
            revoked = log.index("revoked", "a", q)
            assigned_b = log.index("assigned", "b", q)
            closed_b = log.index("closed", "b", q)
            back = log.index("assigned", "a", q, after=assigned_b)
            assert 0 <= revoked < assigned_b < closed_b < back, log.events
        for q in kept:
            assert log.index("revoked", "a", q) == -1  # kept through both changes
        with seen_lock:
            assert len(seen) == len(set(seen)) == sent  # each message exactly once

    def test_close_releases_the_queues_to_the_other_member(self, harness: SourceHarness) -> None:
        queues = harness.create_topic("T", 8)
        a = harness.consumer("g", client_id="member-a")
        b = harness.consumer("g", client_id="member-b")
        a.subscribe("T")
        b.subscribe("T")
        split(a, b)
        kept, moved = halves(harness, a, b, queues)
        for i in range(80):
            harness.send("T", b"%d" % i, queue_id=i % 8)
        got_b = poll_until(b, lambda got: count_of(got) >= 40, timeout=5.0)
        assert sorted(b.assignment()) == moved
        for q in moved:
            b.seek(q, 6)  # pretend the rest was not done yet
        b.commit({q: 6 for q in moved})
        assert count_of(got_b) == 40
        b.close()
        got_a = poll_until(a, lambda got: len(a.assignment()) == 8 and count_of(got) >= 40 + 16, timeout=5.0)
        assert a.assignment() == frozenset(queues)
        offs = offsets(got_a)
        for q in moved:
            assert offs[q] == [6, 7, 8, 9]  # from b's committed offset
        for q in kept:
            assert offs[q] == list(range(10))

    # broker-side queue locks (orderly consumption)

    def test_queue_lock_is_exclusive_renewable_and_released(self, harness: SourceHarness) -> None:
        q0, q1 = harness.create_topic("T", 2)
        a = harness.consumer("g", client_id="member-a")
        b = harness.consumer("g", client_id="member-b")
        if a.assignment_is_lock:
            self._assignment_is_the_lock(a, b, [q0, q1])
            return
        assert a.lock([q0, q1], 60.0) == frozenset({q0, q1})
        assert b.lock([q0, q1], 60.0) == frozenset()  # held by a
        assert a.lock([q0], 60.0) == frozenset({q0})  # renewal by the holder
        a.unlock([q0])
        b.unlock([q1])  # not b's: ignored
        assert b.lock([q0, q1], 60.0) == frozenset({q0})
        a.close()  # leaving releases a's locks
        assert b.lock([q1], 60.0) == frozenset({q1})
        with pytest.raises(ValueError, match="lease"):
            b.lock([q0], 0)

    @staticmethod
    def _assignment_is_the_lock(a: PullSource, b: PullSource, queues: list[MessageQueue]) -> None:
        """A source whose assignment excludes the other members grants
        exactly the asked queues the member owns, whatever the lease."""
        assert a.lock(queues, 60.0) == frozenset()  # owns nothing yet
        a.subscribe("T")
        wait_assigned(a, 2)
        assert a.lock(queues, 60.0) == frozenset(queues)
        assert a.lock(queues[:1], 0.01) == frozenset(queues[:1])
        assert b.lock(queues, 60.0) == frozenset()  # a member of the group that owns nothing
        b.subscribe("T")
        split(a, b, (1, 1))
        assert a.lock(queues, 60.0) | b.lock(queues, 60.0) == frozenset(queues)
        assert not a.lock(queues, 60.0) & b.lock(queues, 60.0)
        a.unlock(queues)  # nothing to release: ownership stays
        assert a.lock(queues, 60.0) == a.assignment()
        with pytest.raises(ValueError, match="lease"):
            b.lock(queues, 0)

    def test_queue_lock_lease_runs_out(self, harness: SourceHarness) -> None:
        (q0,) = harness.create_topic("T", 1)
        a = harness.consumer("g", client_id="member-a")
        b = harness.consumer("g", client_id="member-b")
        if a.assignment_is_lock:
            pytest.skip("the assignment is the lock: no lease to run out")
        assert a.lock([q0], 0.2) == frozenset({q0})
        assert b.lock([q0], 60.0) == frozenset()
        time.sleep(0.3)
        assert b.lock([q0], 60.0) == frozenset({q0})
        assert a.lock([q0], 60.0) == frozenset()

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


def _wait(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()
