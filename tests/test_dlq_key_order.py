"""Dead letters that keep a key's order (``dead_letter_order="key"``).

Once a message of key K is dead-lettered, K's later messages of its queue
follow it into the dead-letter topic, each marked as held behind the
first, instead of running; other keys run.  ``resend_key`` (``lite-push
dlq resend --key``) sends K's dead letters back in offset order and
releases K.  The held state survives a restart (the dead-letter topic is
its record).  Runs on each executor; the Redis and Kafka variants of the
core case are at the end."""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from executors import EX
from helpers import PollCounter, wait_for, wait_until

from lite_push import (
    ConfigError,
    ConsumeFromWhere,
    ConsumeMode,
    ConsumerConfig,
    EmbeddedBroker,
    ManualClock,
    MessageExt,
    held_keys,
    resend_key,
)
from lite_push.dlq import DeadLetter, dead_letters, iter_dead_letters
from lite_push.sources._base import HELD_BEHIND, HELD_KEY, RELEASED_KEY, RESENT_OF, dlq_topic

FIRST = ConsumeFromWhere.FIRST_OFFSET


class Listener:
    """Records what ran, per key, in order: ``(topic, queue_id, offset,
    body)`` of each successful call, and every attempt; fails a message
    when ``fail(message)`` says so."""

    def __init__(self, fail: Callable[[MessageExt], bool] = lambda m: False) -> None:
        self.lock = threading.Lock()
        self.fail = fail
        self.ok: dict[str | None, list[tuple[str, int, int, bytes]]] = defaultdict(list)
        self.attempts: list[tuple[str | None, bytes, int]] = []
        self.active: set[str | None] = set()
        self.overlaps: list[str | None] = []

    def __call__(self, msgs: list[MessageExt]) -> None:
        with self.lock:
            for m in msgs:
                if m.keys in self.active and m.keys is not None:
                    self.overlaps.append(m.keys)
                self.active.add(m.keys)
        try:
            for m in msgs:
                bad = self.fail(m)
                with self.lock:
                    self.attempts.append((m.keys, m.body, m.reconsume_times))
                if bad:
                    raise ValueError(f"cannot process {m.body!r}")
            with self.lock:
                for m in msgs:
                    self.ok[m.keys].append((m.topic, m.queue_id, m.queue_offset, m.body))
        finally:
            with self.lock:
                for m in msgs:
                    self.active.discard(m.keys)

    def bodies(self, key: str | None) -> list[bytes]:
        with self.lock:
            return [b for _, _, _, b in self.ok[key]]

    def count(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.ok.values())


pytestmark = pytest.mark.usefixtures("executor")


def _consumer(source: Any, listener: Any, clock: ManualClock | None = None, topic: str = "T", **cfg: Any) -> Any:
    cfg.setdefault("poll_timeout", 0.02)
    cfg.setdefault("commit_interval", 0.05)
    cfg.setdefault("dead_letter_order", "key")
    consumer = EX.consumer(ConsumerConfig(group="g", **cfg), source=source, listener=listener, clock=clock)
    consumer.subscribe(topic)
    return consumer


def _letters(broker: Any, group: str = "g") -> list[DeadLetter]:
    return list(iter_dead_letters(broker, group))


def _held_bodies(broker: Any, key: str) -> list[bytes]:
    return [d.message.body for d in _letters(broker) if d.held_key == key]


def _retry_scheduled(consumer: Any, clock: ManualClock) -> bool:
    """A parked key's retry is on the timer, due after the clock's now."""
    due = consumer.stats().next_retry_due
    return due is not None and due > clock.monotonic()


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker()
    yield b
    b.close()


def _orders(
    broker: Any, n: int, keys: tuple[str, ...] = ("K", "a", "b", "c"), queue_id: int = 0, start: int = 0
) -> None:
    """``n`` messages to T's queue ``queue_id``, keys in turn; bodies
    ``key-i`` (``i`` from ``start``)."""
    broker.send_batch(
        "T", [{"body": f"{keys[i % len(keys)]}-{i}".encode(), "keys": keys[i % len(keys)], "queue_id": queue_id}
              for i in range(start, start + n)]
    )  # fmt: skip


# -- the core case ------------------------------------------------------------------


