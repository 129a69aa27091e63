"""Flow control: pause a queue that holds too much, resume it at half.

RocketMQ's ConsumerLimitController.  A queue is paused at the source when
its unfinished messages, their bytes, its offset span or the size its offset
map could encode to pass their thresholds (``pull_threshold_for_queue``,
``pull_threshold_size_for_queue``, ``max_span``, ``offset_map_max_bytes``),
or while a lane it fed is over ``lane_capacity``; it resumes when all of them
are at or below ``RESUME_FRACTION`` of their limits (hysteresis, so it does
not flap).  So memory stays bounded under any backlog, and the pull thread
never blocks on a full lane: it pauses the queues that fill it instead.

Runs on the pull thread only.  A lane that brings a paused queue under its
low-water mark wakes the pull thread (``ProcessQueue``), which resumes it on
its next turn.
"""

from __future__ import annotations

import logging

from .._config import ConsumerConfig
from .._lanes.lanes import Lane
from .._state.process_queue import ProcessQueue
from .._state.shared import AppPauses, QueueCounters
from .._types import MessageQueue
from ..sources.contract import PullSource

__all__ = ["RESUME_FRACTION", "FlowControl", "low_water"]

logger = logging.getLogger(__name__)

#: A queue resumes when its unfinished messages, bytes and span are all at or
#: below this fraction of their thresholds.
RESUME_FRACTION = 0.5


def low_water(cfg: ConsumerConfig) -> tuple[int, int, int, int]:
    """The resume marks (messages, bytes, span, offset-map bytes) a new
    ProcessQueue is given."""
    return (
        int(cfg.queue_threshold * RESUME_FRACTION),
        int(cfg.pull_threshold_size_for_queue * RESUME_FRACTION),
        int(cfg.max_span * RESUME_FRACTION),
        int(cfg.offset_map_max_bytes * RESUME_FRACTION),
    )


class FlowControl:
    """Pause and resume decisions for the pull thread."""

    __slots__ = ("_app_pauses", "_config", "_counters", "_lanes", "_owned", "_source")

    def __init__(
        self,
        config: ConsumerConfig,
        *,
        source: PullSource,
        owned: dict[MessageQueue, ProcessQueue],
        lanes: list[Lane],
        counters: dict[MessageQueue, QueueCounters],
        app_pauses: AppPauses,
    ) -> None:
        #: The thresholds (``pull_threshold_*``, ``max_span``,
        #: ``offset_map_max_bytes``, ``lane_capacity``).
        self._config = config
        self._source = source
        #: The owned queues (assignment writes them).
        self._owned = owned
        self._lanes = lanes
        #: Per queue: pauses and resumes counted here.
        self._counters = counters
        #: The application's pauses, which flow control never resumes.
        self._app_pauses = app_pauses

    def over_threshold(self, count: int, size: int, span: int, map_bytes: int) -> bool:
        """Whether a queue's unfinished messages, bytes, span or offset-map
        size pass the pause thresholds (RocketMQ's pullThresholdForQueue,
        ...SizeForQueue, consumeConcurrentlyMaxSpan; ``offset_map_max_bytes``)."""
        cfg = self._config
        return (
            count > cfg.queue_threshold
            or size > cfg.pull_threshold_size_for_queue
            or span > cfg.max_span
            or map_bytes > cfg.offset_map_max_bytes
        )

    def apply(self) -> None:
        """Pause queues over a threshold; resume them below the low-water mark."""
        lanes = self._lanes
        lane_low = self._config.lane_capacity * RESUME_FRACTION

        def still_blocked(i: int) -> bool:
            return lanes[i].depth > lane_low

        to_pause: list[MessageQueue] = []
        to_resume: list[MessageQueue] = []
        counters = self._counters
        app_paused = self._app_pauses.queues  # the application's pauses hold until it resumes
        for q, pq in self._owned.items():
            blocked = pq.unblock_lanes(still_blocked) or q in app_paused
            if not pq.paused:
                if blocked or self.over_threshold(*pq.snapshot()):
                    pq.pause()
                    to_pause.append(q)
                    counters[q].pauses += 1
            elif not blocked and pq.check_resume():
                pq.mark_resumed()
                to_resume.append(q)
                counters[q].resumes += 1
        if to_pause:
            self._source.pause(to_pause)
            logger.debug("paused %s", to_pause)
        if to_resume:
            self._source.resume(to_resume)
            logger.debug("resumed %s", to_resume)
