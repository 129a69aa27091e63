"""Run a real ``redis-server`` for tests, benchmarks and demos.

lite_push never assumes a Redis server is running: the test suite and the
benchmarks start their own with :class:`RedisServer`, on a free loopback
port (``127.0.0.1`` only, protected mode on), with its data in a directory
of its own, and stop it by its own PID.  :class:`RedisCluster` starts
several servers in cluster mode and joins them (``redis-cli --cluster
create``), for the Redis Cluster tests.

Durability: by default the server appends every write to its AOF and fsyncs
it (``appendfsync always``), so a restart (:meth:`RedisServer.restart`, as
the "Redis restarted mid-run" test does) loses nothing acknowledged.

TLS: ``RedisServer(tls=make_tls_files(directory))`` listens with TLS only
(``--port 0 --tls-port``, clients need no certificate of their own), and
its :attr:`~RedisServer.url` is ``rediss://...?ssl_ca_certs=<the CA>``.
:func:`make_tls_files` makes a throwaway CA and a server certificate for
127.0.0.1 with the ``openssl`` command.

    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

__all__ = ["RedisCluster", "RedisServer", "RedisServerError", "TlsFiles", "free_port", "make_tls_files"]

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


class RedisServerError(RuntimeError):
    """``redis-server`` could not be started (the message has the end of its log)."""


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def free_port(*, cluster: bool = False) -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.  With
    ``cluster``, one whose cluster bus port (+10000) is free too, so at most
    55535 (Redis refuses higher ones in cluster mode)."""
    if not cluster:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((LOOPBACK, 0))
            return int(s.getsockname()[1])
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(20000, 55536)
        if _is_free(port) and _is_free(port + 10000):
            return port
    raise RedisServerError("no free port pair (port, port + 10000) on 127.0.0.1")


@dataclass(frozen=True)
class TlsFiles:
    """A server's TLS certificate and key, and the CA that signed it (PEM files)."""

    cert: Path
    key: Path
    ca: Path


