"""OpenTelemetry spans for the listener calls (``ConsumerConfig.tracing``).

:func:`traced` wraps the application's listener once, at construction, so
every executor (thread and asyncio lanes, QUEUE_ORDERLY, each member of
``--processes``) calls the wrapper and none of them changes.  Off (the
default), or without the OpenTelemetry API's recording provider, it returns
the listener itself: not a call more per message.

A call of one message gets a CONSUMER span ``process <topic>`` whose parent
is the context the sender put in the message (W3C ``traceparent`` and
``tracestate`` in its properties: Kafka headers, Redis fields, embedded
properties); with ``batch_size`` above 1 a call gets one span with a link
to each message's context.  Attributes follow the messaging semantic
conventions (``messaging.system``, ``messaging.destination.name``,
``messaging.consumer.group.name``, ``messaging.destination.partition.id``,
``messaging.message.id``; the offset and key as Kafka's names on Kafka,
``lite_push.message.offset`` and ``lite_push.message.key`` elsewhere) and
``lite_push.queue_time_ms`` (from the message's store time).  A message
delivered again (``reconsume_times`` above 0) adds a ``retry`` event; a
call that raises records the exception, and one that raises or returns
anything but success sets the span's status to error; such a span stays
open until the lane decided what becomes of each message (events
``send_back``, ``park``, ``dead_letter``: :func:`verdict_event`, then
:func:`settle`), and ends at the moment the call did.  A steal of the keys
waiting behind a call in progress is a ``steal`` event (:func:`stolen`).
The span is current while the listener runs, so the listener's own spans
are its children.

The API is imported only when tracing is on: ``import lite_push`` never
imports OpenTelemetry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from typing import Any

from ._config import ConsumerConfig
from ._core.listeners import is_async_callable
from ._errors import ConfigError
from ._types import ConsumeResult, MessageExt
from ._version import __version__

__all__ = [
    "SendSpan",
    "check_tracing",
    "no_span",
    "send_context",
    "send_span",
    "settle",
    "stolen",
    "system_of",
    "traced",
    "verdict_event",
]

logger = logging.getLogger(__name__)

_OK = (None, ConsumeResult.SUCCESS)

#: The span of the call that just failed, with its end time, kept open in
#: the lane's thread or task until the lane decided what becomes of each of
#: its messages (:func:`verdict_event`, :func:`settle`).
_PENDING: ContextVar[tuple[Any, int] | None] = ContextVar("lite_push_failed_span", default=None)
#: The spans of the calls in progress, by the id of their list of messages
#: (a steal names the stuck call by that list: :func:`stolen`).
_OPEN: dict[int, Any] = {}


def verdict_event(verdict: str, message: MessageExt) -> None:
    """An event ``verdict`` (``dead_letter``, ``park``, ``send_back``) of
    ``message`` on the span of the call that failed it, if one is kept open
    (nothing to do with tracing off)."""
    pending = _PENDING.get()
    if pending is not None:
        pending[0].add_event(
            verdict,
            {
                "messaging.message.id": message.msg_id,
                "lite_push.message.offset": message.queue_offset,
                "lite_push.reconsume_times": message.reconsume_times,
            },
        )


def settle() -> None:
    """End the span of the call that failed, at the moment the call ended
    (once the lane decided what becomes of its messages)."""
    pending = _PENDING.get()
    if pending is not None:
        _PENDING.set(None)
        pending[0].end(end_time=pending[1])


def stolen(call: Sequence[MessageExt], moved: int) -> None:
    """An event ``steal`` on the span of the call in progress of ``call``:
    ``moved`` messages of other keys left its lane."""
    span = _OPEN.get(id(call))
    if span is not None:
        span.add_event("steal", {"lite_push.messages_moved": moved})


def check_tracing(tracing: object) -> bool:
    """``tracing`` as a broker takes it (a bool); ``True`` needs the
    OpenTelemetry API (:class:`~lite_push.ConfigError` naming ``tracing``)."""
    if not isinstance(tracing, bool):
        raise ConfigError("tracing", f"must be True or False, got {tracing!r}")
    if tracing:
        try:
            import opentelemetry.propagate  # noqa: F401
        except ImportError as e:
            raise ConfigError(
                "tracing", "needs the OpenTelemetry API, which is not installed: pip install 'lite-push[tracing]'"
            ) from e
    return tracing


def send_context() -> dict[str, str] | None:
    """The current context as message properties (W3C ``traceparent`` and
    ``tracestate``), for a broker with tracing on to put in what it sends;
    ``None`` outside any span."""
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None


#: A span around a send of ``count`` messages to ``topic``.
SendSpan = Callable[[str, int], AbstractContextManager[Any]]


def no_span(topic: str, count: int) -> AbstractContextManager[Any]:
    """No span (tracing off)."""
    return nullcontext()


def send_span(system: str) -> SendSpan:
    """A PRODUCER span ``send <topic>`` around each send, current while it
    runs (a broker with tracing on puts its context in what it sends), for a
    sender with no span of its own (``lite-push produce --tracing``)."""
    from opentelemetry import trace

    tracer = trace.get_tracer("lite_push", __version__)

    def span(topic: str, count: int) -> AbstractContextManager[Any]:
        attrs: dict[str, Any] = {
            "messaging.system": system,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": topic,
            "messaging.batch.message_count": count,
        }
        return tracer.start_as_current_span(f"send {topic}", kind=trace.SpanKind.PRODUCER, attributes=attrs)

    return span


def system_of(source: object) -> str:
    """``messaging.system`` for ``source``: its ``messaging_system``
    attribute when it has one, else ``kafka`` or ``redis`` by the package it
    comes from, else ``lite_push`` (the embedded broker, a source of the
    application's own)."""
    named = getattr(source, "messaging_system", None)
    if isinstance(named, str) and named:
        return named
    module = type(source).__module__
    for system in ("kafka", "redis"):
        if f".sources.{system}" in module:
            return system
    return "lite_push"


def traced(config: ConsumerConfig, source: object, listener: Callable[..., Any]) -> Callable[..., Any]:
    """``listener`` making a span of each call when ``config.tracing`` is
    on and a recording tracer provider is set (else ``listener`` itself).
    Raises :class:`~lite_push.ConfigError` naming ``tracing`` when the
    OpenTelemetry API is not installed."""
    if not config.tracing:
        return listener
    try:
        from opentelemetry import trace
    except ImportError as e:
        raise ConfigError(
            "tracing", "needs the OpenTelemetry API, which is not installed: pip install 'lite-push[tracing]'"
        ) from e
    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        logger.warning(
            "group %r: tracing is on but no tracer provider records (set one, e.g. the SDK's, before the "
            "consumer is built): no spans are made",
            config.group,
        )
        return listener
    spans = _Spans(trace.get_tracer("lite_push", __version__), config, system_of(source))
    if is_async_callable(listener):

        async def traced_async(msgs: list[MessageExt]) -> Any:
            settle()  # a failed call's span no lane settled
            span, token = spans.start(msgs)
            try:
                result = await listener(msgs)
            except BaseException as e:
                spans.failed(span, token, msgs, e)
                raise
            spans.done(span, token, msgs, result)
            return result

        return traced_async

    def traced_call(msgs: list[MessageExt]) -> Any:
        settle()  # a failed call's span no lane settled
        span, token = spans.start(msgs)
        try:
            result = listener(msgs)
        except BaseException as e:
            spans.failed(span, token, msgs, e)
            raise
        spans.done(span, token, msgs, result)
        return result

    return traced_call


class _Spans:
    """Starts and ends the spans of one consumer's listener calls."""

    __slots__ = ("_base", "_batch", "_kafka", "_tracer", "_trace", "_context", "_propagate", "_status")

    def __init__(self, tracer: Any, config: ConsumerConfig, system: str) -> None:
        from opentelemetry import context, propagate, trace
        from opentelemetry.trace import Status, StatusCode

        self._tracer = tracer
        self._trace = trace
        self._context = context
        self._propagate = propagate
        self._status = (Status, StatusCode)
        self._batch = config.batch_size > 1
        self._kafka = system == "kafka"
        self._base: dict[str, Any] = {
            "messaging.system": system,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.consumer.group.name": config.group,
        }

    def _parent(self, m: MessageExt) -> Any:
        """The context the sender put in ``m`` (``None``: none)."""
        props = m.properties
        return self._propagate.extract(props) if props and "traceparent" in props else None

    def _message_attributes(self, m: MessageExt, now_ms: int) -> dict[str, Any]:
        attrs: dict[str, Any] = {}
        if m.msg_id:
            attrs["messaging.message.id"] = m.msg_id
        if self._kafka:
            attrs["messaging.kafka.offset"] = m.queue_offset
            if m.keys:
                attrs["messaging.kafka.message.key"] = m.keys
        else:
            attrs["lite_push.message.offset"] = m.queue_offset
            if m.keys:
                attrs["lite_push.message.key"] = m.keys
        if m.store_timestamp > 0:
            attrs["lite_push.queue_time_ms"] = max(0, now_ms - m.store_timestamp)
        return attrs

    def start(self, msgs: list[MessageExt]) -> tuple[Any, Any]:
        """A span for a call of ``msgs``, made current; ``(span, token)``."""
        trace = self._trace
        first = msgs[0]
        now_ms = int(time.time() * 1000)
        attrs = dict(self._base)
        attrs["messaging.destination.name"] = first.topic
        attrs["messaging.destination.partition.id"] = str(first.queue_id)
        links = None
        parent = None
        if self._batch:
            attrs["messaging.batch.message_count"] = len(msgs)
            links = []
            for m in msgs:
                ctx = self._parent(m)
                sc = trace.get_current_span(ctx).get_span_context() if ctx is not None else None
                if sc is not None and sc.is_valid:
                    links.append(trace.Link(sc, self._message_attributes(m, now_ms)))
        else:
            parent = self._parent(first)
            attrs.update(self._message_attributes(first, now_ms))
        span = self._tracer.start_span(
            f"process {first.topic}", context=parent, kind=trace.SpanKind.CONSUMER, attributes=attrs, links=links
        )
        retried = max(m.reconsume_times for m in msgs)
        if retried > 0:
            span.add_event("retry", {"lite_push.reconsume_times": retried})
        token = self._context.attach(trace.set_span_in_context(span))
        _OPEN[id(msgs)] = span
        return span, token

    def done(self, span: Any, token: Any, msgs: list[MessageExt], result: Any) -> None:
        """The call returned ``result``: its span ends, unless ``result`` is
        no success (then it is an error, kept open for the verdicts)."""
        if result in _OK:
            self._context.detach(token)
            _OPEN.pop(id(msgs), None)
            span.end()
            return
        name = result.name if isinstance(result, ConsumeResult) else type(result).__name__
        self._error(span, token, msgs, name, f"the listener returned {name}")

    def failed(self, span: Any, token: Any, msgs: list[MessageExt], error: BaseException) -> None:
        """The call raised ``error``: an error, kept open for the verdicts."""
        span.record_exception(error)
        self._error(span, token, msgs, type(error).__qualname__, f"{type(error).__name__}: {error}")

    def _error(self, span: Any, token: Any, msgs: list[MessageExt], kind: str, description: str) -> None:
        """The call failed: error status, kept open (its end time noted)
        until the lane decided what becomes of its messages (:func:`settle`)."""
        self._context.detach(token)
        _OPEN.pop(id(msgs), None)
        status, code = self._status
        span.set_attribute("error.type", kind)
        span.set_status(status(code.ERROR, description))
        _PENDING.set((span, time.time_ns()))
