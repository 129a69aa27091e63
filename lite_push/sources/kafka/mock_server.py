"""The process that hosts librdkafka's mock Kafka cluster.

It loads the confluent-kafka wheel's librdkafka with :mod:`ctypes`, creates
the cluster (its brokers listen on 127.0.0.1, on ports the kernel picks)
and then either serves :class:`~.mock_cluster.MockKafkaCluster`'s commands
on its standard input (:meth:`MockServer.serve_commands`) or runs until a
signal for a user who started it by hand
(``python -m lite_push.sources.kafka.mock_cluster``, whose options
:mod:`.mock_cluster` parses).

A fixed port (``--port``) is served by a forwarder per broker
(:class:`~lite_push.testing.tcp_proxy.TcpProxy`, so it needs pytest, as
``lite_push.testing`` does) on that port and the next ones, which the
cluster then advertises in its metadata, so clients only ever connect to
the fixed ports.
"""

from __future__ import annotations

import ctypes
import signal
import threading
from collections.abc import Iterable, Sequence
from types import FrameType
from typing import IO, Any

from .library import librdkafka_path

__all__ = ["MockServer", "MockServerError"]

LOOPBACK = "127.0.0.1"


class MockServerError(RuntimeError):
    """librdkafka could not be loaded, or refused to make the cluster or a
    topic (the message says which)."""


def _bind(lib: Any) -> None:
    """Declare the types of the C functions used here."""
    vp, cp, ci, i32 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int32
    lib.rd_kafka_conf_new.restype = vp
    lib.rd_kafka_conf_set.argtypes = [vp, cp, cp, cp, ctypes.c_size_t]
    lib.rd_kafka_new.restype = vp
    lib.rd_kafka_new.argtypes = [ci, vp, cp, ctypes.c_size_t]
    lib.rd_kafka_mock_cluster_new.restype = vp
    lib.rd_kafka_mock_cluster_new.argtypes = [vp, ci]
    lib.rd_kafka_mock_cluster_bootstraps.restype = cp
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [vp]
    lib.rd_kafka_mock_group_initial_rebalance_delay_ms.argtypes = [vp, i32]
    lib.rd_kafka_mock_set_controller_id.argtypes = [vp, i32]
    lib.rd_kafka_mock_topic_create.restype = ci
    lib.rd_kafka_mock_topic_create.argtypes = [vp, cp, ci, ci]
    for name in ("rd_kafka_mock_broker_set_down", "rd_kafka_mock_broker_set_up"):
        getattr(lib, name).restype = ci
        getattr(lib, name).argtypes = [vp, i32]
    lib.rd_kafka_mock_push_request_errors_array.argtypes = [vp, ctypes.c_int16, ctypes.c_size_t, vp]
    lib.rd_kafka_err2str.restype = cp
    lib.rd_kafka_err2str.argtypes = [ci]


