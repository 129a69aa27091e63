"""Wiring: one consumer's parts, each built with the few collaborators it uses.

What several parts share is made first (the owned queues, the timer, the
outbox, the counters, the abort event, the held keys, the failure policy,
the router's released deque, the application's paused queues and keys),
then each part in the order they need each other, so nothing is wired
after construction:

    lanes' workers (CallGate, ParkedKeys)  LaneStealer  CallWatch
    Committer  FailureSender  Dispatcher  BrokerLocks
    Assignment (QueueOpener, RevokeDrain)  FlowControl  PollSync
    PullLoop (Intake, Upkeep with its CommitSchedule)

``ConsumerCore`` owns the result (:class:`Parts`) and runs its life cycle.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .._clock import Clock
from .._config import ConsumeMode, ConsumerConfig
from .._exec.async_executor import AsyncExecutor
from .._exec.call_watch import CallWatch
from .._exec.queue_orderly import QueueOrderlyService
from .._exec.thread_executor import ThreadExecutor
from .._kernels.lanemetrics import LaneMetrics
from .._kernels.router import KeyRouter
from .._lanes.call_gate import CallGate
from .._lanes.failures import FailurePolicy, Outbox
from .._lanes.handback import Handback
from .._lanes.held_keys import HeldKeys
from .._lanes.lane_failures import LaneFailures
from .._lanes.lanes import Lane
from .._lanes.parked_keys import ParkedKeys
from .._lanes.rate_limit import KeyPacer, RateLimiter
from .._lanes.worker import LaneWorker
from .._pull.assignment import AppHooks, Assignment
from .._pull.broker_locks import BrokerLocks
from .._pull.commit_schedule import CommitSchedule
from .._pull.committer import Committer
from .._pull.dispatch import Dispatcher
from .._pull.failure_sender import FailureSender
from .._pull.flow_control import FlowControl
from .._pull.intake import Intake
from .._pull.key_pauses import KeyPauses, KeyPauseSync
from .._pull.lane_steal import LaneStealer
from .._pull.loop import PullLoop
from .._pull.poll_sync import PollSync
from .._pull.queue_opener import QueueOpener
from .._pull.revoke_drain import RevokeDrain
from .._pull.upkeep import Upkeep
from .._state.process_queue import ProcessQueue
from .._state.shared import MAX_SEGMENT, AppPauses, Counters, FailureLatch, KeyOf, safe_key_of
from .._state.timer import RetryTimer
from .._types import MessageExt, MessageQueue
from ..sources.contract import Balance, MessageModel, PullSource
from .shutdown import LanesStop, Stopper
from .snapshots import KeyReadings, LaneReadings, Readings

__all__ = ["MESSAGE_ACK_INTERVAL", "MESSAGE_BUFFER_PER_LANE", "Parts", "build_parts"]

#: With a source balanced by message, a queue is paused once it holds more
#: than this many unfinished messages per lane (or ``pull_threshold_for_queue``
#: if lower): each holds its key for this member, away from the others.
MESSAGE_BUFFER_PER_LANE = 4
#: With a source balanced by message, the longest time between two commits
#: (acknowledgements; ``commit_interval`` if shorter), in seconds: a key is
#: held by its member until the member acknowledged it.
MESSAGE_ACK_INTERVAL = 0.05


@dataclass(frozen=True, slots=True, kw_only=True)
class Parts:
    """What :func:`build_parts` made, for the consumer's life cycle."""

    #: The first failure of a lane or the pull thread.
    latch: FailureLatch
    #: Owned queues: assignment writes, the other parts read.
    owned: dict[MessageQueue, ProcessQueue]
    app_pauses: AppPauses
    #: The keys the application paused (``pause_keys``).
    key_pauses: KeyPauses
    #: QUEUE_ORDERLY's consume pool (``None`` in the other modes).
    orderly: QueueOrderlyService | None
    #: Each lane with its worker (none: the baseline runs its own pool).
    workers: list[tuple[Lane, LaneWorker]]
    committer: Committer
    sender: FailureSender
    #: The source's rebalance listener.
    assignment: Assignment
    pull: PullLoop
    #: What ``stats()`` and the metrics read.
    readings: Readings
    #: Watches the lanes' listener calls (``None``: the baseline).
    watch: CallWatch | None
    #: The consumer's stop (run by the pull side when it leaves its loop).
    stopper: Stopper


