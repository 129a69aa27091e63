"""OpenTelemetry spans of the listener calls (``ConsumerConfig.tracing``),
with the SDK's in-memory exporter on the embedded broker: the sender's
context as the parent, a span per message or per call (links), the
attributes, error status on a failure, a retry event; off, or without a
recording provider, the listener is called as given."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import pytest
from helpers import wait_until
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from tracing_helpers import batch_count, consume, processed, sent_in_span

from lite_push import ConfigError, ConsumeFromWhere, ConsumerConfig, ConsumeResult, EmbeddedBroker, LitePushConsumer
from lite_push._tracing import system_of, traced


def test_a_span_per_message_with_the_senders_context_as_parent(
    broker: EmbeddedBroker, spans: InMemorySpanExporter
) -> None:
    sender = sent_in_span(broker, 3)
    seen: list[Any] = []

    def listener(msgs: list[Any]) -> None:
        seen.append(trace.get_current_span().get_span_context())  # the call's span is current

    consume(broker, listener, 3)
    got = processed()
    assert len(got) == 3
    for s in got:
        assert s.kind is SpanKind.CONSUMER
        assert s.parent is not None and s.parent.span_id == sender.span_id
        assert s.context.trace_id == sender.trace_id
        attrs = dict(s.attributes or {})
        assert attrs["messaging.system"] == "lite_push"
        assert attrs["messaging.destination.name"] == "T"
        assert attrs["messaging.consumer.group.name"] == "g"
        assert attrs["messaging.destination.partition.id"] == "0"
        assert attrs["lite_push.message.key"] == "k0"
        assert attrs["messaging.message.id"]
        assert attrs["lite_push.queue_time_ms"] >= 0
        assert s.status.status_code is StatusCode.UNSET
    assert sorted(dict(s.attributes or {})["lite_push.message.offset"] for s in got) == [0, 1, 2]
    assert {c.span_id for c in seen} == {s.context.span_id for s in got}


def test_a_call_of_several_messages_is_one_span_linked_to_each(
    broker: EmbeddedBroker, spans: InMemorySpanExporter
) -> None:
    sender = sent_in_span(broker, 4)
    broker.send_batch("T", [{"body": b"y", "keys": "k0", "queue_id": 0}])  # no context: no link

    def listener(msgs: list[Any]) -> None:
        pass

    consume(broker, listener, 5, messages=True, batch_size=8)
    got = processed()
    assert all("messaging.batch.message_count" in dict(s.attributes or {}) for s in got)
    assert sum(batch_count(s) for s in got) == 5
    links = [lk for s in got for lk in s.links]
    assert len(links) == 4 and all(lk.context.span_id == sender.span_id for lk in links)
    assert all(s.parent is None or s.parent.span_id != sender.span_id for s in got)


def test_a_failed_call_is_an_error_and_its_redelivery_a_retry(
    broker: EmbeddedBroker, spans: InMemorySpanExporter
) -> None:
    sent_in_span(broker, 1)
    calls: list[int] = []

    def listener(msgs: list[Any]) -> ConsumeResult | None:
        calls.append(msgs[0].reconsume_times)
        if len(calls) == 1:
            raise ValueError("boom")
        if len(calls) == 2:
            return ConsumeResult.RETRY_LATER
        return None

    consume(broker, listener, 3, mode="KEY_ORDERLY", suspend_ms=10)
    got = sorted(processed(), key=lambda s: s.start_time or 0)
    assert [s.status.status_code for s in got[:3]] == [StatusCode.ERROR, StatusCode.ERROR, StatusCode.UNSET]
    first, second, third = got[:3]
    assert [e.name for e in first.events] == ["exception", "park"]  # KEY_ORDERLY: its key waits for the retry
    assert dict(first.attributes or {})["error.type"] == "ValueError"
    assert [e.name for e in second.events] == ["retry", "park"]
    assert dict(second.attributes or {})["error.type"] == "RETRY_LATER"
    assert [e.name for e in third.events] == ["retry"]
    assert (first.end_time or 0) <= (second.start_time or 0)  # ended when its call did


@pytest.mark.parametrize(
    ("mode", "kw", "event", "asynchronous"),
    [
        ("CONCURRENTLY", {}, "send_back", False),
        ("KEY_ORDERLY", {"max_reconsume_times": 0}, "dead_letter", False),
        ("KEY_ORDERLY", {}, "park", True),
        ("QUEUE_ORDERLY", {"max_reconsume_times": 0}, "dead_letter", False),
    ],
)
def test_what_becomes_of_a_failed_message_is_an_event_of_its_span(
    broker: EmbeddedBroker, spans: InMemorySpanExporter, mode: str, kw: dict[str, Any], event: str, asynchronous: bool
) -> None:
    sent_in_span(broker, 1)

    def listener(msgs: list[Any]) -> None:
        raise ValueError("boom")

    async def async_listener(msgs: list[Any]) -> None:
        raise ValueError("boom")

    consume(broker, async_listener if asynchronous else listener, 1, mode=mode, **kw)
    (span,) = processed()[:1]
    assert span.status.status_code is StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception", event]
    assert dict(span.events[1].attributes or {})["lite_push.message.offset"] == 0


def test_a_steal_of_the_keys_behind_a_stuck_call_is_an_event_of_its_span(
    broker: EmbeddedBroker, spans: InMemorySpanExporter
) -> None:
    release = threading.Event()
    started = threading.Event()

    def listener(msgs: list[Any]) -> None:
        if msgs[0].keys == "hung":
            started.set()
            release.wait(20)

    config = ConsumerConfig(group="g", lanes=2, tracing=True, poll_timeout=0.01, steal_after=0.05)
    consumer = LitePushConsumer(
        config, source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET), listener=listener
    )
    consumer.subscribe("T")
    with consumer:
        broker.send_batch("T", [{"body": b"x", "keys": "hung", "queue_id": 0}])
        assert started.wait(10)
        broker.send_batch("T", [{"body": b"x", "keys": f"k{i % 40}", "queue_id": 0} for i in range(400)])
        assert wait_until(lambda: consumer.stats().steals >= 1, timeout=20)  # keys left the stuck lane
        release.set()
        assert wait_until(lambda: len(processed()) == 401, timeout=20)
    (hung,) = [s for s in processed() if dict(s.attributes or {}).get("lite_push.message.key") == "hung"]
    assert "steal" in [e.name for e in hung.events]


def test_an_async_listener_gets_a_span_too(broker: EmbeddedBroker, spans: InMemorySpanExporter) -> None:
    sender = sent_in_span(broker, 2)

    async def listener(msgs: list[Any]) -> None:
        assert trace.get_current_span().get_span_context().trace_id == sender.trace_id

    consume(broker, listener, 2)
    got = processed()
    assert len(got) == 2 and all(s.status.status_code is StatusCode.UNSET for s in got)


def test_off_the_listener_is_called_as_given() -> None:
    def listener(msgs: list[Any]) -> None:
        pass

    assert traced(ConsumerConfig(group="g"), object(), listener) is listener


def test_the_system_is_named_by_the_source() -> None:
    class Mine:
        messaging_system = "mq"

    assert system_of(Mine()) == "mq"
    assert system_of(EmbeddedBroker().pull_consumer("g")) == "lite_push"


def test_tracing_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match="tracing"):
        ConsumerConfig(group="g", tracing="yes")  # type: ignore[arg-type]


def test_without_a_recording_provider_or_the_api_nothing_is_wrapped() -> None:
    """In fresh interpreters: no provider set (a warning, the listener as
    given); the API missing (a ConfigError naming tracing and the extra)."""
    script = """
