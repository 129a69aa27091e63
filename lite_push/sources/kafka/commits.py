"""Committing a Kafka member's offsets: the offset map within the metadata
limit, and the coordinator's refusals.

The offset map rides in the commit metadata.  Kafka refuses metadata over
``offset.metadata.max.bytes`` (4,096 by default) and fails the whole commit,
so a map over the limit is cut to the longest prefix that fits
(:func:`lite_push._state.offset_map.shrink`): the next owner then runs again what
lies past the prefix, which is at-least-once, never a failed commit.

During a rebalance the coordinator may answer REBALANCE_IN_PROGRESS (a
classic group that is between join and sync); the commit is tried again
every :data:`COMMIT_RETRY`, inside the revoke callback for up to a session
(the group is stable again within one), elsewhere for up to
:data:`COMMIT_PATIENCE`.  A commit refused for good (the member is no longer in
the generation, or the rebalance outlasted the patience) raises
:class:`~lite_push.CommitRefusedError`: the consumer's committer logs it once
and commits again at the next interval, and a stop reports what the group
holds.  Commits of partitions not owned are ignored, as the contract says.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ..._errors import CommitRefusedError
from ..._state.offset_map import shrink
from ..._types import MessageQueue, OffsetAndMetadata

__all__ = ["COMMIT_PATIENCE", "COMMIT_RETRY", "FENCED", "commit_within", "fit_metadata"]

logger = logging.getLogger(__name__)

#: Pause between commits the coordinator refused during a rebalance (seconds).
COMMIT_RETRY = 0.05
#: Longest a commit outside the revoke callback waits for a rebalance to
#: end (seconds): a periodic commit that gives up is made again at the next
#: interval.  Inside the revoke callback the wait is up to a session: that
#: commit is what the next owner starts from.
COMMIT_PATIENCE = 2.0
#: Commit errors after which the commit is dropped: the member is out of the
#: generation, or a rebalance outlasted the patience.
FENCED = frozenset(
    {
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError._ASSIGNMENT_LOST,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError.STALE_MEMBER_EPOCH,
    }
)


def fit_metadata(om: OffsetAndMetadata, limit: int, queue: MessageQueue) -> str:
    """``om.metadata``, cut to at most ``limit`` bytes (ASCII: one byte a
    character) when longer."""
    md = om.metadata
    if len(md) > limit:
        md = shrink(md, om.offset, limit)
        logger.info("offset map of %s at %d cut to %d bytes (limit %d)", queue, om.offset, len(md), limit)
    return md


def commit_within(kc: Consumer, tps: list[TopicPartition], patience: float, owner: object) -> None:
    """Commit ``tps`` synchronously; REBALANCE_IN_PROGRESS is retried for up
    to ``patience`` seconds; a commit refused for good raises
    :class:`~lite_push.CommitRefusedError`, any other error its own.  A partition the coordinator refused on its own
    is logged."""
    deadline = time.monotonic() + patience
    while True:
        try:
            result = kc.commit(offsets=tps, asynchronous=False)
            break
        except KafkaException as e:
            code = e.args[0].code() if e.args else None
            if code == KafkaError.REBALANCE_IN_PROGRESS and time.monotonic() < deadline:
                time.sleep(COMMIT_RETRY)  # the coordinator takes commits again once the group is stable
                continue
            if code in FENCED:
                raise CommitRefusedError(
                    f"{owner!r}: commit refused ({e.args[0].str()}); the group keeps its last accepted offsets"
                ) from None
            raise
    for tp in result or ():
        if tp.error is not None:
            logger.warning("%r: commit of %s-%d refused: %s", owner, tp.topic, tp.partition, tp.error.str())
