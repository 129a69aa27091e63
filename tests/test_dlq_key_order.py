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
from typing import Any

import orjson
import pytest
from executors import EX
from helpers import PollCounter, wait_for
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lite_push import (
    ConfigError,
    ConsumeFromWhere,
    ConsumeMode,
    ConsumerConfig,
    EmbeddedBroker,
    ManualClock,
    MessageExt,
    MessageModel,
    held_keys,
    resend_key,
)
from lite_push.dlq import DeadLetter, dead_letters, iter_dead_letters
from lite_push.sources.contract import HELD_BEHIND, HELD_KEY, RELEASED_KEY, RESENT_OF, dlq_topic

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
            for key in {m.keys for m in msgs}:
                if key in self.active and key is not None:
                    self.overlaps.append(key)
                self.active.add(key)
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
        "T",
        [
            {"body": f"{keys[i % len(keys)]}-{i}".encode(), "keys": keys[i % len(keys)], "queue_id": queue_id}
            for i in range(start, start + n)
        ],
    )


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
    assert [d.message.body for d in letters] == [b"K-%d" % i for i in [*range(0, 40, 4), 40, 42, 44, 46]]
    first = letters[0]
    assert (first.held_key, first.held_behind) == ("K", None)
    assert first.reason == "listener raised ValueError: cannot process b'K-0'"
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
        broker.pull_consumer("g", consume_from=FIRST),
        listener,
        lanes=2,
        max_reconsume_times=0,
        dead_letter_order="message",
    )
    assert ConsumerConfig(group="g").dead_letter_order == "message"
    with consumer:
        wait_for(lambda: listener.count() == 11, 30, "the others and K's later messages")
        wait_for(lambda: consumer.stats().dead_lettered == 1, 30, "K-0 stored in the DLQ")
        st = consumer.stats()
        assert (st.dead_lettered, st.held_keys, st.held_behind) == (1, 0, 0)
    assert listener.bodies("K") == [b"K-4", b"K-8"]  # the key moved on
    (d,) = _letters(broker)
    assert (d.message.body, d.held_key, d.held_behind) == (b"K-0", None, None)
    assert held_keys(broker, "g") == []


