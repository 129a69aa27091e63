"""Sources: the message logs lite_push consumes (``_base`` is the contract)."""

from ._base import (
    DEFAULT_DELAY_LEVELS,
    Balance,
    ConsumeFromWhere,
    MessageModel,
    PullSource,
    RebalanceListener,
    dlq_topic,
    is_retry_or_dlq_topic,
    retry_topic,
)
from .embedded import EmbeddedBroker, EmbeddedPullConsumer

__all__ = [
    "DEFAULT_DELAY_LEVELS",
    "Balance",
    "ConsumeFromWhere",
    "EmbeddedBroker",
    "EmbeddedPullConsumer",
    "MessageModel",
    "PullSource",
    "RebalanceListener",
    "dlq_topic",
    "is_retry_or_dlq_topic",
    "retry_topic",
]
