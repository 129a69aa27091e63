"""Sources: the message logs lite_push consumes (``_base`` is the contract)."""

from ._base import (
    DEFAULT_DELAY_LEVELS,
    Balance,
    ConsumeFrom,
    ConsumeFromWhere,
    MessageModel,
    PullSource,
    RebalanceListener,
    dlq_topic,
    is_retry_or_dlq_topic,
    retry_topic,
)
from .embedded import EmbeddedBroker, EmbeddedPullConsumer
from .group_admin import GroupAdmin, GroupMember

__all__ = [
    "DEFAULT_DELAY_LEVELS",
    "Balance",
    "ConsumeFrom",
    "ConsumeFromWhere",
    "EmbeddedBroker",
    "EmbeddedPullConsumer",
    "GroupAdmin",
    "GroupMember",
    "MessageModel",
    "PullSource",
    "RebalanceListener",
    "dlq_topic",
    "is_retry_or_dlq_topic",
    "retry_topic",
]