class MockServer:
    """librdkafka's mock cluster of ``brokers`` brokers in this process;
    ``rebalance_delay_ms`` is its group coordinator's initial rebalance
    delay; ``port``: broker ``i`` is reached on ``port + i - 1`` (else on
    the port the kernel gave it).  Raises :class:`MockServerError`."""

    def __init__(self, brokers: int = 1, *, rebalance_delay_ms: int = 0, port: int | None = None) -> None:
        try:
            lib = ctypes.CDLL(librdkafka_path())
        except (OSError, ImportError) as e:
            raise MockServerError(f"cannot load librdkafka (it comes with the confluent-kafka wheel): {e}") from None
        _bind(lib)
        self._lib = lib
        errstr = ctypes.create_string_buffer(512)
        conf = lib.rd_kafka_conf_new()
        # The handle only hosts the cluster: it connects nowhere, and says nothing.
        lib.rd_kafka_conf_set(conf, b"log_level", b"0", errstr, len(errstr))
        rk = lib.rd_kafka_new(0, conf, errstr, len(errstr))  # RD_KAFKA_PRODUCER
        if not rk:
            raise MockServerError(f"rd_kafka_new failed: {errstr.value.decode()}")
        self._rk = rk
        mc = lib.rd_kafka_mock_cluster_new(rk, brokers)
        if not mc:
            raise MockServerError("rd_kafka_mock_cluster_new failed")
        self._mc = mc
        lib.rd_kafka_mock_group_initial_rebalance_delay_ms(mc, rebalance_delay_ms)
        lib.rd_kafka_mock_set_controller_id(mc, 1)
        #: ``host:port`` of each broker, broker 1 first (librdkafka lists them in id order).
        self.brokers: list[str] = lib.rd_kafka_mock_cluster_bootstraps(mc).decode().split(",")
        self._proxies: list[Any] = []
        if port is not None:
            self._forward(port)

    def _forward(self, port: int) -> None:
        """Serve broker ``i`` on ``port + i - 1``: a forwarder on each, and
        the cluster advertises those ports."""
        try:
            from ...testing.tcp_proxy import TcpProxy
        except ImportError:  # lite_push.testing needs pytest
            raise MockServerError(
                "--port forwards each broker's port through lite_push.testing.TcpProxy, which needs pytest: "
                "pip install 'lite-push[testing]' (without --port the brokers listen on free ports)"
            ) from None

        set_host_port = getattr(self._lib, "rd_kafka_mock_broker_set_host_port", None)
        if set_host_port is None:
            raise MockServerError("a fixed port needs rd_kafka_mock_broker_set_host_port, which this librdkafka lacks")
        set_host_port.restype = None
        set_host_port.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_char_p, ctypes.c_int]
        fixed = []
        for i, address in enumerate(self.brokers):
            proxy = TcpProxy(LOOPBACK, int(address.rsplit(":", 1)[1]), listen_port=port + i)
            try:
                proxy.start()
            except OSError as e:
                raise MockServerError(f"port {port + i}: {e.strerror}") from None
            self._proxies.append(proxy)
            set_host_port(self._mc, i + 1, LOOPBACK.encode(), port + i)
            fixed.append(f"{LOOPBACK}:{port + i}")
        self.brokers = fixed

    @property
    def bootstrap(self) -> str:
        """``host:port,...`` for ``bootstrap.servers``."""
        return ",".join(self.brokers)

    def create_topic(self, name: str, partitions: int) -> None:
        """Create ``name`` with ``partitions`` partitions (replication 1)."""
        self._check(self._lib.rd_kafka_mock_topic_create(self._mc, name.encode(), partitions, 1), f"topic {name!r}")

    def set_down(self, broker_id: int, down: bool = True) -> None:
        """Broker ``broker_id`` (1-based) stops answering (``down``), or
        answers again."""
        lib = self._lib
        setter = lib.rd_kafka_mock_broker_set_down if down else lib.rd_kafka_mock_broker_set_up
        self._check(setter(self._mc, broker_id), f"broker {broker_id}")

    def push_request_errors(self, api_key: int, errors: Sequence[int]) -> None:
        """The next ``len(errors)`` requests of Kafka API ``api_key`` get
        these error codes, one each."""
        codes = (ctypes.c_int * len(errors))(*errors)
        push = self._lib.rd_kafka_mock_push_request_errors_array
        push(self._mc, api_key, len(errors), ctypes.cast(codes, ctypes.c_void_p))

    def _check(self, err: int, what: str) -> None:
        if err != 0:
            raise MockServerError(f"{what}: {self._lib.rd_kafka_err2str(err).decode()}")

    # -- serving -------------------------------------------------------------------

    def serve_commands(self, lines: Iterable[str], out: IO[str]) -> None:
        """Answer one command per line until ``lines`` end (their writer is
        gone): ``topic <name> <partitions>``, ``down <broker id>``, ``up
        <broker id>``, ``errors <api key> <code>...``; each gets ``ok`` or
        ``error <text>`` on ``out``."""
        for line in lines:
            parts = line.split()
            if not parts:
                continue
            try:
                if len(parts) == 3 and parts[0] == "topic" and parts[2].isdecimal():
                    self.create_topic(parts[1], int(parts[2]))
                elif len(parts) == 2 and parts[0] in ("down", "up") and parts[1].isdecimal():
                    self.set_down(int(parts[1]), parts[0] == "down")
                elif len(parts) >= 3 and parts[0] == "errors" and all(p.lstrip("-").isdecimal() for p in parts[1:]):
                    self.push_request_errors(int(parts[1]), [int(p) for p in parts[2:]])
                else:
                    raise MockServerError(f"unknown command {line.strip()!r}")
            except MockServerError as e:
                print(f"error {e}", file=out, flush=True)
            else:
                print("ok", file=out, flush=True)

    def serve_until_signal(self) -> str:
        """Wait for SIGINT or SIGTERM; return its name."""
        got: list[str] = []
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            got.append(signal.Signals(signum).name)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
        stop.wait()
        return got[0]
