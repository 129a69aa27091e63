"""lite_push: key-ordered parallel consumption of partitioned message logs.

Layout (one concern per module; underscored modules are implementation;
``docs/ARCHITECTURE.md`` follows one message through them):

* ``_types``, ``_config``, ``_errors``, ``_clock``  value types and the listener
  types, ConsumerConfig, the error tree, injectable time
* ``_consumer``        LitePushConsumer: the facade for plain code
* ``_async_consumer``  AsyncLitePushConsumer: the facade inside an event loop
* ``_consumer_core``   what both share: checks, start, stop
* ``_shutdown``        a stop: the calls in flight finish (or a drain), the commit read back
* ``_listeners``       the listener given: a signature that takes the messages, the executor it picks
* ``_wiring``          building one consumer's parts, each with the collaborators it uses
* ``_shared``          what several parts share: counters, the first failure, app pauses
* ``_pull_loop``       the pull thread: poll -> track -> dispatch, timers, commits
* ``_dispatch``        routing gathered messages to the lanes (router or round robin)
* ``_assignment``      rebalance: queues assigned and revoked (drain, commit), queue locks
* ``_flow_control``    pause and resume of queues
* ``_committer``       commit points (lowest unfinished offset + offset map)
* ``_failure_sender``  dead letters and send-backs stored by the pull thread
* ``_lanes``           the bounded per-lane FIFOs
* ``_lane_worker``     what a lane does: consume, park, retry (written once)
* ``_steps``           how a lane worker tells its executor which calls to make
* ``_call_gate``       a lane's checks before each call: shutdown, fence, ``max_rate``
* ``_parked_keys``     a lane's keys parked on the timer (retries, ``key_min_interval``),
                       or by the application (``pause_keys``)
* ``_key_pauses``      the keys the application paused, handed to every lane by the pull thread
* ``_thread_executor`` / ``_async_executor``  lanes driven by threads / coroutines
* ``_admission``       asyncio: how many lanes may be in listener calls at once
* ``_rate_limit``      ``max_rate`` (the consumer's RateLimiter) and ``key_min_interval`` (KeyPacer)
* ``_watchdog``        the event-loop block watchdog
* ``_call_watch``      the lanes' calls in progress: slow-call warnings, stuck calls named
* ``_lane_steal``      moving keys off a lane stuck in a call (``steal_after``)
* ``_process_queue``   per-queue in-flight state (RocketMQ's ProcessQueue)
* ``_failures``        the failure policy (one classification), the lanes' outbox
* ``_timer``           the consumer's one timer and its kinds of timed work
* ``_queue_orderly``   the QUEUE_ORDERLY baseline (RocketMQ's orderly consumer)
* ``_router``          router selector: Java's hash, and KeyRouter's lane placement
                       (``_router_c`` compiled from ``_ext/``, ``_router_py`` twin)
* ``_offsets``         offset tracker selector (``_offsets_c`` / ``_offsets_py``)
* ``_lanemetrics``     the lanes' histogram recorder selector (``_lanemetrics_c`` /
                       ``_lanemetrics_py``)
* ``_untrack``         messages left to their reference counts, out of the cyclic GC
                       (``_untrack_c`` / ``_untrack_py``, which leaves them tracked)
* ``_kafka_decode``    a Kafka record without headers as its message, the fast way
                       (``_kafka_decode_c`` / ``_kafka_decode_py``)
* ``_offset_map``      the finished offsets committed above the committed one
* ``_snapshots``       ``stats()`` and the metrics snapshot
* ``supervisor``       ProcessSupervisor: N member processes of one group, one per
                       core (restarts with back-off, SIGTERM drains all, one scrape target)
* ``_member_process``  one member process: its body, and the supervisor's handle on it
* ``_member_metrics``  the supervisor's endpoint: the members' metrics merged, their health
* ``_restart_policy``  when a member that died starts again, and when to give up
* ``_signals``         SIGINT / SIGTERM as a request to stop; a second one, at once
* ``metric_names``     every Prometheus metric's name, type, labels and help
* ``metrics``          the metrics collector and the HTTP exporter
* ``_metrics_serving`` a consumer joining and leaving the collector and the exporter
* ``codec``            JSON bodies (orjson)
* ``dlq``              reading dead letters and re-sending them (a held key's in order)
* ``_held_keys``       ``dead_letter_order="key"``: keys held behind their dead letters
* ``_held_log``        which keys a dead-letter topic holds (read back at a start or a rebalance)
* ``_resent_log``      which dead letters were sent back already (``lite-push dlq resend`` skips them)
* ``cli/``             the ``lite-push`` command (parser, settings, sources, consume, dlq); ``demo``: the demo
* ``sources/``         the source contract; ``embedded/``, ``redis/`` and ``kafka/``: the three sources
* ``rebalance/``       queue allocation strategies
* ``testing/``         for tests of code built on lite_push: the source contract suite
                       (imported on its own, as ``lite_push.testing``; needs pytest)

The names below are the public API.  ``ROUTER_IMPL``, ``OFFSETS_IMPL`` and
``LANE_METRICS_IMPL`` say whether each compiled kernel or its pure-Python twin
is in use.  A source's ``RebalanceListener`` is not among them: it is part of
the source contract (``lite_push.sources``), which the consumer implements
itself; the application's rebalance hooks are the consumer's ``on_assigned``
and ``on_revoked`` (of type ``AppHook``).
"""