@pytest.mark.parametrize("retries", [0, 2])
def test_a_dead_lettered_key_holds_its_later_messages_in_order_and_other_keys_run(broker, retries):
    broker.create_topic("T", 2)
    _orders(broker, 40)  # K-0, a-1, b-2, c-3, K-4, ...: K is every 4th of queue 0
    broker.send_batch("T", [{"body": b"x-%d" % i, "keys": "x", "queue_id": 1} for i in range(10)])
    listener = Listener(fail=lambda m: m.body == b"K-0")
    clock = ManualClock()
    consumer = _consumer(
        broker.pull_consumer("g", consume_from=FIRST), listener, clock, lanes=4, max_reconsume_times=retries
    )
    polls = PollCounter(consumer._source)
    q0, q1 = broker.queues("T")
    with consumer:
        # every other key runs while K waits (parked for its retries, then held)
        wait_for(lambda: listener.count() == 30 + 10, 30, lambda: f"{listener.count()} of 40 consumed")
        for _ in range(retries):
            wait_for(lambda: _retry_scheduled(consumer, clock), 30, "K's retry on the timer")
            clock.advance(1.0)
        wait_for(lambda: consumer.stats().dead_lettered == 10, 30, lambda: f"{consumer.stats()}")
        # K's later messages arriving now follow it too; others still run
        _orders(broker, 8, keys=("K", "d"), start=40)
        wait_for(lambda: consumer.stats().dead_lettered == 14 and listener.count() == 44, 30, "the late ones")
        st = consumer.stats()
        assert (st.held_keys, st.held_key_names, st.held_behind) == (1, ("K",), 13)
        clock.advance(1.0)  # a commit
        polls.turns(3)
        wait_for(lambda: consumer.stats().committed == {q0: 48, q1: 10}, 30, lambda: f"{consumer.stats().committed}")
    assert listener.bodies("K") == []  # never given K's later messages
    assert {b for k, b, _ in listener.attempts if k == "K"} == {b"K-0"}
    assert [a[2] for a in listener.attempts if a[0] == "K"] == list(range(retries + 1))
    assert listener.overlaps == []
    letters = _letters(broker)
    assert [d.message.body for d in letters] == [b"K-%d" % i for i in range(0, 40, 4)] + [b"K-40", b"K-42", b"K-44", b"K-46"]
    first = letters[0]
    assert (first.held_key, first.held_behind, first.reason) == ("K", None, "listener raised ValueError: cannot process b'K-0'")
    for d in letters[1:]:
        assert (d.held_key, d.held_behind) == ("K", "T/0/0")
        assert d.reason == "key 'K' is held behind the dead letter of T/0/0"
        assert d.message.properties[HELD_BEHIND] == "T/0/0" and d.message.properties[HELD_KEY] == "K"
    assert [(h.key, h.letters, h.behind, h.first_origin) for h in held_keys(broker, "g")] == [("K", 14, 13, "T/0/0")]


def test_message_order_is_the_default_and_unchanged(broker):
    broker.create_topic("T", 1)
    _orders(broker, 12)
    listener = Listener(fail=lambda m: m.body == b"K-0")
    consumer = _consumer(
        broker.pull_consumer("g", consume_from=FIRST), listener, lanes=2, max_reconsume_times=0,
        dead_letter_order="message",
    )  # fmt: skip
    assert ConsumerConfig(group="g").dead_letter_order == "message"
    with consumer:
        wait_for(lambda: listener.count() == 11, 30, "the others and K's later messages")
        st = consumer.stats()
        assert (st.dead_lettered, st.held_keys, st.held_behind) == (1, 0, 0)
    assert listener.bodies("K") == [b"K-4", b"K-8"]  # the key moved on
    (d,) = _letters(broker)
    assert (d.message.body, d.held_key, d.held_behind) == (b"K-0", None, None)
    assert held_keys(broker, "g") == []


