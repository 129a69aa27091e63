"""What both consumer facades share: checks, the pull thread, shutdown.

:class:`ConsumerCore` checks its arguments, has ``_core.wiring`` build the
parts (each with the few collaborators it uses; nothing is wired after
construction) and runs their life cycle:

    source.poll ─► PullLoop (track) ─► Dispatcher (route) ─► Lane ─► LaneWorker ─► listener
                        │                                                 │
      Assignment ◄──────┘ (rebalance, inside poll)                        └─► ProcessQueue.complete
      FlowControl, FailureSender, Committer (pull thread)                     (commit point moves)

The facades add only how they are started and stopped:
``LitePushConsumer`` from plain code (threads, or an event loop on a thread of
its own for an ``async def`` listener), ``AsyncLitePushConsumer`` from inside a
running event loop.

Threads: the **pull thread** (``_pull.loop``) is the only one that polls,
commits and stores failures (lanes only ``wakeup()`` the source); one task
per lane (a thread, or a coroutine) drains its lane; ``stats()`` and the
metrics collector only read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from .._clock import SYSTEM_CLOCK, Clock
from .._config import ConsumeMode, ConsumerConfig
from .._errors import ConfigError, ConsumerFailedError, LitePushError
from .._exec.async_executor import AsyncExecutor
from .._exec.thread_executor import ThreadExecutor
from .._kernels.lanemetrics import LANE_METRICS_IMPL, LaneMetrics
from .._kernels.offsets import OFFSETS_IMPL
from .._kernels.router import ROUTER_IMPL
from .._pull.assignment import AppHook, AppHooks
from .._pull.runner import PullRunner
from .._state.shared import ABORT_GRACE, FailureLatch
from .._tracing import traced
from .._types import MessageQueue
from ..metrics import new_lane_metrics
from ..metrics._serving import MetricsServing
from ..sources.contract import Balance, MessageModel, PullSource, retry_topic
from .listeners import is_async_callable, resolve_executor
from .shutdown import StopReport
from .snapshots import ConsumerMetrics, ConsumerStats, metrics_of, stats_of
from .wiring import build_parts

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["ConsumerCore", "is_async_callable"]

logger = logging.getLogger(__name__)

#: How long a failed consumer lets its other lanes finish what they hold.
FAILURE_DRAIN = 10.0


def _check_source(config: ConsumerConfig, source: PullSource) -> None:
    """The consumer and its source agree: one group name, a revoke (plus
    the fencing margin) fits inside the source's session, a source that
    balances by message holds keys by the key the consumer routes by, and
    held keys (``dead_letter_order="key"``) can be read back."""
    if source.group is not None and source.group != config.group:
        raise ConfigError(
            "group",
            f"ConsumerConfig.group is {config.group!r} but the source is a member of group {source.group!r}: "
            "they must be the same (retries go to the source group's retry topic)",
        )
    session = source.session_timeout
    if session is not None and config.revoke_timeout + config.fence_margin >= session:
        raise ConfigError(
            "revoke_timeout",
            f"revoke_timeout ({config.revoke_timeout:g} s) + fence_margin ({config.fence_margin:g} s) must be "
            f"shorter than the source's session_timeout ({session:g} s): a revoke stops the member's "
            "heartbeats, and the group moves its queues once the session lapses",
        )
    if config.dead_letter_order == "key":
        why = None
        if source.balance is Balance.MESSAGE:
            why = "a source that balances by message (Balance.MESSAGE) moves keys between members at any time"
        elif source.message_model is MessageModel.BROADCASTING:
            why = "BROADCASTING members share the group's dead-letter topic while each reads every queue"
        elif source.dead_letter_reader() is None:
            why = f"the source ({type(source).__name__}) cannot read its dead-letter topic back (dead_letter_reader)"
        if why is not None:
            raise ConfigError("dead_letter_order", f"'key' is not available here: {why}")
    if config.key_extractor is not None and source.balance is Balance.MESSAGE:
        raise ConfigError(
            "key_extractor",
            "must be None with a source that balances by message (Balance.MESSAGE): the server holds a key "
            "for one member by the message's keys (what the producer set), so the consumer must route by them too",
        )


def _topic_names(topics: list[str] | tuple[str, ...]) -> list[str]:
    """The names of a ``subscribe()`` list: ``ValueError`` when empty,
    ``TypeError`` naming the first that is not a str."""
    if not topics:
        raise ValueError("subscribe() needs at least one topic, got an empty " + type(topics).__name__)
    for t in topics:
        if not isinstance(t, str):
            raise TypeError(f"subscribe(): each topic must be a str, got {t!r} in {topics!r}")
    return list(topics)


class ConsumerCore:
    """The parts of one consumer and their life cycle (see the module
    docstring); the public facades derive from it."""

    #: Whether the facade runs lanes on an event loop only (an ``async def``
    #: listener, ``executor`` unset or ``"asyncio"``).
    EVENT_LOOP_ONLY: ClassVar[bool] = False

    def __init__(
        self,
        config: ConsumerConfig,
        *,
        source: PullSource,
        listener: Any,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
        on_assigned: AppHook | None = None,
        on_revoked: AppHook | None = None,
    ) -> None:
        if not isinstance(config, ConsumerConfig):
            raise ConfigError("config", f"must be a ConsumerConfig, got {type(config).__name__}")
        if not isinstance(source, PullSource):
            raise ConfigError("source", f"must be a PullSource, got {type(source).__name__}")
        if not config.group:  # named once, with the source
            if source.group is None:
                raise ConfigError("group", "is not given, and the source belongs to no group: name it in either")
            config = replace(config, group=source.group)
        # the listener fits its call, and the executor fits the listener (unset: chosen by it)
        config = resolve_executor(config, listener, needs_async=self.EVENT_LOOP_ONLY)
        listener = traced(config, source, listener)  # itself unless tracing is on
        _check_source(config, source)
        if source.rebalance_listener is not None:
            # The consumer installs its own (it drains and commits revoked
            # queues): one set before would be silently replaced.
            raise ConfigError(
                "source",
                f"already has a rebalance listener ({source.rebalance_listener!r}): the consumer installs its "
                "own, and a source serves one consumer; pass on_assigned= / on_revoked= to the consumer for "
                "the application's rebalance hooks",
            )
        for name, hook in (("on_assigned", on_assigned), ("on_revoked", on_revoked)):
            if hook is not None and (not callable(hook) or is_async_callable(hook)):
                raise ConfigError(name, f"must be a plain (not async) function of the queues, got {hook!r}")
        limit = source.metadata_limit
        if limit is not None and config.offset_map_max_bytes > limit:
            # the source stores at most this much metadata: pause before the map outgrows it
            config = replace(config, offset_map_max_bytes=limit)
        self.config = config
        self._source = source
        clock = self._clock = clock or SYSTEM_CLOCK
        self._executor: ThreadExecutor | AsyncExecutor = (
            AsyncExecutor(
                config.group,
                listener=listener,
                block_threshold=config.loop_block_threshold,
                turn_target=config.loop_turn_target,
            )
            if config.executor == "asyncio"
            else ThreadExecutor(config.group, listener)
        )
        assert config.lanes is not None  # resolve_executor chose it with the executor
        lanes = self._lanes = self._executor.make_lanes(config.lanes, source.wakeup)
        lane_metrics: list[LaneMetrics] | None = None
        if config.metrics_port is not None or registry is not None:
            lane_metrics = [new_lane_metrics() for _ in lanes]
            for lane in lanes:
                lane.stamp()
        self._stopping = threading.Event()  # stop polling
        self._stopped = threading.Event()  # the pull thread finished shutdown
        self._run_stop = threading.Event()  # stop(): run() returns
        parts = build_parts(
            config,
            source=source,
            clock=clock,
            executor=self._executor,
            lanes=lanes,
            listener=listener,
            lane_metrics=lane_metrics,
            latch=FailureLatch(self._on_failure),
            stopping=self._stopping,
            hooks=AppHooks(on_assigned=on_assigned, on_revoked=on_revoked),
        )
        self._latch = parts.latch
        self._owned = parts.owned
        self._app_pauses = parts.app_pauses
        self._key_pauses = parts.key_pauses
        self._orderly = parts.orderly
        self._lane_workers = parts.workers
        self._committer = parts.committer
        self._sender = parts.sender
        self._pull = parts.pull
        self._readings = parts.readings
        self._watch = parts.watch
        self._stopper = parts.stopper
        source.set_rebalance_listener(parts.assignment)
        #: The source's listener: checked at start (one set since would
        #: silently replace it).
        self._assignment = parts.assignment
        #: The pull side: the pull thread, or (asyncio executor) a task on
        #: the loop with its helper thread.
        self._puller = PullRunner(self._pull, config.group)
        self._started = False
        self._subscriptions: list[tuple[str, str]] = []
        self._serving = MetricsServing(config, registry, lane_metrics is not None)

    # -- public API shared by both facades --------------------------------------------

    def subscribe(self, topic: str | list[str] | tuple[str, ...], expression: str = "*") -> None:
        """Consume ``topic`` (a name, or a list or tuple of names), filtered
        by tag ``expression`` (``"*"`` or ``"TagA || TagB"``, for each of
        them).  Only before ``start()``.  In CONCURRENTLY mode the group's
        retry topic ``%RETRY%<group>`` is subscribed too (once), as
        RocketMQ does."""
        if self._started:
            raise LitePushError("subscribe() must be called before start()")
        if isinstance(topic, (list, tuple)):
            for t in _topic_names(topic):
                self.subscribe(t, expression)
            return
        if not isinstance(topic, str):
            raise TypeError(f"subscribe(): topic must be a str, or a list or tuple of them, got {topic!r}")
        self._source.subscribe(topic, expression)
        self._subscriptions.append((topic, expression))
        retry = retry_topic(self.config.group)
        if (
            self.config.mode is ConsumeMode.CONCURRENTLY
            and self._source.message_model is not MessageModel.BROADCASTING  # it retries its failures itself
            and self._source.balance is not Balance.MESSAGE  # so does a member balanced by message
            and topic != retry
            and all(t != retry for t, _ in self._subscriptions)
        ):
            self._source.subscribe(retry, "*")
            self._subscriptions.append((retry, "*"))

    def stats(self) -> ConsumerStats:
        """A snapshot of counters and per-queue state (any thread)."""
        st = stats_of(self._readings, self._baseline_counts(), self._puller.alive())
        health, readiness = self.health()
        return replace(st, health=health, readiness=readiness)

    def pause(self, queues: Iterable[MessageQueue]) -> None:
        """Stop polling these queues until :meth:`resume` (any thread): what
        was polled already is still processed and committed; flow control
        never resumes them.  Queues not owned (yet) are paused when they
        come."""
        self._app_pauses.pause(queues)
        self._source.wakeup()

    def resume(self, queues: Iterable[MessageQueue]) -> None:
        """Undo :meth:`pause` (any thread); a queue still over a flow-control
        threshold resumes when it falls below."""
        self._app_pauses.resume(queues)
        self._source.wakeup()

    def paused_by_app(self) -> frozenset[MessageQueue]:
        """The queues :meth:`pause` holds now."""
        return self._app_pauses.queues

    def pause_keys(self, keys: Iterable[str]) -> None:
        """Hold the messages of these keys until :meth:`resume_keys` (any
        thread; before ``start()`` too), while the lanes go on with other
        keys.  KEY_ORDERLY: they wait in offset order on the key's lane; in
        CONCURRENTLY they wait too, on whichever lanes they reach.  Every
        message of a key stored after this returns waits; one polled before
        may still run if its lane took it before the pause reached the lane
        (the pull thread hands it to every lane at once), and a call already
        running finishes.  Waiting messages are unfinished:
        their queue's commit stays below them, the other keys' finished
        offsets above are committed in the offset map, and flow control
        counts them (a key that keeps piling up pauses its queue at the
        source).  The pause belongs to this consumer: not stored, not known
        to a queue's next owner; a revoke or a shutdown leaves the waiting
        messages uncommitted, to be delivered again.  ``keys``: an iterable
        of non-empty ``str`` (the key messages are routed by); ``TypeError``
        / ``ValueError`` otherwise.  QUEUE_ORDERLY has no keys to hold:
        :class:`~lite_push.LitePushError`."""
        self._key_pauses.pause(keys)
        self._source.wakeup()

    def resume_keys(self, keys: Iterable[str]) -> None:
        """Undo :meth:`pause_keys` (any thread): what waited for each key
        runs, in order, one message per call; keys not paused are ignored."""
        self._key_pauses.resume(keys)
        self._source.wakeup()

    def paused_keys(self) -> frozenset[str]:
        """The keys :meth:`pause_keys` holds now."""
        return self._key_pauses.keys

    @property
    def name(self) -> str:
        """How the health endpoints name this consumer."""
        return f"consumer {self.config.group!r}"

    def health(self) -> tuple[str, str]:
        """``(liveness, readiness)``, each ``"ok"`` or one line saying why
        not (any thread).  Alive: not failed, not stopped, its pull thread
        and every lane running (a consumer not started yet is alive).
        Ready: started, subscribed, polling, and owning at least one queue
        (assignment received)."""
        puller = self._puller
        failure = self._latch.failure
        if failure is not None:
            live = f"failed: {type(failure).__name__}: {failure}"
        elif self._stopping.is_set():
            live = "stopped" if self._stopped.is_set() else "stopping"
        elif self._started and puller.started and not puller.alive():
            live = "its pull thread is not running"
        elif self._started and not self._executor.lanes_alive():
            live = "a lane is not running"
        else:
            live = "ok"
        if live != "ok":
            return live, live
        if not self._started or not puller.started:
            return live, "not started"
        if not self._subscriptions:
            return live, "not subscribed"
        if not self._owned:
            return live, "no queue assigned yet"
        return live, "ok"

    @property
    def metrics_url(self) -> str | None:
        """``http://addr:port/metrics`` once started with ``metrics_port``."""
        return self._serving.url

    def metrics_snapshot(self) -> ConsumerMetrics | None:
        """This consumer's metric samples now (the collector of
        :mod:`lite_push.metrics` calls it at scrape time); None when metrics
        are off."""
        if self._readings.lanes.metrics is None:
            return None
        return metrics_of(self._readings, self._baseline_counts())

    # -- life cycle (the facades call these) ------------------------------------------

    def _begin_start(self) -> None:
        """Check that the consumer may start; start its metrics (a bad
        ``metrics_port`` raises and leaves it unstarted)."""
        if self._stopping.is_set():
            raise LitePushError(
                "this consumer was shut down and cannot start again: build a new one (with a new source)"
            )
        if self._started:
            raise LitePushError("consumer already started")
        if not self._subscriptions:
            raise LitePushError("subscribe() to at least one topic before start()")
        if self._source.rebalance_listener is not self._assignment:
            raise LitePushError(
                "the source's rebalance listener was replaced after the consumer was built "
                "(set_rebalance_listener): the consumer needs its own to drain and commit revoked "
                "queues; pass on_assigned= / on_revoked= to the consumer for the application's hooks"
            )
        self._serving.start(self)
        self._started = True

    def _start_pull(self) -> None:
        """Start the pull side: a thread of its own, or with the asyncio
        executor a task on the running loop (call on the loop's thread)."""
        group = self.config.group
        self._puller.start(self._finish, on_loop=isinstance(self._executor, AsyncExecutor))
        if self._watch is not None:
            self._watch.start()
        logger.info(
            "lite_push consumer %r started: mode=%s executor=%s lanes=%d router=%s offsets=%s lane_metrics=%s",
            group,
            self.config.consume_mode.name,
            self.config.executor,
            self.config.lanes,
            ROUTER_IMPL,
            OFFSETS_IMPL,
            LANE_METRICS_IMPL,
        )

    def _stop(self, timeout: float) -> bool:
        """Stop polling; let the listener calls in flight finish (or, with
        ``drain_on_shutdown``, everything queued) for at most ``timeout``
        seconds; commit what finished; close the source (``_core.shutdown``).
        Whether everything started finished and its commit was taken.
        Idempotent."""
        if not self._started:
            self._stopping.set()
            self._source.close()
            return True
        if not self._stopping.is_set():
            self._stopper.begin(timeout)
            self._stopping.set()
            self._source.wakeup()
        while not self._stopped.wait(0.1):
            if time.monotonic() > self._stopper.deadline + ABORT_GRACE + 5.0:
                break
        if self._stopped.is_set():
            self._serving.stop(self)  # a failed consumer's endpoint outlives its pull thread
        report = self._stopper.report
        return self._stopped.is_set() and report is not None and report.clean

    def stop(self) -> None:
        """Ask :meth:`run` to return, as SIGTERM would: it then shuts the
        consumer down.  From any thread (or a signal handler)."""
        self._run_stop.set()

    def stop_now(self) -> None:
        """Stop at once (a second Ctrl-C): wait no longer for the listener
        calls running, commit what finished, close; a stop under way (or
        ``run()``) ends soon after.  From any thread."""
        self._stopper.hurry()
        self._run_stop.set()
        if self._started and not self._stopping.is_set():
            self._stopping.set()
            self._source.wakeup()

    def _run_outcome(self) -> StopReport:
        """What ``run()`` returns once it stopped the consumer: the stop's
        report, or :class:`~lite_push.ConsumerFailedError` if it failed."""
        failure = self.failure
        if failure is not None:
            raise ConsumerFailedError(f"consumer {self.config.group!r} failed: {self.stats().failure}") from failure
        report = self.stop_report
        assert report is not None  # shutdown() waited for the stop
        return report

    @property
    def stop_report(self) -> StopReport | None:
        """What the last stop did: what was committed (read back from the
        source) and which queues will be delivered again from where
        (``summary()`` says it in a line); ``None`` until stopped."""
        return self._stopper.report

    @property
    def failure(self) -> BaseException | None:
        """The unexpected error of a lane or the pull thread that stopped the
        consumer (logged at ERROR with its traceback); ``None`` while it is
        healthy.  ``stats().failure`` says the same in words."""
        return self._latch.failure

    def _on_failure(self) -> None:
        # A lane or the pull thread failed: stop polling and shut down as
        # shutdown() would (drain what the other lanes hold, commit).
        if not self._stopping.is_set():
            self._stopper.begin(FAILURE_DRAIN)
            self._stopping.set()
            self._source.wakeup()

    def _finish(self, crashed: bool) -> None:
        # The pull side, leaving its loop: polling has stopped, so no new
        # work arrives.  The stop (``_core.shutdown``) lets the calls in flight
        # finish (or drains), commits and reads the commits back; then the
        # source is closed, which releases the queues to the other members
        # only after that commit.
        if crashed:
            self._stopper.begin(FAILURE_DRAIN)
        try:
            self._stopper.run()
        finally:
            if self._watch is not None:
                self._watch.close()
            try:
                self._source.close()
            finally:
                if self._latch.failure is None:
                    self._serving.stop(self)
                # else the endpoint stays up, its probes saying why, until
                # shutdown() (_stop) takes it down
                self._stopped.set()
                report = self._stopper.report
                logger.info(
                    "lite_push consumer %r stopped: %s",
                    self.config.group,
                    report.summary() if report is not None else "the stop did not finish",
                )

    def _baseline_counts(self) -> tuple[int, int]:
        return self._orderly.counts() if self._orderly is not None else (0, 0)
