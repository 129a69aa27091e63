"""``lite-push consume``'s status line (issue 19, item 6)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

from helpers import wait_until

from lite_push import ConsumerStats, EmbeddedBroker, MessageQueue
from lite_push.cli.progress import Status
from lite_push.sources import PullSource

Q0, Q1 = MessageQueue("T", "b", 0), MessageQueue("T", "b", 1)


class _Ends:
    """The one thing the status line asks the source."""

    def __init__(self, ends: dict[MessageQueue, int] | None, fail: bool = False) -> None:
        self.ends, self.fail = ends, fail

    def end_offsets(self, queues: list[MessageQueue]) -> dict[MessageQueue, int]:
        if self.fail:
            raise ConnectionError("down")
        return {q: e for q, e in (self.ends or {}).items() if q in queues}


def _stats(consumed: int, **kw: object) -> ConsumerStats:
    base: dict[str, object] = {
        "consumed": consumed,
        "retried": 0,
        "in_flight": {Q0: 5, Q1: 7},
        "in_flight_bytes": {Q0: 1, Q1: 1},
        "paused": frozenset({Q1}),
        "committed": {Q0: 100, Q1: 40},
        "lane_depths": (0,),
        "dead_lettered": 2,
    }
    base.update(kw)
    return ConsumerStats(**base)  # type: ignore[arg-type]


def test_a_line_every_interval_with_rate_lag_in_flight_and_paused() -> None:
    out = io.StringIO()
    start = 1000.0
    status = Status(out, _Ends({Q0: 130, Q1: 50}), interval=5.0, start=start)  # type: ignore[arg-type]
    assert not status.tick(_stats(100), now=start + 4.9)
    assert status.tick(_stats(1_000), now=start + 5.0)
    assert out.getvalue() == ("consumed 1,000 (+200/s)  lag 40  in flight 12  paused 1 of 2 queues  dead letters 2\n")
    assert not status.tick(_stats(2_000), now=start + 9.0)
    assert status.tick(_stats(6_000), now=start + 10.0)
    assert out.getvalue().splitlines()[1].startswith("consumed 6,000 (+1,000/s)")


def test_the_line_prints_when_the_source_cannot_tell_its_ends() -> None:
    out = io.StringIO()
    source: PullSource = _Ends(None, fail=True)  # type: ignore[assignment]
    status = Status(out, source, interval=1.0, start=0.0)
    assert status.tick(_stats(10), now=1.0)
    assert " lag 0 " in out.getvalue()


def test_consume_prints_the_status_line_with_progress_on(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    broker = EmbeddedBroker(data)
    broker.create_topic("T", queue_count=2)
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(500)])
    broker.close()
    (tmp_path / "progress_listener.py").write_text("def handle(msgs):\n    pass\n")
    out = tmp_path / "out.txt"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "LITE_PUSH_COMMIT_INTERVAL": "0.5"}  # committed by the line
    argv = [
        sys.executable,
        "-m",
        "lite_push",
        "consume",
        "--source",
        f"embedded:{data}",
        "--group",
        "g",
        "--topic",
        "T",
        "--listener",
        "progress_listener:handle",
        "--from",
        "first",
        "--progress",
        "on",
    ]
    with out.open("w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.DEVNULL, env=env, cwd=tmp_path)
    try:
        assert wait_until(lambda: "consumed 500 " in out.read_text(), timeout=30), out.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    line = next(x for x in out.read_text().splitlines() if x.startswith("consumed 500 "))
    assert " lag 0 " in line and "in flight 0" in line and "paused 0 of 2 queues" in line


def test_a_long_call_is_named_on_the_line() -> None:
    from lite_push import CallInProgress

    out = io.StringIO()
    status = Status(out, _Ends({Q0: 100, Q1: 40}), interval=1.0, start=0.0)  # type: ignore[arg-type]
    short = CallInProgress(2, "acct-1", Q0, 7, 1, 4.9)
    assert status.tick(_stats(10, longest_call=short), now=1.0)
    assert "longest call" not in out.getvalue()  # under SLOW_CALL: a call like any other
    stuck = CallInProgress(3, "acct-7", Q1, 9120, 1, 73.44)
    assert status.tick(_stats(20, longest_call=stuck), now=2.0)
    assert (
        out.getvalue()
        .splitlines()[1]
        .endswith("dead letters 2  longest call: key 'acct-7' (T@b#1 offset 9,120) has run 73.4 s on lane 3")
    )
