"""Stuck calls named (issue 29, point 2): the call watch, ``stats()``, the
gauge, the WARNING line; a stuck call does not fail ``/healthz``."""

from __future__ import annotations

import logging
import threading

import pytest
from helpers import wait_for
from prometheus_client import CollectorRegistry

from lite_push import (
    CallInProgress,
    ConsumeFromWhere,
    ConsumerConfig,
    EmbeddedBroker,
    LitePushConsumer,
    ManualClock,
    MessageExt,
    MessageQueue,
)
from lite_push._exec.call_watch import STEAL_FLOOR, STEAL_MULTIPLE, CallWatch, longest_call
from lite_push._lanes.lanes import Lane


def _msg(offset: int, key: str | None, queue_id: int = 0) -> MessageExt:
    return MessageExt("T", queue_id, offset, b"", keys=key)


class _Now:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_slow_call_is_logged_once_and_its_lane_is_asked_about_until_nothing_more_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = _Now()
    lanes = [Lane(i, lambda: None) for i in range(3)]
    asked: list[tuple[int, object]] = []
    watch = CallWatch(
        "g",
        lanes=lanes,
        monotonic=now,
        steal_after=2.0,
        slow_call_warning=5.0,
        request=lambda i, c: asked.append((i, c)),
    )
    call = ([_msg(7, "acct-1", 2)], 100.0)
    lanes[1].call = call
    caplog.set_level(logging.WARNING, logger="lite_push._exec.call_watch")
    watch.check()
    assert asked == [] and watch.warnings == 0
    now.t = 102.0
    watch.check()
    assert asked == [(1, call)]  # past steal_after: once for what the task holds
    watch.check()
    assert asked == [(1, call)]
    lanes[1].depth = 3  # more queued behind it since
    watch.check()
    assert asked == [(1, call), (1, call)]
    now.t = 105.0
    watch.check()
    watch.check()
    assert watch.warnings == 1
    [record] = [r for r in caplog.records if "slow_call_warning" in r.getMessage()]
    assert "key 'acct-1' (T@embedded#2 offset 7) has run 5.0 s on lane 1" in record.getMessage()
    call2 = ([_msg(8, "acct-1", 2)], 105.0)
    lanes[1].call = call2  # the next call: young again
    watch.check()
    assert len(asked) == 2 and watch.warnings == 1


def test_auto_learns_the_call_times_it_sees_end() -> None:
    now = _Now()
    lanes = [Lane(0, lambda: None)]
    watch = CallWatch(
        "g", lanes=lanes, monotonic=now, steal_after="auto", slow_call_warning=None, request=lambda i, c: None
    )
    assert watch.threshold == STEAL_FLOOR
    for i in range(50):  # calls seen at 0.3 s of age, then ended
        lanes[0].call = ([_msg(i, "k")], now.t - 0.3)
        watch.check()
        lanes[0].call = None
        watch.check()
    assert watch.threshold == pytest.approx(STEAL_MULTIPLE * 0.3)
    off = CallWatch("g", lanes=lanes, monotonic=now, steal_after="auto", slow_call_warning=None, request=None)
    assert off.threshold is None  # no stealer: keys never move


def test_the_longest_call_is_the_one_that_started_first() -> None:
    lanes = [Lane(i, lambda: None) for i in range(3)]
    assert longest_call(lanes, 10.0) is None
    lanes[0].call = ([_msg(5, "a"), _msg(6, "b")], 8.0)
    lanes[2].call = ([_msg(1, None, 1)], 3.5)
    got = longest_call(lanes, 10.0)
    assert got == CallInProgress(2, None, MessageQueue("T", "embedded", 1), 1, 1, 6.5)
    assert longest_call(lanes, 10.0, key_of=lambda m: "x") == CallInProgress(
        2, "x", MessageQueue("T", "embedded", 1), 1, 1, 6.5
    )


def test_a_stuck_call_is_named_in_stats_metrics_and_the_log_but_the_consumer_stays_healthy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    clock = ManualClock()
    release = threading.Event()
    started = threading.Event()

    def listener(msgs: list[MessageExt]) -> None:
        if msgs[0].keys == "stuck":
            started.set()
            release.wait(30)

    registry = CollectorRegistry()
    consumer = LitePushConsumer(
        ConsumerConfig(group="g", lanes=2, slow_call_warning=60.0, poll_timeout=0.02),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener,
        clock=clock,
        registry=registry,
    )
    consumer.subscribe("T")
    caplog.set_level(logging.WARNING, logger="lite_push._exec.call_watch")
    with consumer:
        broker.send("T", b"x", keys="ok")
        broker.send("T", b"x", keys="stuck")
        wait_for(started.is_set, 10, "the stuck call")
        clock.advance(61.0)
        call = consumer.stats().longest_call
        assert call is not None
        assert (call.key, call.queue.queue_id, call.offset, call.seconds) == ("stuck", 0, 1, 61.0)
        assert registry.get_sample_value("lite_push_oldest_call_seconds", {"group": "g"}) == 61.0
        wait_for(lambda: consumer.stats().slow_calls == 1, 10, "the slow call counted")
        assert consumer.health() == ("ok", "ok")  # alive and ready: a stuck call is not a dead process
        assert registry.get_sample_value("lite_push_slow_calls_total", {"group": "g"}) == 1.0
        release.set()
        wait_for(lambda: consumer.stats().longest_call is None, 10, "no call in progress")
    lines = [r.getMessage() for r in caplog.records if "slow_call_warning" in r.getMessage()]
    assert len(lines) == 1 and "key 'stuck' (T@embedded#0 offset 1) has run 61.0 s" in lines[0]


def test_a_watch_closed_while_it_starts_neither_fails_nor_runs_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer that fails while it starts closes its watch from the pull
    thread, maybe while the watch's thread is being started (a fresh-clone
    CI run met it: "cannot join thread before it is started" ended the
    consumer's stop early).  The close waits for the start; nothing raises
    and no watch thread runs on.  Closed before it starts, it starts none."""
    lanes = [Lane(0, lambda: None)]

    def make() -> CallWatch:
        return CallWatch("race", lanes=lanes, monotonic=lambda: 0.0, steal_after=None, slow_call_warning=1.0)

    early = make()
    early.close()
    early.start()
    assert not _watch_threads()

    entered, proceed = threading.Event(), threading.Event()
    real_start = threading.Thread.start

    def slow_start(self: threading.Thread) -> None:  # the watch's thread object exists, not yet started
        if self.name == "lite-push-calls-race":
            entered.set()
            proceed.wait(10)
        real_start(self)

    watch = make()
    errors: list[BaseException] = []

    def close() -> None:
        try:
            watch.close()
        except BaseException as e:  # what the test looks for
            errors.append(e)

    closer = threading.Thread(target=close)
    monkeypatch.setattr(threading.Thread, "start", slow_start)
    starter = threading.Thread(target=watch.start)
    real_start(starter)
    assert entered.wait(10)
    real_start(closer)
    closer.join(0.2)  # the old close raised here at once; the new one waits for the start
    proceed.set()
    starter.join(10)
    closer.join(10)
    assert errors == []
    assert not _watch_threads()


def _watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "lite-push-calls-race" and t.is_alive()]
