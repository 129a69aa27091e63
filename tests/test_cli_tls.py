"""Issue 30, point 5 (``rediss://``): the command line on a Redis server
that speaks TLS only (a throwaway CA and certificate made with openssl),
and one line saying TLS, exit 1, when the URL's scheme and the port do not
match (``rediss://`` to a plain port used to wait 5 s and say only
"Timeout connecting to server")."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import Service, _check_consumed, _lines, assert_one_line_error

from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis.tls import tls_mismatch
from lite_push.sources.redis_server import RedisServer, make_tls_files

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    files = make_tls_files(tmp_path_factory.mktemp("tls"))
    with RedisServer(appendonly=False, tls=files) as server:
        yield server


def lite_push(*argv: str) -> subprocess.CompletedProcess[str]:
    """``python -m lite_push ARGV`` as a subprocess (this checkout's package)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", "lite_push", *argv], capture_output=True, text=True, timeout=60, env=env
    )


def test_consume_and_dlq_list_work_over_tls(tls_server: RedisServer, tmp_path: Path) -> None:
    url = f"{tls_server.url}&namespace=tls-{uuid.uuid4().hex[:8]}"
    assert url.startswith("rediss://127.0.0.1:") and "ssl_ca_certs=" in url
    broker = RedisBroker(tls_server.url, namespace=url.rsplit("=", 1)[1])
    try:
        broker.create_topic("T", 2)
        sent: dict[str, list[int]] = {}
        for i in range(200):
            sent.setdefault(f"k{i % 13}", []).append(i)
        broker.send_batch("T", [(str(i).encode(), f"k{i % 13}") for i in range(200)])
        first = broker.messages(broker.queues("T")[0])[0]
        assert broker.retries.store_dead_letters("g", [(first, "kept for the test", "")]) == [None]
        listed = lite_push("dlq", "list", "--source", url, "--group", "g")
        assert listed.returncode == 0, listed.stderr
        assert "reason=kept for the test" in listed.stdout and listed.stdout.count("\n") == 1, listed.stdout
        argv = ["--source", url, "--group", "g", "--topic", "T", "--from", "first", "--no-metrics", "--lanes", "4"]
        service = Service(tmp_path, [*argv, "--listener", "cli_test_listener:handle"])
        try:
            service.wait_consumed(200, timeout=60.0)
            code = service.stop(timeout=30.0)
        finally:
            service.kill()
        assert code == 0, service.output()
        _check_consumed(_lines(service.consumed), sent)
        for q in broker.queues("T"):
            committed = broker.committed("g", q)
            assert committed is not None and committed.offset == broker.max_offset(q), q
    finally:
        broker.close()


@pytest.mark.parametrize("command", ["dlq", "consume"])
@pytest.mark.parametrize("case", ["rediss to a plain port", "redis to a TLS port", "rediss without its CA"])
def test_a_scheme_that_does_not_fit_the_port_is_one_line_saying_tls(
    tls_server: RedisServer, redis_server: RedisServer, command: str, case: str
) -> None:
    if case == "rediss to a plain port":
        url, says = f"rediss://127.0.0.1:{redis_server.port}/0", ["TLS handshake", "is the server TLS?", "redis://"]
    elif case == "redis to a TLS port":
        url, says = f"redis://127.0.0.1:{tls_server.port}/0", ["TLS:", "speaks TLS: use rediss://"]
    else:
        url, says = f"rediss://127.0.0.1:{tls_server.port}/0", ["TLS handshake", "not trusted", "ssl_ca_certs"]
    if command == "dlq":
        done = lite_push("dlq", "list", "--source", url, "--group", "g")
    else:
        done = lite_push(
            "consume", "--source", url, "--group", "g", "--topic", "T", "--listener", "json:dumps", "--no-metrics"
        )
    assert done.returncode == 1, done.stderr
    assert_one_line_error(done.stderr, f"source {url}", *says)


def test_tls_mismatch_asks_the_server_what_it_speaks(tls_server: RedisServer, redis_server: RedisServer) -> None:
    assert tls_mismatch("127.0.0.1", redis_server.port, tls=True) == (
        f"the server at 127.0.0.1:{redis_server.port} is not TLS: use redis://"
    )
    assert tls_mismatch("127.0.0.1", tls_server.port, tls=False) == (
        f"the server at 127.0.0.1:{tls_server.port} speaks TLS: use rediss://"
    )
    assert tls_mismatch("127.0.0.1", redis_server.port, tls=False) is None  # no mismatch
    assert tls_mismatch("127.0.0.1", tls_server.port, tls=True) is None
