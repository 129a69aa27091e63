"""Stopping, as a user meets it: Ctrl-C and SIGTERM sent for real.

* ``lite-push consume``: the first signal lets the listener calls running
  finish, commits what finished and lets the rest come back on the next
  start (nothing lost); ``--drain`` works through everything polled first;
  a second signal stops at once (exit 130), committing only what finished.
  The last line says what the source holds, read back.
* ``LitePushConsumer.run()`` / ``AsyncLitePushConsumer.run()``: block until
  SIGINT, SIGTERM or ``stop()`` from another thread, then a clean stop with
  no traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from helpers import wait_until

from lite_push.cli.settings import NON_CONFIG_ENV
from lite_push.sources import EmbeddedBroker
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer

LISTENER = """
import os
import time

OUT = os.environ["STOP_TEST_OUT"]


def _record(msgs):
    with open(OUT, "a") as f:
        f.write("".join(f"{m.keys} {m.queue_id} {m.queue_offset}\\n" for m in msgs))


def slow(msgs):
    time.sleep(0.01)
    _record(msgs)


def stuck(msgs):
    _record(msgs)  # started: it never finishes
    time.sleep(600)
"""


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITE_PUSH_") or k in NON_CONFIG_ENV}
    env["STOP_TEST_OUT"] = str(tmp_path / "consumed.txt")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    return env


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


class Run:
    """A command (``python -m lite_push ...`` or a script) as a subprocess,
    its output in files."""

    def __init__(self, tmp_path: Path, argv: list[str], name: str) -> None:
        (tmp_path / "stop_test_listener.py").write_text(LISTENER)
        self.consumed = tmp_path / "consumed.txt"
        self.stdout = tmp_path / f"{name}.out"
        self.stderr = tmp_path / f"{name}.err"
        with self.stdout.open("w") as out, self.stderr.open("w") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, env=_env(tmp_path), cwd=tmp_path)

    def wait_for(self, predicate: object, what: str, timeout: float = 60.0) -> None:
        assert callable(predicate)
        ok = wait_until(lambda: self.proc.poll() is not None or predicate(), timeout, 0.02)
        assert ok and self.proc.poll() is None, f"waiting for {what}\n{self.output()}"

    def out(self) -> str:
        return self.stdout.read_text()

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)

    def output(self) -> str:
        return f"stdout:\n{self.stdout.read_text()}\nstderr:\n{self.stderr.read_text()}"


def _argv(source: str, listener: str, *more: str, metrics: bool = False) -> list[str]:
    """``lite-push consume`` of topic T from the start of ``source`` with
    ``listener`` of ``stop_test_listener`` on 4 lanes (no metrics unless
    ``metrics``)."""
    return [
        sys.executable,
        "-m",
        "lite_push",
        "consume",
        "--source",
        source,
        "--group",
        "g",
        "--topic",
        "T",
        "--from",
        "first",
        "--listener",
        f"stop_test_listener:{listener}",
        "--lanes",
        "4",
        *([] if metrics else ["--no-metrics"]),
        *more,
    ]


def _consume(tmp_path: Path, data: Path, listener: str, *more: str, name: str = "consume") -> Run:
    return Run(tmp_path, _argv(f"embedded:{data}", listener, *more), name)


def _produce(data: Path, n: int, keys: int = 40) -> None:
    with EmbeddedBroker(data) as broker:
        broker.create_topic("T", 4)
        for i in range(n):
            broker.send("T", str(i).encode(), keys=f"k{i % keys}")


def _seen(lines: list[str]) -> dict[str, list[tuple[int, int]]]:
    by_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for line in lines:
        key, qid, off = line.split()
        by_key[key].append((int(qid), int(off)))
    return by_key


def _offsets(lines: list[str]) -> set[tuple[int, int]]:
    return {(q, o) for seq in _seen(lines).values() for q, o in seq}


def _every(data: Path) -> set[tuple[int, int]]:
    with EmbeddedBroker(data) as broker:
        return {(q.queue_id, o) for q in broker.queues("T") for o in range(broker.max_offset(q))}


def _last_line(run: Run) -> str:
    lines = run.out().splitlines()
    assert lines, run.output()
    return lines[-1]


def test_ctrl_c_stops_now_and_what_never_started_comes_back(tmp_path: Path) -> None:
    """3,000 messages queued for 4 lanes of a 10 ms listener: Ctrl-C does
    not work through the backlog; the next start gets the rest, and every
    message was finished by one run or the other, each key in offset order."""
    data = tmp_path / "data"
    _produce(data, 3000)
    first = _consume(tmp_path, data, "slow", name="first")
    first.wait_for(lambda: len(_lines(first.consumed)) >= 40, "40 messages consumed")
    first.signal(signal.SIGINT)
    assert first.wait() == 0, first.output()
    done_first = _lines(first.consumed)
    last = _last_line(first)
    assert last.startswith(f"stopped: consumed {len(done_first):,}; offsets committed for 4 queues"), last
    assert "polled but not finished come back" in last and "the next start resumes" in last, last
    assert len(done_first) < 3000  # the backlog was let go, not worked through
    assert "Traceback" not in first.stderr.read_text()

    second = _consume(tmp_path, data, "slow", name="second")
    every = _every(data)
    second.wait_for(lambda: _offsets(_lines(second.consumed)) >= every, "every message")
    second.signal(signal.SIGTERM)
    assert second.wait() == 0, second.output()
    lines = _lines(second.consumed)
    assert _offsets(lines) == every  # nothing lost
    done_second = lines[len(done_first) :]
    for run in (done_first, done_second):
        for key, seq in _seen(run).items():
            for qid in {q for q, _ in seq}:
                offs = [o for q, o in seq if q == qid]
                assert offs == sorted(offs), key


def test_drain_works_through_everything_polled(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _produce(data, 300)
    run = _consume(tmp_path, data, "slow", "--drain")
    run.wait_for(lambda: len(_lines(run.consumed)) >= 20, "20 messages consumed")
    run.signal(signal.SIGTERM)
    assert run.wait() == 0, run.output()
    assert "SIGTERM: stopping (waiting up to 30s for everything polled)" in run.out()
    last = _last_line(run)
    assert last == "stopped: consumed 300; offsets committed for 4 queues", last
    assert sorted(_lines(run.consumed)) == sorted(set(_lines(run.consumed))) and len(_lines(run.consumed)) == 300


def test_a_second_ctrl_c_stops_at_once_with_exit_130(tmp_path: Path) -> None:
    """Every lane stuck in a call: the first Ctrl-C waits for the calls, the
    second gives them up; nothing at or past them is committed."""
    data = tmp_path / "data"
    _produce(data, 100)
    run = _consume(tmp_path, data, "stuck")
    run.wait_for(lambda: len(_lines(run.consumed)) >= 4, "4 calls started")
    run.signal(signal.SIGINT)
    run.wait_for(lambda: "SIGINT: stopping" in run.out(), "the first stop")
    run.signal(signal.SIGINT)
    assert run.wait() == 130, run.output()
    out = run.out()
    assert "SIGINT again: stopping at once" in out
    last = _last_line(run)
    assert "4 listener calls given up at the deadline" in last and "offsets committed for 4 queues" in last, last
    assert "Traceback" not in run.stderr.read_text()
    started = _offsets(_lines(run.consumed))
    with EmbeddedBroker(data) as broker:
        for q in broker.queues("T"):
            committed = broker.committed("g", q)
            stuck_at = min((o for qid, o in started if qid == q.queue_id), default=None)
            if committed is not None and stuck_at is not None:
                assert committed.offset <= stuck_at, (q, committed, stuck_at)


RUN_SCRIPT = """
import sys
import threading

