"""Liveness and readiness: ``/healthz`` and ``/readyz`` on the metrics port,
and the same two words in ``stats()`` (issue 19, item 2)."""

from __future__ import annotations

import http.client
import socket
import urllib.error
import urllib.parse
import urllib.request

import pytest
from helpers import wait_until

from lite_push import ConsumeFromWhere, ConsumerConfig, EmbeddedBroker, LitePushConsumer, MessageExt
from lite_push._lanes.worker import LaneWorker


def _consumer(broker: EmbeddedBroker, listener, group: str = "g", **cfg) -> LitePushConsumer:  # type: ignore[no-untyped-def]
    cfg.setdefault("poll_timeout", 0.02)
    cfg.setdefault("commit_interval", 0.05)
    c = LitePushConsumer(
        ConsumerConfig(group=group, metrics_port=0, **cfg),
        source=broker.pull_consumer(group, consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener,
    )
    c.subscribe("T")
    return c


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _base(c: LitePushConsumer) -> str:
    assert c.metrics_url is not None
    return c.metrics_url.removesuffix("/metrics")


def test_a_running_consumer_is_alive_and_ready_and_says_so_on_its_metrics_port(broker: EmbeddedBroker) -> None:
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(50)])
    c = _consumer(broker, lambda msgs: None)
    assert c.stats().health == "ok" and c.stats().readiness == "not started"
    with c:
        base = _base(c)
        assert wait_until(lambda: _get(base + "/readyz") == (200, "ok\n"), timeout=10)
        assert _get(base + "/healthz") == (200, "ok\n")
        status, text = _get(base + "/metrics")
        assert status == 200 and "lite_push_lanes" in text
        assert _get(base + "/")[0] == 200  # Prometheus's default path still answers
        status, text = _get(base + "/nope")
        assert status == 404 and "/healthz" in text
        st = c.stats()
        assert (st.health, st.readiness) == ("ok", "ok")
    st = c.stats()
    assert (st.health, st.readiness) == ("stopped", "stopped")


def _head(url: str) -> tuple[int, dict[str, str]]:
    """Status and headers of a HEAD of ``url`` (http.client reads no body)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        conn.request("HEAD", parts.path)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}
    finally:
        conn.close()


def _head_raw(url: str) -> bytes:
    """Everything the server sends back to a HEAD of ``url``, to the end of
    the connection (the server closes it after one answer)."""
    parts = urllib.parse.urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as s:
        s.sendall(f"HEAD {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def test_head_answers_every_path_as_get_does_without_a_body(broker: EmbeddedBroker) -> None:
    """Load balancers and uptime checks probe with HEAD: /metrics (and /)
    answer 200 with GET's headers, as /healthz, /readyz and a 404 do; the
    Content-Length is that of GET's body, and no body follows."""
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(20)])
    members = [_consumer(broker, lambda msgs: None) for _ in range(3)]  # two queues: one member owns none
    started: list[LitePushConsumer] = []
    try:
        for m in members:
            m.start()
            started.append(m)
        assert wait_until(lambda: sum(1 for m in members if m.stats().readiness == "ok") == 2, timeout=15)
        idle = next(m for m in members if m.stats().readiness != "ok")
        base = _base(idle)  # (port 0: an endpoint of its own)
        for path in ("/metrics", "/"):
            status, headers = _head(base + path)
            assert status == 200, (path, status)
            assert headers["content-type"].startswith("text/plain; version=0.0.4"), headers
            assert int(headers["content-length"]) > 1000  # the size of the page GET sends
        for path, (code, text) in {
            "/healthz": (200, "ok\n"),
            "/readyz": (503, "consumer 'g': no queue assigned yet\n"),
            "/nope": (404, "not found: /metrics, /healthz or /readyz\n"),
        }.items():
            assert _get(base + path) == (code, text)
            status, headers = _head(base + path)
            assert status == code and headers["content-length"] == str(len(text.encode())), (path, headers)
            assert headers["content-type"] == "text/plain; charset=utf-8"
        for path, code in {"/metrics": 200, "/healthz": 200, "/readyz": 503, "/nope": 404}.items():
            raw = _head_raw(base + path)
            head, sep, body = raw.partition(b"\r\n\r\n")
            assert head.startswith(f"HTTP/1.0 {code} ".encode()) and sep and body == b"", (path, raw)
    finally:
        for m in started:
            m.shutdown(timeout=5)


def test_a_member_without_a_queue_is_alive_but_not_ready(broker: EmbeddedBroker) -> None:
    """Three members, two queues: one owns nothing, so it is not ready, and
    the shared endpoint names it."""
    members = [_consumer(broker, lambda msgs: None) for _ in range(3)]
    started: list[LitePushConsumer] = []
    try:
        for m in members:
            m.start()
            started.append(m)
        assert wait_until(lambda: sum(1 for m in members if m.stats().readiness == "ok") == 2, timeout=15)
        idle = next(m for m in members if m.stats().readiness != "ok")
        assert idle.stats().readiness == "no queue assigned yet" and idle.stats().health == "ok"
        status, text = _get(_base(idle) + "/readyz")
        assert (status, text) == (503, "consumer 'g': no queue assigned yet\n")
        assert _get(_base(idle) + "/healthz") == (200, "ok\n")
    finally:
        for m in started:
            m.shutdown(timeout=5)


def test_a_failed_consumer_is_not_alive_and_the_probe_says_why(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    def completed(self: LaneWorker, *args: object, **kwargs: object) -> None:
        raise RuntimeError("injected lane bug")

    monkeypatch.setattr(LaneWorker, "completed", completed)
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(10)])
    seen: list[MessageExt] = []
    c = _consumer(broker, seen.extend)
    c.start()
    try:
        base = _base(c)
        assert wait_until(lambda: c.failure is not None, timeout=10)
        status, text = _get(base + "/healthz")
        assert status == 503 and text.startswith("consumer 'g': ") and "injected lane bug" in text
        assert text.count("\n") == 1  # one line
        assert c.stats().health.startswith("failed: RuntimeError: injected lane bug")
        assert _get(base + "/readyz")[0] == 503
    finally:
        c.shutdown(timeout=5)
