"""Run librdkafka's mock Kafka cluster for tests, benchmarks and demos.

The confluent-kafka wheel ships librdkafka, and librdkafka carries a Kafka
protocol server of its own: the *mock cluster* (``rd_kafka_mock_cluster_new``),
which answers Metadata, Produce, Fetch, ListOffsets, the consumer-group
protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit with
metadata, OffsetFetch) and more, on loopback sockets.  It has no admin API
(CreateTopics is refused), so topics are created through its C API.

:class:`MockKafkaCluster` starts it in a helper process of its own (this
module run as ``python -m lite_push.sources.kafka.mock_cluster``), which
loads the wheel's librdkafka with :mod:`ctypes`, creates the cluster, prints
its bootstrap servers (``127.0.0.1:<port>`` each, a port the kernel chose)
and then serves one command per line on its standard input:

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

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from types import TracebackType

__all__ = ["MockClusterError", "MockKafkaCluster", "librdkafka_path"]

from .library import librdkafka_path

logger = logging.getLogger(__name__)


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
        cmd = [sys.executable, "-m", __name__, str(self.brokers), str(self.rebalance_delay_ms)]
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
        self._command(f"topic {name} {int(partitions)}", f"topic {name!r}")

    def broker_down(self, broker_id: int = 1) -> None:
        """Take broker ``broker_id`` (1-based) down: its connections drop and
        new ones are refused (a network partition, as a client sees it)."""
        self._command(f"down {int(broker_id)}", f"broker {broker_id}")

    def broker_up(self, broker_id: int = 1) -> None:
        """Bring broker ``broker_id`` back."""
        self._command(f"up {int(broker_id)}", f"broker {broker_id}")

    def push_request_errors(self, api_key: int, errors: Sequence[int]) -> None:
        """Answer the next ``len(errors)`` requests of Kafka API ``api_key``
        (8: OffsetCommit, ...) with these error codes, one each, whoever
        sends them (a coordinator refusing commits, as a client sees it)."""
        codes = " ".join(str(int(e)) for e in errors)
        self._command(f"errors {int(api_key)} {codes}", f"errors for API {api_key}")

    def _command(self, line: str, what: str) -> None:
        with self._lock:
            proc = self._proc
            if proc is None or proc.stdin is None:
                raise MockClusterError("the mock cluster is not running")
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            answer = self._read_line(10.0)
        if answer != "ok":
            raise MockClusterError(f"{what}: {answer}")

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


# -- the helper process ---------------------------------------------------------


def _serve(brokers: int, rebalance_delay_ms: int) -> int:  # pragma: no cover - runs in the helper process
    lib = ctypes.CDLL(librdkafka_path())
    vp, cp, ci = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
    lib.rd_kafka_conf_new.restype = vp
    lib.rd_kafka_conf_set.argtypes = [vp, cp, cp, cp, ctypes.c_size_t]
    lib.rd_kafka_new.restype = vp
    lib.rd_kafka_new.argtypes = [ci, vp, cp, ctypes.c_size_t]
    lib.rd_kafka_mock_cluster_new.restype = vp
    lib.rd_kafka_mock_cluster_new.argtypes = [vp, ci]
    lib.rd_kafka_mock_cluster_bootstraps.restype = cp
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [vp]
    lib.rd_kafka_mock_group_initial_rebalance_delay_ms.argtypes = [vp, ctypes.c_int32]
    lib.rd_kafka_mock_set_controller_id.argtypes = [vp, ctypes.c_int32]
    lib.rd_kafka_mock_topic_create.restype = ci
    lib.rd_kafka_mock_topic_create.argtypes = [vp, cp, ci, ci]
    for name in ("rd_kafka_mock_broker_set_down", "rd_kafka_mock_broker_set_up"):
        getattr(lib, name).restype = ci
        getattr(lib, name).argtypes = [vp, ctypes.c_int32]
    lib.rd_kafka_mock_push_request_errors_array.argtypes = [vp, ctypes.c_int16, ctypes.c_size_t, vp]
    lib.rd_kafka_err2str.restype = cp
    lib.rd_kafka_err2str.argtypes = [ci]
    errstr = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    # The handle only hosts the cluster: it connects nowhere, and says nothing.
    lib.rd_kafka_conf_set(conf, b"log_level", b"0", errstr, len(errstr))
    rk = lib.rd_kafka_new(0, conf, errstr, len(errstr))  # RD_KAFKA_PRODUCER
    if not rk:
        print(f"error {errstr.value.decode()}", flush=True)
        return 1
    mc = lib.rd_kafka_mock_cluster_new(rk, brokers)
    if not mc:
        print("error rd_kafka_mock_cluster_new failed", flush=True)
        return 1
    lib.rd_kafka_mock_group_initial_rebalance_delay_ms(mc, rebalance_delay_ms)
    lib.rd_kafka_mock_set_controller_id(mc, 1)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    print(f"bootstrap {lib.rd_kafka_mock_cluster_bootstraps(mc).decode()}", flush=True)
    for line in sys.stdin:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "topic" and parts[2].isdecimal():
            err = lib.rd_kafka_mock_topic_create(mc, parts[1].encode(), int(parts[2]), 1)
            print("ok" if err == 0 else f"error {lib.rd_kafka_err2str(err).decode()}", flush=True)
        elif len(parts) == 2 and parts[0] in ("down", "up") and parts[1].isdecimal():
            setter = lib.rd_kafka_mock_broker_set_down if parts[0] == "down" else lib.rd_kafka_mock_broker_set_up
            err = setter(mc, int(parts[1]))
            print("ok" if err == 0 else f"error {lib.rd_kafka_err2str(err).decode()}", flush=True)
        elif len(parts) >= 3 and parts[0] == "errors" and all(p.lstrip("-").isdecimal() for p in parts[1:]):
            codes = (ci * (len(parts) - 2))(*map(int, parts[2:]))
            lib.rd_kafka_mock_push_request_errors_array(mc, int(parts[1]), len(parts) - 2, ctypes.cast(codes, vp))
            print("ok", flush=True)
        elif parts:
            print(f"error unknown command {line.strip()!r}", flush=True)
    os._exit(0)  # stdin closed: the starter is gone


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_serve(int(sys.argv[1]), int(sys.argv[2])))
