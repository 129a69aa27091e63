"""Helpers for tests of a source: poll until something happened, check what
came, and :class:`OwnershipLog`, which follows which member owns which queue.

They are loosely timed (a deadline of seconds, polled in short steps), so
they hold for an in-process source and for one behind a network."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable

from .._errors import CommitRefusedError
from .._types import MessageExt, MessageQueue, PollBatch
from ..sources import PullSource, RebalanceListener
from ._harness import SourceHarness

__all__ = [
    "OwnershipLog",
    "assert_contiguous",
    "count_of",
    "halves",
    "leave",
    "messages_of",
    "offsets",
    "poll_messages",
    "poll_topic",
    "poll_until",
    "split",
    "wait_assigned",
]


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
    """How many messages ``batches`` hold."""
    return sum(len(b.messages) for b in batches)


def poll_messages(
    consumer: PullSource, n: int, *, timeout: float = 5.0, poll_timeout: float = 0.05, max_per_queue: int = 32
) -> list[PollBatch]:
    """Poll until ``n`` messages came (or ``timeout``); return the batches."""
    return poll_until(
        consumer,
        lambda got: count_of(got) >= n,
        timeout=timeout,
        poll_timeout=poll_timeout,
        max_per_queue=max_per_queue,
    )


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
    """Per queue, the offsets of the messages in ``batches``, in the order polled."""
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
    """Shared by the rebalance listeners of several members: records every
    event and every moment two members owned one queue."""

    def __init__(self) -> None:
        #: Guards the three below (the members' listeners run on their own threads).
        self.lock = threading.Lock()
        #: Which member owns each queue now.
        self.owner: dict[MessageQueue, str] = {}
        #: ``(what, member, queues)``, in order: "assigned", "revoked" or "closed".
        self.events: list[tuple[str, str, tuple[MessageQueue, ...]]] = []
        #: Each time a member was given a queue another one still owned.
        self.violations: list[str] = []

    def listener(self, name: str, consumer: PullSource, *, commit: bool = True) -> RebalanceListener:
        """A rebalance listener for member ``name`` (``consumer``) that
        records into this log; on a revoke it commits the positions first,
        as a runtime does (unless ``commit`` is False)."""
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
                    with contextlib.suppress(CommitRefusedError):  # as a runtime: the next owner replays
                        consumer.commit({q: consumer.position(q) for q in queues})
                log.released(name, queues, "revoked")

        return _Listener()

    def released(self, name: str, queues: Iterable[MessageQueue], what: str) -> None:
        """Member ``name`` gave ``queues`` up (``what``: "revoked" or "closed")."""
        queues = tuple(sorted(queues))
        with self.lock:
            for q in queues:
                if self.owner.get(q) == name:
                    del self.owner[q]
            self.events.append((what, name, queues))

    def owned_by(self, name: str) -> set[MessageQueue]:
        """The queues member ``name`` owns now."""
        with self.lock:
            return {q for q, n in self.owner.items() if n == name}

    def index(self, what: str, name: str, q: MessageQueue, after: int = -1) -> int:
        """Where the first ``what`` event of ``name`` naming ``q`` after
        event ``after`` is in :attr:`events` (-1: none)."""
        with self.lock:
            for i, (w, n, qs) in enumerate(self.events):
                if i > after and w == what and n == name and q in qs:
                    return i
        return -1


def leave(consumer: PullSource, log: OwnershipLog | None, name: str) -> None:
    """What a runtime does to leave: commit the positions, then close."""
    owned = consumer.assignment()
    with contextlib.suppress(CommitRefusedError):  # as a runtime: the next owner replays
        consumer.commit({q: consumer.position(q) for q in owned})
    if log is not None:
        log.released(name, owned, "closed")
    consumer.close()
