"""Run the same consumer tests on each executor and each consumer facade.

* ``thread``: :class:`~lite_push.LitePushConsumer` with lane threads.
* ``asyncio``: :class:`~lite_push.AsyncLitePushConsumer` on the application's
  loop: a default asyncio event loop the test runs in a background thread;
  the handle drives ``await start()`` / ``await shutdown()`` on it.
* ``uvloop``: :class:`~lite_push.LitePushConsumer` with
  ``executor="asyncio"``, started from plain code: it runs its own event
  loop (uvloop, installed here) on a thread of its own.

A test builds its consumer with :meth:`Executor.consumer` and uses the
returned object as it would a ``LitePushConsumer`` (``with``, ``start``,
``shutdown``, ``stats``, ``subscribe``).  For the async executors a plain
test listener is wrapped into an ``async def`` that awaits it on a thread
pool: a listener that blocks (on an event, a barrier, a sleep) then waits the
way awaited I/O does, without freezing the loop, so the tests' blocking
listeners keep their meaning.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from lite_push import AsyncLitePushConsumer, ConsumerConfig, LitePushConsumer
from lite_push._core.consumer_core import is_async_callable

#: pytest ids of the executors.
EXECUTORS = ["thread", "asyncio", "uvloop"]


class LoopThread:
    """The application's event loop, running forever in a daemon thread."""

    def __init__(self, kind: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"test-loop-{kind}", daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class AsyncHandle:
    """A synchronous face for an AsyncLitePushConsumer on a LoopThread."""

    def __init__(self, consumer: Any, loop: LoopThread) -> None:
        self.consumer = consumer
        self._loop = loop

    def start(self) -> None:
        self._loop.call(self.consumer.start())

    def shutdown(self, timeout: float = 10.0) -> bool:
        return bool(self._loop.call(self.consumer.shutdown(timeout), timeout + 30.0))

    def __enter__(self) -> AsyncHandle:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.consumer, name)


class Executor:
    """One executor under test."""

    def __init__(self, name: str) -> None:
        self.name = name
        #: The application's loop (``asyncio``); ``uvloop`` consumers run their own.
        self.loop: LoopThread | None = None
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None
        if name != "thread":
            self.pool = concurrent.futures.ThreadPoolExecutor(64, thread_name_prefix="test-listener")
        if name == "asyncio":
            self.loop = LoopThread(name)

    @property
    def is_async(self) -> bool:
        return self.pool is not None

    def listener(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` as this executor's listener (async executors: awaited on
        the pool unless it is already ``async def``)."""
        if self.pool is None or is_async_callable(fn):
            return fn
        pool = self.pool

        async def listener(msgs: list[Any]) -> Any:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, msgs)

        return listener

    def config(self, **cfg: Any) -> ConsumerConfig:
        if self.is_async:
            cfg.setdefault("executor", "asyncio")
        return ConsumerConfig(**cfg)

    def consumer(self, config: ConsumerConfig, source: Any, listener: Callable[..., Any], **kw: Any) -> Any:
        """A consumer (or its handle) running ``listener`` on this executor;
        ``config`` gets ``executor='asyncio'`` when this one is async."""
        if self.is_async and config.mode.name == "QUEUE_ORDERLY":
            pytest.skip("QUEUE_ORDERLY (the baseline) runs on threads only")
        if self.is_async and config.executor != "asyncio":
            import dataclasses

            config = dataclasses.replace(config, executor="asyncio")
        if self.loop is None:
            return LitePushConsumer(config, source=source, listener=self.listener(listener), **kw)
        consumer = AsyncLitePushConsumer(config, source=source, listener=self.listener(listener), **kw)
        return AsyncHandle(consumer, self.loop)

    def close(self) -> None:
        if self.loop is not None:
            self.loop.close()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


class _Current:
    """``EX``: the executor of the running test (set by the ``executor``
    fixture in conftest.py), so module helpers can build consumers with it."""

    executor: Executor | None = None

    def __getattr__(self, name: str) -> Any:
        if self.executor is None:
            raise RuntimeError("no executor: mark the module with pytest.mark.usefixtures('executor')")
        return getattr(self.executor, name)


EX: Any = _Current()


def executor_fixture(request: pytest.FixtureRequest) -> Iterator[Executor]:
    ex = EX.executor = Executor(request.param)
    try:
        yield ex
    finally:
        EX.executor = None
        ex.close()
