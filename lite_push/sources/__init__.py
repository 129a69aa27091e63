"""Sources: the message logs lite_push consumes.

:mod:`.contract` is what a source implements and what the consumer relies
on; ``embedded``, ``redis`` and ``kafka`` are the three sources.  The
embedded broker's names are imported on first use, so the contract is
imported without any concrete source.
"""

from typing import TYPE_CHECKING, Any

from .contract import (
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
from .group_admin import GroupAdmin, GroupMember

if TYPE_CHECKING:
    from .embedded import EmbeddedBroker, EmbeddedPullConsumer

_EMBEDDED = ("EmbeddedBroker", "EmbeddedPullConsumer")


def __getattr__(name: str) -> Any:
    """``EmbeddedBroker`` and ``EmbeddedPullConsumer``, imported on first use."""
    if name in _EMBEDDED:
        from . import embedded

        return getattr(embedded, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
