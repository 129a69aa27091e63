"""A Kafka cluster out of reach is told in lite_push's words only.

librdkafka's own log lines (``FAIL ... Connect to ... failed: Connection
refused``, ``1/1 brokers are down``) go to the
``lite_push.sources.kafka.librdkafka`` logger at DEBUG: a ``lite-push``
command on a ``kafka://`` URL nobody listens on prints its one-line error
and nothing else (run as subprocesses: in-process, pytest's log capture
would hide what the interpreter's last-resort handler prints), and
``--log-level DEBUG`` still shows them.  A running member that loses its
cluster logs one WARNING line, and one INFO line when a broker is back
(:class:`~lite_push.sources.kafka.reachability.Reachability`, on the
statistics of the group client; then on librdkafka's mock cluster, whose
broker is taken down and up again).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from helpers import wait_for

from lite_push.sources.kafka import KafkaBroker
from lite_push.sources.kafka.client_log import LIBRDKAFKA_LOGGER, LibrdkafkaLog
from lite_push.sources.kafka.mock_cluster import MockKafkaCluster
from lite_push.sources.kafka.reachability import Reachability
from lite_push.sources.redis_server import free_port

REPO = Path(__file__).resolve().parent.parent
REACH_LOGGER = "lite_push.sources.kafka.reachability"

#: A log record's first line, as ``consume`` formats it.
_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+): ")

#: Every command that opens a kafka:// source (``--source`` added).
COMMANDS = {
    "topic list": ["topic", "list"],
    "topic describe": ["topic", "describe", "--topic", "T"],
    "topic create": ["topic", "create", "--topic", "T", "--queues", "2"],
    "group describe": ["group", "describe", "--group", "g", "--topic", "T"],
    "group reset-offsets": ["group", "reset-offsets", "--group", "g", "--topic", "T", "--to", "first"],
    "dlq list": ["dlq", "list", "--group", "g"],
    "dlq resend": ["dlq", "resend", "--group", "g", "--all"],
    "produce": ["produce", "--topic", "T"],
    "consume": ["consume", "--group", "g", "--topic", "T", "--listener", "quiet_listener:handle", "--no-metrics"],
}


def test_every_kafka_command_on_an_unreachable_cluster_prints_one_line(tmp_path: Path) -> None:
    """Nothing listens on the port: each command fails after its first
    metadata request's wait (10 s; they run side by side), with one line on
    stderr and status 1.  ``consume --log-level DEBUG`` shows librdkafka's
    lines, at DEBUG."""
    (tmp_path / "quiet_listener.py").write_text("def handle(msgs):\n    return None\n")
    url = f"kafka://127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITE_PUSH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), str(REPO), env.get("PYTHONPATH")]))
    runs = {**COMMANDS, "consume --log-level DEBUG": [*COMMANDS["consume"], "--log-level", "DEBUG"]}
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "lite_push", *argv, "--source", url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=tmp_path,
            text=True,
        )
        for name, argv in runs.items()
    }
    done: dict[str, tuple[int, str, str]] = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate("a line\n" if name == "produce" else "", timeout=120)
            done[name] = (proc.returncode, out, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    error = f"lite-push: error: source {url}: KafkaException: "
    for name in COMMANDS:
        code, _, err = done[name]
        assert code == 1, (name, err)
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(error), (name, err)
    code, _, err = done["consume --log-level DEBUG"]
    assert code == 1 and err.splitlines()[-1].startswith(error), err
    records = [(m[1], m[2]) for line in err.splitlines() if (m := _RECORD.match(line))]
    from_librdkafka = {level for level, name in records if name == LIBRDKAFKA_LOGGER.name}
    assert from_librdkafka == {"DEBUG"}, err  # reachable, at DEBUG only
    assert "librdkafka ERROR: FAIL" in err and "Connection refused" in err
    assert [r for r in records if r[0] in ("WARNING", "ERROR", "CRITICAL")] == []


def test_librdkafka_lines_go_to_debug_with_their_level_named(caplog: pytest.LogCaptureFixture) -> None:
    log = LibrdkafkaLog(logging.getLogger("test.librdkafka"))
    with caplog.at_level(logging.DEBUG, logger="test.librdkafka"):
        log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1", "[thrd:x]: x: Connect to x failed: 100%")
        log.log(logging.WARNING, "%s [%s] %s", "SESSTMOUT", "c#consumer-2", "[thrd:main]: timed out")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.DEBUG, "librdkafka ERROR: FAIL [rdkafka#producer-1] [thrd:x]: x: Connect to x failed: 100%"),
        (logging.DEBUG, "librdkafka WARNING: SESSTMOUT [c#consumer-2] [thrd:main]: timed out"),
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="test.librdkafka"):
        log.log(logging.CRITICAL, "%s", "nothing at INFO")
    assert caplog.records == []


# -- a running member's outage ------------------------------------------------------------


def _stats(*brokers: tuple[str, str, str]) -> str:
    """librdkafka statistics with these ``(name, source, state)`` brokers."""
    return orjson.dumps({"brokers": {n: {"name": n, "source": s, "state": st} for n, s, st in brokers}}).decode()


UP = _stats(("h:1/1", "learned", "UP"), ("GroupCoordinator", "logical", "UP"), (":0/internal", "internal", "UP"))
DOWN = _stats(
    ("h:1/bootstrap", "configured", "TRY_CONNECT"),
    ("GroupCoordinator", "logical", "INIT"),
    (":0/internal", "internal", "UP"),
)
NEVER = _stats(("h:1/bootstrap", "configured", "CONNECT"), (":0/internal", "internal", "UP"))


def test_an_outage_is_one_warning_and_its_end_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    reach = Reachability("member-1", clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger=REACH_LOGGER)

    def logged() -> list[tuple[int, str]]:
        out = [(r.levelno, r.getMessage()) for r in caplog.records]
        caplog.clear()
        return out

    reach.on_stats(NEVER)  # a cluster never reached is the command's error, not an outage
    reach.on_stats("not json")
    reach.on_stats('{"brokers": 3}')
    assert logged() == [] and not reach.down
    reach.on_stats(UP)
    assert logged() == [(logging.DEBUG, "member-1: Kafka brokers reached (h:1/1 UP)")] and not reach.down
    reach.on_stats(DOWN)  # the internal broker is always up: it does not count, nor does the coordinator
    assert logged() == [
        (logging.WARNING, "member-1: no Kafka broker reachable (h:1/bootstrap TRY_CONNECT); librdkafka keeps retrying")
    ]
    assert reach.down
    now[0] += 12.5
    reach.on_stats(DOWN)
    reach.on_stats(NEVER)
    assert logged() == []  # one line per outage
    reach.on_stats(UP)
    assert logged() == [(logging.INFO, "member-1: Kafka brokers reachable again after 12.5 s")]
    reach.on_stats(UP)
    reach.on_stats(DOWN)
    assert [level for level, _ in logged()] == [logging.WARNING]  # the next outage


def test_a_member_whose_broker_goes_down_and_up_logs_it_once_each(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=REACH_LOGGER)

    def lines(level: int) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == REACH_LOGGER and r.levelno == level]

    with MockKafkaCluster() as cluster:
        broker = KafkaBroker(cluster.bootstrap, topic_creator=cluster.create_topic)
        try:
            broker.create_topic("T", 2)
            member = broker.pull_consumer("g")
            try:
                member.subscribe("T")

                def polled_until(what: str, cond: object) -> None:
                    def check() -> bool:
                        member.poll(0.1)
                        return bool(cond())  # type: ignore[operator]

                    wait_for(check, 60.0, what)

                polled_until("an assignment", member.assignment)
                polled_until("statistics with the broker up", lambda: lines(logging.DEBUG))
                cluster.broker_down(1)
                polled_until("the outage's warning", lambda: lines(logging.WARNING))
                cluster.broker_up(1)
                polled_until("the outage's end", lambda: lines(logging.INFO))
                (warning,) = lines(logging.WARNING)
                assert "no Kafka broker reachable" in warning and "librdkafka keeps retrying" in warning
                (back,) = lines(logging.INFO)
                assert "Kafka brokers reachable again after" in back
            finally:
                member.close()
        finally:
            broker.close()
