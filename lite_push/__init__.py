"""lite_push: key-ordered parallel consumption of partitioned message logs.

Layout (one concern per module; underscored modules are implementation):

* ``_types``          value types: MessageQueue, MessageExt, PollBatch, ...
* ``_config``         ConsumerConfig (validated, frozen) and ConsumeMode
* ``_errors``         LitePushError and its subclasses
* ``_consumer``       LitePushConsumer: pull thread, dispatch, flow control, commit
* ``_async_consumer`` AsyncLitePushConsumer: the asyncio executor (lanes as coroutines)
* ``_lanes``          the bounded per-lane FIFOs
* ``_process_queue``  per-queue in-flight state (RocketMQ's ProcessQueue)
* ``_router``         key-hash router selector (``_router_c`` compiled from
                      ``_ext/``, ``_router_py`` pure-Python twin)
* ``_offsets``        offset tracker selector (``_offsets_c`` / ``_offsets_py``)
* ``_lanemetrics``    the lanes' histogram recorder selector (``_lanemetrics_c`` /
                      ``_lanemetrics_py``)
* ``metric_names``    every Prometheus metric's name, type, labels and help
* ``metrics``         the metrics collector and the HTTP exporter
* ``cli``             the ``lite-push`` command (settings in ``_cli_config``)
* ``demo``            the embedded-broker demo
* ``_failures``       failure decisions, the retry timer, the lanes' outbox
* ``_offset_map``     the finished offsets committed above the committed one
* ``codec``           JSON bodies (orjson)
* ``dlq``             reading dead letters and re-sending them
* ``_clock``          injectable time
* ``sources/``        the source contract, the embedded broker, the Redis Streams source
* ``rebalance/``      queue allocation strategies
"""

from ._clock import Clock, ManualClock, SystemClock
from ._config import ConsumeMode, ConsumerConfig, KeyExtractor
from ._consumer import ConsumerStats, Listener, LitePushConsumer
from ._errors import (
    ConfigError,
    LitePushError,
    MessageDecodeError,
    MessageTooLargeError,
    NonRetryableError,
    NotSubscribedError,
    SourceClosedError,
    UnknownTopicError,
)
from ._offsets import OFFSETS_IMPL
from ._router import ROUTER_IMPL
from ._types import (
    ConsumeResult,
    MessageExt,
    MessageQueue,
    OffsetAndMetadata,
    PollBatch,
    SendResult,
)
from ._async_consumer import AsyncLitePushConsumer
from .dlq import DeadLetter, dead_letters, resend
from .sources import (
    ConsumeFromWhere,
    EmbeddedBroker,
    EmbeddedPullConsumer,
    MessageModel,
    PullSource,
    RebalanceListener,
    dlq_topic,
    retry_topic,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncLitePushConsumer",
    "OFFSETS_IMPL",
    "ROUTER_IMPL",
    "Clock",
    "ConfigError",
    "ConsumeFromWhere",
    "ConsumeMode",
    "ConsumeResult",
    "ConsumerConfig",
    "ConsumerStats",
    "DeadLetter",
    "EmbeddedBroker",
    "EmbeddedPullConsumer",
    "KeyExtractor",
    "Listener",
    "LitePushConsumer",
    "LitePushError",
    "ManualClock",
    "MessageDecodeError",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "MessageTooLargeError",
    "NonRetryableError",
    "NotSubscribedError",
    "OffsetAndMetadata",
    "PollBatch",
    "PullSource",
    "RebalanceListener",
    "SendResult",
    "SourceClosedError",
    "SystemClock",
    "UnknownTopicError",
    "__version__",
    "dead_letters",
    "dlq_topic",
    "resend",
    "retry_topic",
]
