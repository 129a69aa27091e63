"""Consumer configuration: a frozen dataclass validated at construction.

Defaults follow RocketMQ's DefaultMQPushConsumer where it has the setting
(pullThresholdForQueue 1000, pullThresholdSizeForQueue 100 MiB,
consumeConcurrentlyMaxSpan 2000, pullBatchSize 32,
consumeMessageBatchMaxSize 1, persistConsumerOffsetInterval 5 s,
suspendCurrentQueueTimeMillis 1000).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from ._errors import ConfigError
from ._types import MessageExt

__all__ = ["ConsumeMode", "ConsumerConfig", "KeyExtractor", "by_executor", "default_lanes"]

#: Returns the ordering key of a message, or ``None`` for "no key".
KeyExtractor = Callable[[MessageExt], "str | None"]

MIB = 1024 * 1024
#: The values of :attr:`ConsumerConfig.executor` (``None``: by the listener).
EXECUTORS = ("thread", "asyncio")
#: Most lanes on threads (a thread each).
THREAD_LANES = 1024
#: Most lanes on the asyncio executor (a coroutine each).
ASYNC_LANES = 65536
#: Lanes when ``lanes`` is left unset, on threads: a thread each, so few
#: (RocketMQ's consume pool has 20).
DEFAULT_THREAD_LANES = 16
#: Lanes when ``lanes`` is left unset, on the asyncio executor: a lane's
#: task runs only while it has work, so lanes well beyond the keys in
#: flight cost little, and a key gets a lane of its own (keys sharing a
#: lane wait for each other: with 1,000 keys of 100 ms calls, 1,024 lanes
#: reached 44-67 % of the hot-key bound and 2,048 96 %; RESULTS.md,
#: issue 31).  Admission keeps the loop's turn short whatever the count.
#: An idle lane still holds its lane, worker, gate and parked keys, about
#: twenty objects the cyclic GC walks: 4,096 lanes cost 0.6 us of CPU a
#: message more than 1,024 or 2,048 over 1,000 keys (RESULTS.md, issue 40).
DEFAULT_ASYNC_LANES = 2048
#: ``pull_threshold_for_queue`` when left unset, on threads: RocketMQ's.
DEFAULT_THREAD_THRESHOLD = 1000
#: ``pull_threshold_for_queue`` when left unset, on the asyncio executor:
#: thousands of lanes each need a few messages queued to stay busy.  At
#: 1,000 a queue's keys held 4-8 messages each, a lane ran dry every 3-4
#: messages and its task ended and started again; on Kafka 55,000 msg/s
#: against 86,000 at 5,000 (1,000 keys of 1 ms calls; RESULTS.md, issue 40).
DEFAULT_ASYNC_THRESHOLD = 5000
#: ``pull_batch_size`` when left unset, on threads: RocketMQ's.
DEFAULT_THREAD_PULL_BATCH = 32
#: ``pull_batch_size`` when left unset, on the asyncio executor, which
#: reads on the loop's own thread: sixteen times fewer reads for a dispatch
#: than at 32 (on Redis a round trip each, the loop waiting).  At 128
#: against 32: Redis 69,000-72,000 msg/s against 59,000-61,000, Kafka 3 %
#: more; at 512 against 128 (1,000 keys of 1 ms calls, same runs): Redis
#: 8-9 % more, Kafka level (RESULTS.md, issue 40).
DEFAULT_ASYNC_PULL_BATCH = 512
#: The values of :attr:`ConsumerConfig.lane_placement`.
LANE_PLACEMENTS = ("load", "hash", "java")
#: The values of :attr:`ConsumerConfig.dead_letter_order`.
DEAD_LETTER_ORDERS = ("message", "key")


class ConsumeMode(enum.Enum):
    """How a consumer orders work."""

    #: Messages of one key run one at a time, in offset order; keys run in
    #: parallel over ``lanes``.  Keyless messages keep their queue's order.
    KEY_ORDERLY = "KEY_ORDERLY"
    #: Messages are spread round-robin over the lanes; no order is promised.
    CONCURRENTLY = "CONCURRENTLY"
    #: The baseline: RocketMQ's ConsumeMessageOrderlyService.  One thread per
    #: queue at a time, behind a broker lock, a queue lock and a consume
    #: lock, on a shared pool of ``consume_thread_min`` threads.
    QUEUE_ORDERLY = "QUEUE_ORDERLY"


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if type(value) is not int:
        raise ConfigError(name, f"must be an int in [{low}, {high}], got {value!r}")
    if not low <= value <= high:
        raise ConfigError(name, f"must be in [{low}, {high}], got {value}")


def _check_float(
    name: str, value: object, low: float, high: float, *, low_open: bool = False, unit: str = "seconds"
) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(name, f"must be a number of {unit}, got {value!r}")
    bad_low = not value > low if low_open else not value >= low  # NaN is out of range
    if bad_low or value > high:
        bracket = "(" if low_open else "["
        raise ConfigError(name, f"must be in {bracket}{low}, {high}], got {value}")


def default_lanes(executor: str) -> int:
    """The lanes of an unset ``lanes`` on ``executor``."""
    return DEFAULT_ASYNC_LANES if executor == "asyncio" else DEFAULT_THREAD_LANES


def by_executor(config: ConsumerConfig, executor: str) -> dict[str, object]:
    """The settings ``config`` left unset that follow ``executor``, set:
    ``lanes`` and ``pull_threshold_for_queue`` (``dataclasses.replace``
    arguments)."""
    out: dict[str, object] = {}
    if config.lanes is None:
        out["lanes"] = default_lanes(executor)
    if config.pull_threshold_for_queue is None:
        out["pull_threshold_for_queue"] = DEFAULT_ASYNC_THRESHOLD if executor == "asyncio" else DEFAULT_THREAD_THRESHOLD
    if config.pull_batch_size is None:
        out["pull_batch_size"] = DEFAULT_ASYNC_PULL_BATCH if executor == "asyncio" else DEFAULT_THREAD_PULL_BATCH
    return out


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """Settings of one :class:`~lite_push.LitePushConsumer` (each a
    keyword argument with a default).

    Invalid values raise :class:`~lite_push.ConfigError` naming the field and
    the allowed range.  The fields:

    ``group``
        Consumer group name.  ``""`` (default): the group of the source the consumer
        is given (``broker.pull_consumer("orders", ...)``), so the group is named
        once; named in both, they must agree.
    ``mode``
        Ordering mode: a :class:`ConsumeMode`, or its name in any case
        (``"key_orderly"``), which becomes the member (:attr:`consume_mode` reads it
        as the member, typed).
    ``lanes``
        Number of lanes: each is a FIFO drained by one task (a thread, or a
        coroutine on the asyncio executor).  This, not the number of queues, sets
        the consumer's concurrency.  ``None`` (default): by the executor,
        ``DEFAULT_THREAD_LANES`` (16) threads or ``DEFAULT_ASYNC_LANES`` (2048)
        coroutines (an idle one costs no task); the consumer's ``config`` holds the
        number chosen.
    ``lane_capacity``
        Messages a lane may hold before the queues feeding it are paused.  A
        dispatch is checked as a whole, so a lane holds at most twice this plus one
        poll (``pull_batch_size`` per queue) waiting for its task.  It also bounds a
        dispatch (see ``_pull.loop.DISPATCH_BUDGET``).
    ``batch_size``
        Most messages handed to one listener call (consumeMessageBatchMaxSize).
    ``pull_batch_size``
        Most messages pulled from one queue per poll (pullBatchSize). ``None``
        (default): by the executor, ``DEFAULT_THREAD_PULL_BATCH`` (32, RocketMQ's)
        on threads, ``DEFAULT_ASYNC_PULL_BATCH`` (512) on the asyncio executor,
        which reads on the loop's thread.
    ``pull_threshold_for_queue``
        Pause a queue when it has more unfinished messages than this. ``None``
        (default): by the executor, ``DEFAULT_THREAD_THRESHOLD`` (1000, RocketMQ's)
        on threads, ``DEFAULT_ASYNC_THRESHOLD`` (5000) on the asyncio executor,
        whose thousands of lanes each need a few messages queued; the consumer's
        ``config`` holds the number chosen.
    ``pull_threshold_size_for_queue``
        Pause a queue when its unfinished message bodies exceed this (bytes).
    ``max_span``
        Pause a queue when highest pulled minus lowest unfinished offset exceeds
        this.  Not RocketMQ's 2000: a parked (retrying) key holds the lowest
        unfinished offset while its queue flows on, and what is finished above it is
        committed in the offset map.  The default lets a key parked for its whole
        retry schedule (16 x 1 s) at 50,000 msg/s keep its queue flowing.  Memory:
        the compiled offset tracker keeps one byte per offset of the span (at most 2
        MiB per queue at this default); the pure-Python twin about 40 bytes (lower
        this when running without the extension).
    ``offset_map_max_bytes``
        Pause a queue when its offset map (the finished offsets above the committed
        one, stored with each commit) could encode to more than this many bytes.
        The run-length form needs about 8 bytes per unfinished offset, so with the
        default thresholds this is rarely the binding limit.
    ``commit_interval``
        Seconds between periodic offset commits.
    ``poll_timeout``
        Longest a poll blocks (seconds); bounds how late a resume is seen.
    ``suspend_ms``
        Orderly modes: delay before a failed message is processed again
        (milliseconds).  In KEY_ORDERLY only its key waits; in QUEUE_ORDERLY (the
        baseline) its whole queue waits.
    ``max_reconsume_times``
        Failed attempts after which a message goes to the dead-letter queue
        ``%DLQ%<group>``; -1 retries forever (RocketMQ's orderly default).
    ``retry_start_level``
        CONCURRENTLY: a failed message is sent back to ``%RETRY%<group>`` at delay
        level ``retry_start_level + reconsume_times`` (RocketMQ: 3, i.e. 10 s, then
        30 s, 1 m, ...; the source's levels, the last one repeats).
    ``revoke_timeout``
        Longest a revoked queue's in-flight work is awaited before its final commit
        and release (seconds).
    ``drain_on_shutdown``
        What a stop (``shutdown()``, SIGINT/SIGTERM) waits for.  ``False``
        (default), as a Kafka consumer's close: the listener calls running finish,
        the messages polled but never started are let go uncommitted (the next start
        delivers them again), what finished is committed.  ``True``: the lanes first
        work through everything queued, retries included.  Either way
        ``shutdown(timeout)`` waits at most ``timeout`` seconds.
    ``fence_margin``
        Fencing: seconds before the end of the source's certain ownership of a queue
        (:meth:`~lite_push.sources.PullSource.owned_for`) at which lanes stop
        starting listener calls for it (a safety margin for the moment between the
        check and the call).  ``revoke_timeout`` plus this must be shorter than the
        source's session timeout.
    ``key_extractor``
        Ordering key of a message; ``None`` means ``message.keys``.  It must be a
        pure function of the message (the router reads it again when a lane is done
        with the message).
    ``lane_placement``
        KEY_ORDERLY: which lane a key runs on.  ``"load"`` (default): a key with
        messages queued or in flight stays on its lane, a key with none goes to the
        lane with the fewest messages queued or in flight. ``"hash"``: a fixed,
        well-mixed hash of the key mod ``lanes``. ``"java"``: Java's
        ``String.hashCode`` mod ``lanes``, the lane the Java runtime would pick (its
        low bits are poorly mixed for sequential ids, and a queue's keys reach only
        ``lanes / gcd(lanes, queues)`` lanes).  The producer's queue choice is
        Java's in every case.
    ``consume_thread_min``
        QUEUE_ORDERLY: threads of the shared consume pool (all that ever run).
    ``consume_thread_max``
        QUEUE_ORDERLY: the most threads of the shared consume pool; at least
        ``consume_thread_min``, the number that runs (as in RocketMQ, whose pool has
        an unbounded queue).
    ``lock_lease``
        QUEUE_ORDERLY: lease of the broker-side queue lock (seconds).
    ``lock_renew_interval``
        QUEUE_ORDERLY: seconds between renewals of the queue locks.
    ``max_continuous_consume``
        QUEUE_ORDERLY: seconds a consume request may run before it yields.
    ``executor``
        How lanes run: ``"thread"`` (a thread per lane, a plain listener; at most
        1024 lanes) or ``"asyncio"`` (a coroutine per lane on one event loop, uvloop
        when installed, an ``async def`` listener; up to 65536 lanes; see
        :class:`~lite_push.AsyncLitePushConsumer`).  ``None`` (default): by the
        listener, ``"asyncio"`` for an ``async def`` one and ``"thread"`` for a
        plain one; the consumer's ``config`` holds the executor chosen.  Named, it
        must fit the listener (a :class:`~lite_push.ConfigError` naming ``executor``
        otherwise).
    ``loop_block_threshold``
        asyncio executor: a listener that keeps the event loop busy (does not await)
        for longer than this many seconds is logged with its duration.
    ``loop_turn_target``
        asyncio executor: how long a turn of the event loop may take (seconds)
        before fewer lanes are let into listener calls at once. When the loop cannot
        keep up with every lane that has work, lanes queue for a slot and new keys
        go to the lanes that run (see ``_exec.admission.Admission``): the same
        throughput, each key's next message waits less, and the busiest keys are not
        starved by the idle ones.  ``0``: every lane with work runs at once.
    ``max_rate``
        The consumer's rate limit: listener calls start at most this many messages
        per second in all (a call of a batch counts its messages), to protect what
        the listener calls.  A lane over the limit waits for its turn (without
        holding a lock, the pull thread or the event loop); after an idle spell up
        to a tenth of a second's worth may start at once.  ``None``: no limit.
    ``key_min_interval``
        KEY_ORDERLY: the least time (seconds) between the starts of two listener
        calls of one key.  A key's next message waits on the consumer's timer, as a
        parked key does, while its lane goes on with other keys; messages without a
        key are not paced.  ``0``: off.
    ``steal_after``
        KEY_ORDERLY with ``lane_placement="load"``: when a lane's listener call has
        run longer than this many seconds, the other keys queued on that lane (those
        with nothing in flight there) move, whole and in offset order, to other
        lanes, and new keys avoid the lane until the call returns; the key of the
        slow call stays.  ``"auto"`` (default): ``STEAL_MULTIPLE`` times the 99th
        percentile of the recent call times the call watch saw, and at least
        ``STEAL_FLOOR`` seconds. ``None``: keys never move.
    ``slow_call_warning``
        A listener call that runs longer than this many seconds is logged once, at
        WARNING, with its key, queue and offset.  ``None``: never.
    ``metrics_port``
        Serve Prometheus metrics over HTTP on this port (``None``: no exporter;
        ``0``: any free port).  Consumers in one process that name the same address
        and port share one exporter.
    ``metrics_addr``
        Address the metrics exporter binds (loopback unless told otherwise).
    ``dead_letter_order``
        What a dead letter does to its key.  ``"message"`` (default): the key moves
        on, its later messages run.  ``"key"`` (KEY_ORDERLY only): the key is held
        in its queue, and its later messages follow the dead letter into
        ``%DLQ%<group>`` in offset order, each marked as held behind it, until
        ``lite_push.dlq.resend_key`` (``lite-push dlq resend --key``) sends them
        back in order; other keys run as usual. Held keys survive a restart and a
        rebalance: the dead-letter topic is their record.
    ``tracing``
        OpenTelemetry spans for the listener calls (``pip install
        'lite-push[tracing]'``): a CONSUMER span per message (per call with
        ``batch_size`` above 1), the sender's context as its parent, on the
        global tracer provider.  ``False`` (default): nothing is traced.
    """

    group: str = ""
    mode: ConsumeMode | str = ConsumeMode.KEY_ORDERLY
    lanes: int | None = None
    lane_capacity: int = 4096
    batch_size: int = 1
    pull_batch_size: int | None = None
    pull_threshold_for_queue: int | None = None
    pull_threshold_size_for_queue: int = 100 * MIB
    max_span: int = 1 << 20
    offset_map_max_bytes: int = 64 * 1024
    commit_interval: float = 5.0
    poll_timeout: float = 0.1
    suspend_ms: int = 1000
    max_reconsume_times: int = 16
    retry_start_level: int = 3
    revoke_timeout: float = 10.0
    drain_on_shutdown: bool = False
    fence_margin: float = 0.5
    key_extractor: KeyExtractor | None = None
    lane_placement: str = "load"
    consume_thread_min: int = 20
    consume_thread_max: int = 20
    lock_lease: float = 60.0
    lock_renew_interval: float = 20.0
    max_continuous_consume: float = 60.0
    executor: str | None = None
    loop_block_threshold: float = 0.1
    loop_turn_target: float = 0.0015
    max_rate: float | None = None
    key_min_interval: float = 0.0
    steal_after: float | str | None = "auto"
    slow_call_warning: float | None = 60.0
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    dead_letter_order: str = "message"
    tracing: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.group, str) or (self.group and not self.group.strip()):
            raise ConfigError("group", f"must be a group name, or '' for the source's group, got {self.group!r}")
        if isinstance(self.mode, str):  # its name, in any case, as the command line takes it
            named = {m.name: m for m in ConsumeMode}.get(self.mode.strip().upper())
            if named is not None:
                object.__setattr__(self, "mode", named)
        if not isinstance(self.mode, ConsumeMode):
            allowed = ", ".join(m.name for m in ConsumeMode)
            raise ConfigError("mode", f"must be a ConsumeMode or its name ({allowed}), got {self.mode!r}")
        if self.executor is not None and self.executor not in EXECUTORS:
            allowed = ", ".join(map(repr, EXECUTORS))
            raise ConfigError("executor", f"must be one of {allowed} or None (by the listener), got {self.executor!r}")
        if self.executor == "asyncio" and self.mode is ConsumeMode.QUEUE_ORDERLY:
            raise ConfigError("executor", "QUEUE_ORDERLY (the baseline) runs on threads only: use executor='thread'")
        if self.lane_placement not in LANE_PLACEMENTS:
            raise ConfigError(
                "lane_placement",
                f"must be one of {', '.join(map(repr, LANE_PLACEMENTS))}, got {self.lane_placement!r}",
            )
        # unset, the executor follows the listener: the consumer checks threads' limit then
        if self.lanes is not None:
            _check_int("lanes", self.lanes, 1, THREAD_LANES if self.executor == "thread" else ASYNC_LANES)
        if self.executor is not None:
            for name, value in by_executor(self, self.executor).items():
                object.__setattr__(self, name, value)
        _check_float("loop_block_threshold", self.loop_block_threshold, 0.0, 3600.0, low_open=True)
        _check_float("loop_turn_target", self.loop_turn_target, 0.0, 60.0)
        _check_int("lane_capacity", self.lane_capacity, 1, 1_000_000)
        _check_int("batch_size", self.batch_size, 1, 1024)
        if self.pull_batch_size is not None:
            _check_int("pull_batch_size", self.pull_batch_size, 1, 1024)
        if self.pull_threshold_for_queue is not None:
            _check_int("pull_threshold_for_queue", self.pull_threshold_for_queue, 1, 1_000_000)
        _check_int("pull_threshold_size_for_queue", self.pull_threshold_size_for_queue, 1, 1 << 40)
        _check_int("max_span", self.max_span, 1, 1 << 30)
        _check_int("offset_map_max_bytes", self.offset_map_max_bytes, 64, 1 << 30)
        _check_float("commit_interval", self.commit_interval, 0.0, 3600.0, low_open=True)
        _check_float("poll_timeout", self.poll_timeout, 0.0, 60.0, low_open=True)
        _check_int("suspend_ms", self.suspend_ms, 0, 3_600_000)
        _check_int("max_reconsume_times", self.max_reconsume_times, -1, 1_000_000)
        _check_int("retry_start_level", self.retry_start_level, 1, 1000)
        _check_float("revoke_timeout", self.revoke_timeout, 0.0, 3600.0)
        _check_float("fence_margin", self.fence_margin, 0.0, 3600.0)
        for flag in ("drain_on_shutdown", "tracing"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(flag, f"must be True or False, got {getattr(self, flag)!r}")
        _check_int("consume_thread_min", self.consume_thread_min, 1, 1000)
        _check_int("consume_thread_max", self.consume_thread_max, 1, 1000)
        if self.consume_thread_max < self.consume_thread_min:
            raise ConfigError(
                "consume_thread_max",
                f"must be >= consume_thread_min ({self.consume_thread_min}), got {self.consume_thread_max}",
            )
        _check_float("lock_lease", self.lock_lease, 0.0, 3600.0, low_open=True)
        _check_float("lock_renew_interval", self.lock_renew_interval, 0.0, 3600.0, low_open=True)
        if self.lock_renew_interval >= self.lock_lease:
            raise ConfigError(
                "lock_renew_interval",
                f"must be shorter than lock_lease ({self.lock_lease}), got {self.lock_renew_interval}",
            )
        _check_float("max_continuous_consume", self.max_continuous_consume, 0.0, 86400.0, low_open=True)
        if self.max_rate is not None:
            _check_float("max_rate", self.max_rate, 0.0, 1e9, low_open=True, unit="messages per second")
        _check_float("key_min_interval", self.key_min_interval, 0.0, 86400.0)
        if self.key_min_interval > 0 and self.mode is not ConsumeMode.KEY_ORDERLY:
            raise ConfigError(
                "key_min_interval",
                "paces the calls of one key, which only KEY_ORDERLY runs one at a time; "
                f"mode is {self.consume_mode.name}",
            )
        self._check_slow_calls()
        if self.dead_letter_order not in DEAD_LETTER_ORDERS:
            raise ConfigError(
                "dead_letter_order",
                f"must be one of {', '.join(map(repr, DEAD_LETTER_ORDERS))}, got {self.dead_letter_order!r}",
            )
        if self.dead_letter_order == "key" and self.mode is not ConsumeMode.KEY_ORDERLY:
            raise ConfigError(
                "dead_letter_order",
                f"'key' keeps a key's order behind its dead letters, which only KEY_ORDERLY keeps; mode is "
                f"{self.consume_mode.name}",
            )
        if self.metrics_port is not None:
            _check_int("metrics_port", self.metrics_port, 0, 65535)
        if not isinstance(self.metrics_addr, str) or not self.metrics_addr.strip():
            raise ConfigError("metrics_addr", f"must be a host address string, got {self.metrics_addr!r}")
        if self.key_extractor is not None and not callable(self.key_extractor):
            raise ConfigError("key_extractor", f"must be callable or None, got {self.key_extractor!r}")

    def _check_slow_calls(self) -> None:
        steal = self.steal_after
        if steal is not None and steal != "auto":
            if isinstance(steal, str):
                raise ConfigError("steal_after", f"must be 'auto', None or a number of seconds, got {steal!r}")
            _check_float("steal_after", steal, 0.0, 86400.0, low_open=True)
            if self.mode is not ConsumeMode.KEY_ORDERLY or self.lane_placement != "load":
                raise ConfigError(
                    "steal_after",
                    "moves keys between lanes, which only KEY_ORDERLY with lane_placement='load' does "
                    f"(mode is {self.consume_mode.name}, lane_placement {self.lane_placement!r}); use None or 'auto'",
                )
        if self.slow_call_warning is not None:
            _check_float("slow_call_warning", self.slow_call_warning, 0.0, 86400.0, low_open=True)

    @property
    def consume_mode(self) -> ConsumeMode:
        """:attr:`mode` as the :class:`ConsumeMode` member (a name given is
        one after construction)."""
        assert isinstance(self.mode, ConsumeMode)
        return self.mode

    @property
    def poll_size(self) -> int:
        """``pull_batch_size`` as it applies: the one set, else the
        executor's default (the threads' while no executor is chosen yet)."""
        if self.pull_batch_size is not None:
            return self.pull_batch_size
        return DEFAULT_ASYNC_PULL_BATCH if self.executor == "asyncio" else DEFAULT_THREAD_PULL_BATCH

    @property
    def queue_threshold(self) -> int:
        """``pull_threshold_for_queue`` as it applies: the one set, else the
        executor's default (the threads' while no executor is chosen yet)."""
        if self.pull_threshold_for_queue is not None:
            return self.pull_threshold_for_queue
        return DEFAULT_ASYNC_THRESHOLD if self.executor == "asyncio" else DEFAULT_THREAD_THRESHOLD

    @property
    def steals(self) -> bool:
        """Whether keys move off a lane stuck in a call (``steal_after``)."""
        return self.steal_after is not None and self.mode is ConsumeMode.KEY_ORDERLY and self.lane_placement == "load"
