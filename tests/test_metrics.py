"""Prometheus metrics: what a scrape of a running consumer shows, against
``stats()`` and the broker; shared exporters and registries; config errors."""

from __future__ import annotations

import asyncio
import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest
from helpers import wait_until
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lite_push import (
    LANE_METRICS_IMPL,
    OFFSETS_IMPL,
    ROUTER_IMPL,
    AsyncLitePushConsumer,
    ConfigError,
    ConsumeFromWhere,
    ConsumeMode,
    ConsumerConfig,
    EmbeddedBroker,
    LitePushConsumer,
    MessageExt,
    __version__,
)
from lite_push.metrics.names import METRICS, exported_series

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _parse(text: str) -> Samples:
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        return _parse(r.read().decode())


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def _matching(samples: Samples, name: str, **labels: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        lab: v for (n, lab), v in samples.items() if n == name and all((k, val) in lab for k, val in labels.items())
    }


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker()
    b.create_topic("T", queue_count=3)
    yield b
    b.close()


def _consumer(broker: EmbeddedBroker, listener, group: str = "g", registry=None, **cfg) -> LitePushConsumer:  # type: ignore[no-untyped-def]
    """A consumer; with ``executor="asyncio"`` the one for a running loop."""
    cfg.setdefault("poll_timeout", 0.02)
    cfg.setdefault("commit_interval", 0.05)
    cls = AsyncLitePushConsumer if cfg.get("executor") == "asyncio" else LitePushConsumer
    c = cls(
        ConsumerConfig(group=group, **cfg),
        source=broker.pull_consumer(group, consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener,
        registry=registry,
    )
    return c


def test_a_scrape_over_http_matches_stats_and_the_broker(broker: EmbeddedBroker) -> None:
    broker.send_batch("T", [(b"x" * 10, f"k{i % 17}") for i in range(600)])
    gate = threading.Event()
    seen: list[int] = []

    def listener(msgs: list[MessageExt]) -> None:
        if msgs[0].keys == "k3":
            gate.wait(10)  # one key's messages stay in flight until released
        seen.append(len(msgs))

    # More lanes than keys: k3's held call holds its lane, and no other key
    # shares it (a key placed on k3's lane would wait behind the held call)
    c = _consumer(broker, listener, lanes=32, metrics_port=0)
    c.subscribe("T")
    with c:
        assert c.metrics_url is not None and c.metrics_url.startswith("http://127.0.0.1:")
        k3 = sum(1 for i in range(600) if i % 17 == 3)
        assert wait_until(lambda: c.stats().consumed == 600 - k3)
        s = _scrape(c.metrics_url)
        st = c.stats()
        # held messages: in flight, per queue, as stats() says
        for q, n in st.in_flight.items():
            labels = {"group": "g", "topic": q.topic, "queue": str(q.queue_id)}
            assert _value(s, "lite_push_in_flight_messages", **labels) == n
            assert _value(s, "lite_push_queue_paused", **labels) == 0
            assert _value(s, "lite_push_messages_polled_total", **labels) == broker.max_offset(q)
        assert sum(_matching(s, "lite_push_in_flight_messages", group="g").values()) == k3
        assert sum(_matching(s, "lite_push_in_flight_bytes", group="g").values()) == k3 * 10
        assert _value(s, "lite_push_messages_processed_total", group="g", mode="KEY_ORDERLY", outcome="success") == (
            600 - k3
        )
        assert _value(s, "lite_push_lanes", group="g") == 32
        assert _value(s, "lite_push_lanes_busy", group="g") >= 1  # the lane holding k3
        assert _value(s, "lite_push_assigned_queues", group="g") == 3
        assert _value(s, "lite_push_rebalances_total", group="g") >= 1
        build = _matching(s, "lite_push_build_info")
        assert [dict(lab) for lab in build] == [
            {
                "version": __version__,
                "router": ROUTER_IMPL,
                "offsets": OFFSETS_IMPL,
                "lane_metrics": LANE_METRICS_IMPL,
            }
        ]
        assert {ROUTER_IMPL, OFFSETS_IMPL, LANE_METRICS_IMPL} <= {"cython", "python"}
        # the listener histogram counted every finished message, once
        assert _value(s, "lite_push_listener_duration_seconds_count", group="g", mode="KEY_ORDERLY") == 600 - k3
        assert _value(s, "lite_push_end_to_end_latency_seconds_count", group="g") == 600 - k3
        # every message taken from its lane so far (k3's later ones may still
        # queue behind its held call)
        assert _value(s, "lite_push_lane_wait_seconds_count", group="g") == 600 - sum(st.lane_depths)
        gate.set()
        assert wait_until(lambda: c.stats().consumed == 600)
        # committed to the end: lag 0 once the commit ran
        qs = broker.queues("T")

        def committed_to_end() -> bool:
            s2 = _scrape(c.metrics_url or "")
            return all(
                _value(s2, "lite_push_lag_messages", group="g", topic="T", queue=str(q.queue_id)) == 0
                and _value(s2, "lite_push_committed_offset", group="g", topic="T", queue=str(q.queue_id))
                == broker.max_offset(q)
                for q in qs
            )

        assert wait_until(committed_to_end)
        s = _scrape(c.metrics_url)
        for q in qs:
            at = _value(s, "lite_push_last_commit_timestamp_seconds", group="g", topic="T", queue=str(q.queue_id))
            assert at > 1.7e9
    # stopped: the exporter is gone with the last consumer using it
    with pytest.raises(OSError):
        urllib.request.urlopen(c.metrics_url, timeout=2)


def test_lag_counts_what_is_stored_and_not_committed(broker: EmbeddedBroker) -> None:
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(90)])
    release = threading.Event()

    def listener(msgs: list[MessageExt]) -> None:
        release.wait(10)

    c = _consumer(broker, listener, lanes=2, metrics_port=0, pull_threshold_for_queue=5)
    c.subscribe("T")
    with c:
        assert c.metrics_url is not None
        assert wait_until(lambda: len(c.stats().paused) == 3)  # flow control stopped all three
        s = _scrape(c.metrics_url)
        for q in broker.queues("T"):
            labels = {"group": "g", "topic": "T", "queue": str(q.queue_id)}
            assert _value(s, "lite_push_lag_messages", **labels) == broker.max_offset(q)  # nothing committed yet
            assert _value(s, "lite_push_queue_paused", **labels) == 1
            assert _value(s, "lite_push_queue_pauses_total", **labels) >= 1
        release.set()
        assert wait_until(lambda: c.stats().consumed == 90)
        s = _scrape(c.metrics_url)
        assert sum(_matching(s, "lite_push_queue_resumes_total", group="g").values()) >= 3


