"""Run librdkafka's mock Kafka cluster: a local Kafka for trying lite_push,
and for its tests, benchmarks and demos.

The confluent-kafka wheel ships librdkafka, and librdkafka carries a Kafka
protocol server of its own: the *mock cluster* (``rd_kafka_mock_cluster_new``),
which answers Metadata, Produce, Fetch, ListOffsets, the consumer-group
protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit with
metadata, OffsetFetch) and more, on loopback sockets.  It has no admin API
(CreateTopics is refused), so topics are created through its C API.

By hand, ``python -m lite_push.sources.kafka.mock_cluster`` starts one (1
broker by default, on 127.0.0.1, on a free port or ``--port``; Kafka's
3 s initial rebalance delay, so the members of a group started together
form it together), makes the ``--topic NAME:PARTITIONS`` topics, prints the
``kafka://`` URL to give ``lite-push --source``, and runs until Ctrl-C or
SIGTERM (exit status 0; everything it holds is in memory, and gone then).
``--help`` lists the options.

:class:`MockKafkaCluster` starts it in a helper process of its own (the
same command with ``--commands``: the hosting side is
:mod:`.mock_server`), which prints its bootstrap servers and then serves
one command per line on its standard input:

    topic <name> <partitions>     create a topic   -> "ok" or "error <text>"
    down <broker id>              the broker stops answering (its connections drop)
    up <broker id>                ... and answers again
    errors <api key> <code>...    the next requests of that API get these errors

It is stopped by its PID (SIGTERM, then SIGKILL); closing its standard
input stops it too, so it never outlives the process that started it.

    with MockKafkaCluster(brokers=3) as cluster:
        cluster.create_topic("orders", 8)
        producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap})

What the mock does not do as a real broker would: it keeps everything in
memory, does not enforce ``offset.metadata.max.bytes`` (lite_push's own
tests check the 4,096-byte bound of its commit metadata) and has no
CreateTopics.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import NoReturn

from .library import librdkafka_path
from .mock_server import MockServer, MockServerError

__all__ = ["KAFKA_REBALANCE_DELAY_MS", "MockClusterError", "MockKafkaCluster", "librdkafka_path", "main"]

logger = logging.getLogger(__name__)

#: The command's initial rebalance delay, Kafka's default: the members of a
#: ``consume --processes N`` started together join the group's first
#: generation (the mock lets a member join a group already up only after
#: its session timeout less a second).  :class:`MockKafkaCluster` makes new
#: groups form at once instead (its ``rebalance_delay_ms``, 0).
KAFKA_REBALANCE_DELAY_MS = 3000


class MockClusterError(RuntimeError):
    """The mock cluster could not be started, or refused a command."""


class MockKafkaCluster:
    """librdkafka's mock cluster in a helper process, on 127.0.0.1.

    ``brokers``: how many brokers it has; ``rebalance_delay_ms``: the
    group coordinator's initial rebalance delay (Kafka's
    ``group.initial.rebalance.delay.ms``; 0 makes a new group form at once).
    """

    def __init__(self, brokers: int = 1, *, rebalance_delay_ms: int = 0, start_timeout: float = 20.0) -> None:
        if type(brokers) is not int or brokers < 1:
            raise ValueError(f"brokers must be an int >= 1, got {brokers!r}")
        self.brokers = brokers
        self.rebalance_delay_ms = rebalance_delay_ms
        self.start_timeout = start_timeout
        self._proc: subprocess.Popen[str] | None = None
        self._bootstrap = ""
        self._lock = threading.Lock()

    @property
    def bootstrap(self) -> str:
        """``host:port[,host:port...]`` for ``bootstrap.servers``."""
        if not self._bootstrap:
            raise MockClusterError("the mock cluster is not running")
        return self._bootstrap

    @property
    def pid(self) -> int | None:
        """The helper process's PID (None when not running)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def start(self) -> MockKafkaCluster:
        if self._proc is not None:
            return self
        cmd = [
            sys.executable,
            "-m",
            __name__,
            "--commands",
            "--brokers",
            str(self.brokers),
            "--rebalance-delay-ms",
            str(self.rebalance_delay_ms),
        ]
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1
        )
        line = self._read_line(self.start_timeout)
        if not line.startswith("bootstrap "):
            self.stop()
            raise MockClusterError(f"the mock cluster did not start: {line!r}")
        self._bootstrap = line.split(" ", 1)[1]
        logger.info("mock Kafka cluster (pid %d) on %s", self._proc.pid, self._bootstrap)
        return self

    def _read_line(self, timeout: float) -> str:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        if not box:
            raise MockClusterError(f"the mock cluster (pid {proc.pid}) did not answer within {timeout:g}s")
        return box[0].strip()

    def create_topic(self, name: str, partitions: int) -> None:
        """Create ``name`` with ``partitions`` partitions (replication 1).
        Raises :class:`MockClusterError` naming the topic when refused
        (for example, it exists already)."""
        if not name or any(c.isspace() for c in name):
            raise ValueError(f"topic name must be non-empty without spaces, got {name!r}")
        self._command(f"topic {name} {int(partitions)}")

    def broker_down(self, broker_id: int = 1) -> None:
        """Take broker ``broker_id`` (1-based) down: its connections drop and
        new ones are refused (a network partition, as a client sees it)."""
        self._command(f"down {int(broker_id)}")

    def broker_up(self, broker_id: int = 1) -> None:
        """Bring broker ``broker_id`` back."""
        self._command(f"up {int(broker_id)}")

    def push_request_errors(self, api_key: int, errors: Sequence[int]) -> None:
        """Answer the next ``len(errors)`` requests of Kafka API ``api_key``
        (8: OffsetCommit, ...) with these error codes, one each, whoever
        sends them (a coordinator refusing commits, as a client sees it)."""
        self._command(f"errors {int(api_key)} " + " ".join(str(int(e)) for e in errors))

    def _command(self, line: str) -> None:
        with self._lock:
            proc = self._proc
            if proc is None or proc.stdin is None:
                raise MockClusterError("the mock cluster is not running")
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            answer = self._read_line(10.0)
        if answer != "ok":  # "error <what>: <why>"
            raise MockClusterError(answer.removeprefix("error "))

    def stop(self) -> None:
        """Stop the helper process by its PID (SIGTERM, then SIGKILL)."""
        proc, self._proc = self._proc, None
        self._bootstrap = ""
        if proc is None:
            return
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(5.0)
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:  # pragma: no cover - a broken pipe at exit
                    pass

    def __enter__(self) -> MockKafkaCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# -- the command ------------------------------------------------------------------------


