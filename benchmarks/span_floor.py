"""The OpenTelemetry SDK's floor under ``ConsumerConfig.tracing`` (issue 43):
a bare loop making one CONSUMER span per message with the processor
``harness.py --tracing`` uses (batching to an exporter that drops the
spans), the same ten attributes, made current and ended, without and with a
parent extracted from a ``traceparent``; CPU per span (every thread of the
process, the batch processor's too).

    .venv/bin/python benchmarks/span_floor.py
"""

from __future__ import annotations

import time

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult


class Dropped(SpanExporter):
    def export(self, spans: object) -> SpanExportResult:  # type: ignore[override]
        return SpanExportResult.SUCCESS

tp = TracerProvider()
tp.add_span_processor(BatchSpanProcessor(Dropped()))
trace.set_tracer_provider(tp)
tracer = trace.get_tracer("floor")
carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
attrs = {"messaging.system": "lite_push", "messaging.operation.type": "process", "messaging.operation.name": "process",
         "messaging.consumer.group.name": "bench", "messaging.destination.name": "T",
         "messaging.destination.partition.id": "0", "messaging.message.id": "x-T-0-1",
         "lite_push.message.offset": 1, "lite_push.message.key": "k", "lite_push.queue_time_ms": 3}
for name, with_parent in (("no parent", False), ("parent from traceparent", True)):
    n = 100_000
    t0 = time.process_time()
    for _ in range(n):
        parent = propagate.extract(carrier) if with_parent else None
        span = tracer.start_span("process T", context=parent, kind=trace.SpanKind.CONSUMER, attributes=attrs)
        token = context.attach(trace.set_span_in_context(span))
        context.detach(token)
        span.end()
    cpu = time.process_time() - t0
    print(f"{name}: {cpu / n * 1e6:.1f} µs CPU per span")
tp.shutdown()