def test_retries_and_dead_letters_are_counted_by_outcome(broker: EmbeddedBroker) -> None:
    broker.send_batch("T", [(b"x", "bad" if i == 5 else f"k{i}") for i in range(40)])

    def listener(msgs: list[MessageExt]) -> None:
        if msgs[0].keys == "bad":
            raise RuntimeError("boom")

    c = _consumer(broker, listener, lanes=4, metrics_port=0, suspend_ms=0, max_reconsume_times=2)
    c.subscribe("T")
    with c:
        assert c.metrics_url is not None
        assert wait_until(lambda: c.stats().dead_lettered == 1 and c.stats().consumed == 39)
        s = _scrape(c.metrics_url)
        st = c.stats()
        by = {
            o: _value(s, "lite_push_messages_processed_total", group="g", mode="KEY_ORDERLY", outcome=o)
            for o in ("success", "retry", "dlq")
        }
        assert by == {"success": 39, "retry": st.retried, "dlq": 1}
        assert st.retried == 3  # the first attempt and two retries failed


def test_tag_filtered_offsets_are_counted(broker: EmbeddedBroker) -> None:
    broker.send_batch("T", [{"body": b"x", "keys": f"k{i}", "tags": "A" if i % 3 else "B"} for i in range(300)])
    c = _consumer(broker, lambda msgs: None, lanes=4, metrics_port=0)
    c.subscribe("T", "A")
    with c:
        assert c.metrics_url is not None
        wanted = sum(1 for i in range(300) if i % 3)
        assert wait_until(lambda: c.stats().consumed == wanted)
        s = _scrape(c.metrics_url)
        assert sum(_matching(s, "lite_push_messages_polled_total", group="g").values()) == wanted
        # every B a poll passed over, except any after the last A of its queue the scan has not reached
        filtered = sum(_matching(s, "lite_push_messages_filtered_total", group="g").values())
        assert 300 - wanted - 3 <= filtered <= 300 - wanted