from ._assignment import AppHook
from ._async_consumer import AsyncLitePushConsumer
from ._call_watch import CallInProgress
from ._clock import Clock, ManualClock, SystemClock
from ._config import ConsumeMode, ConsumerConfig, KeyExtractor
from ._consumer import LitePushConsumer
from ._errors import (
    AdminNotSupportedError,
    CommitRefusedError,
    ConfigError,
    ConsumerFailedError,
    GroupActiveError,
    LitePushError,
    MessageDecodeError,
    MessageTooLargeError,
    NonRetryableError,
    NotSubscribedError,
    SourceClosedError,
    SourceUnavailableError,
    UnknownTopicError,
)
from ._lanemetrics import LANE_METRICS_IMPL
from ._offsets import OFFSETS_IMPL
from ._router import ROUTER_IMPL
from ._shutdown import QueueStop, StopReport
from ._snapshots import ConsumerStats
from ._types import (
    AsyncListener,
    ConsumeResult,
    Listener,
    MessageExt,
    MessageQueue,
    OffsetAndMetadata,
    PollBatch,
    SendResult,
)
from ._version import __version__
from .dlq import DeadLetter, HeldKey, dead_letters, held_keys, resend, resend_key
from .sources import (
    Balance,
    ConsumeFrom,
    ConsumeFromWhere,
    EmbeddedBroker,
    EmbeddedPullConsumer,
    GroupAdmin,
    GroupMember,
    MessageModel,
    PullSource,
    dlq_topic,
    retry_topic,
)
from .supervisor import MemberState, ProcessSupervisor

# Sorted as ruff's RUF022 sorts (constants, then classes, then the rest),
# as most of the package's modules sort theirs; tests/test_public_api.py checks it.
__all__ = [
    "LANE_METRICS_IMPL",
    "OFFSETS_IMPL",
    "ROUTER_IMPL",
    "AdminNotSupportedError",
    "AppHook",
    "AsyncListener",
    "AsyncLitePushConsumer",
    "Balance",
    "CallInProgress",
    "Clock",
    "CommitRefusedError",
    "ConfigError",
    "ConsumeFrom",
    "ConsumeFromWhere",
    "ConsumeMode",
    "ConsumeResult",
    "ConsumerConfig",
    "ConsumerFailedError",
    "ConsumerStats",
    "DeadLetter",
    "EmbeddedBroker",
    "EmbeddedPullConsumer",
    "GroupActiveError",
    "GroupAdmin",
    "GroupMember",
    "HeldKey",
    "KeyExtractor",
    "Listener",
    "LitePushConsumer",
    "LitePushError",
    "ManualClock",
    "MemberState",
    "MessageDecodeError",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "MessageTooLargeError",
    "NonRetryableError",
    "NotSubscribedError",
    "OffsetAndMetadata",
    "PollBatch",
    "ProcessSupervisor",
    "PullSource",
    "QueueStop",
    "SendResult",
    "SourceClosedError",
    "SourceUnavailableError",
    "StopReport",
    "SystemClock",
    "UnknownTopicError",
    "__version__",
    "dead_letters",
    "dlq_topic",
    "held_keys",
    "resend",
    "resend_key",
    "retry_topic",
]
