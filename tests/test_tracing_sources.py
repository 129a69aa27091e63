"""A trace across lite_push on every source: a broker with ``tracing=True``
puts the sender's context in what it sends (embedded properties, Redis
fields, Kafka headers), and the consumer's span of that message is its
child; an item with a ``traceparent`` of its own keeps it (a dead letter
sent again keeps its original context)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from tracing_helpers import consume, processed

from lite_push import ConfigError, EmbeddedBroker, MessageQueue, dlq
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer


@pytest.fixture(params=["embedded", "durable", "redis", "kafka"])
def traced_broker(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    if request.param == "embedded":
        b: Any = EmbeddedBroker(tracing=True)
    elif request.param == "durable":
        b = EmbeddedBroker(tmp_path / "log", tracing=True)
    elif request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        b = RedisBroker(server.url, namespace=f"tr-{uuid.uuid4().hex[:8]}", tracing=True)
    else:
        from lite_push.sources.kafka import KafkaBroker
        from lite_push.sources.kafka.mock_cluster import MockKafkaCluster

        cluster = MockKafkaCluster()
        cluster.start()
        request.addfinalizer(cluster.stop)
        # a short session: the mock cluster holds a group its last member
        # left until that member's session ends, and a test consumes twice
        b = KafkaBroker(cluster.bootstrap, topic_creator=cluster.create_topic, tracing=True, session_timeout=3.0)
    b.create_topic("T", 1)
    yield b
    b.close()


def test_the_consumer_span_is_the_senders_child_on_every_source(traced_broker: Any, spans: Any) -> None:
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("order placed", kind=SpanKind.PRODUCER) as span:
        traced_broker.send("T", b"x", keys="k0")
        traced_broker.send_batch("T", [(b"y", "k1"), {"body": b"z", "keys": "k2", "properties": {"a": "b"}}])
        sender = span.get_span_context()
    traced_broker.send("T", b"w", keys="k3")  # outside any span: no context
    bodies: dict[bytes, dict[str, str]] = {}

    def listener(msgs: list[Any]) -> None:
        for m in msgs:
            bodies[m.body] = dict(m.properties)

    consume(traced_broker, listener, 4)
    got = processed()
    children = [s for s in got if s.parent is not None and s.parent.span_id == sender.span_id]
    assert len(children) == 3 and all(s.context.trace_id == sender.trace_id for s in children)
    assert bodies[b"z"]["a"] == "b" and "traceparent" in bodies[b"z"]
    assert "traceparent" not in bodies[b"w"]
    system = dict(got[0].attributes or {})["messaging.system"]
    assert (
        system
        == {"EmbeddedBroker": "lite_push", "RedisBroker": "redis", "KafkaBroker": "kafka"}[type(traced_broker).__name__]
    )


def test_an_item_with_its_own_context_keeps_it(spans: Any) -> None:
    broker = EmbeddedBroker(tracing=True)
    broker.create_topic("T", 1)
    original = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with trace.get_tracer("test").start_as_current_span("resend"):
        broker.send_batch("T", [{"body": b"x", "properties": {"traceparent": original}}])
    (m,) = broker.messages(MessageQueue("T", "embedded", 0))
    assert m.properties["traceparent"] == original
    broker.close()


def test_a_broker_checks_its_switch() -> None:
    with pytest.raises(ConfigError, match="tracing"):
        EmbeddedBroker(tracing="on")  # type: ignore[arg-type]


def test_produce_with_tracing_sends_in_a_span_the_consumer_continues(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, spans: Any
) -> None:
    """``lite-push produce --tracing``: a PRODUCER span ``send T`` per batch,
    its context in each message; the consumer's spans are its children."""
    from lite_push.cli import main

    url = f"embedded:{tmp_path / 'log'}"
    assert main(["topic", "create", "--source", url, "--topic", "T", "--queues", "1"]) == 0
    lines = tmp_path / "lines"
    lines.write_bytes(b"a:1\nb:2\n")
    with open(lines) as stdin:  # a file: produce reads its descriptor
        monkeypatch.setattr(sys, "stdin", stdin)
        assert main(["produce", "--source", url, "--topic", "T", "--key-separator", ":", "--tracing"]) == 0
    (send,) = [s for s in spans.get_finished_spans() if s.name == "send T"]
    assert send.kind is SpanKind.PRODUCER and dict(send.attributes or {})["messaging.batch.message_count"] == 2
    broker = EmbeddedBroker(tmp_path / "log")
    try:
        consume(broker, lambda msgs: None, 2)
    finally:
        broker.close()
    got = processed()
    assert len(got) == 2 and all(s.parent is not None and s.parent.span_id == send.context.span_id for s in got)


def test_a_dead_letter_sent_again_keeps_its_original_context(spans: Any) -> None:
    broker = EmbeddedBroker(tracing=True)
    broker.create_topic("T", 1)
    with trace.get_tracer("test").start_as_current_span("order placed") as span:
        broker.send("T", b"x", keys="k0")
        original = span.get_span_context()

    def fails(msgs: list[Any]) -> None:
        raise ValueError("never")

    consume(broker, fails, 1, max_reconsume_times=0)
    (letter,) = broker.messages(MessageQueue("%DLQ%g", "embedded", 0))
    with trace.get_tracer("test").start_as_current_span("operator resends"):
        dlq.resend(broker, letter)
    (again,) = broker.messages(MessageQueue("T", "embedded", 0))[1:]
    assert again.properties["traceparent"].split("-")[2] == format(original.span_id, "016x")
    broker.close()


def test_calls_failures_and_dead_letters_are_traced_on_every_source(traced_broker: Any, spans: Any) -> None:
    """On every source: a call of several messages is one span linked to
    each sender; a failed attempt is an error with the exception, its
    redelivery a ``retry``, the last one a ``dead_letter``; the dead letter
    sent again carries the sender's context."""
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("orders placed", kind=SpanKind.PRODUCER) as span:
        traced_broker.send_batch("T", [(b"a%d" % i, "k0") for i in range(4)])
        sender = span.get_span_context()
    consume(traced_broker, lambda msgs: None, 4, messages=True, batch_size=8)
    links = [lk for s in processed() for lk in s.links]
    assert len(links) == 4 and all(lk.context.span_id == sender.span_id for lk in links)
    assert all(s.parent is None for s in processed())  # a call's span has links, not a parent

    spans.clear()
    with tracer.start_as_current_span("order placed", kind=SpanKind.PRODUCER) as span:
        traced_broker.send("T", b"bad", keys="k1")
        original = span.get_span_context()

    def fails(msgs: list[Any]) -> None:
        raise ValueError("boom")

    consume(traced_broker, fails, 2, mode="KEY_ORDERLY", max_reconsume_times=1, suspend_ms=10)
    first, second = sorted(processed(), key=lambda s: s.start_time or 0)[:2]
    assert first.parent is not None and first.parent.span_id == original.span_id
    assert first.status.status_code is StatusCode.ERROR and second.status.status_code is StatusCode.ERROR
    assert dict(first.attributes or {})["error.type"] == "ValueError"
    assert [e.name for e in first.events] == ["exception", "park"]
    assert [e.name for e in second.events] == ["retry", "exception", "dead_letter"]

    (letter,) = dlq.dead_letters(traced_broker, "g")
    with tracer.start_as_current_span("operator resends"):
        dlq.resend(traced_broker, letter)
    again = traced_broker.messages(traced_broker.queues("T")[0])[-1]
    assert again.body == b"bad"
    assert again.properties["traceparent"].split("-")[1:3] == [
        format(original.trace_id, "032x"),
        format(original.span_id, "016x"),
    ]