import logging, sys
{block}
from lite_push import ConfigError, ConsumerConfig
from lite_push._tracing import traced
f = lambda msgs: None
try:
    print(traced(ConsumerConfig(group="g", tracing=True), object(), f) is f)
except ConfigError as e:
    print(e)
"""
    plain = subprocess.run([sys.executable, "-c", script.format(block="")], capture_output=True, text=True)
    assert plain.stdout.strip() == "True" and "no tracer provider records" in plain.stderr
    missing = subprocess.run(
        [sys.executable, "-c", script.format(block="sys.modules['opentelemetry'] = None")],
        capture_output=True,
        text=True,
    )
    assert "tracing" in missing.stdout and "lite-push[tracing]" in missing.stdout


def test_the_switch_comes_from_the_flag_the_environment_or_the_file(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lite_push.cli.parser import build_parser
    from lite_push.cli.plan import plan_of
    from lite_push.cli.settings import load_settings

    common = ["consume", "--source", "embedded", "--topic", "T", "--group", "g", "--listener", "json:dumps"]
    plan, _, _ = plan_of(build_parser().parse_args([*common, "--tracing"]))
    assert plan.config.tracing is True
    plan, _, _ = plan_of(build_parser().parse_args(common))
    assert plan.config.tracing is False
    monkeypatch.setenv("LITE_PUSH_TRACING", "1")
    assert load_settings({"group": "g"}).consumer_config().tracing is True
    monkeypatch.delenv("LITE_PUSH_TRACING")
    path = tmp_path / "c.toml"
    path.write_text('[consumer]\ngroup = "g"\ntracing = true\n')
    assert load_settings({}, config_file=path).consumer_config().tracing is True
