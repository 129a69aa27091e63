"""The loop watchdog on its own (``lite_push._exec.watchdog``), on a real event
loop whose time it reads from a clock the test moves: each blocking episode
is reported once, with its own duration, whether the loop turns between two
blocks or not, and closing the watch reports a block that ended since its
last look, or one still under way.  (Consumers with blocking listeners:
test_async_executor.py.)

The loop runs "lane" code of this file (:func:`fake_lane`, named to the
watchdog as the lane's function), which blocks the loop thread on an event
per message until the test lets it go.  The watchdog's wait between looks
is counted (:class:`Looks`), so the test knows when it has looked."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator

import pytest

from lite_push import ManualClock
from lite_push._exec.async_executor import LoopThread
from lite_push._exec.watchdog import LoopWatchdog

THRESHOLD = 0.1
#: How far the clock moves between two looks: under the threshold plus a
#: timer period, so no look takes the watch thread for stalled.
STEP = 0.1


class Looks(threading.Event):
    """The watchdog's ``stop``: its wait between two looks, counted."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self._cond = threading.Condition()

    def wait(self, timeout: float | None = None) -> bool:
        with self._cond:
            self.count += 1
            self._cond.notify_all()
        return super().wait(timeout)

    def looked(self) -> None:
        """Until the watch thread has looked at least once from now."""
        with self._cond:
            target = self.count + 2  # the wait under way ends, a look, the next wait
            assert self._cond.wait_for(lambda: self.count >= target, 10.0), "the watchdog did not look"


class Lane:
    """What :func:`fake_lane` blocks on: an event per message, and one set
    when it is in each call."""

    def __init__(self, msgs: list[str]) -> None:
        self.msgs = msgs
        self.entered = {m: threading.Event() for m in msgs}
        self.release = {m: threading.Event() for m in msgs}


def fake_lane(lane: Lane) -> None:
    """One listener call per message, each blocking the loop thread until
    released; nothing between them lets the loop turn."""
    for msg in lane.msgs:
        lane.entered[msg].set()
        lane.release[msg].wait(30.0)


class Watched:
    """A loop on a thread of its own, watched by a watchdog on ``clock``."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.looks = Looks()
        self.watchdog = LoopWatchdog(
            "g",
            threshold=THRESHOLD,
            lane_file=__file__,
            lane_functions=frozenset({fake_lane.__name__}),
            clock=self.clock.monotonic,
        )
        self.watchdog.stop = self.looks
        self.loop_thread = LoopThread("watched-loop")

        async def start() -> None:
            self.watchdog.start(asyncio.get_running_loop())

        self.loop_thread.call(start(), timeout=10.0)

    def run(self, lane: Lane) -> None:
        self.loop_thread.loop.call_soon_threadsafe(fake_lane, lane)

    def advance(self, seconds: float) -> None:
        """Move the clock by ``seconds``, a step at a time, the watchdog
        looking after each."""
        for _ in range(round(seconds / STEP)):
            self.clock.advance(STEP)
            self.looks.looked()


@pytest.fixture
def watched() -> Iterator[Watched]:
    w = Watched()
    yield w
    w.watchdog.close()
    w.loop_thread.stop()


def _reports(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in list(caplog.records) if "blocked the event loop" in r.getMessage()]


def test_two_listener_calls_blocking_one_after_the_other_are_two_reports(
    watched: Watched, caplog: pytest.LogCaptureFixture
) -> None:
    lane = Lane(["a", "b"])
    with caplog.at_level(logging.WARNING, logger="lite_push"):
        watched.run(lane)
        assert lane.entered["a"].wait(10.0)
        watched.advance(0.5)  # "a" blocks for 0.5 s
        lane.release["a"].set()
        assert lane.entered["b"].wait(10.0)
        watched.advance(0.5)  # then "b", with no turn of the loop between
        assert len(_reports(caplog)) == 1  # the first call ended: reported at once
        lane.release["b"].set()
        watched.looks.looked()
        watched.looks.looked()  # the loop turned, and the watchdog saw it
        reports = _reports(caplog)
    # "a": from the loop's last turn to the last look in it (0.5 s), less a
    # timer period; "b": from the first look in it, less a timer period, to
    # the turn (0.4 s): never more than the block was
    assert len(reports) == 2, reports
    assert "for 475 ms (threshold 100 ms)" in reports[0] and "fake_lane" in reports[0], reports
    assert "for 400 ms (threshold 100 ms)" in reports[1] and "fake_lane" in reports[1], reports
    assert watched.watchdog.blocks == 2 and watched.watchdog.longest_block == pytest.approx(0.475)


def test_a_block_that_ended_since_the_last_look_is_reported_by_closing(
    watched: Watched, caplog: pytest.LogCaptureFixture
) -> None:
    lane = Lane(["a"])
    with caplog.at_level(logging.WARNING, logger="lite_push"):
        watched.run(lane)
        assert lane.entered["a"].wait(10.0)
        watched.advance(0.5)
        lane.release["a"].set()
        watched.loop_thread.call(asyncio.sleep(0), timeout=10.0)  # the loop turned
        watched.watchdog.close()  # maybe before the watch thread looked again
        reports = _reports(caplog)
    assert len(reports) == 1, reports
    assert "for 475 ms" in reports[0] and "still blocked" not in reports[0], reports


def test_a_block_under_way_when_the_watch_closes_is_reported_as_it_stands(
    watched: Watched, caplog: pytest.LogCaptureFixture
) -> None:
    lane = Lane(["a"])
    try:
        with caplog.at_level(logging.WARNING, logger="lite_push"):
            watched.run(lane)
            assert lane.entered["a"].wait(10.0)
            watched.advance(1.0)
            watched.watchdog.close()  # the loop is still blocked
            reports = _reports(caplog)
    finally:
        lane.release["a"].set()
    assert len(reports) == 1, reports
    assert "for 975 ms" in reports[0] and reports[0].endswith("(still blocked as the consumer stopped)"), reports


def test_a_block_within_the_threshold_is_not_reported(watched: Watched, caplog: pytest.LogCaptureFixture) -> None:
    lane = Lane(["a"])
    with caplog.at_level(logging.DEBUG, logger="lite_push"):
        watched.run(lane)
        assert lane.entered["a"].wait(10.0)
        watched.advance(0.1)  # the loop has not turned for the threshold, not more
        lane.release["a"].set()
        watched.loop_thread.call(asyncio.sleep(0), timeout=10.0)
        watched.looks.looked()
        watched.watchdog.close()
    assert _reports(caplog) == [] and watched.watchdog.blocks == 0
