"""Sources: the message logs lite_push consumes (``_base`` is the contract)."""

from ._base import ConsumeFromWhere, PullSource, RebalanceListener
from .embedded import EmbeddedBroker, EmbeddedPullConsumer

__all__ = [
    "ConsumeFromWhere",
    "EmbeddedBroker",
    "EmbeddedPullConsumer",
    "PullSource",
    "RebalanceListener",
]
