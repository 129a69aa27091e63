"""The error tree: one root, a few subclasses, each carrying its context."""

from __future__ import annotations

__all__ = [
    "AdminNotSupportedError",
    "ConfigError",
    "ConsumerFailedError",
    "GroupActiveError",
    "LitePushError",
    "MessageDecodeError",
    "MessageTooLargeError",
    "NonRetryableError",
    "NotSubscribedError",
    "SourceClosedError",
    "SourceUnavailableError",
    "UnknownTopicError",
]


class LitePushError(Exception):
    """Root of every error lite_push raises on purpose."""


class ConfigError(LitePushError, ValueError):
    """A configuration value is invalid; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class UnknownTopicError(LitePushError, KeyError):
    """The topic does not exist on the source."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"unknown topic {topic!r}")
        self.topic = topic

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class MessageTooLargeError(LitePushError, ValueError):
    """A message body exceeds the source's maximum size."""

    def __init__(self, topic: str, size: int, limit: int) -> None:
        super().__init__(f"message for topic {topic!r} has {size} bytes, more than the limit of {limit}")
        self.topic = topic
        self.size = size
        self.limit = limit


class NonRetryableError(LitePushError):
    """Raised by a listener for a message that can never succeed: it goes to
    the dead-letter queue at once, with this error as the reason, instead of
    being retried (``ConsumeResult.DLQ_NOW`` does the same)."""


class ConsumerFailedError(LitePushError):
    """The consumer stopped because a lane or its pull thread failed (a bug,
    not a listener's failure, which is retried): ``__cause__`` is what
    failed.  What it had not finished stays uncommitted and is delivered
    again."""


class MessageDecodeError(LitePushError, ValueError):
    """A message body could not be decoded (for example it is not valid
    JSON).  Raised from a listener it is a failure like any other: retried,
    then dead-lettered with this text as the reason."""

    def __init__(self, topic: str, queue_id: int, offset: int, reason: str) -> None:
        super().__init__(f"cannot decode the body of {topic}#{queue_id} offset {offset}: {reason}")
        self.topic = topic
        self.queue_id = queue_id
        self.offset = offset
        self.reason = reason


class NotSubscribedError(LitePushError):
    """A queue operation named a queue this consumer does not own."""


class CommitRefusedError(LitePushError):
    """The group refused a commit (a Kafka coordinator in a rebalance, or
    a member no longer in the group's generation): the committed offsets
    stayed as they were.  The consumer commits again at the next interval,
    and at its stop reports what the group holds."""


class SourceClosedError(LitePushError):
    """The source was used after ``close()``."""


class SourceUnavailableError(LitePushError):
    """The source's server cannot be reached (it is down, the address is
    wrong, or it refused the connection): ``address`` names it (never with
    a password), ``reason`` is what the client said."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"cannot connect to {address}: {reason}")
        self.address = address
        self.reason = reason


class GroupActiveError(LitePushError):
    """A consumer group's committed offsets were not changed because the
    group has live members (``members``: their client ids), which would
    overwrite them with their own commits; stop them first."""

    def __init__(self, group: str, members: list[str]) -> None:
        shown = ", ".join(members[:5]) + (f" and {len(members) - 5} more" if len(members) > 5 else "")
        super().__init__(
            f"group {group!r} has {len(members)} live member(s): {shown}; stop them first "
            "(offsets change only while the group is empty)"
        )
        self.group = group
        self.members = members


class AdminNotSupportedError(LitePushError):
    """The source cannot do this admin operation (librdkafka's mock cluster
    has no DescribeConsumerGroups, for one); the message names the tool that
    can."""
