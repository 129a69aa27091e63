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
