"""A listener is checked when it is given, and picks its executor.

Lanes call a listener with one argument, the list of messages.  One whose
signature cannot take it is refused where it is given: a ``ConfigError``
naming ``listener`` from the Python API, one line and exit 2 from
``lite-push consume`` (before any source is asked).  Callables whose
signature cannot be read pass.  ``ConsumerConfig.executor`` left unset
follows the listener (an ``async def`` runs on the event loop, a plain one
on threads), in ``LitePushConsumer`` and ``AsyncLitePushConsumer`` alike; a
named executor that does not fit is a ``ConfigError`` naming ``executor``.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until

from lite_push import (
    AsyncLitePushConsumer,
    ConfigError,
    ConsumeFromWhere,
    ConsumerConfig,
    EmbeddedBroker,
    LitePushConsumer,
    MessageExt,
)
from lite_push._core.listeners import signature_problem

REPO = Path(__file__).resolve().parent.parent


# -- listeners of every shape ----------------------------------------------------------


def takes_messages(msgs: list[MessageExt]) -> None:
    return None


async def takes_messages_async(msgs: list[MessageExt]) -> None:
    return None


def takes_nothing() -> None:
    return None


def takes_two(msgs: list[MessageExt], context: object) -> None:
    return None


def takes_a_keyword(msgs: list[MessageExt], *, context: object) -> None:
    return None


def takes_optional_more(msgs: list[MessageExt], context: object = None, *, retry: bool = False) -> None:
    return None


def takes_anything(*args: object, **kwargs: object) -> None:
    return None


async def takes_nothing_async() -> None:
    return None


class Handler:
    def __call__(self, msgs: list[MessageExt]) -> None:
        return None

    def on_messages(self, msgs: list[MessageExt]) -> None:
        return None

    def on_nothing(self) -> None:
        return None

    @staticmethod
    def static(msgs: list[MessageExt]) -> None:
        return None


class AsyncHandler:
    async def __call__(self, msgs: list[MessageExt]) -> None:
        return None


class NoArgHandler:
    def __call__(self) -> None:
        return None


GOOD: list[tuple[str, Callable[..., Any]]] = [
    ("function", takes_messages),
    ("async def", takes_messages_async),
    ("optional extras", takes_optional_more),
    ("*args", takes_anything),
    ("class with __call__", Handler()),
    ("class with async __call__", AsyncHandler()),
    ("bound method", Handler().on_messages),
    ("staticmethod", Handler.static),
    ("partial filling the second", functools.partial(takes_two, context="c")),
    ("partial of an async def", functools.partial(takes_messages_async)),
    ("lambda", lambda msgs: None),
    ("builtin without a readable signature", print),
]

BAD: list[tuple[str, Callable[..., Any], str]] = [
    ("no argument", takes_nothing, "takes_nothing()"),
    ("async def, no argument", takes_nothing_async, "takes_nothing_async()"),
    ("two positional", takes_two, "missing a required argument: 'context'"),
    ("required keyword-only", takes_a_keyword, "missing a required argument: 'context'"),
    ("bound method of none", Handler().on_nothing, "Handler.on_nothing()"),
    ("class with a bare __call__", NoArgHandler(), "NoArgHandler()"),
    ("partial still needing one more", functools.partial(takes_two), "partial(takes_two, ...)"),
    ("lambda of none", lambda: None, "<lambda>()"),
]


def _broker() -> EmbeddedBroker:
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=2)
    return broker


@pytest.mark.parametrize(("listener"), [g[1] for g in GOOD], ids=[g[0] for g in GOOD])
def test_a_listener_that_takes_the_messages_is_accepted(listener: Callable[..., Any]) -> None:
    assert signature_problem(listener) is None
    broker = _broker()
    consumer = LitePushConsumer(ConsumerConfig(group="g"), source=broker.pull_consumer("g"), listener=listener)
    consumer.shutdown()


@pytest.mark.parametrize(("listener", "fragment"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_listener_that_cannot_take_the_messages_is_refused(listener: Callable[..., Any], fragment: str) -> None:
    broker = _broker()
    with pytest.raises(ConfigError) as info:
        LitePushConsumer(ConsumerConfig(group="g"), source=broker.pull_consumer("g"), listener=listener)
    assert info.value.field == "listener"
    text = str(info.value)
    assert fragment in text and "the list of messages" in text, text
    assert len(text.splitlines()) == 1


def test_the_async_consumer_refuses_an_async_listener_of_the_wrong_shape() -> None:
    broker = _broker()
    with pytest.raises(ConfigError, match=r"takes_nothing_async\(\) cannot take") as info:
        AsyncLitePushConsumer(ConsumerConfig(group="g"), source=broker.pull_consumer("g"), listener=takes_nothing_async)
    assert info.value.field == "listener"


# -- the executor follows the listener -----------------------------------------------


def _consume(listener: Callable[..., Any], n: int = 20) -> LitePushConsumer:
    broker = _broker()
    for i in range(n):
        broker.send("T", body=b"x", keys=f"k{i % 5}")
    consumer = LitePushConsumer(
        ConsumerConfig(group="g", lanes=4, poll_timeout=0.02),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener,
    )
    consumer.subscribe("T")
    with consumer:
        assert wait_until(lambda: consumer.stats().consumed >= n, timeout=30)
    return consumer


def test_an_async_listener_with_the_default_config_runs_on_an_event_loop() -> None:
    loops: set[int] = set()

    async def listener(msgs: list[MessageExt]) -> None:
        loops.add(id(asyncio.get_running_loop()))  # raises outside a running loop
        await asyncio.sleep(0)

    consumer = _consume(listener)
    assert consumer.config.executor == "asyncio"
    assert len(loops) == 1  # one loop, the consumer's own


def test_a_plain_listener_with_the_default_config_runs_on_threads() -> None:
    threads: set[str] = set()
    in_loop: list[bool] = []

    def listener(msgs: list[MessageExt]) -> None:
        threads.add(threading.current_thread().name)
        try:
            asyncio.get_running_loop()
            in_loop.append(True)
        except RuntimeError:
            in_loop.append(False)

    consumer = _consume(listener)
    assert consumer.config.executor == "thread"
    assert not any(in_loop) and threads and threading.main_thread().name not in threads


def test_the_async_consumer_needs_no_executor_setting() -> None:
    broker = _broker()
    for i in range(20):
        broker.send("T", body=b"x", keys=f"k{i % 5}")
    seen: list[int] = []

    async def listener(msgs: list[MessageExt]) -> None:
        seen.extend(m.queue_offset for m in msgs)

    async def main() -> AsyncLitePushConsumer:
        consumer = AsyncLitePushConsumer(
            ConsumerConfig(group="g", lanes=8, poll_timeout=0.02),  # executor unset
            source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
            listener=listener,
        )
        consumer.subscribe("T")
        async with consumer:
            for _ in range(3000):
                if consumer.stats().consumed >= 20:
                    break
                await asyncio.sleep(0.01)
        return consumer

    consumer = asyncio.run(main())
    assert consumer.config.executor == "asyncio" and consumer.stats().consumed == 20 and len(seen) == 20


@pytest.mark.parametrize(
    ("executor", "listener", "fragment"),
    [
        ("thread", takes_messages_async, "'thread' runs a plain listener, but takes_messages_async is an `async def`"),
        ("asyncio", takes_messages, "'asyncio' runs an `async def` listener, but takes_messages is a plain function"),
    ],
)
def test_an_executor_that_does_not_fit_the_listener_is_named(
    executor: str, listener: Callable[..., Any], fragment: str
) -> None:
    broker = _broker()
    with pytest.raises(ConfigError) as info:
        LitePushConsumer(
            ConsumerConfig(group="g", executor=executor), source=broker.pull_consumer("g"), listener=listener
        )
    assert info.value.field == "executor" and fragment in str(info.value)


def test_an_explicit_executor_that_fits_is_kept() -> None:
    broker = _broker()
    c1 = LitePushConsumer(ConsumerConfig(group="g", executor="thread"), broker.pull_consumer("g"), takes_messages)
    c2 = LitePushConsumer(
        ConsumerConfig(group="h", executor="asyncio"), broker.pull_consumer("h"), takes_messages_async
    )
    assert (c1.config.executor, c2.config.executor) == ("thread", "asyncio")
    c1.shutdown()
    c2.shutdown()
    assert ConsumerConfig(group="g").executor is None  # unset until a listener is given


# -- the command line ------------------------------------------------------------------

LISTENERS = textwrap.dedent(
    """
    import functools

    def good(msgs):
        return None

    async def agood(msgs):
        return None

    def nothing():
        return None

    def two(msgs, context):
        return None

    def keyword(msgs, *, context):
        return None

    class Handler:
        def on_nothing(self):
            return None

    handler = Handler()
    partial_two = functools.partial(two)
    """
)


@pytest.mark.parametrize(
    ("spec", "extra", "fragment"),
    [
        ("bad_listeners:nothing", [], "listener 'bad_listeners:nothing': nothing() cannot take the one argument"),
        ("bad_listeners:two", [], "two(msgs, context) cannot take the one argument"),
        ("bad_listeners:keyword", [], "missing a required argument: 'context'"),
        ("bad_listeners:handler.on_nothing", [], "Handler.on_nothing() cannot take"),
        ("bad_listeners:partial_two", [], "partial(two, ...)"),
        ("bad_listeners:agood", ["--executor", "thread"], "executor: 'thread' runs a plain listener, but agood"),
        ("bad_listeners:good", ["--executor", "asyncio"], "executor: 'asyncio' runs an `async def` listener"),
    ],
)
def test_the_command_refuses_a_listener_of_the_wrong_shape_before_asking_the_source(
    tmp_path: Path, spec: str, extra: list[str], fragment: str
) -> None:
    (tmp_path / "bad_listeners.py").write_text(LISTENERS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITE_PUSH_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO)])
    # nothing listens on port 1: a command that asked the source would fail there (exit 1)
    argv = ["consume", "--source", "redis://127.0.0.1:1/0", "--group", "g", "--topic", "T", "--listener", spec]
    done = subprocess.run(
        [sys.executable, "-m", "lite_push", *argv, *extra],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 2 and done.stdout == "", done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("lite-push: error: ") and fragment in lines[0], done.stderr