def test_consumers_share_one_exporter_and_registry_without_clashes(broker: EmbeddedBroker) -> None:
    broker.create_topic("U", queue_count=2)
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(50)])
    broker.send_batch("U", [(b"x", f"k{i}") for i in range(20)])
    with socket.socket() as sock:  # a free port, shared by both consumers
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    a = _consumer(broker, lambda msgs: None, group="a", lanes=2, metrics_port=port)
    a.subscribe("T")
    b = _consumer(broker, lambda msgs: None, group="b", lanes=3, metrics_port=port)
    b.subscribe("U")
    with a, b:
        assert a.metrics_url == b.metrics_url == f"http://127.0.0.1:{port}/metrics"
        assert wait_until(lambda: a.stats().consumed == 50 and b.stats().consumed == 20)
        s = _scrape(a.metrics_url or "")
        ok = {"mode": "KEY_ORDERLY", "outcome": "success"}
        assert _value(s, "lite_push_messages_processed_total", group="a", **ok) == 50
        assert _value(s, "lite_push_messages_processed_total", group="b", **ok) == 20
        assert _value(s, "lite_push_lanes", group="a") == 2 and _value(s, "lite_push_lanes", group="b") == 3
        assert len(_matching(s, "lite_push_build_info")) == 1  # once per registry
    # both stopped: the shared exporter is closed
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_an_application_registry_gets_the_metrics_and_no_exporter_starts(broker: EmbeddedBroker) -> None:
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(30)])
    registry = CollectorRegistry()
    c = _consumer(broker, lambda msgs: None, lanes=2, registry=registry)
    c.subscribe("T")
    with c:
        assert c.metrics_url is None
        assert wait_until(lambda: c.stats().consumed == 30)
        s = _parse(generate_latest(registry).decode())
        assert _value(s, "lite_push_messages_processed_total", group="g", mode="KEY_ORDERLY", outcome="success") == 30
        names = {n for n, _ in s}
        assert names <= exported_series(), names - exported_series()
    s = _parse(generate_latest(registry).decode())
    assert not _matching(s, "lite_push_lanes")  # a stopped consumer leaves the registry


def test_without_metrics_nothing_is_recorded(broker: EmbeddedBroker) -> None:
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(30)])
    c = _consumer(broker, lambda msgs: None, lanes=2)
    c.subscribe("T")
    with c:
        assert wait_until(lambda: c.stats().consumed == 30)
        assert c.metrics_snapshot() is None and c.metrics_url is None
        assert not any(lane.stamping for lane in c._lanes)


def test_asyncio_executor_exports_the_same_metrics(broker: EmbeddedBroker) -> None:
    broker.send_batch("T", [(b"x", f"k{i % 9}") for i in range(200)])

    async def listener(msgs: list[MessageExt]) -> None:
        await asyncio.sleep(0)

    registry2 = CollectorRegistry()
    c2 = _consumer(broker, listener, group="g2", lanes=64, registry=registry2, executor="asyncio")
    c2.subscribe("T")
    scraped: list[Samples] = []

    async def main2() -> None:
        async with c2:  # type: ignore[attr-defined]
            while c2.stats().consumed < 200:
                await asyncio.sleep(0.01)
            scraped.append(_parse(generate_latest(registry2).decode()))

    asyncio.run(main2())
    s = scraped[0]
    assert _value(s, "lite_push_messages_processed_total", group="g2", mode="KEY_ORDERLY", outcome="success") == 200
    assert _value(s, "lite_push_listener_duration_seconds_count", group="g2", mode="KEY_ORDERLY") == 200
    assert _value(s, "lite_push_lanes", group="g2") == 64


def test_metrics_config_errors_name_the_field(broker: EmbeddedBroker) -> None:
    with pytest.raises(ConfigError, match="metrics_port"):
        ConsumerConfig(group="g", metrics_port=70000)
    with pytest.raises(ConfigError, match="metrics_addr"):
        ConsumerConfig(group="g", metrics_addr="")
    with socket.socket() as busy:  # a port another process holds
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        c = _consumer(broker, lambda msgs: None, lanes=1, metrics_port=port)
        c.subscribe("T")
        with pytest.raises(ConfigError, match="metrics_port"):
            c.start()
    # An address that is no address (or none of this host's) is the address's
    # fault, not the port's (issue 30, 5).
    for addr in ("999.1.1.1", "192.0.2.1"):
        c = _consumer(broker, lambda msgs: None, lanes=1, metrics_port=0, metrics_addr=addr)
        c.subscribe("T")
        with pytest.raises(ConfigError) as info:
            c.start()
        assert info.value.field == "metrics_addr", info.value


def test_metric_names_are_the_documented_ones() -> None:
    registry = CollectorRegistry()
    b = EmbeddedBroker()
    b.create_topic("T", queue_count=1)
    c = _consumer(b, lambda msgs: None, lanes=1, registry=registry, mode=ConsumeMode.QUEUE_ORDERLY)
    c.subscribe("T")
    with c:
        s = _parse(generate_latest(registry).decode())
    names = {n for n, _ in s}
    assert names <= exported_series()
    # every family is declared once, with its help
    assert all(doc for _, _, doc in METRICS.values())
    b.close()