from lite_push import AsyncLitePushConsumer, ConsumerConfig, LitePushConsumer
from lite_push.sources import ConsumeFromWhere, EmbeddedBroker

import stop_test_listener

kind, how = sys.argv[1], sys.argv[2]
broker = EmbeddedBroker()
broker.create_topic("T", 2)
for i in range(200):
    broker.send("T", str(i).encode(), keys=f"k{i % 10}")
source = broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET)
if kind == "async":
    async def listener(msgs):
        stop_test_listener._record(msgs)
    consumer = AsyncLitePushConsumer(ConsumerConfig(group="g"), source, listener)
else:
    consumer = LitePushConsumer(ConsumerConfig(group="g"), source, stop_test_listener._record)
consumer.subscribe("T")
if how == "stop":
    def stop_when_done():
        while consumer.stats().consumed < 200:
            threading.Event().wait(0.01)
        consumer.stop()
    threading.Thread(target=stop_when_done, daemon=True).start()
print("running", flush=True)
report = consumer.run()
print("report:", report.summary(), flush=True)
"""


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "stop"])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_run_blocks_until_a_signal_or_stop_then_stops_cleanly(tmp_path: Path, kind: str, how: str) -> None:
    (tmp_path / "run_it.py").write_text(textwrap.dedent(RUN_SCRIPT))
    run = Run(tmp_path, [sys.executable, "run_it.py", kind, how], "run")
    run.wait_for(lambda: len(_lines(run.consumed)) >= 200, "200 messages consumed")
    if how != "stop":
        assert run.proc.poll() is None  # run() blocks while nothing stops it
        run.signal(signal.Signals[how])
    assert run.wait() == 0, run.output()
    assert "report: offsets committed for 2 queues" in run.out(), run.output()
    err = run.stderr.read_text()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_a_second_ctrl_c_stops_the_members_of_consume_processes_at_once(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """``--processes 2``, every lane stuck in a call: the first Ctrl-C waits
    for the members' calls, the second stops them at once; exit 130, and
    each member's stop is in the last line."""
    url = f"{redis_server.url}?namespace=stop-{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(redis_server.url, namespace=url.rsplit("=", 1)[1])
    try:
        broker.create_topic("T", 4)
        for i in range(200):
            broker.send("T", str(i).encode(), keys=f"k{i % 40}")
    finally:
        broker.close()
    argv = _argv(url, "stuck", "--processes", "2", metrics=True)
    run = Run(tmp_path, argv, "processes")
    run.wait_for(lambda: len(_lines(run.consumed)) >= 2, "calls started")
    run.signal(signal.SIGINT)
    run.wait_for(lambda: "SIGINT: stopping 2 members" in run.out(), "the first stop")
    run.signal(signal.SIGINT)
    assert run.wait() == 130, run.output()
    assert "SIGINT again: stopping the members at once" in run.out()
    last = _last_line(run)
    assert last.startswith("stopped: consumed 0 (2 members)") and "member 0: " in last and "member 1: " in last, last
    assert "given up at the deadline" in last, last
    assert "Traceback" not in run.stderr.read_text()


