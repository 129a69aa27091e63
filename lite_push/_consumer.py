"""LitePushConsumer: the consumer for plain (synchronous) code.

Key-affinity push consumption on top of a pull source: a pull thread polls
the source and routes each message to one of ``config.lanes`` lanes by its
key; each lane is drained in order by one task, so the messages of one key
never run concurrently and run in offset order, while thousands of keys run
in parallel.  Per queue the lowest unfinished offset is committed, so a
commit never passes unfinished work; delivery is at-least-once.

The parts are described in ``_core.consumer_core`` (and ``docs/ARCHITECTURE.md``);
this module is only the synchronous face: ``start()``, ``shutdown()``,
``with``.  With an ``async def`` listener (the executor follows it:
``"asyncio"``), ``start()`` runs an event loop of the consumer's own (uvloop
when installed) on a thread of its own, and ``shutdown()`` stops it; code
that already runs an event loop uses :class:`~lite_push.AsyncLitePushConsumer`.
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from typing import TYPE_CHECKING

from ._clock import Clock
from ._config import ConsumerConfig
from ._core.consumer_core import ConsumerCore
from ._core.shutdown import StopReport
from ._core.signals import StopOnSignal
from ._core.snapshots import ConsumerStats
from ._exec.async_executor import AsyncExecutor, LoopThread
from ._pull.assignment import AppHook
from ._types import AsyncListener, Listener
from .sources.contract import PullSource

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["ConsumerStats", "LitePushConsumer"]

logger = logging.getLogger(__name__)

#: How often ``run()`` looks whether :meth:`LitePushConsumer.stop` was
#: called or the consumer failed (seconds).
RUN_POLL = 0.1


class LitePushConsumer(ConsumerCore):
    """Consumes a :class:`~lite_push.sources.PullSource` with ``config.lanes``
    lanes, keeping per-key order in ``KEY_ORDERLY`` mode.

    Use as a context manager, or call :meth:`start` and :meth:`shutdown`.
    The listener is called with a list of up to ``config.batch_size``
    messages; returning ``None`` or ``SUCCESS`` marks them done, raising or
    returning ``RETRY_LATER`` processes them again later (see the README's
    "What it promises").  The listener is called with that one argument: one
    whose signature cannot take it is refused here.  A plain listener runs
    on lane threads, an ``async def`` one on an event loop the consumer
    starts on a thread of its own: ``config.executor`` left unset follows
    the listener (:attr:`config` then says which), and one set explicitly
    must fit it.  Invalid arguments raise :class:`~lite_push.ConfigError`
    naming the field.

    ``on_assigned`` / ``on_revoked``: the application's rebalance hooks,
    called with the queues (sorted) on the pull thread, after lite_push's
    own work -- for a revoke, after the queues' listener calls finished (up
    to ``revoke_timeout``) and their offsets were committed.  Keep them
    short: they run inside the rebalance.  What they raise is logged.
    The consumer installs its own rebalance listener on ``source``: a source
    that already has one (``set_rebalance_listener``) raises ConfigError,
    and :meth:`start` raises if one was set after the consumer was built.
    :meth:`pause` / :meth:`resume` stop and restart polling of queues.
    """

    def __init__(
        self,
        config: ConsumerConfig,
        source: PullSource,
        listener: Listener | AsyncListener,
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
        self._loop_thread: LoopThread | None = None

    def start(self) -> None:
        """Start the lanes and the pull thread (and, for an ``async def``
        listener, the event loop they run on).  Only once."""
        self._begin_start()
        executor = self._executor
        if isinstance(executor, AsyncExecutor):
            loop_thread = self._loop_thread = LoopThread(f"lite-push-loop-{self.config.group}")

            async def start_on_loop() -> None:
                executor.start(self._lane_workers)
                self._start_pull()  # the pull side is a task on that loop

            loop_thread.call(start_on_loop())
        else:
            executor.start(self._lane_workers)
            self._start_pull()

    def shutdown(self, timeout: float = 10.0) -> bool:
        """Stop polling, let the lanes finish what they hold (at most
        ``timeout`` seconds), commit final offsets, close the source (and
        stop the consumer's event loop, if it has one).

        Returns whether everything queued was processed in time; what was not
        stays uncommitted and is delivered again.  Idempotent."""
        try:
            return self._stop(timeout)
        finally:
            if self._loop_thread is not None:
                if isinstance(self._executor, AsyncExecutor):
                    self._executor.close()
                self._loop_thread.stop()

    def run(self, timeout: float = 10.0) -> StopReport:
        """Start, block until SIGINT or SIGTERM (handled while it runs, when
        called on the main thread) or :meth:`stop` from another thread, then
        shut down (:meth:`shutdown` with ``timeout``) and return what the
        stop did.  No ``KeyboardInterrupt``: Ctrl-C is a stop.  A second
        signal stops at once: the listener calls still running are not
        awaited, what finished is committed.  Raises
        :class:`~lite_push.ConsumerFailedError` when a lane or the pull
        thread failed and stopped the consumer."""
        signals = StopOnSignal(on_again=lambda _name: self.stop_now())
        main = threading.current_thread() is threading.main_thread()
        if main:
            signals.install()
        try:
            self.start()
            while not signals.event.wait(RUN_POLL):
                if self._run_stop.is_set() or self.failure is not None:
                    break
            if signals.signal_name is not None:
                logger.info("consumer %r: %s, stopping", self.config.group, signals.signal_name)
            self.shutdown(timeout)
        finally:
            if main:
                signals.restore()
        return self._run_outcome()

    def __enter__(self) -> LitePushConsumer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()