def _hold_k(broker: Any, listener: Listener, n: int = 12, **cfg: Any) -> None:
    """Run group g over T (1 queue, ``n`` messages, K every 4th) until K's
    first message is dead-lettered and its later ones held behind it."""
    cfg.setdefault("lanes", 2)
    with _consumer(broker.pull_consumer("g", consume_from=FIRST), listener, max_reconsume_times=0, **cfg) as c:
        wait_for(lambda: c.stats().dead_lettered == (n + 3) // 4, 30, lambda: f"{c.stats()}")
        wait_for(lambda: listener.count() == n - (n + 3) // 4, 30, "the other keys")


def test_a_held_key_stays_held_after_a_restart_on_a_durable_broker(tmp_path):
    with EmbeddedBroker(tmp_path) as broker:
        broker.create_topic("T", 1)
        _orders(broker, 12)
        _hold_k(broker, Listener(fail=lambda m: m.body == b"K-0"))
    with EmbeddedBroker(tmp_path) as broker:  # a new process, in effect
        _orders(broker, 6, start=12)  # K-12, K-16 among them
        listener = Listener()  # K's messages would now succeed: they must not run
        with _consumer(broker.pull_consumer("g", consume_from=FIRST), listener, lanes=2) as c:
            wait_for(lambda: listener.count() == 4, 30, "the other keys")
            wait_for(lambda: c.stats().held_behind == 2, 30, lambda: f"{c.stats()}")
            assert (c.stats().held_keys, c.stats().held_key_names) == (1, ("K",))
        assert listener.bodies("K") == []
        assert _held_bodies(broker, "K") == [b"K-0", b"K-4", b"K-8", b"K-12", b"K-16"]
        assert broker.committed("g", broker.queues("T")[0]).offset == 18


def test_resend_key_runs_the_held_messages_in_order_then_releases_the_key(broker):
    broker.create_topic("T", 1)
    _orders(broker, 12)
    broken = {"K": True}
    listener = Listener(fail=lambda m: broken["K"] and m.body == b"K-0")
    with _consumer(broker.pull_consumer("g", consume_from=FIRST), listener, lanes=2, max_reconsume_times=0) as c:
        wait_for(lambda: c.stats().dead_lettered == 3 and listener.count() == 9, 30, "K held")
        broken["K"] = False  # the cause is fixed
        results = resend_key(broker, "g", "K")
        assert [(r.queue.queue_id, r.offset) for r in results] == [(0, 12), (0, 13), (0, 14)]
        _orders(broker, 4, keys=("K",), start=20)  # K's later messages: after the copies
        wait_for(lambda: len(listener.bodies("K")) == 7, 30, lambda: f"{listener.bodies('K')}")
        st = c.stats()
        assert (st.held_keys, st.held_key_names, st.dead_lettered) == (0, (), 3)
    assert listener.bodies("K") == [b"K-0", b"K-4", b"K-8", b"K-20", b"K-21", b"K-22", b"K-23"]
    assert held_keys(broker, "g") == []
    copies = broker.messages(broker.queues("T")[0], 12, 15)
    assert [(m.body, m.keys, m.properties) for m in copies] == [
        (b"K-%d" % i, "K", {RESENT_OF: f"T/0/{i}"}) for i in (0, 4, 8)
    ]
    (dlq,) = broker.queues(dlq_topic("g"))
    release = broker.messages(dlq, 3)[0]
    assert release.body == b"" and release.properties[RELEASED_KEY] == "K"
    assert [d.message.queue_offset for d in dead_letters(broker, "g")] == [0, 1, 2]  # the release is no dead letter
    assert resend_key(broker, "g", "K") == []  # nothing held any more


def test_a_message_that_came_between_the_read_and_the_copies_keeps_the_key_held(broker):
    broker.create_topic("T", 1)
    _orders(broker, 8)
    listener = Listener(fail=lambda m: m.body == b"K-0" and m.reconsume_times == 0 and RESENT_OF not in m.properties)

    class Racing:
        """The broker, with a message of K produced just before the copies."""

        def __getattr__(self, name: str) -> Any:
            return getattr(broker, name)

        def send_batch(self, topic: str, items: Any) -> Any:
            broker.send("T", b"K-late", keys="K", queue_id=0)
            return broker.send_batch(topic, items)

    with _consumer(broker.pull_consumer("g", consume_from=FIRST), listener, lanes=2, max_reconsume_times=0) as c:
        wait_for(lambda: c.stats().dead_lettered == 2 and listener.count() == 6, 30, "K held")
        resend_key(Racing(), "g", "K")
        wait_for(lambda: listener.bodies("K") == [b"K-0", b"K-4"], 30, lambda: f"{listener.bodies('K')}")
        wait_for(lambda: c.stats().dead_lettered == 3, 30, "K-late held behind")
        assert c.stats().held_key_names == ("K",)
        [held] = held_keys(broker, "g")
        assert (held.key, held.origins) == ("K", ("T/0/8",))  # K-late, at offset 8
        _orders(broker, 2, keys=("K",), start=30)
        wait_for(lambda: c.stats().dead_lettered == 5, 30, "K's later messages held behind K-late")
        resend_key(broker, "g", "K")
        wait_for(lambda: len(listener.bodies("K")) == 5, 30, lambda: f"{listener.bodies('K')}")
        assert c.stats().held_keys == 0
    assert listener.bodies("K") == [b"K-0", b"K-4", b"K-late", b"K-30", b"K-31"]


def test_copies_resent_while_the_group_was_down_run_before_anything_older_of_the_key(tmp_path):
    """Restarted between the resend and its copies, a consumer holds the key
    until its messages pass the last copy: one stored before the copies is
    later than the held letters, so it waits behind them."""
    with EmbeddedBroker(tmp_path) as broker:
        broker.create_topic("T", 1)
        _orders(broker, 8)
        _hold_k(broker, Listener(fail=lambda m: m.body == b"K-0"), n=8)
        broker.send("T", b"K-new", keys="K", queue_id=0)  # offset 8: before the copies
        resend_key(broker, "g", "K")  # copies of K-0, K-4 at 9, 10
        broker.send("T", b"K-newer", keys="K", queue_id=0)  # 11
    with EmbeddedBroker(tmp_path) as broker:
        listener = Listener()
        with _consumer(broker.pull_consumer("g", consume_from=FIRST), listener, lanes=2) as c:
            wait_for(lambda: len(listener.bodies("K")) == 2 and c.stats().dead_lettered == 2, 30, lambda: f"{c.stats()}")
            assert c.stats().held_key_names == ("K",)
            resend_key(broker, "g", "K")
            wait_for(lambda: len(listener.bodies("K")) == 4, 30, lambda: f"{listener.bodies('K')}")
            assert c.stats().held_keys == 0
        assert listener.bodies("K") == [b"K-0", b"K-4", b"K-new", b"K-newer"]


def test_copies_consumed_before_a_restart_leave_the_key_free(tmp_path):
    with EmbeddedBroker(tmp_path) as broker:
        broker.create_topic("T", 1)
        _orders(broker, 8)
        listener = Listener(fail=lambda m: m.body == b"K-0" and RESENT_OF not in m.properties)
        with _consumer(broker.pull_consumer("g", consume_from=FIRST), listener, lanes=2, max_reconsume_times=0) as c:
            wait_for(lambda: c.stats().dead_lettered == 2 and listener.count() == 6, 30, "K held")
            resend_key(broker, "g", "K")
            wait_for(lambda: listener.bodies("K") == [b"K-0", b"K-4"], 30, "the copies")
    with EmbeddedBroker(tmp_path) as broker:
        broker.send("T", b"K-next", keys="K", queue_id=0)
        listener = Listener()
        with _consumer(broker.pull_consumer("g", consume_from=FIRST), listener, lanes=2) as c:
            wait_for(lambda: listener.bodies("K") == [b"K-next"], 30, lambda: f"{listener.bodies('K')}")
            assert c.stats().held_keys == 0


def test_a_new_member_of_the_group_reads_the_held_keys_of_the_queues_it_gains(broker):
    """A queue that moves to another member (here: the first member left)
    stays held there: the new owner reads the held keys back when it gains it."""
    broker.create_topic("T", 1)
    _orders(broker, 8)
    _hold_k(broker, Listener(fail=lambda m: m.body == b"K-0"), n=8)
    _orders(broker, 4, start=8)
    listener = Listener()
    with _consumer(broker.pull_consumer("g", consume_from=FIRST), listener, lanes=2) as c:
        wait_for(lambda: listener.count() == 3 and c.stats().held_behind == 1, 30, lambda: f"{c.stats()}")
    assert listener.bodies("K") == []
    assert _held_bodies(broker, "K") == [b"K-0", b"K-4", b"K-8"]
