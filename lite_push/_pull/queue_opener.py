"""A queue gained: its ProcessQueue, and whether its keys reach every lane.

A queue assigned to this member starts at the source's position, with the
offset map committed there: offsets an earlier owner finished above the
committed one are skipped, not run again.  A map that cannot be read is
ignored (logged): every message above the offset is then processed again,
never lost.

With ``lane_placement="java"`` and no ``key_extractor``, the keys of a few
of a topic's queues may reach only some of the lanes (see
:meth:`QueueOpener.check_lane_reach`): logged as a warning, with a lane
count that reaches them all.  Pull side only (inside ``poll``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection

from .._config import ConsumeMode, ConsumerConfig
from .._kernels.router import lane_of
from .._state.offset_map import FinishedOffsets, OffsetMapError, decode
from .._state.process_queue import ProcessQueue
from .._types import MessageQueue
from ..sources.contract import PullSource
from .flow_control import low_water

__all__ = ["QueueOpener", "coprime_near"]

logger = logging.getLogger(__name__)


def coprime_near(lanes: int, queues: int) -> int:
    """The lane count nearest ``lanes`` (above first) coprime with ``queues``."""
    for d in range(lanes):
        for n in (lanes + d, lanes - d):
            if n >= 1 and math.gcd(n, queues) == 1:
                return n
    return 1


class QueueOpener:
    """Opens the queues one consumer gains (see the module docstring)."""

    def __init__(self, config: ConsumerConfig, *, source: PullSource, lanes: int) -> None:
        self._config = config
        self._source = source
        #: How many lanes (a queue's keyless lane, the lane-reach warning).
        self._lanes = lanes
        #: Where a paused queue resumes (flow control's low-water marks).
        self._low = low_water(config)

    def open(self, q: MessageQueue) -> ProcessQueue:
        """``q``'s ProcessQueue, at the source's position."""
        source = self._source
        position = source.position(q)
        return ProcessQueue(
            q,
            next_offset=position,
            keyless_lane=lane_of(str(q), self._lanes),
            resume_at=self._low,
            wake=source.wakeup,
            finished=self._finished_map(q, position),
        )

    def check_lane_reach(self, topics: set[str], owned: Collection[MessageQueue]) -> None:
        """``lane_placement="java"``: warn when the ``owned`` queues' keys cannot
        reach every lane.  A producer's hash selector puts key k in queue
        ``h(k) mod Q`` and the lane is ``h(k) mod L`` with the same Java hash, so queue q's keys
        only reach the lanes ``l = q (mod gcd(L, Q))``: L/g lanes per queue.
        A member owning a few of the queues then leaves lanes idle unless L
        is coprime with Q."""
        cfg = self._config
        if cfg.mode is not ConsumeMode.KEY_ORDERLY or cfg.key_extractor is not None or cfg.lane_placement != "java":
            return
        lanes = self._lanes
        for topic in sorted(topics):
            try:
                total = self._source.queue_count(topic)
            except Exception:  # only a hint
                continue
            if not total:
                continue
            g = math.gcd(lanes, total)
            classes = {q.queue_id % g for q in owned if q.topic == topic}
            reach = len(classes) * (lanes // g)
            if reach < lanes:
                logger.warning(
                    "consumer %r: the keys of its %d queue(s) of %r (of %d) can reach only %d of its %d lanes: "
                    "the producers' hash selector and the lane hash are the same Java hash and %d lanes share "
                    "the factor %d with %d queues; a lane count coprime with %d (e.g. %d) uses every lane",
                    cfg.group,
                    sum(1 for q in owned if q.topic == topic),
                    topic,
                    total,
                    reach,
                    lanes,
                    lanes,
                    g,
                    total,
                    total,
                    coprime_near(lanes, total),
                )

    def _finished_map(self, q: MessageQueue, position: int) -> FinishedOffsets | None:
        """The offset map committed with ``q``'s offset, when polling starts
        exactly there; a map that cannot be read is ignored (logged)."""
        group = self._config.group
        try:
            committed = self._source.committed(q)
        except Exception:
            logger.exception("consumer %r: reading the committed offset of %s failed", group, q)
            return None
        if committed is None or not committed.metadata or committed.offset != position:
            return None
        try:
            finished = decode(committed.metadata, committed.offset)
        except OffsetMapError as exc:
            logger.warning(
                "consumer %r: ignoring the offset map committed for %s (%s); messages above offset %d "
                "will be processed again",
                group,
                q,
                exc,
                committed.offset,
            )
            return None
        if finished is not None:
            logger.info(
                "consumer %r: %s resumes at %d; %d finished offsets below %d will be skipped (offset map)",
                group,
                q,
                position,
                finished.finished_count(),
                finished.end,
            )
        return finished
