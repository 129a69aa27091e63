"""What the tracing tests share: the process's SDK tracer provider with an
in-memory exporter (OpenTelemetry allows one provider per process), and a
consumer run until its spans finished."""

from __future__ import annotations

from typing import Any

from helpers import wait_until
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from lite_push import ConsumeFromWhere, ConsumerConfig, EmbeddedBroker, LitePushConsumer

_EXPORTER = InMemorySpanExporter()


def install() -> InMemorySpanExporter:
    """The process's SDK tracer provider, set on first use (OpenTelemetry
    allows no second one), exporting to memory; the exporter, emptied."""
    current = trace.get_tracer_provider()
    if not isinstance(current, TracerProvider):
        tp = TracerProvider()
        tp.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(tp)
    assert isinstance(trace.get_tracer_provider(), TracerProvider)
    _EXPORTER.clear()
    return _EXPORTER


def sent_in_span(broker: EmbeddedBroker, n: int) -> Any:
    """Send ``n`` messages of key k0 inside a producer span carrying its
    context in their properties; return that span's context."""
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("send T", kind=SpanKind.PRODUCER) as span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        broker.send_batch("T", [{"body": b"x", "keys": "k0", "properties": carrier, "queue_id": 0}] * n)
        return span.get_span_context()


def batch_count(span: Any) -> int:
    return int(dict(span.attributes or {}).get("messaging.batch.message_count", 1))


def processed() -> list[Any]:
    """The consumer spans finished so far."""
    return [s for s in _EXPORTER.get_finished_spans() if s.name == "process T"]


def consume(broker: EmbeddedBroker, listener: Any, n: int, *, messages: bool = False, **cfg: Any) -> None:
    """Consume T until ``n`` consumer spans finished (``messages``: until
    they carried ``n`` messages)."""
    # revoke_timeout under the Kafka tests' short session
    config = ConsumerConfig(group="g", lanes=2, tracing=True, poll_timeout=0.01, revoke_timeout=2.0, **cfg)
    consumer = LitePushConsumer(
        config, source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET), listener=listener
    )
    consumer.subscribe("T")
    consumer.start()
    try:
        if messages:
            assert wait_until(lambda: sum(batch_count(s) for s in processed()) >= n, timeout=20)
        else:
            assert wait_until(lambda: len(processed()) >= n, timeout=20)
    finally:
        consumer.shutdown(10)
