"""The HTTP endpoint of ``metrics_port``: metrics, liveness and readiness.

One server per ``(metrics_addr, port)``, shared by the consumers of a process
that name the same one (each consumer's series carry its ``group``):

* ``GET /metrics`` (and ``/``): the Prometheus text of the registry;
* ``GET /healthz``: 200 ``ok`` while every consumer on it is alive (its pull
  thread and every lane running, not failed), else 503 with one line
  naming the first that is not and why;
* ``GET /readyz``: 200 ``ok`` once every consumer on it is ready (started,
  subscribed, polling, owning at least one queue), else 503 with one line;
* anything else: 404, naming the three paths.

``HEAD`` answers every path as ``GET`` does, with the same status and
headers (``Content-Length`` included) and no body (``_head_as_get``):
load balancers and uptime checkers probe with it.

A consumer says how it is with ``health() -> (liveness, readiness)``, each
``"ok"`` or the reason (see ``ConsumerCore.health``); ``stats()`` carries
the same two strings.  The server runs on daemon threads (prometheus-client's
threading WSGI server) and only reads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

__all__ = ["HEALTH_PATHS", "HealthSource", "exporter_for", "release_exporter"]

logger = logging.getLogger(__name__)

#: The paths that answer with health rather than metrics.
HEALTH_PATHS = ("/healthz", "/readyz")

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
#: A WSGI application.
_WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class HealthSource(Protocol):
    """A consumer on an exporter: its name and how it is."""

    @property
    def name(self) -> str: ...

    def health(self) -> tuple[str, str]:
        """``(liveness, readiness)``: each ``"ok"`` or why not (one line)."""
        ...


def _head_as_get(app: _WsgiApp) -> _WsgiApp:
    """``app``, answering ``HEAD`` as it answers ``GET`` (prometheus-client's
    ``/metrics`` answers 405 to it): the same status and headers, the
    ``Content-Length`` of the body that ``GET`` would send, and no body."""

    def head_too(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "HEAD":
            return app(environ, start_response)
        answered: list[tuple[str, list[tuple[str, str]]]] = []

        def keep(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
            answered[:] = [(status, list(headers))]

        body = app({**environ, "REQUEST_METHOD": "GET"}, keep)
        try:
            size = sum(len(chunk) for chunk in body)
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
        status, headers = answered[0]
        if not any(name.lower() == "content-length" for name, _ in headers):
            headers.append(("Content-Length", str(size)))
        start_response(status, headers)
        return []

    return head_too


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes and probes are not logged."""


class _Exporter:
    __slots__ = ("consumers", "lock", "port", "refs", "registry", "server", "thread")

    def __init__(self, addr: str, port: int, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.lock = threading.Lock()
        self.consumers: list[HealthSource] = []
        self.refs = 0
        metrics = make_wsgi_app(registry)

        def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            path = environ.get("PATH_INFO") or "/"
            if path in HEALTH_PATHS:
                code, text = self.answer(path == "/healthz")
                start_response(code, [("Content-Type", "text/plain; charset=utf-8")])
                return [text.encode() + b"\n"]
            if path in ("/", "/metrics"):
                return metrics(environ, start_response)  # type: ignore[no-any-return]
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found: /metrics, /healthz or /readyz\n"]

        self.server = make_server(addr, port, _head_as_get(app), ThreadingWSGIServer, handler_class=_QuietHandler)
        self.port: int = self.server.server_port
        self.thread = threading.Thread(
            target=self.server.serve_forever, name=f"lite-push-exporter-{self.port}", daemon=True
        )
        self.thread.start()

    def answer(self, liveness: bool) -> tuple[str, str]:
        """The status line and the one-line body of a probe."""
        with self.lock:
            consumers = list(self.consumers)
        for c in consumers:
            try:
                state = c.health()[0 if liveness else 1]
            except Exception as e:  # a probe must answer, whatever happened
                state = f"health check failed: {type(e).__name__}: {e}"
            if state != "ok":
                return "503 Service Unavailable", f"{c.name}: {state}"
        if not consumers:
            return "503 Service Unavailable", "no consumer"
        return "200 OK", "ok"


_exporters: dict[tuple[str, int], _Exporter] = {}
_exporters_lock = threading.Lock()


def exporter_for(
    addr: str, port: int, registry: CollectorRegistry | None, consumer: HealthSource
) -> tuple[tuple[str, int], int]:
    """Start (or share) the HTTP endpoint on ``addr:port`` serving
    ``registry`` and ``consumer``'s health; return its key (for
    :func:`release_exporter`) and the port it listens on.  Port 0 starts a
    new endpoint on a free port."""
    reg = REGISTRY if registry is None else registry
    with _exporters_lock:
        ex = _exporters.get((addr, port)) if port else None
        if ex is not None and ex.registry is not reg:
            raise ValueError(f"{addr}:{port} already serves another registry")
        if ex is None:
            ex = _Exporter(addr, port, reg)
            _exporters[(addr, ex.port)] = ex
            logger.info("metrics on http://%s:%d/metrics (health: /healthz, /readyz)", addr, ex.port)
        ex.refs += 1
        with ex.lock:
            ex.consumers.append(consumer)
        return (addr, ex.port), ex.port


def release_exporter(key: tuple[str, int], consumer: HealthSource) -> None:
    """``consumer`` stopped: it leaves the endpoint, which shuts down when
    nobody uses it."""
    with _exporters_lock:
        ex = _exporters.get(key)
        if ex is None:
            return
        with ex.lock:
            if consumer in ex.consumers:
                ex.consumers.remove(consumer)
        ex.refs -= 1
        if ex.refs > 0:
            return
        del _exporters[key]
    ex.server.shutdown()
    ex.server.server_close()
    ex.thread.join(5.0)
