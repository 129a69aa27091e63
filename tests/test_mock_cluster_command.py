"""``python -m lite_push.sources.kafka.mock_cluster`` as a user starts it
(issue 41): with no arguments a local Kafka (librdkafka's mock cluster, one
broker on 127.0.0.1) whose ``kafka://`` URL is the first line it prints;
lite-push lists, produces to and consumes its topics through that URL; it
runs until SIGTERM or SIGINT and then exits 0 without a traceback.  Its
options have ``--help``; bad ones are one line, exit status 2."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from helpers import wait_until
from test_cli import Service, _check_consumed
from test_cli_topic import cli_env, lite_push, ok, one_line_error

from lite_push.sources.kafka import KafkaBroker
from lite_push.sources.redis_server import free_port

MODULE = "lite_push.sources.kafka.mock_cluster"
PROG = f"python -m {MODULE}"


class Cluster:
    """The command running, and the lines it printed at the start."""

    def __init__(self, *argv: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", MODULE, *argv],
            stdin=subprocess.DEVNULL,  # a user's mock reads nothing from it
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=cli_env(),
            text=True,
        )
        self.lines = [self._line() for _ in range(3)]
        self.url = self.lines[0]

    def _line(self, timeout: float = 30.0) -> str:
        box: list[str] = []
        out = self.proc.stdout
        assert out is not None
        reader = threading.Thread(target=lambda: box.append(out.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        assert box and box[0], f"no line from the mock cluster (exit {self.proc.poll()})"
        return box[0].rstrip("\n")

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> tuple[int, str]:
        """Send ``sig`` by PID; its exit status and what it said on stderr."""
        self.proc.send_signal(sig)
        _, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=10)


@pytest.fixture
def started() -> Iterator[list[Cluster]]:
    """The clusters a test starts, killed at its end if still running."""
    clusters: list[Cluster] = []
    yield clusters
    for c in clusters:
        c.kill()


def test_with_no_arguments_it_serves_one_broker_and_stops_cleanly_on_sigterm(started: list[Cluster]) -> None:
    c = Cluster()
    started.append(c)
    assert re.fullmatch(r"kafka://127\.0\.0\.1:[0-9]+", c.url), c.lines
    servers = c.url.removeprefix("kafka://")
    assert c.lines[1:] == [
        f"librdkafka's mock Kafka cluster: 1 broker in memory, bootstrap.servers={servers}; topics: none (make "
        "them with --topic NAME:PARTITIONS)",
        "give lite-push the URL above as --source; Ctrl-C or SIGTERM stops it",
    ]
    r = lite_push("topic", "list", "--source", c.url)
    assert r.returncode == 0 and r.stdout == b"" and r.stderr.decode().startswith(f"no topics on {c.url}")
    # it has no CreateTopics: lite-push says how to make the topic
    line = one_line_error(lite_push("topic", "create", "--source", c.url, "--topic", "orders", "--queues", "2"), 1)
    assert line.endswith(f"as {PROG} runs it: start it with --topic orders:2)"), line
    code, err = c.stop(signal.SIGTERM)
    assert (code, err) == (0, "SIGTERM: stopped\n")


def test_lite_push_produces_to_and_consumes_its_topic(started: list[Cluster], tmp_path: Path) -> None:
    c = Cluster("--topic", "orders:3", "--topic", "audit")
    started.append(c)
    assert c.lines[1].endswith("topics: orders (3 partitions), audit (1 partition)"), c.lines
    assert ok(lite_push("topic", "list", "--source", c.url)) == [
        "topic=audit queues=1 messages=0",
        "topic=orders queues=3 messages=0",
    ]
    n, keys = 60, 7
    sent: dict[str, list[int]] = {}
    for i in range(n):
        sent.setdefault(f"k{i % keys}", []).append(i)
    stdin = "".join(f"k{i % keys}:{i}\n" for i in range(n)).encode()
    assert ok(lite_push("produce", "--source", c.url, "--topic", "orders", "--key-separator", ":", stdin=stdin)) == [
        f"sent {n} messages to orders"
    ]
    service = Service(
        tmp_path,
        [
            "--source",
            c.url,
            "--topic",
            "orders",
            "--group",
            "g",
            "--listener",
            "cli_test_listener:handle",
            "--from",
            "first",
        ],
    )
    try:
        lines = service.wait_consumed(n)
        assert service.stop() == 0, service.output()
    finally:
        service.kill()
    _check_consumed(lines, sent)
    r = lite_push("group", "describe", "--source", c.url, "--group", "g", "--topic", "orders")
    assert r.returncode in (0, 1)  # the mock cannot list a group's members (DescribeConsumerGroups)
    code, err = c.stop(signal.SIGINT)  # Ctrl-C
    assert (code, err) == (0, "SIGINT: stopped\n")


def test_a_group_of_two_processes_forms_at_once_on_it(started: list[Cluster], tmp_path: Path) -> None:
    """Issue 41: ``consume --processes 2`` on a topic of 1,000 messages in 8
    partitions, with Kafka's default session (45 s).  The mock ends a join
    into a group already formed only when its timer (session - 1 s) runs
    out; started as a user starts it, with the broker's initial rebalance
    delay (3 s), both members join the first generation, 4 partitions each.
    The last line says what each member's stop committed, read back from
    the group, which holds the end of every partition."""
    c = Cluster("--topic", "orders:8")
    started.append(c)
    n = 1000
    stdin = "".join(f"k{i % 37}:{i}\n" for i in range(n)).encode()
    assert ok(lite_push("produce", "--source", c.url, "--topic", "orders", "--key-separator", ":", stdin=stdin))
    service = Service(
        tmp_path,
        [
            "--source",
            c.url,
            "--group",
            "g",
            "--topic",
            "orders",
            "--from",
            "first",
            "--listener",
            "cli_test_listener:handle",
            "--processes",
            "2",
        ],
    )
    described = lite_push("topic", "describe", "--source", c.url, "--topic", "orders", "--json")
    ends = {q["queue"]: q["end"] for q in orjson.loads(described.stdout)["queues"]}
    broker = KafkaBroker(c.url.removeprefix("kafka://"))

    def committed_to_the_end() -> bool:
        held = {q.queue_id: broker.committed("g", q) for q in broker.queues("orders")}
        return all((h.offset if h is not None else 0) == ends[qid] for qid, h in held.items())

    try:
        service.wait_consumed(n, timeout=60)
        # Each member commits once its work is done.  (Stopped before that, the
        # member that leaves last may have its commits refused: the mock
        # refuses commits while a group re-forms, where a broker takes those
        # of the current generation; the last line would say so.)
        assert wait_until(committed_to_the_end, timeout=30), service.output()
        assert service.stop() == 0, service.output()
    finally:
        service.kill()
        broker.close()
    out = service.stdout.read_text()
    for member in (0, 1):
        assert f"member {member}: offsets committed for 4 queues" in out, out


def test_a_fixed_port(started: list[Cluster]) -> None:
    port = free_port()
    c = Cluster("--port", str(port), "--topic", "orders:2")
    started.append(c)
    assert c.url == f"kafka://127.0.0.1:{port}"
    assert ok(lite_push("produce", "--source", c.url, "--topic", "orders", stdin=b"a\nb\n")) == [
        "sent 2 messages to orders"
    ]
    assert ok(lite_push("topic", "describe", "--source", c.url, "--topic", "orders"))[-1] == (
        "topic=orders queues=2 messages=2"
    )
    # a second one cannot have that port: one line, exit 1
    busy = subprocess.run(
        [sys.executable, "-m", MODULE, "--port", str(port)],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
        check=False,
    )
    assert (busy.returncode, busy.stdout) == (1, "")
    assert busy.stderr.count("\n") == 1, busy.stderr
    assert busy.stderr.startswith(f"{PROG}: error: port {port}: Address already in use"), busy.stderr
    assert c.stop()[0] == 0


def test_a_fixed_port_without_pytest_says_what_it_needs() -> None:
    code = (
        "import sys; sys.modules['pytest'] = None  # as if it were not installed\n"
        f"from {MODULE} import main; main(['--port', '{free_port()}'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=60, check=False
    )
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"{PROG}: error: --port forwards each broker's port through lite_push.testing.TcpProxy, which needs "
        "pytest: pip install 'lite-push[testing]' (without --port the brokers listen on free ports)\n"
    )


def test_help_and_bad_options() -> None:
    done = subprocess.run(
        [sys.executable, "-m", MODULE, "--help"], capture_output=True, text=True, env=cli_env(), timeout=60, check=False
    )
    assert done.returncode == 0 and done.stderr == ""
    for option in (
        "--brokers N",
        "--port PORT",
        "--topic NAME[:PARTITIONS]",
        "--rebalance-delay-ms MS",
        "default: 3000, Kafka's own",
        "--commands",
        "Ctrl-C or SIGTERM",
    ):
        assert option in " ".join(done.stdout.split()), option
    for argv, says in [
        (["--brokers", "0"], "argument --brokers: expected an int >= 1, got '0'"),
        (["--rebalance-delay-ms", "-1"], "argument --rebalance-delay-ms: expected an int >= 0, got '-1'"),
        (["--port", "65535", "--brokers", "2"], "argument --port: 2 broker(s) from port 65535 go past 65535"),
        (["--topic", "orders:0"], "argument --topic: expected NAME or NAME:PARTITIONS (a count >= 1), got 'orders:0'"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["3", "0"], "unrecognized arguments: 3 0"),  # the helper's old positional arguments
    ]:
        done = subprocess.run(
            [sys.executable, "-m", MODULE, *argv],
            capture_output=True,
            text=True,
            env=cli_env(),
            timeout=60,
            check=False,
        )
        assert (done.returncode, done.stdout, done.stderr) == (2, "", f"{PROG}: error: {says}\n")