def _hold_k(broker: Any, listener: Listener, n: int = 12, held: int = 1, **cfg: Any) -> None:
    """Run group g over T (1 queue, ``n`` messages, a key every 4th) until
    the first message of each of ``held`` keys is dead-lettered and their
    later ones held behind it."""
    cfg.setdefault("lanes", 2)
    dead = held * ((n + 3) // 4)
    with _consumer(broker.pull_consumer("g", consume_from=FIRST), listener, max_reconsume_times=0, **cfg) as c:
        wait_for(lambda: c.stats().dead_lettered == dead, 30, lambda: f"{c.stats()}")
        wait_for(lambda: listener.count() == n - dead, 30, "the other keys")


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
            wait_for(
                lambda: len(listener.bodies("K")) == 2 and c.stats().dead_lettered == 2, 30, lambda: f"{c.stats()}"
            )
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


def test_a_queue_that_moves_to_another_member_stays_held_there(broker):
    """Two members, a rebalance: the member that gains the held key's queue
    holds it (it reads the dead-letter topic when it gains queues); the one
    that gave it up forgets it."""
    broker.create_topic("T", 2)
    _orders(broker, 8)  # K held in queue 0
    first = Listener(fail=lambda m: m.body == b"K-0")
    a = _consumer(broker.pull_consumer("g", consume_from=FIRST, client_id="m2"), first, lanes=2, max_reconsume_times=0)
    q0 = broker.queues("T")[0]
    with a:
        wait_for(lambda: a.stats().dead_lettered == 2 and first.count() == 6, 30, lambda: f"{a.stats()}")
        second = Listener()
        b = _consumer(broker.pull_consumer("g", consume_from=FIRST, client_id="m1"), second, lanes=2)
        with b:  # m1 sorts first: it gains queue 0
            wait_for(lambda: q0 in b.stats().committed and q0 not in a.stats().committed, 30, "queue 0 moved")
            assert a.stats().held_keys == 0  # forgotten with the queue
            _orders(broker, 4, start=8)  # K-8 among them, in queue 0
            wait_for(lambda: second.count() == 3 and b.stats().held_behind == 1, 30, lambda: f"{b.stats()}")
            assert b.stats().held_key_names == ("K",)
    assert first.bodies("K") == [] and second.bodies("K") == []
    assert _held_bodies(broker, "K") == [b"K-0", b"K-4", b"K-8"]


def test_the_setting_comes_from_the_command_line_the_environment_or_the_file(tmp_path):
    from lite_push.cli.parser import build_parser
    from lite_push.cli.plan import CONFIG_FLAGS
    from lite_push.cli.settings import load_settings, settings_of

    args = build_parser().parse_args(["consume", "--group", "g", "--dead-letter-order", "key"])
    assert settings_of(args, CONFIG_FLAGS).consumer_config().dead_letter_order == "key"
    env = {"LITE_PUSH_GROUP": "g", "LITE_PUSH_DEAD_LETTER_ORDER": "key"}
    assert load_settings(environ=env).consumer_config().dead_letter_order == "key"
    path = tmp_path / "c.toml"
    path.write_text('[consumer]\ngroup = "g"\ndead_letter_order = "key"\n')
    assert load_settings(config_file=path).consumer_config().dead_letter_order == "key"
    with pytest.raises(ConfigError, match="dead_letter_order"):
        load_settings(environ={**env, "LITE_PUSH_DEAD_LETTER_ORDER": "sometimes"}).consumer_config()


# -- the command line ---------------------------------------------------------------


def test_the_command_line_lists_held_keys_and_releases_one(tmp_path, capsys):
    from lite_push import cli

    def run(*argv: str) -> tuple[int, str, str]:
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    with EmbeddedBroker(tmp_path) as broker:
        broker.create_topic("T", 1)
        _orders(broker, 12, keys=("K", "a", "J", "b"))
        _hold_k(broker, Listener(fail=lambda m: m.body in (b"K-0", b"J-2")), held=2)
        held = {h.key: h for h in held_keys(broker, "g")}  # K's and J's letters may interleave
    k, j = held["K"], held["J"]
    assert (k.origins, j.origins) == (("T/0/0", "T/0/4", "T/0/8"), ("T/0/2", "T/0/6", "T/0/10"))
    source = ("--source", f"embedded:{tmp_path}", "--group", "g")
    code, out, err = run("dlq", "list", *source, "--held")
    assert code == 0, err
    expected = {
        h.key: f"key={h.key} letters=3 behind=2 first={h.origins[0]} offsets={','.join(map(str, h.offsets))}"
        for h in (k, j)
    }
    assert sorted(out.splitlines()) == sorted(expected.values())
    code, out, _ = run("dlq", "list", *source, "--held", "--json")
    docs = {d["key"]: d for d in map(orjson.loads, out.splitlines())}
    assert docs["K"] == {"key": "K", "letters": 3, "behind": 2, "offsets": list(k.offsets), "origins": list(k.origins)}
    code, out, _ = run("dlq", "list", *source)
    lines = sorted(out.splitlines(), key=lambda line: int(line.split()[0].removeprefix("offset=")))
    assert len(lines) == 6
    for o in k.offsets:
        assert lines[o].endswith(" held_key=K" if o == k.offsets[0] else " held_key=K held_behind=T/0/0"), lines[o]

    # an offset held behind a key is refused: its key goes back whole
    code, out, err = run("dlq", "resend", *source, "--offset", str(j.offsets[1]))
    assert code == 2 and out == "" and "use --key J" in err
    code, out, err = run("dlq", "resend", *source, "--key", "nobody")
    assert code == 2 and "'nobody' holds no dead letters in %DLQ%g" in err
    code, out, err = run("dlq", "resend", *source, "--key", "K")
    assert code == 0, err
    lines = out.splitlines()
    assert [line.split(" -> ")[0] for line in lines[:3]] == [
        f"resent offset={o} origin={origin}" for o, origin in zip(k.offsets, k.origins, strict=True)
    ]
    assert [line.split(" -> ")[1].split()[0] for line in lines[:3]] == ["T/0/12", "T/0/13", "T/0/14"]
    assert lines[3:] == ["released key=K letters=3"]
    code, out, _ = run("dlq", "list", *source, "--held")
    assert out == expected["J"] + "\n"
    code, out, err = run("dlq", "resend", *source, "--all", "--progress", "off")
    # K's letters went back with K's release: --all skips them, and releases J
    assert code == 0 and out.splitlines()[-1] == "released key=J letters=3"
    assert [line.split(" -> ")[0] for line in out.splitlines()[:3]] == [
        f"resent offset={o} origin={origin}" for o, origin in zip(j.offsets, j.origins, strict=True)
    ]
    assert len(out.splitlines()) == 4
    assert err == "lite-push dlq resend: 3 dead letter(s) of %DLQ%g resent already, skipped (--force resends them)\n"
    code, out, _ = run("dlq", "list", *source, "--held")
    assert out == ""
    code, out, _ = run("dlq", "list", *source)
    assert all(line.endswith(" resent_to=released") for line in out.splitlines()), out
    code, out, err = run("dlq", "resend", *source, "--all", "--progress", "off")
    assert (code, out) == (0, "") and "6 dead letter(s) of %DLQ%g resent already" in err
    # --force: every one again, as plain dead letters (their keys are released)
    code, out, err = run("dlq", "resend", *source, "--all", "--force", "--progress", "off")
    assert code == 0 and len(out.splitlines()) == 6 and err == "", err
    with EmbeddedBroker(tmp_path) as broker:
        copies = broker.messages(broker.queues("T")[0], 12)
        assert [(m.body, m.properties[RESENT_OF]) for m in copies[:6]] == [
            (b"K-0", "T/0/0"),
            (b"K-4", "T/0/4"),
            (b"K-8", "T/0/8"),
            (b"J-2", "T/0/2"),
            (b"J-6", "T/0/6"),
            (b"J-10", "T/0/10"),
        ]
        assert sorted((m.body, m.properties.get(RESENT_OF)) for m in copies[6:]) == sorted(
            [
                (b"K-0", None),
                (b"K-4", None),
                (b"K-8", None),
                (b"J-2", None),
                (b"J-6", None),
                (b"J-10", None),
            ]
        )


# -- settings, stats and metrics ---------------------------------------------------


def test_bad_settings_are_config_errors_naming_dead_letter_order(broker, tmp_path):
    with pytest.raises(ConfigError, match="dead_letter_order.*'message', 'key'.*'keys'"):
        ConsumerConfig(group="g", dead_letter_order="keys")
    for mode in (ConsumeMode.CONCURRENTLY, ConsumeMode.QUEUE_ORDERLY):
        with pytest.raises(ConfigError, match=f"dead_letter_order.*only KEY_ORDERLY.*{mode.name}"):
            ConsumerConfig(group="g", mode=mode, dead_letter_order="key")
    broker.create_topic("T", 1)

    class Blind(type(broker.pull_consumer("other"))):  # type: ignore[misc]
        """A source that cannot read its dead-letter topic back."""

        def dead_letter_reader(self) -> None:
            return None

    with pytest.raises(ConfigError, match="dead_letter_order.*cannot read its dead-letter topic back"):
        EX.consumer(ConsumerConfig(group="g", dead_letter_order="key"), source=Blind(broker, "g"), listener=print)
    broadcasting = broker.pull_consumer("g", message_model=MessageModel.BROADCASTING, offset_file=tmp_path / "o.json")
    with pytest.raises(ConfigError, match="dead_letter_order.*BROADCASTING"):
        EX.consumer(ConsumerConfig(group="g", dead_letter_order="key"), source=broadcasting, listener=print)
    broadcasting.close()


def test_stats_and_metrics_show_the_held_keys(broker):
    broker.create_topic("T", 1)
    keys = tuple(f"k{i:02d}" for i in range(25)) + ("ok",)
    _orders(broker, 26 * 3, keys=keys)
    listener = Listener(fail=lambda m: m.keys != "ok" and int(m.body.split(b"-")[1]) < 26)
    registry = CollectorRegistry()
    consumer = EX.consumer(
        ConsumerConfig(group="g", dead_letter_order="key", max_reconsume_times=0, lanes=4, poll_timeout=0.02),
        source=broker.pull_consumer("g", consume_from=FIRST),
        listener=listener,
        registry=registry,
    )
    consumer.subscribe("T")
    samples: dict[str, float] = {}
    with consumer:
        wait_for(lambda: consumer.stats().dead_lettered == 75, 30, lambda: f"{consumer.stats()}")
        st = consumer.stats()
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            for sample in family.samples:
                samples[sample.name] = sample.value
    assert (st.held_keys, st.held_behind) == (25, 50)
    assert st.held_key_names == keys[:20]  # the first 20, sorted
    assert listener.bodies("ok") == [b"ok-25", b"ok-51", b"ok-77"]
    assert samples["lite_push_held_keys"] == 25
    assert samples["lite_push_held_messages_total"] == 50


# -- under real concurrency -----------------------------------------------------------


def _settled(consumer: Any, broker: Any) -> bool:
    """Every message of T was finished (run, or stored in the dead-letter
    topic) and committed."""
    committed = consumer.stats().committed
    return all(committed.get(q) == broker.max_offset(q) for q in broker.queues("T"))


@pytest.mark.parametrize("batch_size", [1, 3])
def test_every_key_runs_then_is_held_in_offset_order_under_concurrency(broker, batch_size):
    """Many keys on 4 queues and 8 lanes, random failures (some retried,
    some dead-lettered at once), copies resent while more messages arrive
    and some copies failing again: for every key, what the listener ran
    followed by its held dead letters is the key's messages in order, each
    once.  At the end, with failures off and every held key released, every
    message ran exactly once, in order."""
    import zlib

    broker.create_topic("T", 4)
    keys = [f"k{i}" for i in range(60)]
    rng = random.Random(7)
    sent: dict[str, list[int]] = defaultdict(list)  # key -> its message numbers, in order
    counter = iter(range(1_000_000))
    lock = threading.Lock()

    def produce(n: int) -> None:
        items = []
        with lock:
            for _ in range(n):
                i, key = next(counter), rng.choice(keys)
                sent[key].append(i)
                items.append({"body": f"{key}|{i}".encode(), "keys": key})
        broker.send_batch("T", items)

    failing = {"on": True}

    def fail(m: MessageExt) -> bool:
        if not failing["on"]:
            return False
        copy = RESENT_OF in m.properties
        roll = zlib.crc32(m.body + b"|%d|%d" % (m.reconsume_times, copy)) % 100
        return roll < (25 if copy else 4)  # a retry fails again as often

    listener = Listener(fail=fail)
    produce(1500)
    consumer = _consumer(
        broker.pull_consumer("g", consume_from=FIRST),
        listener,
        lanes=8,
        batch_size=batch_size,
        max_reconsume_times=1,
        suspend_ms=1,
    )

    def number(body: bytes) -> int:
        return int(body.split(b"|")[1])

    def check(final: bool) -> None:
        letters: dict[str, list[int]] = defaultdict(list)
        for h in held_keys(broker, "g"):
            (dlq,) = broker.queues(dlq_topic("g"))
            letters[h.key] = [number(broker.messages(dlq, o, o + 1)[0].body) for o in h.offsets]
        for key in keys:
            ran = [number(b) for b in listener.bodies(key)]
            assert ran + letters[key] == sent[key], (key, ran, letters[key])
            if final:
                assert letters[key] == []

    with consumer:
        wait_for(lambda: _settled(consumer, broker), 60, lambda: f"{consumer.stats()}")
        assert consumer.stats().held_keys > 0
        check(final=False)
        # more messages arrive while held keys are released (some copies fail again)
        producer = threading.Thread(target=lambda: [produce(50) for _ in range(10)])
        producer.start()
        for h in held_keys(broker, "g"):
            resend_key(broker, "g", h.key)
        producer.join()
        wait_for(lambda: _settled(consumer, broker), 60, lambda: f"{consumer.stats()}")
        check(final=False)
        failing["on"] = False
        for _ in range(10):  # each round may leave keys held by messages that raced the copies
            held = held_keys(broker, "g")
            if not held:
                break
            for h in held:
                resend_key(broker, "g", h.key)
            wait_for(lambda: _settled(consumer, broker), 60, lambda: f"{consumer.stats()}")
        assert consumer.stats().held_keys == 0
        check(final=True)
    assert listener.overlaps == []


# -- the fold of a dead-letter topic ---------------------------------------------------


def _letter(offset: int, key: str, origin: int, **props: str) -> MessageExt:
    base = {
        "DLQ_GROUP": "g",
        "DLQ_REASON": "r",
        "ORIGIN_TOPIC": "T",
        "ORIGIN_QUEUE_ID": "0",
        "ORIGIN_OFFSET": str(origin),
        "ORIGIN_MESSAGE_ID": f"m{origin}",
        HELD_KEY: key,
    }
    return MessageExt("%DLQ%g", 0, offset, b"", keys=key, properties={**base, **props})


def test_the_fold_orders_a_keys_letters_by_place_and_a_release_closes_what_it_covers():
    from lite_push.dlq._held_log import HeldLog

    log = HeldLog()
    log.feed(
        [
            _letter(0, "K", 10),
            _letter(1, "K", 14),
            _letter(2, "J", 11),
            _letter(3, "K", 20),  # arrived while K's letters were being resent
            MessageExt(
                "%DLQ%g",
                0,
                4,
                b"",
                properties={
                    RELEASED_KEY: "K",
                    "lite_push.RELEASED_THROUGH": "1",
                    "lite_push.RESENT_TO": '[["T", 0, 31]]',
                },
            ),
            _letter(5, "K", 30, **{RESENT_OF: "T/0/10"}),  # the copy of K's first failed again: it keeps its place
            _letter(6, "K", 31, **{RESENT_OF: "T/0/14"}),  # and the next copy waited behind it
            _letter(7, "K", 32, **{RESENT_OF: "T/0/14"}),  # a place held twice counts once, the later letter
            MessageExt("%DLQ%g", 0, 8, b"", properties={RELEASED_KEY: "J", "lite_push.RELEASED_THROUGH": "x"}),
            MessageExt(
                "%DLQ%g",
                0,
                9,
                b"",
                properties={
                    RELEASED_KEY: "J",
                    "lite_push.RELEASED_THROUGH": "2",
                    "lite_push.RESENT_TO": '[["T", "0", 5]]',
                },
            ),
        ]
    )
    assert log.next_offset == 10
    assert [(x.origin, x.dlq_offset) for x in log.letters("K")] == [("T/0/10", 5), ("T/0/14", 7), ("T/0/20", 3)]
    assert [x.origin for x in log.letters("J")] == ["T/0/11"]  # the malformed releases closed nothing
    assert log.copies == {"K": {("T", 0): 31}}
