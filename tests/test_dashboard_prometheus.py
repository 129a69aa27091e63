"""The Grafana dashboard against a real Prometheus (issue 19, item 5).

A consumer runs on the embedded broker with its metrics port on; the test
starts ``prometheus`` (the Debian package, which ``scripts/bootstrap.sh``
installs when missing) on a free loopback port, scraping that port every
second, and stops it by its PID.  Then every PromQL expression of
``grafana/dashboards/`` is evaluated through Prometheus's HTTP API, with the
dashboard's variables set to this consumer: each returns data, or is listed
in :data:`EMPTY_UNTIL` with the event that fills it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import supervisor_members as members
from helpers import wait_until
from test_grafana import collect_expressions, load_dashboard

from lite_push import (
    ConsumeFromWhere,
    ConsumerConfig,
    EmbeddedBroker,
    LitePushConsumer,
    NonRetryableError,
    ProcessSupervisor,
)

#: Expressions that stay empty until an event this run does not make, with
#: the event.  None today: lite_push exports every series from the start
#: (counters at 0; a lock-renewal or send-back rate is 0 until QUEUE_ORDERLY
#: or CONCURRENTLY makes one).  The "Member processes" panel reads a process
#: supervisor's endpoint: the run has Prometheus scrape one too.
EMPTY_UNTIL: dict[str, str] = {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _query(base: str, expr: str) -> list[object]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _live(expr: str) -> str:
    """The expression with the dashboard's variables set to this run."""
    for var, value in (
        ("${group}", "g"),
        ("$group", "g"),
        ("${topic}", "T"),
        ("$topic", "T"),
        ("${queue}", ".*"),
        ("$queue", ".*"),
        ("$__rate_interval", "30s"),
    ):
        expr = expr.replace(var, value)
    return expr


def test_every_dashboard_expression_returns_data_on_a_real_prometheus(tmp_path: Path) -> None:
    exe = shutil.which("prometheus")
    assert exe, "prometheus is not on PATH: scripts/bootstrap.sh installs it (apt-get install prometheus)"
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=2)

    def listener(msgs):  # type: ignore[no-untyped-def]
        for m in msgs:
            if m.keys == "poison":
                raise NonRetryableError("never works")  # a dead letter
            if m.keys == "flaky" and m.reconsume_times == 0:
                raise RuntimeError("first attempt fails")  # a retry
        time.sleep(0.001)

    consumer = LitePushConsumer(
        # max_rate far above the traffic: the "Rate limits" panel's limit series exists
        ConsumerConfig(group="g", lanes=4, metrics_port=0, commit_interval=0.2, suspend_ms=100, max_rate=100_000),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener,
    )
    consumer.subscribe("T", "A")
    port = _free_port()
    # two member processes under a supervisor, for the "Member processes" panel
    supervisor = ProcessSupervisor(members.embedded_member, 2, metrics_port=0, shutdown_timeout=5.0)
    with consumer, supervisor:
        assert consumer.metrics_url is not None and supervisor.metrics_url is not None
        urls = (consumer.metrics_url, supervisor.metrics_url)
        targets = [u.removeprefix("http://").removesuffix("/metrics") for u in urls]
        (tmp_path / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"scrape_configs:\n  - job_name: lite-push\n    static_configs:\n      - targets: {targets!r}\n"
        )
        proc = subprocess.Popen(
            [
                exe,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "prometheus.log", "wb"),
        )
        base = f"http://127.0.0.1:{port}"
        try:
            # traffic while Prometheus scrapes: successes, a retry, a dead
            # letter, filtered messages, a queue paused and resumed
            deadline = time.monotonic() + 8.0
            i = 0
            q0 = broker.queues("T")[0]
            while time.monotonic() < deadline:
                if i == 600:
                    consumer.pause([q0])  # a pause and a resume for the "Paused queues" panel
                elif i == 900:
                    consumer.resume([q0])
                items = [{"body": b"x", "keys": f"k{i + j}", "tags": "A" if j % 3 else "B"} for j in range(100)]
                items += [{"body": b"p", "keys": "poison", "tags": "A"}, {"body": b"f", "keys": "flaky", "tags": "A"}]
                broker.send_batch("T", items)
                i += 100
                time.sleep(0.5)
            assert wait_until(lambda: bool(_query(base, 'count(up{job="lite-push"} == 1) == 2')), timeout=20), (
                tmp_path / "prometheus.log"
            ).read_text()[-2000:]
            # a rate needs two samples in its window: on a loaded machine Prometheus may have
            # scraped a target once by now
            three = 'min(count_over_time(up{job="lite-push"}[30s])) >= 3'
            assert wait_until(lambda: bool(_query(base, three)), timeout=30), _query(
                base, 'count_over_time(up{job="lite-push"}[30s])'
            )
            empty = []
            for where, expr in collect_expressions(load_dashboard()):
                if not _query(base, _live(expr)):
                    if not any(name in expr for name in EMPTY_UNTIL):
                        empty.append(f"{where}: {expr}")
            assert empty == [], "\n".join(empty)
            # the run made the events the panels show: not zeros only
            for expr in (
                'lite_push_messages_processed_total{group="g", outcome="success"}',
                'lite_push_messages_processed_total{group="g", outcome="retry"}',
                'lite_push_messages_processed_total{group="g", outcome="dlq"}',
                'sum(lite_push_messages_filtered_total{group="g"})',
                'sum(lite_push_queue_pauses_total{group="g"})',
                'lite_push_committed_offset{group="g"}',
            ):
                values = [float(r["value"][1]) for r in _query(base, expr)]  # type: ignore[index]
                assert values and max(values) > 0, (expr, values)
        finally:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
    broker.close()
