"""The listener a consumer is given: whether it can be called as lanes call
it, and which executor runs it.

Lanes call a listener with one positional argument, the list of messages
(``listener(msgs)``, awaited when it is an ``async def``).  A listener whose
signature cannot take that (``def handle():``, one with two required
positional parameters, or a required keyword-only one) would pass every
start-up check and then fail on every message, sending each to the
dead-letter queue: it is refused when it is given (:func:`signature_problem`;
the command line refuses it when it loads it).  A callable whose signature
cannot be read (a builtin, some C functions) is let through.

``ConsumerConfig.executor`` left ``None`` follows the listener
(:func:`resolve_executor`): an ``async def`` one runs on ``"asyncio"``, a
plain one on ``"thread"``; an executor named explicitly must fit it.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import replace

from .._config import THREAD_LANES, ConsumeMode, ConsumerConfig, by_executor
from .._errors import ConfigError

__all__ = ["is_async_callable", "listener_name", "resolve_executor", "signature_problem"]

#: What a lane passes: stands in for the list of messages when a
#: listener's signature is checked.
_MESSAGES: list[object] = []


def is_async_callable(fn: object) -> bool:
    """Whether calling ``fn`` returns a coroutine: an ``async def``
    function, a partial of one, or an object with an ``async def
    __call__``."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def listener_name(fn: object) -> str:
    """How an error names ``fn``: its qualified name, else its type's."""
    if isinstance(fn, functools.partial):
        return f"partial({listener_name(fn.func)}, ...)"
    name = getattr(fn, "__qualname__", None)
    return name if isinstance(name, str) else type(fn).__name__


def signature_problem(fn: object) -> str | None:
    """Why ``fn`` cannot be called with one positional argument, the list
    of messages (its name, its signature and what does not fit), or
    ``None`` when it can, or when its signature cannot be read."""
    try:
        sig = inspect.signature(fn)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # no readable signature (builtins, C functions): let it through
        return None
    try:
        sig.bind(_MESSAGES)
    except TypeError as e:
        empty = inspect.Parameter.empty
        bare = sig.replace(  # the parameters as written, without annotations: one short line
            parameters=[p.replace(annotation=empty) for p in sig.parameters.values()], return_annotation=empty
        )
        what = "the one argument a listener is called with, the list of messages"
        return f"{listener_name(fn)}{bare} cannot take {what}: {e}"
    return None


def resolve_executor(config: ConsumerConfig, listener: object, *, needs_async: bool = False) -> ConsumerConfig:
    """``config`` with ``executor`` fitting ``listener``: unset (``None``),
    ``"asyncio"`` for an ``async def`` listener and ``"thread"`` for a plain
    one; set, it must fit.  ``needs_async``: the consumer runs lanes on an
    event loop only (:class:`~lite_push.AsyncLitePushConsumer`).  Raises
    :class:`~lite_push.ConfigError` naming ``listener`` (not callable, a
    signature that cannot take the messages, a plain one where only an
    ``async def`` runs) or ``executor`` (set to one that does not fit)."""
    if not callable(listener):
        raise ConfigError("listener", f"must be callable, got {listener!r}")
    problem = signature_problem(listener)
    if problem is not None:
        raise ConfigError("listener", problem)
    is_async = is_async_callable(listener)
    name = listener_name(listener)
    told = config.executor
    if needs_async:
        if told == "thread":
            raise ConfigError(
                "executor", "AsyncLitePushConsumer runs lanes on the event loop: leave executor unset or 'asyncio'"
            )
        if not is_async:
            raise ConfigError(
                "listener",
                f"{name} is a plain function; AsyncLitePushConsumer needs an `async def` listener "
                "(LitePushConsumer runs a plain one on threads)",
            )
    if told == "thread" and is_async:
        raise ConfigError(
            "executor",
            f"'thread' runs a plain listener, but {name} is an `async def`: leave executor unset "
            "(it follows the listener) or set executor='asyncio'",
        )
    if told == "asyncio" and not is_async:
        raise ConfigError(
            "executor",
            f"'asyncio' runs an `async def` listener, but {name} is a plain function: leave executor unset "
            "(it follows the listener) or set executor='thread'",
        )
    if told is not None:
        return config
    if is_async and config.mode is ConsumeMode.QUEUE_ORDERLY:
        raise ConfigError(
            "listener",
            f"{name} is an `async def`; QUEUE_ORDERLY (the baseline) runs on threads only and needs a plain listener",
        )
    if not is_async and config.lanes is not None and config.lanes > THREAD_LANES:
        raise ConfigError(
            "lanes",
            f"must be at most {THREAD_LANES} on threads (a plain listener; an `async def` one runs on asyncio, "
            f"up to 65536 lanes), got {config.lanes}",
        )
    executor = "asyncio" if is_async else "thread"
    return replace(config, executor=executor, **by_executor(config, executor))  # type: ignore[arg-type]
