"""Test helpers: a recording listener that checks per-key exclusivity, and
waits on conditions (never a bare sleep before an assertion)."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

from lite_push import ConsumerStats, LitePushConsumer, MessageExt, MessageQueue


class Recorder:
    """A listener that records every call and fails the test on overlap.

    ``order[key]`` lists the ``(queue_id, offset)`` of each delivery of the
    key, in the order the listener started them; ``overlaps`` lists keys that
    were ever in the listener twice at once.
    """

    def __init__(
        self, *, delay: float = 0.0, jitter: float = 0.0, key_of: Callable[[MessageExt], object] | None = None
    ) -> None:
        self.lock = threading.Lock()
        self.active: set[object] = set()
        self.overlaps: list[object] = []
        self.order: dict[object, list[tuple[int, int]]] = defaultdict(list)
        self.seen: list[tuple[str, int, int]] = []
        self.calls = 0
        self.delay = delay
        self.jitter = jitter
        self.key_of = key_of or (lambda m: m.keys)
        self.rng = random.Random(1234)

    def __call__(self, msgs: list[MessageExt]) -> None:
        keys = [self.key_of(m) for m in msgs]
        with self.lock:
            self.calls += 1
            for k in set(keys):
                if k in self.active:
                    self.overlaps.append(k)
                self.active.add(k)
            for m, k in zip(msgs, keys, strict=False):
                self.order[k].append((m.queue_id, m.queue_offset))
                self.seen.append((m.topic, m.queue_id, m.queue_offset))
            pause = self.delay + (self.rng.random() * self.jitter if self.jitter else 0.0)
        if pause:
            time.sleep(pause)
        with self.lock:
            for k in set(keys):
                self.active.discard(k)

    def count(self) -> int:
        with self.lock:
            return len(self.seen)


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0, interval: float = 0.005) -> bool:
    """Poll ``predicate`` until true or ``timeout``; return its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def wait_for(predicate: Callable[[], object], timeout: float, what: str | Callable[[], str]) -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout``
    seconds, saying what was awaited (``what``, or what it returns then: a
    callable can describe the state at the failure)."""
    if not wait_until(lambda: bool(predicate()), timeout):
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what() if callable(what) else what}")


class PollCounter:
    """Counts the polls a consumer's pull thread made on ``source`` (the
    source's ``poll`` is wrapped on the instance, before or after the
    consumer started: the pull loop looks it up on every call).

    :meth:`turns` proves that the pull thread went round its loop after a
    moment: where a test asserts that something does *not* happen (a paused
    queue is not resumed, a retry not yet due does not run), it waits for
    turns instead of sleeping, so the pull thread has really looked, however
    slow the machine."""

    def __init__(self, source: object) -> None:
        self._cond = threading.Condition()
        self.polls = 0
        inner = source.poll  # type: ignore[attr-defined]

        def poll(*args: object, **kw: object) -> object:
            try:
                return inner(*args, **kw)
            finally:
                with self._cond:
                    self.polls += 1
                    self._cond.notify_all()

        source.poll = poll  # type: ignore[attr-defined]

    def turns(self, n: int = 2, timeout: float = 30.0) -> None:
        """Wait until ``n + 1`` more polls returned: the pull loop's body
        (fences, dispatch, timers, flow control, commit) then ran whole at
        least ``n`` times after this call, each time after a poll that
        returned after this call (a turn's extra polls for a burst of
        messages count too: ask for more turns than the test needs)."""
        with self._cond:
            start = self.polls
            if not self._cond.wait_for(lambda: self.polls > start + n, timeout):
                raise AssertionError(f"the pull thread made {self.polls - start} of {n + 1} polls in {timeout:g} s")


def commit_pass(consumer: object, queues: Iterable[MessageQueue], timeout: float = 30.0) -> None:
    """Wait until the consumer's committer has looked at each of ``queues``
    after this call (it committed, or found the committed offset current):
    what a test then asserts about commits held at a commit made after the
    state it set up, not merely after some sleep.  (Reads each queue's
    ``last_commit_time``, on the wall clock the committer stamps it with.)"""
    pqs = consumer._owned  # type: ignore[attr-defined]
    since = time.time()
    for q in queues:

        def looked(q: MessageQueue = q) -> bool:
            pq = pqs.get(q)
            t = None if pq is None else pq.last_commit_time
            return t is not None and t > since

        wait_for(looked, timeout, f"a commit pass over {q}")


def wait_consumed(consumer: LitePushConsumer, n: int, timeout: float = 60.0) -> ConsumerStats:
    assert wait_until(lambda: consumer.stats().consumed >= n, timeout), (
        f"consumed {consumer.stats().consumed} of {n} within {timeout}s"
    )
    return consumer.stats()


def assert_offsets_increase(order: dict[object, list[tuple[int, int]]], *, first_only: bool = False) -> None:
    """Each key's deliveries per queue come in increasing offset order
    (with ``first_only``, redeliveries of an already seen offset are ignored)."""
    for key, seq in order.items():
        last: dict[int, int] = {}
        seen: set[tuple[int, int]] = set()
        for qid, off in seq:
            if first_only:
                if (qid, off) in seen:
                    continue
                seen.add((qid, off))
            prev = last.get(qid, -1)
            assert off > prev, f"key {key!r}: offset {off} of queue {qid} ran after {prev}"
            last[qid] = off


def read_offset_log(path: Path) -> list[tuple[int, int]]:
    """The ``(queue_id, offset)`` lines a child process appended to ``path``
    (a torn last line, from a kill, is ignored)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            out.append((int(parts[0]), int(parts[1])))
    return out


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    """``(status, body)`` of a GET of ``url``, an HTTP error status included."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
