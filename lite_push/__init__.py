"""lite_push: key-ordered parallel consumption of partitioned message logs.

Layout: the public API at the root (the consumers, ``ConsumerConfig``, the
error tree, the value types, ``codec``), and packages by role.
``docs/ARCHITECTURE.md`` follows one message through them.

* ``_core/``      what both consumers share: checks, wiring, shutdown, the
                  listener, ``stats()``, signals
* ``_pull/``      the pull side: the loop, dispatch, assignment, flow control,
                  commits, the failure sender, key pauses, stealing keys
* ``_lanes/``     the lane side: the lanes, their worker and its steps, the call
                  gate, rate limits, the failure policy, parked and held keys
* ``_state/``     what the two sides share: process queues, the offset map, the
                  timer, counters and latches (its docstring names the channels)
* ``_exec/``      the executors: threads, asyncio (admission, watchdog), the call
                  watch, and the QUEUE_ORDERLY baseline
* ``_kernels/``   the compiled kernels (from ``_ext/``) and their twins
* ``dlq/``        reading dead letters and sending them back (``lite-push dlq``)
* ``metrics/``    the collector, the HTTP exporter, ``metrics.names`` (every metric)
* ``supervisor/`` ProcessSupervisor: N member processes of one group
* ``sources/``    the source contract (``sources.contract``) and the embedded,
                  Redis and Kafka sources; ``rebalance/``: allocation
                  strategies; ``cli/``: the ``lite-push`` command;
                  ``testing/``: the source contract suite (needs pytest)

The names below are the public API.  ``ROUTER_IMPL``, ``OFFSETS_IMPL`` and
``LANE_METRICS_IMPL`` say whether each compiled kernel or its pure-Python twin
is in use.  A source's ``RebalanceListener`` is not among them: it is part of
the source contract (``lite_push.sources``), which the consumer implements
itself; the application's rebalance hooks are the consumer's ``on_assigned``
and ``on_revoked`` (of type ``AppHook``).
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ._async_consumer import AsyncLitePushConsumer
from ._clock import Clock, ManualClock, SystemClock
from ._config import ConsumeMode, ConsumerConfig, KeyExtractor
from ._consumer import LitePushConsumer
from ._core.shutdown import QueueStop, StopReport
from ._core.snapshots import ConsumerStats
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
from ._exec.call_watch import CallInProgress
from ._kernels.lanemetrics import LANE_METRICS_IMPL
from ._kernels.offsets import OFFSETS_IMPL
from ._kernels.router import ROUTER_IMPL
from ._pull.assignment import AppHook
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
    GroupAdmin,
    GroupMember,
    MessageModel,
    PullSource,
    dlq_topic,
    retry_topic,
)
from .supervisor import MemberState, ProcessSupervisor

if _TYPE_CHECKING:
    from .sources.embedded import EmbeddedBroker, EmbeddedPullConsumer

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


def __getattr__(name: str) -> _Any:
    """The embedded broker's names, imported on first use (so that
    ``lite_push.sources.contract`` is imported without any concrete source)."""
    if name in __all__:  # listed, not bound here: ``lite_push.sources`` loads it
        from . import sources

        return getattr(sources, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