def build_parts(
    config: ConsumerConfig,
    *,
    source: PullSource,
    clock: Clock,
    executor: ThreadExecutor | AsyncExecutor,
    lanes: list[Lane],
    listener: Any,
    lane_metrics: list[LaneMetrics] | None,
    latch: FailureLatch,
    stopping: threading.Event,
    hooks: AppHooks,
) -> Parts:
    """Build the parts of one consumer (see the module docstring)."""
    by_message = source.balance is Balance.MESSAGE
    if by_message:
        # Every buffered message holds its key for this member, until it is
        # acknowledged: buffer little and acknowledge often.
        cap = min(config.queue_threshold, MESSAGE_BUFFER_PER_LANE * len(lanes))
        config = dataclasses.replace(
            config,
            pull_threshold_for_queue=max(1, cap),
            commit_interval=min(config.commit_interval, MESSAGE_ACK_INTERVAL),
        )
    key_of = None if config.key_extractor is None else safe_key_of(config.key_extractor)
    abort = threading.Event()
    owned: dict[MessageQueue, ProcessQueue] = {}
    counters = Counters(len(lanes))
    timer = RetryTimer(source.wakeup)  # the pull thread may be waiting past a new earliest entry
    outbox = Outbox(source.wakeup)
    app_pauses = AppPauses()
    key_pauses = KeyPauses(config.group, lanes=config.mode is not ConsumeMode.QUEUE_ORDERLY)
    limiter = None if config.max_rate is None else RateLimiter(config.max_rate, clock.monotonic)
    pacer = KeyPacer(config.key_min_interval, key_of=key_of) if config.key_min_interval > 0 else None
    generations = itertools.count(1)  # of parks, shared by the lanes (next() is atomic)
    by_key = config.dead_letter_order == "key"
    held = HeldKeys(config.group, key_of=key_of, reader=source.dead_letter_reader() if by_key else None)
    policy = FailurePolicy(
        config.mode is not ConsumeMode.CONCURRENTLY,
        max_reconsume_times=config.max_reconsume_times,
        retry_start_level=config.retry_start_level,
        held=held if by_key else None,
    )
    router: KeyRouter | None = None
    released: deque[tuple[int, list[MessageExt]]] | None = None
    if config.mode is ConsumeMode.KEY_ORDERLY:
        router = KeyRouter(len(lanes), config.lane_placement, key_of, MAX_SEGMENT)
        if router.tracks_load:
            released = deque()  # lanes append what they are done with; the dispatcher drains it
    lane_limit = None
    if isinstance(executor, AsyncExecutor) and config.loop_turn_target:
        lane_limit = executor.lane_limit  # new keys go to the lanes admission lets run
    # QUEUE_ORDERLY (the baseline) replaces the lanes with RocketMQ's
    # consume pool; see _queue_orderly.
    orderly: QueueOrderlyService | None = None
    if config.mode is ConsumeMode.QUEUE_ORDERLY:
        orderly = QueueOrderlyService(
            config,
            listener=listener,
            abort=abort,
            clock_monotonic=clock.monotonic,
            dead_letter=outbox.put,
            policy=policy,
            limiter=limiter,
            clock_wait=clock.wait,
        )
    workers = (
        []
        if orderly is not None
        else [
            (
                lane,
                _lane_worker(
                    lane,
                    config,
                    clock=clock,
                    abort=abort,
                    limiter=limiter,
                    pacer=pacer,
                    timer=timer,
                    counters=counters,
                    key_of=key_of,
                    policy=policy,
                    outbox=outbox,
                    latch=latch,
                    lane_metrics=lane_metrics,
                    released=released,
                    generations=generations,
                ),
            )
            for lane in lanes
        ]
    )
    dispatcher = Dispatcher(
        lanes,
        owned,
        lane_capacity=config.lane_capacity,
        flush=executor.flush,
        router=router,
        released=released,
        lane_limit=lane_limit,
        orderly=orderly,
    )
    stealer: LaneStealer | None = None
    if router is not None and released is not None and config.steals:
        stealer = LaneStealer(
            lanes,
            dispatcher=dispatcher,
            parked=[w.parked for _, w in workers],
            counters=counters,
            group=config.group,
            wake=source.wakeup,
            key_of=key_of,
        )
    watch = (
        None
        if orderly is not None
        else CallWatch(
            config.group,
            lanes=lanes,
            monotonic=clock.monotonic,
            steal_after=config.steal_after if stealer is not None else None,
            slow_call_warning=config.slow_call_warning,
            request=None if stealer is None else stealer.request,
            key_of=key_of,
        )
    )
    committer = Committer(source, owned=owned, group=config.group)
    sender = FailureSender(
        source,
        outbox=outbox,
        timer=timer,
        counters=counters,
        group=config.group,
        suspend_ms=config.suspend_ms,
        broadcasting=source.message_model is MessageModel.BROADCASTING or by_message,
    )
    locks = (
        None
        if orderly is None
        else BrokerLocks(config, source=source, clock=clock, owned=owned, orderly=orderly, counters=counters)
    )
    assignment = Assignment(
        config,
        owned=owned,
        counters=counters,
        opener=QueueOpener(config, source=source, lanes=len(lanes)),
        drain=RevokeDrain(
            config,
            clock=clock,
            counters=counters,
            timer=timer,
            dispatcher=dispatcher,
            committer=committer,
            sender=sender,
        ),
        hooks=hooks,
        held=held if by_key else None,
        locks=locks,
    )
    flow = FlowControl(config, source=source, owned=owned, lanes=lanes, counters=counters.queues, app_pauses=app_pauses)
    sync = PollSync(
        source,
        clock=clock,
        owned=owned,
        fence_margin=config.fence_margin,
        key_pauses=None if orderly is not None else KeyPauseSync(key_pauses, dispatcher=dispatcher, lanes=len(lanes)),
        stealer=stealer,
    )
    pull = PullLoop(
        config,
        source=source,
        clock=clock,
        timer=timer,
        intake=Intake(
            config,
            source=source,
            owned=owned,
            dispatcher=dispatcher,
            flow=flow,
            queue_counters=counters.queues,
            sync=sync,
        ),
        upkeep=Upkeep(
            timer,
            dispatcher=dispatcher,
            sender=sender,
            flow=flow,
            commits=CommitSchedule(committer, interval=config.commit_interval),
            pacer=pacer,
            locks=locks,
        ),
        latch=latch,
        stopping=stopping,
    )
    readings = Readings(
        config=config,
        source=source,
        counters=counters,
        owned=owned,
        timer=timer,
        latch=latch,
        lanes=LaneReadings(lanes=lanes, metrics=lane_metrics, limit=lane_limit, watch=watch, limiter=limiter),
        keys=KeyReadings(pauses=key_pauses, held=held),
    )
    stopper = Stopper(
        group=config.group,
        drain=config.drain_on_shutdown,
        clock=clock,
        calls=LanesStop(lanes=lanes, executor=executor, orderly=orderly, abort=abort, owned=owned),
        owned=owned,
        sender=sender,
        committer=committer,
        source=source,
    )
    return Parts(
        latch=latch,
        owned=owned,
        app_pauses=app_pauses,
        key_pauses=key_pauses,
        orderly=orderly,
        workers=workers,
        committer=committer,
        sender=sender,
        assignment=assignment,
        pull=pull,
        readings=readings,
        watch=watch,
        stopper=stopper,
    )


