"""Supervised lanes and pull thread (issue 16, point 2).

* A listener that raises anything but ``KeyboardInterrupt``/``SystemExit`` --
  a ``BaseException`` subclass, an async listener's own ``CancelledError`` --
  made a failed attempt: the message is retried as usual and the lane lives
  on.  (Before, such an error killed the lane and the queues feeding it
  stalled for good.)
* An unexpected error in a lane or in the pull thread (a bug, injected here)
  is logged at ERROR with its traceback and moves the consumer to a failed
  state: ``stats().failure`` says so, the consumer stops by itself, ``run()``
  raises ``ConsumerFailedError`` and ``lite-push consume`` exits 1.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from pathlib import Path

import pytest
from executors import EX
from helpers import wait_until

from lite_push import (
    AsyncLitePushConsumer,
    ConsumeFromWhere,
    ConsumeMode,
    ConsumerConfig,
    ConsumerFailedError,
    EmbeddedBroker,
    MessageExt,
    cli,
)
from lite_push._lanes.worker import LaneWorker
from lite_push._pull.flow_control import FlowControl

MESSAGES = 600


class Boom(BaseException):
    """Not an ``Exception``: what a listener may raise by mistake."""


def _broker() -> EmbeddedBroker:
    broker = EmbeddedBroker(delay_levels=(0.01,) * 18)  # CONCURRENTLY retries come back at once
    broker.create_topic("T", queue_count=4)
    broker.send_batch("T", [(str(i).encode(), f"k{i % 40}") for i in range(MESSAGES)])
    return broker


def _consumer(broker: EmbeddedBroker, listener: object, **cfg: object) -> object:
    cfg.setdefault("poll_timeout", 0.02)
    cfg.setdefault("commit_interval", 0.05)
    cfg.setdefault("suspend_ms", 10)
    cfg.setdefault("retry_start_level", 1)
    consumer = EX.consumer(
        ConsumerConfig(group="g", lanes=8, max_reconsume_times=-1, **cfg),  # type: ignore[arg-type]
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener,  # type: ignore[arg-type]
    )
    consumer.subscribe("T")
    return consumer


def _break_a_lane(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Inject a lane bug: the second segment a lane completes raises
    (after its listener calls succeeded).  Returns the call counter."""
    real = LaneWorker.completed
    calls = [0]

    def completed(self: LaneWorker, *args: object) -> None:
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("injected lane bug")
        real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(LaneWorker, "completed", completed)
    return calls


@pytest.mark.usefixtures("executor")
@pytest.mark.parametrize("mode", [ConsumeMode.KEY_ORDERLY, ConsumeMode.CONCURRENTLY])
def test_a_listener_raising_a_base_exception_is_a_failed_attempt(mode: ConsumeMode) -> None:
    attempts: Counter[bytes] = Counter()
    done: set[bytes] = set()
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> None:
        for m in msgs:
            with lock:
                attempts[m.body] += 1
                first = attempts[m.body] == 1
            if first and int(m.body) % 7 == 0:
                raise Boom(f"message {m.body!r}")
            with lock:
                done.add(m.body)

    with EmbeddedBroker(delay_levels=(0.01,) * 18) as broker:
        broker.create_topic("T", queue_count=4)
        broker.send_batch("T", [(str(i).encode(), f"k{i % 40}") for i in range(MESSAGES)])
        c = _consumer(broker, listener, mode=mode)
        with c:
            assert wait_until(lambda: len(done) == MESSAGES, timeout=60), (len(done), c.stats())
            st = c.stats()
            assert st.failure is None and st.polling
            assert st.retried >= MESSAGES // 7
    assert all(attempts[str(i).encode()] >= 2 for i in range(0, MESSAGES, 7))