def make_tls_files(directory: str | os.PathLike[str], *, days: int = 2) -> TlsFiles:
    """Make a throwaway CA and a certificate for ``127.0.0.1`` (and
    ``localhost``) signed by it, valid for ``days``, in ``directory``, with
    the ``openssl`` command (:class:`RedisServerError` without it)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RedisServerError("openssl not found: install the Debian package openssl")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(d / "server.crt", d / "server.key", d / "ca.crt")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    steps = [
        [
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            d / "ca.key",
            "-out",
            files.ca,
            "-days",
            str(days),
            "-subj",
            "/CN=lite_push test CA",
        ],
        [
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            files.key,
            "-out",
            d / "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
        [
            "x509",
            "-req",
            "-in",
            d / "server.csr",
            "-CA",
            files.ca,
            "-CAkey",
            d / "ca.key",
            "-CAcreateserial",
            "-out",
            files.cert,
            "-days",
            str(days),
            "-extfile",
            d / "san.cnf",
        ],
    ]
    for step in steps:
        done = subprocess.run([openssl, *map(str, step)], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RedisServerError(f"openssl {step[0]} failed:\n{done.stderr}")
    return files


def _server_pid(port: int, timeout: float = 0.5, ca: Path | None = None) -> int | None:
    """The PID of the Redis server answering on ``port`` (None if none
    does); ``ca``: it speaks TLS, with a certificate that CA signed."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=timeout) as raw:
            s = raw
            if ca is not None:
                s = ssl.create_default_context(cafile=str(ca)).wrap_socket(raw, server_hostname=LOOPBACK)
            s.sendall(b"INFO server\r\n")
            data = b""
            while b"process_id:" not in data or not data.endswith(b"\r\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return None
    for line in data.split(b"\r\n"):
        if line.startswith(b"process_id:"):
            return int(line.split(b":", 1)[1])
    return None


class RedisServer:
    """One ``redis-server`` process on ``127.0.0.1:port``.

    ``port`` defaults to a free one; ``data_dir`` to a temporary directory
    removed by :meth:`stop` (a given directory is kept).  ``extra_args`` are
    appended to the command line (e.g. ``["--cluster-enabled", "yes"]``).
    ``tls``: the port speaks TLS only, with these files (clients are not
    asked for a certificate).
    Raises :class:`RedisServerError` when the executable is missing or the
    server does not answer within ``start_timeout`` seconds.
    """

    def __init__(
        self,
        port: int | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        appendonly: bool = True,
        extra_args: list[str] | None = None,
        executable: str = "redis-server",
        start_timeout: float = 10.0,
        tls: TlsFiles | None = None,
    ) -> None:
        path = shutil.which(executable)
        if path is None:
            raise RedisServerError(
                f"{executable} not found: install the Debian package redis-server (scripts/bootstrap.sh does)"
            )
        self.executable = path
        self.port = port if port is not None else free_port()
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="lite-push-redis-"))
        self.appendonly = appendonly
        self.extra_args = list(extra_args or [])
        self.start_timeout = start_timeout
        self.tls = tls
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``; with TLS
        ``rediss://127.0.0.1:<port>/0?ssl_ca_certs=<CA file>``."""
        if self.tls is not None:
            ca = urllib.parse.quote(str(self.tls.ca), safe="/")
            return f"rediss://{LOOPBACK}:{self.port}/0?ssl_ca_certs={ca}"
        return f"redis://{LOOPBACK}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's PID while it runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    def start(self) -> RedisServer:
        """Start the server and wait until it answers (and it is this process
        that answers, not another server already on the port)."""
        if self.pid is not None:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        tls = self.tls
        listen = (
            ["--port", str(self.port)]
            if tls is None
            else [
                "--port",
                "0",
                "--tls-port",
                str(self.port),
                "--tls-cert-file",
                str(tls.cert),
                "--tls-key-file",
                str(tls.key),
                "--tls-ca-cert-file",
                str(tls.ca),
                "--tls-auth-clients",
                "no",
            ]
        )
        cmd = [
            self.executable,
            *listen,
            "--bind",
            LOOPBACK,
            "--protected-mode",
            "yes",
            "--dir",
            str(self.data_dir),
            "--logfile",
            str(self.log_path),
            "--save",
            "",
            "--daemonize",
            "no",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "always",
            *self.extra_args,
        ]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            if _server_pid(self.port, ca=None if tls is None else tls.ca) == self._proc.pid:  # ours, not another
                logger.info("redis-server pid %d listening on %s:%d", self._proc.pid, LOOPBACK, self.port)
                return self
            time.sleep(0.02)
        self.stop(remove=False)
        raise RedisServerError(f"redis-server on port {self.port} did not start:\n{self._log_tail()}")

    def stop(self, *, remove: bool | None = None) -> None:
        """Stop the server by its PID (SIGTERM, then SIGKILL after 10 s).
        Removes a temporary data directory unless ``remove=False``."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if proc is not None and proc.stderr is not None:
            proc.stderr.close()
        if (self._own_dir if remove is None else remove) and self.data_dir.exists():
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def kill(self) -> None:
        """``kill -9`` the server (its data directory is kept)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)

    def restart(self) -> None:
        """Stop (keeping the data) and start again on the same port."""
        self.stop(remove=False)
        self.start()

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class RedisCluster:
    """``masters`` cluster-mode servers on free loopback ports, joined with
    ``redis-cli --cluster create`` (no replicas).  ``url`` names the first
    node; cluster clients discover the others."""

    def __init__(self, masters: int = 3, *, start_timeout: float = 30.0) -> None:
        if masters < 3:
            raise ValueError(f"masters must be >= 3 (Redis Cluster needs three), got {masters}")
        ports: list[int] = []
        while len(ports) < masters:
            port = free_port(cluster=True)
            if port not in ports and port + 10000 not in ports and port - 10000 not in ports:
                ports.append(port)
        self.servers = [
            RedisServer(port, extra_args=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"])
            for port in ports
        ]
        self.start_timeout = start_timeout

    @property
    def url(self) -> str:
        return self.servers[0].url

    @property
    def ports(self) -> list[int]:
        return [s.port for s in self.servers]

    def start(self) -> RedisCluster:
        try:
            for s in self.servers:
                s.start()
            cli = shutil.which("redis-cli")
            if cli is None:
                raise RedisServerError("redis-cli not found (Debian package redis-tools)")
            nodes = [f"{LOOPBACK}:{s.port}" for s in self.servers]
            out = subprocess.run(
                [cli, "--cluster", "create", *nodes, "--cluster-yes"],
                capture_output=True,
                text=True,
                timeout=self.start_timeout,
            )
            if out.returncode != 0:
                raise RedisServerError(f"redis-cli --cluster create failed:\n{out.stdout}\n{out.stderr}")
            deadline = time.monotonic() + self.start_timeout
            while time.monotonic() < deadline:
                if all(self._cluster_ok(s.port) for s in self.servers):
                    return self
                time.sleep(0.1)
            raise RedisServerError("the cluster did not reach cluster_state:ok")
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _cluster_ok(port: int) -> bool:
        try:
            with socket.create_connection((LOOPBACK, port), timeout=0.5) as s:
                s.sendall(b"CLUSTER INFO\r\n")
                data = b""
                while b"cluster_state" not in data or not data.endswith(b"\r\n"):
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                return b"cluster_state:ok" in data
        except OSError:
            return False

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