def _lane_worker(
    lane: Lane,
    config: ConsumerConfig,
    *,
    clock: Clock,
    abort: threading.Event,
    limiter: RateLimiter | None,
    pacer: KeyPacer | None,
    timer: RetryTimer,
    counters: Counters,
    key_of: KeyOf | None,
    policy: FailurePolicy,
    outbox: Outbox,
    latch: FailureLatch,
    lane_metrics: list[LaneMetrics] | None,
    released: deque[tuple[int, list[MessageExt]]] | None,
    generations: Iterator[int],
) -> LaneWorker:
    """The worker of ``lane``, with its call gate, parked keys, hand-back
    and failures."""
    i = lane.index
    gate = CallGate(i, group=config.group, clock=clock, abort=abort, limiter=limiter)
    parked = ParkedKeys(
        i,
        timer=timer,
        generations=generations,
        counters=counters,
        monotonic=clock.monotonic,
        suspend=config.suspend_ms / 1000.0,
        key_of=key_of,
    )
    back = Handback(
        i,
        counters=counters,
        outbox=outbox,
        policy=policy,
        release=None if released is None else released.append,
    )
    return LaneWorker(
        lane,
        gate=gate,
        parked=parked,
        back=back,
        failures=LaneFailures(
            i, group=config.group, policy=policy, parked=parked, back=back, counters=counters, latch=latch
        ),
        batch_size=config.batch_size,
        metrics=None if lane_metrics is None else lane_metrics[i],
        pacer=pacer,
    )