def _topic(spec: str) -> tuple[str, int]:
    """``NAME`` or ``NAME:PARTITIONS`` (1 by default)."""
    m = re.fullmatch(r"([^\s:]+)(?::([0-9]+))?", spec)
    if m is None or (m.group(2) is not None and int(m.group(2)) < 1):
        raise argparse.ArgumentTypeError(f"expected NAME or NAME:PARTITIONS (a count >= 1), got {spec!r}")
    return m.group(1), int(m.group(2) or 1)


def _int_from(low: int) -> Callable[[str], int]:
    """An argparse type: an int >= ``low``."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = low - 1
        if n < low:
            raise argparse.ArgumentTypeError(f"expected an int >= {low}, got {text!r}")
        return n

    return parse


class _Parser(argparse.ArgumentParser):
    """Bad arguments are one line (``PROG: error: ...``) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m lite_push.sources.kafka.mock_cluster",
        description="A local Kafka to try lite_push on: librdkafka's mock cluster (it comes with the "
        "confluent-kafka wheel), in memory, on 127.0.0.1. It prints the kafka:// URL to give lite-push as "
        "--source and runs until Ctrl-C or SIGTERM. It has no CreateTopics (lite-push topic create is "
        "refused): make its topics with --topic.",
    )
    p.add_argument("--brokers", type=_int_from(1), default=1, metavar="N", help="how many brokers (default: 1)")
    p.add_argument(
        "--port",
        type=_int_from(1),
        default=None,
        help="broker 1 listens on PORT, broker 2 on PORT+1, ... (default: free ports the kernel picks)",
    )
    p.add_argument(
        "--topic",
        type=_topic,
        action="append",
        default=[],
        metavar="NAME[:PARTITIONS]",
        help="make this topic at the start (1 partition by default); may be given again",
    )
    p.add_argument(
        "--rebalance-delay-ms",
        type=_int_from(0),
        default=KAFKA_REBALANCE_DELAY_MS,
        metavar="MS",
        help="the group coordinator's initial rebalance delay (Kafka's group.initial.rebalance.delay.ms; "
        f"default: {KAFKA_REBALANCE_DELAY_MS}, Kafka's own: the members that join a new group within it form its "
        "first generation together)",
    )
    p.add_argument(
        "--commands",
        action="store_true",
        help="for MockKafkaCluster: print 'bootstrap HOST:PORT,...', then serve the commands 'topic NAME "
        "PARTITIONS', 'down ID' and 'up ID' on standard input until it closes",
    )
    return p


def _announce(server: MockServer, topics: list[tuple[str, int]]) -> None:
    """The lines a user reads at the start: the URL alone on the first."""
    n = len(server.brokers)
    made = ", ".join(f"{t} ({k} partition{'' if k == 1 else 's'})" for t, k in topics)
    print(f"kafka://{server.bootstrap}")
    print(
        f"librdkafka's mock Kafka cluster: {n} broker{'' if n == 1 else 's'} in memory, bootstrap.servers="
        f"{server.bootstrap}; topics: {made or 'none (make them with --topic NAME:PARTITIONS)'}"
    )
    print("give lite-push the URL above as --source; Ctrl-C or SIGTERM stops it", flush=True)


def main(argv: Sequence[str] | None = None) -> NoReturn:  # pragma: no cover - runs in the hosting process
    """The command (see the module's documentation); the process ends here."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.port is not None and args.port + args.brokers - 1 > 65535:
        parser.error(f"argument --port: {args.brokers} broker(s) from port {args.port} go past 65535")
    try:
        server = MockServer(args.brokers, rebalance_delay_ms=args.rebalance_delay_ms, port=args.port)
        for name, partitions in args.topic:
            server.create_topic(name, partitions)
    except MockServerError as e:
        if args.commands:  # the starter reads the error on stdout
            print(f"error {e}", flush=True)
        else:
            print(f"{parser.prog}: error: {e}", file=sys.stderr, flush=True)
        os._exit(1)
    if args.commands:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        print(f"bootstrap {server.bootstrap}", flush=True)
        server.serve_commands(sys.stdin, sys.stdout)  # until the starter is gone
    else:
        _announce(server, args.topic)
        name = server.serve_until_signal()
        print(f"{name}: stopped", file=sys.stderr, flush=True)
    sys.stdout.flush()
    # the cluster's threads are not joined: nothing of it is kept
    os._exit(0)


if __name__ == "__main__":  # pragma: no cover
    main()
