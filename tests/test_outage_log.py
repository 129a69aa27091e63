"""A source that goes away logs one warning line per episode, not a
traceback.

A commit (or poll, or lock) that keeps failing is logged by ``Episode``: the
first failure as one WARNING line naming the error, its traceback at DEBUG
only, the later failures at DEBUG, the recovery at INFO.  Before, the first
warning carried the client library's chained traceback: some forty lines
for one Redis outage.  Shown on the committer alone, then on ``lite-push
consume`` as a subprocess whose redis-server is killed under it.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest
from helpers import wait_for

from lite_push import ConsumerConfig, EmbeddedBroker, MessageExt, MessageQueue, OffsetAndMetadata
from lite_push._pull.committer import Committer
from lite_push._pull.flow_control import low_water
from lite_push._state.process_queue import ProcessQueue
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer

REPO = Path(__file__).resolve().parent.parent
MQ = MessageQueue("T", "embedded", 0)
COMMIT_LOGGER = "lite_push._state.shared"


class _Down(Exception):
    """What a client library raises for a server that is not there: an
    error chained to the socket's (as redis-py's ``ConnectionError``)."""


def _refused() -> None:
    try:
        raise ConnectionRefusedError(111, "Connection refused")
    except OSError as e:
        raise _Down("Error 111 connecting to 127.0.0.1:6379.\nConnection refused.") from e


def _records(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str, bool]]:
    """The commit episode's records: level, message, whether a traceback."""
    out = [(r.levelno, r.getMessage(), r.exc_info is not None) for r in caplog.records if r.name == COMMIT_LOGGER]
    caplog.clear()
    return out


def test_a_commit_that_keeps_failing_logs_one_line_per_episode(
    broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    source = broker.pull_consumer("g")
    source.subscribe("T")
    source.poll(0.0)
    down = True
    real_commit = source.commit

    def commit(offsets: Mapping[MessageQueue, OffsetAndMetadata]) -> None:
        if down:
            _refused()
        real_commit(offsets)

    source.commit = commit  # type: ignore[method-assign]
    pq = ProcessQueue(
        MQ, next_offset=0, keyless_lane=0, resume_at=low_water(ConsumerConfig(group="g")), wake=lambda: None
    )
    msgs = [MessageExt("T", 0, i, b"x", keys="k") for i in range(4)]
    pq.add_batch(msgs, 4)
    pq.owned_until = float("inf")
    committer = Committer(source, owned={MQ: pq}, group="g")
    caplog.set_level(logging.DEBUG, logger=COMMIT_LOGGER)
    try:
        pq.complete(msgs[:1])
        assert committer.commit_all()
        warning, traceback = _records(caplog)
        assert warning == (
            logging.WARNING,
            "commit failed for consumer 'g' (1 queue(s)); retrying "
            "(_Down: Error 111 connecting to 127.0.0.1:6379. Connection refused.)",
            False,
        )
        assert traceback[0] == logging.DEBUG and traceback[2]  # the traceback, for whoever wants it
        pq.complete(msgs[1:2])
        assert committer.commit_all()
        assert _records(caplog) == [(logging.DEBUG, "commit failed again for consumer 'g' (1 queue(s))", True)]
        down = False
        pq.complete(msgs[2:3])
        assert committer.commit_all()
        assert _records(caplog) == [(logging.INFO, "commit recovered for consumer 'g'", False)]
        committed = source.committed(MQ)
        assert committed is not None and committed.offset == 3
        down = True  # a new episode: a new warning
        pq.complete(msgs[3:])
        assert committer.commit_all()
        assert [(level, has_trace) for level, _, has_trace in _records(caplog)] == [
            (logging.WARNING, False),
            (logging.DEBUG, True),
        ]
    finally:
        source.close()


# -- lite-push consume while its redis-server goes away -----------------------------------

SLOW_LISTENER = """
import time

def handle(msgs):
    time.sleep(0.02)
"""

#: A log record's first line, as ``consume`` formats it.
_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+): (.*)$")


def _records_of(text: str) -> list[tuple[str, str, str, list[str]]]:
    """The log records of a stderr: level, logger, message and the lines
    that follow the first (a traceback)."""
    records: list[tuple[str, str, str, list[str]]] = []
    for line in text.splitlines():
        m = _RECORD.match(line)
        if m:
            records.append((m[1], m[2], m[3], []))
        else:
            assert records, f"output before the first log record: {line!r}"
            records[-1][3].append(line)
    return records


def test_consume_logs_a_redis_outage_as_one_warning_line_per_episode(tmp_path: Path) -> None:
    """``lite-push consume --log-level DEBUG`` on a real redis-server,
    killed while the listener works: the commit fails, again and again (at
    DEBUG, with the traceback), and at WARNING it is one line."""
    ns = f"outage-{uuid.uuid4().hex[:8]}"
    (tmp_path / "slow_listener.py").write_text(SLOW_LISTENER)
    err_path = tmp_path / "stderr.txt"
    with RedisServer(appendonly=False) as server:
        broker = RedisBroker(server.url, namespace=ns)
        try:
            broker.create_topic("T", 4)
            broker.send_batch("T", [{"body": b"x", "keys": f"k{i}"} for i in range(20000)])
            committed = lambda: any(broker.committed("g", q) is not None for q in broker.queues("T"))  # noqa: E731
            env = {k: v for k, v in os.environ.items() if not k.startswith("LITE_PUSH_")}
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), str(REPO), env.get("PYTHONPATH")]))
            argv = ["--source", f"{server.url}?namespace={ns}", "--group", "g", "--topic", "T", "--from", "first"]
            argv += ["--listener", "slow_listener:handle", "--no-metrics", "--log-level", "DEBUG"]
            with err_path.open("w") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "lite_push", "consume", *argv],
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    env=env,
                    cwd=tmp_path,
                )
            try:
                wait_for(committed, 60.0, lambda: f"a first commit; stderr:\n{err_path.read_text()[-3000:]}")
                server.kill()  # by its PID, under the consumer's feet
                wait_for(
                    lambda: "commit failed again for consumer 'g'" in err_path.read_text(),
                    60.0,
                    lambda: f"a second failed commit; stderr:\n{err_path.read_text()[-3000:]}",
                )
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
        finally:
            broker.close()
    records = _records_of(err_path.read_text())
    commit = [r for r in records if r[2].startswith("commit ") and r[0] != "DEBUG"]
    assert len(commit) == 1, commit
    level, logger, message, more = commit[0]
    assert (level, logger, more) == ("WARNING", COMMIT_LOGGER, []), commit  # one line
    refused = f"ConnectionError: Error 111 connecting to 127.0.0.1:{server.port}. Connection refused."
    episode = rf"commit failed for consumer 'g' \([1-4] queue\(s\)\); retrying \({re.escape(refused)}\)"
    assert re.fullmatch(episode, message), message
    again = [r for r in records if r[2].startswith("commit failed again for consumer 'g'")]
    assert again and all(level == "DEBUG" and more for level, _, _, more in again)  # the tracebacks, at DEBUG
    # every traceback line in the whole log belongs to a DEBUG record
    assert [r[:3] for r in records if r[3] and r[0] != "DEBUG"] == []
