"""AsyncLitePushConsumer: the consumer for code that runs an event loop.

The same consumer as :class:`~lite_push.LitePushConsumer` (the same pull
thread, routing, parking, commits; see ``_core.consumer_core``), with lanes as
coroutines on the application's running loop (see ``_exec.async_executor``):
``await start()`` / ``await shutdown()`` or ``async with``.  ``run()`` runs it
stand-alone on a new loop (uvloop when installed) until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING

from ._clock import Clock
from ._config import ConsumerConfig
from ._core.consumer_core import ConsumerCore
from ._core.shutdown import StopReport
from ._errors import LitePushError
from ._exec.async_executor import AsyncExecutor, new_event_loop
from ._exec.watchdog import LoopWatchdog
from ._pull.assignment import AppHook
from ._types import AsyncListener
from .sources.contract import PullSource

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["AsyncLitePushConsumer"]

logger = logging.getLogger(__name__)


#: How often ``run()`` looks whether the consumer failed (seconds).
FAILURE_POLL = 0.1


class AsyncLitePushConsumer(ConsumerCore):
    """A consumer whose lanes are coroutines on the running event loop.

    The listener is an ``async def`` taking a list of up to ``batch_size``
    messages (``config.executor`` may be left unset: it becomes
    ``"asyncio"``; ``"thread"`` is a :class:`~lite_push.ConfigError` naming
    ``executor``); returning ``None``
    or ``SUCCESS`` marks them done, raising or returning ``RETRY_LATER``
    retries them, exactly as with threads.  A listener should await its
    I/O: one that blocks the loop blocks every lane (and is logged, see
    ``loop_block_threshold``).  Rebalance hooks and the source's rebalance
    listener are as for :class:`~lite_push.LitePushConsumer`."""

    EVENT_LOOP_ONLY = True

    def __init__(
        self,
        config: ConsumerConfig,
        source: PullSource,
        listener: AsyncListener,
        *,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
        on_assigned: AppHook | None = None,
        on_revoked: AppHook | None = None,
    ) -> None:
        super().__init__(
            config,
            source=source,
            listener=listener,
            clock=clock,
            registry=registry,
            on_assigned=on_assigned,
            on_revoked=on_revoked,
        )
        assert isinstance(self._executor, AsyncExecutor)
        self._async_executor = self._executor

    @property
    def watchdog(self) -> LoopWatchdog:
        """The loop-block watchdog (its ``longest_block`` is the longest
        listener block seen, in seconds)."""
        return self._async_executor.watchdog

    @property
    def longest_block(self) -> float:
        """Longest listener block of the loop seen, in seconds."""
        return self.watchdog.longest_block

    async def start(self) -> None:
        """Start the lane coroutines on the running loop, the watchdog and
        the pull thread.  Only once."""
        self._begin_start()
        self._async_executor.start(self._lane_workers)
        self._start_pull()

    async def shutdown(self, timeout: float = 10.0) -> bool:
        """Stop polling, let the lanes finish what they hold (at most
        ``timeout`` seconds; the loop keeps running them meanwhile), commit,
        close the source.  Returns whether everything queued was processed
        in time.  Idempotent."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(None, self._stop, timeout)
        finally:
            self._async_executor.close()

    def run(
        self, until: Awaitable[object] | None = None, *, use_uvloop: bool = True, timeout: float = 10.0
    ) -> StopReport:
        """Run stand-alone: a new event loop (uvloop when installed and
        ``use_uvloop``), :meth:`start`, then wait for ``until`` or, without
        it, for SIGINT/SIGTERM or :meth:`stop` from another thread; then
        :meth:`shutdown` (``timeout``) and return what the stop did.  A
        second signal stops at once (the listener calls running are
        cancelled, what finished is committed).  No ``KeyboardInterrupt``.
        Raises :class:`~lite_push.ConsumerFailedError` when a lane or the
        pull thread failed and stopped the consumer."""

        async def wait_for_stop() -> None:
            if until is not None:
                await until
                return
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, partial(self._signalled, stop, sig))
            await stop.wait()

        async def stopped_or_failed() -> None:
            while self.failure is None and not self._run_stop.is_set():
                await asyncio.sleep(FAILURE_POLL)

        async def main() -> None:
            await self.start()
            waits = [asyncio.ensure_future(wait_for_stop()), asyncio.ensure_future(stopped_or_failed())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
                await self.shutdown(timeout)

        with asyncio.Runner(loop_factory=lambda: new_event_loop(use_uvloop)) as runner:
            runner.run(main())
        return self._run_outcome()

    def _signalled(self, stop: asyncio.Event, sig: signal.Signals) -> None:
        """(loop) The first SIGINT/SIGTERM stops; a second one hurries the stop."""
        if stop.is_set():
            logger.warning("consumer %r: %s again, stopping at once", self.config.group, sig.name)
            self.stop_now()
        else:
            logger.info("consumer %r: %s, stopping", self.config.group, sig.name)
            stop.set()

    async def __aenter__(self) -> AsyncLitePushConsumer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.shutdown()

    def __enter__(self) -> AsyncLitePushConsumer:
        raise LitePushError(
            "AsyncLitePushConsumer runs on an event loop: use `async with consumer:` or consumer.run(); "
            "plain code uses LitePushConsumer, which runs an async listener on a loop of its own"
        )

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Never reached: :meth:`__enter__` raises (it exists so that
        ``with`` gets that clear error, not a TypeError)."""