def test_consume_whose_output_reader_went_away_stops_and_commits(tmp_path: Path) -> None:
    """``lite-push consume ... | head -1``: the status line meets a closed
    pipe; the command stops as on SIGTERM (commits what finished, no ERROR
    of a source closed under its consumer) and exits 141."""
    data = tmp_path / "data"
    _produce(data, 200)
    (tmp_path / "stop_test_listener.py").write_text(LISTENER)
    argv = _argv(f"embedded:{data}", "slow", "--progress", "on")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(tmp_path), cwd=tmp_path)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    assert first.startswith(b"lite-push consume: "), first
    assert wait_until(lambda: len(_lines(tmp_path / "consumed.txt")) >= 200, timeout=60)
    proc.stdout.close()  # the reader goes away; the next status line finds the pipe closed
    try:
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read().decode()
    assert code == 141, err
    assert "Traceback" not in err and "ERROR" not in err, err
    with EmbeddedBroker(data) as broker:
        for q in broker.queues("T"):
            committed = broker.committed("g", q)
            assert committed is not None and committed.offset == broker.max_offset(q), q


STUCK_SCRIPT = """
import asyncio
import logging
import sys
import time

from lite_push import AsyncLitePushConsumer, ConsumerConfig, LitePushConsumer
from lite_push.sources import EmbeddedBroker

import stop_test_listener

logging.basicConfig(level=logging.INFO)
broker = EmbeddedBroker()
broker.create_topic("T", 2)
for i in range(20):
    broker.send("T", str(i).encode(), keys=f"k{i % 4}")
source = broker.pull_consumer("g", consume_from="first")
if sys.argv[1] == "async":
    async def listener(msgs):
        stop_test_listener._record(msgs)
        await asyncio.sleep(600)
    consumer = AsyncLitePushConsumer(ConsumerConfig(lanes=4), source, listener)
else:
    consumer = LitePushConsumer(ConsumerConfig(lanes=4), source, stop_test_listener.stuck)
consumer.subscribe("T")
report = consumer.run(timeout=300)
print("report:", report.summary(), "| finished:", report.finished, flush=True)
"""


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_second_signal_hurries_run(tmp_path: Path, kind: str) -> None:
    """``run()`` with every lane stuck in a call: the first Ctrl-C waits
    for the calls (up to the 300 s timeout), the second gives them up;
    ``run()`` returns a report that says so."""
    (tmp_path / "stuck_run.py").write_text(textwrap.dedent(STUCK_SCRIPT))
    run = Run(tmp_path, [sys.executable, "stuck_run.py", kind], "stuck")
    run.wait_for(lambda: len(_lines(run.consumed)) >= 4, "4 calls started")
    run.signal(signal.SIGINT)
    run.wait_for(lambda: "SIGINT, stopping" in run.stderr.read_text(), "the first stop")
    run.signal(signal.SIGINT)
    assert run.wait() == 0, run.output()
    out = run.out()
    assert "4 listener calls given up at the deadline" in out and "| finished: False" in out, run.output()
    assert "Traceback" not in run.stderr.read_text(), run.output()
