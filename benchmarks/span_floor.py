"""The OpenTelemetry SDK's floor under ``ConsumerConfig.tracing`` (issue 43):
a bare loop making one CONSUMER span per message with the processor
``harness.py --tracing`` uses (batching to an exporter that drops the
spans), the same ten attributes, made current and ended, without and with a
parent extracted from a ``traceparent``; then lite_push's own wrapper
(``traced``, as ``ConsumerConfig(tracing=True)`` wraps a listener) around a
no-op listener, called on one thread.  CPU per span (every thread of the
process, the batch processor's too).  ``--ratio R``: the provider samples
that share of the traces without a parent (``ParentBased(TraceIdRatioBased(R))``;
a span not sampled is not recorded).

    .venv/bin/python benchmarks/span_floor.py
    .venv/bin/python benchmarks/span_floor.py --ratio 0.01
"""

from __future__ import annotations

import argparse
import time

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from lite_push import ConsumerConfig, EmbeddedBroker, MessageQueue
from lite_push._tracing import traced


class Dropped(SpanExporter):
    def export(self, spans: object) -> SpanExportResult:  # type: ignore[override]
        return SpanExportResult.SUCCESS


parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--ratio", type=float, default=1.0, help="the sampled share of traces without a parent")
ratio = parser.parse_args().ratio
tp = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
tp.add_span_processor(BatchSpanProcessor(Dropped()))
trace.set_tracer_provider(tp)
tracer = trace.get_tracer("floor")
carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
attrs = {
    "messaging.system": "lite_push",
    "messaging.operation.type": "process",
    "messaging.operation.name": "process",
    "messaging.consumer.group.name": "bench",
    "messaging.destination.name": "T",
    "messaging.destination.partition.id": "0",
    "messaging.message.id": "x-T-0-1",
    "lite_push.message.offset": 1,
    "lite_push.message.key": "k",
    "lite_push.queue_time_ms": 3,
}
print(f"sampled share of traces without a parent: {ratio:g}")
for name, with_parent in (("SDK, no parent", False), ("SDK, parent from traceparent", True)):
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

# lite_push's wrapper on one thread: the SDK's floor plus what the wrapper adds
broker = EmbeddedBroker()
broker.create_topic("T", 1)
broker.send_batch("T", [(b"x", f"k{i}") for i in range(10)])
calls = [[m] for m in broker.messages(MessageQueue("T", "embedded", 0))] * 10_000
wrapped = traced(ConsumerConfig(group="bench", tracing=True), broker, lambda msgs: None)
t0 = time.process_time()
for call in calls:
    wrapped(call)
cpu = time.process_time() - t0
print(f"lite_push's wrapper, no parent: {cpu / len(calls) * 1e6:.1f} µs CPU per span")
broker.close()
tp.shutdown()
