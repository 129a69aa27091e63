"""The contract suite, part 2: members of one group share its queues (a
rebalance hands them over with their commits) and exclude each other with
broker-side queue locks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from .._types import MessageQueue, PollBatch
from ..sources import PullSource, RebalanceListener
from ._harness import SourceHarness
from ._polling import (
    OwnershipLog,
    count_of,
    halves,
    leave,
    offsets,
    poll_until,
    split,
    wait_assigned,
)

__all__ = ["GroupContract"]


class GroupContract:
    """Groups, rebalance and queue locks (see :class:`~lite_push.testing.SourceContract`)."""

    # groups and rebalance

    def test_the_rebalance_listener_installed_is_the_one_read(self, harness: SourceHarness) -> None:
        """``rebalance_listener`` reads back what ``set_rebalance_listener``
        installed: a consumer refuses a source that already has one."""
        c = harness.consumer("g")
        assert c.rebalance_listener is None
        mine = RebalanceListener()
        c.set_rebalance_listener(mine)
        assert c.rebalance_listener is mine
        c.set_rebalance_listener(None)
        assert c.rebalance_listener is None

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

    def test_poll_nowait_never_runs_the_rebalance_listener(self, harness: SourceHarness) -> None:
        """A rebalance is ``poll``'s: its listener waits for listener calls
        that may run on the very event loop that reads with ``poll_nowait``.
        While one is due ``poll_nowait`` answers ``None``, and the next
        ``poll`` runs it."""
        harness.create_topic("T", 4)
        calls: list[tuple[str, bool]] = []  # (callback, inside poll_nowait)
        inside = False

        class Listener(RebalanceListener):
            def on_assigned(self, queues: object) -> None:
                calls.append(("on_assigned", inside))

            def on_revoked(self, queues: object) -> None:
                calls.append(("on_revoked", inside))

        a = harness.consumer("g", client_id="member-a")
        a.set_rebalance_listener(Listener())
        a.subscribe("T")
        wait_assigned(a, 4)
        b = harness.consumer("g", client_id="member-b")
        b.subscribe("T")
        deadline = time.monotonic() + 10
        while len(a.assignment()) != 2 and time.monotonic() < deadline:
            inside = True
            try:
                read = a.poll_nowait()
            finally:
                inside = False
            if read is None:
                a.poll(0.02)
            b.poll(0.02)
        assert len(a.assignment()) == 2
        assert ("on_revoked", False) in calls
        assert [c for c in calls if c[1]] == []

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

    def test_a_queue_paused_when_it_moved_away_is_read_when_it_comes_back(self, harness: SourceHarness) -> None:
        """Pause is the member's own state of a queue it owns: a queue that
        moves away while paused and comes back is a new assignment, not
        paused (Kafka: librdkafka keeps a partition's pause across a revoke
        and a later assign, so the source resumes what it gives up)."""
        queues = harness.create_topic("T", 8)
        a = harness.consumer("g", client_id="member-a")
        a.subscribe("T")
        wait_assigned(a, 8)
        a.pause(queues)
        for i in range(40):
            harness.send("T", b"%d" % i, queue_id=i % 8)
        b = harness.consumer("g", client_id="member-b")
        b.subscribe("T")
        split(a, b)
        kept, moved = halves(harness, a, b, queues)
        assert a.paused() == frozenset(kept)
        b.close()  # nothing committed: a reads the moved queues from the start
        got = poll_until(a, lambda got: len(a.assignment()) == 8 and count_of(got) >= 20, timeout=10.0)
        assert a.assignment() == frozenset(queues)
        assert a.paused() == frozenset(kept)
        offs = offsets(got)
        assert sorted(offs) == moved, offs
        for q in moved:
            assert offs[q] == list(range(5))

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


def _wait(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()