@pytest.mark.parametrize("executor", ["asyncio", "uvloop"], indirect=True)
def test_an_async_listener_cancelling_itself_is_a_failed_attempt(executor: object) -> None:
    attempts: Counter[bytes] = Counter()
    done: set[bytes] = set()

    async def listener(msgs: list[MessageExt]) -> None:
        for m in msgs:
            attempts[m.body] += 1
            if attempts[m.body] == 1 and int(m.body) % 5 == 0:
                raise asyncio.CancelledError("a listener's own cancellation, not the lane's")
            done.add(m.body)

    with _broker() as broker:
        c = _consumer(broker, listener)
        with c:
            assert wait_until(lambda: len(done) == MESSAGES, timeout=60), (len(done), c.stats())
            assert c.stats().failure is None
        # shutdown still cancels the lanes' own tasks (the context exited)
    assert all(attempts[str(i).encode()] == 2 for i in range(0, MESSAGES, 5))


@pytest.mark.usefixtures("executor")
def test_a_lane_that_fails_stops_the_consumer_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = _break_a_lane(monkeypatch)
    with _broker() as broker, caplog.at_level(logging.ERROR, logger="lite_push"):
        c = _consumer(broker, lambda msgs: None)
        c.start()
        try:
            assert wait_until(lambda: not c.stats().polling, timeout=30), (calls, c.stats())  # it stopped by itself
            st = c.stats()
            assert st.failure == "RuntimeError: injected lane bug"
            assert isinstance(c.failure, RuntimeError)
        finally:
            c.shutdown()
        # logged at ERROR with the traceback
        records = [r for r in caplog.records if "lane" in r.getMessage() and r.exc_info]
        assert records and records[0].levelno == logging.ERROR
        # what was not finished stays uncommitted: a new member gets every message again or later
        offsets = [broker.committed("g", q) for q in broker.queues("T")]
        committed = sum(om.offset for om in offsets if om is not None)
        assert committed < MESSAGES


@pytest.mark.usefixtures("executor")
def test_a_pull_thread_that_fails_stops_the_consumer(monkeypatch: pytest.MonkeyPatch) -> None:
    def apply(self: FlowControl) -> None:
        raise RuntimeError("injected pull-thread bug")

    monkeypatch.setattr(FlowControl, "apply", apply)
    with _broker() as broker:
        c = _consumer(broker, lambda msgs: None)
        c.start()
        try:
            assert wait_until(lambda: c.stats().failure is not None, timeout=30)
            assert wait_until(lambda: not c.stats().polling, timeout=30)
            assert c.stats().failure == "RuntimeError: injected pull-thread bug"
        finally:
            c.shutdown()


def test_run_raises_when_the_consumer_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    _break_a_lane(monkeypatch)

    async def listener(msgs: list[MessageExt]) -> None:
        return None

    with _broker() as broker:
        c = AsyncLitePushConsumer(
            ConsumerConfig(group="g", executor="asyncio", lanes=4, poll_timeout=0.02),
            source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
            listener=listener,
        )
        c.subscribe("T")
        never: asyncio.Future[None] | None = None

        async def forever() -> None:
            nonlocal never
            never = asyncio.get_running_loop().create_future()
            await never

        with pytest.raises(ConsumerFailedError, match="injected lane bug") as info:
            c.run(forever())
        assert isinstance(info.value.__cause__, RuntimeError)


def test_the_cli_exits_1_when_the_consumer_failed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "broker"
    store.mkdir()
    with EmbeddedBroker(store) as broker:
        broker.create_topic("T", queue_count=2)
        broker.send_batch("T", [(b"x", f"k{i}") for i in range(50)])
    listeners = tmp_path / "listeners"
    listeners.mkdir()
    (listeners / "supervised_listener.py").write_text("def handle(msgs):\n    return None\n")
    monkeypatch.syspath_prepend(str(listeners))

    def completed(self: LaneWorker, *args: object) -> None:
        raise RuntimeError("injected lane bug")

    monkeypatch.setattr(LaneWorker, "completed", completed)
    code = cli.main(
        ["consume", "--source", f"embedded:{store}", "--group", "g", "--topic", "T", "--from", "first"]
        + ["--listener", "supervised_listener:handle", "--no-metrics", "--log-level", "ERROR"]
    )
    out = capsys.readouterr().out
    assert code == 1, out
    assert "consumer failed: RuntimeError: injected lane bug" in out
    assert "stopped: the consumer failed" in out
