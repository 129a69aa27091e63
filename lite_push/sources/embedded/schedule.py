"""The embedded broker's retries, dead letters and delayed delivery.

``send_back`` and ``send_to_dlq`` (called through a consumer, for its group)
store copies made by ``contract.origin_properties``.  Dead letters go straight
to ``%DLQ%<group>``.  Retries are delayed like RocketMQ's
SCHEDULE_TOPIC_XXXX: the internal :data:`SCHEDULE_TOPIC` has one queue per
delay level, and ``send_back`` appends the copy to its level's queue with
REAL_TOPIC (``%RETRY%<group>``) and TIMER_DELIVER_MS (due time: the clock's
``.time()`` plus the level's delay, in ms).  One fixed delay per level makes
each level queue FIFO by due time (as long as the wall clock does not go
back), so only the heads are checked.

Per level, the delivery offset -- what was already moved -- is the committed
offset of the internal group ``%SCHEDULE%`` on that queue, stored in
offsets.json with the other groups, so it survives a restart.  Delivering a
due message appends a copy, minus REAL_TOPIC and TIMER_DELIVER_MS, to its
retry topic and then advances the delivery offset, both under one lock;
offsets.json is written after.  A crash between the two writes delivers that
message again after restart: delivery is at-least-once.  Delivery is lazy:
every poll compares the clock with :attr:`Schedule.next_due_ms` (the
earliest head due time, +inf when nothing is scheduled) and delivers what is
due; a poll that waits does not wait past it.  ``deliver_due()`` does the
same for callers with no consumer.

Retry and DLQ topics have one queue and are created on first use.
SCHEDULE_TOPIC is created by the first ``send_back`` with one queue per delay
level (grown on reopen when more levels are configured; extra queues of a
shorter list are still delivered from).  It cannot be subscribed, sent to or
created by users, and ``topics()`` does not list it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from ..._errors import SourceClosedError
from ..._types import MessageExt, MessageQueue, OffsetAndMetadata
from .._common import BrokerClock, dead_letter_item, retry_item, validate_topic
from ..contract import (
    REAL_TOPIC,
    TIMER_DELIVER_MS,
    dlq_topic,
    retry_topic,
)
from .groups import SCHEDULE_GROUP, GroupCoordinator
from .log import LogStore

__all__ = ["SCHEDULE_TOPIC", "Schedule"]

logger = logging.getLogger(__name__)

#: The broker's internal topic of delayed retries, one queue per delay level;
#: consumers cannot subscribe to it.
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
#: Due messages moved per lock acquisition by a delivery run.
_DELIVER_CHUNK = 4096
#: How long delivery waits before trying again after it failed (seconds).
_DELIVER_RETRY_DELAY = 1.0
_INF = math.inf


def _due_ms(m: MessageExt) -> int:
    """When a scheduled message is due (0, i.e. at once, when its property
    is missing or unreadable: it is then dropped with a warning)."""
    raw = m.properties.get(TIMER_DELIVER_MS)
    try:
        return int(raw) if raw is not None else 0
    except ValueError:
        return 0


class Schedule:
    """Stores retries and dead letters, and moves due retries to their
    retry topics."""

    def __init__(
        self,
        log: LogStore,
        groups: GroupCoordinator,
        clock: BrokerClock,
        delay_levels: tuple[float, ...],
        max_message_size: int,
        check_open: Callable[[], None],
    ) -> None:
        self._log = log
        self._groups = groups
        self._clock = clock
        self._levels = delay_levels
        self._max_size = max_message_size
        self._check_open = check_open
        #: Earliest due time (ms) of a scheduled message, +inf when none.
        #: Written under the lock, read without it by every poll (a float
        #: read is atomic; a stale value only makes a poll look once more or
        #: a little later).
        self.next_due_ms = _INF

    @property
    def delay_levels(self) -> tuple[float, ...]:
        """The seconds each delay level waits (level ``n`` is ``[n - 1]``)."""
        return self._levels

    def grow_to_levels_locked(self) -> None:
        """(lock held, at start) A schedule topic made with fewer delay
        levels than the broker has now gets a queue per level."""
        t = self._log.get(SCHEDULE_TOPIC)
        if t is not None and len(t.queues) < len(self._levels):
            self._log.grow_locked(t, len(self._levels))

    # -- storing ----------------------------------------------------------------

    def send_back(self, group: str, items: Sequence[tuple[MessageExt, int]]) -> list[BaseException | None]:
        """Store each copy in the schedule queue of its delay level, due
        ``delay`` seconds from the clock's ``.time()``, bound for
        ``%RETRY%<group>``."""
        levels = self._levels
        target = retry_topic(group)
        now_ms = int(self._clock.time() * 1000)
        broker_name = self._log.broker_name

        def copy(item: tuple[MessageExt, int]) -> MessageExt:
            message, level, props = retry_item(item, levels, self._max_size)
            times = message.reconsume_times + 1
            props[REAL_TOPIC] = target
            props[TIMER_DELIVER_MS] = str(now_ms + round(levels[level - 1] * 1000))
            return MessageExt(
                SCHEDULE_TOPIC,
                level - 1,
                -1,
                message.body,
                message.keys,
                message.tags,
                props,
                message.born_timestamp,
                reconsume_times=times,
                broker_name=broker_name,
            )

        return self._store_copies(items, copy, SCHEDULE_TOPIC, len(levels), target)

    def send_to_dlq(self, group: str, items: Sequence[tuple[MessageExt, str, str]]) -> list[BaseException | None]:
        """Store each copy in ``%DLQ%<group>`` with its reason."""
        target = dlq_topic(group)
        broker_name = self._log.broker_name

        def copy(item: tuple[MessageExt, str, str]) -> MessageExt:
            message, props = dead_letter_item(item, group, self._max_size)
            return MessageExt(
                target,
                0,
                -1,
                message.body,
                message.keys,
                message.tags,
                props,
                message.born_timestamp,
                reconsume_times=message.reconsume_times,
                broker_name=broker_name,
            )

        return self._store_copies(items, copy, target, 1, None)

    def _store_copies(
        self,
        items: Sequence[Any],
        copy: Callable[[Any], MessageExt],
        topic: str,
        queue_count: int,
        also_create: str | None,
    ) -> list[BaseException | None]:
        """Build ``copy(item)`` of every item (an exception is that item's
        result), then store the copies in ``topic`` (created with
        ``queue_count`` queues if missing, as is ``also_create``) under one
        lock acquisition with one write per queue; a failure there is the
        result of every copy."""
        self._check_open()
        results: list[BaseException | None] = [None] * len(items)
        copies: list[MessageExt] = []
        built: list[int] = []
        for i, item in enumerate(items):
            try:
                copies.append(copy(item))
            except Exception as e:
                results[i] = e
            else:
                built.append(i)
        if not copies:
            return results
        log = self._log
        encoded = log.encode(copies, queue_count)
        try:
            with log.lock:
                self._check_open()
                if also_create is not None:
                    log.ensure_locked(also_create, 1)
                log.append_locked(log.ensure_locked(topic, queue_count), *encoded)
                if topic == SCHEDULE_TOPIC:
                    self.recompute_next_due_locked()
        except Exception as e:
            logger.warning("storing %d message(s) in %r failed: %s", len(copies), topic, e)
            for i in built:
                results[i] = e
        return results

    # -- delivering ---------------------------------------------------------------

    def deliver_due(self) -> int:
        """Move every delayed retry that is due (by the clock's ``.time()``)
        to its retry topic; return how many were moved."""
        now_ms = int(self._clock.time() * 1000)
        total = 0
        more = True
        groups = self._groups
        while more:
            snapshot = None
            with self._log.lock:
                self._check_open()
                moved, advanced, more = self._deliver_locked(now_ms)
                if advanced and self._log.durable:
                    snapshot = groups.offsets_snapshot()
            if snapshot is not None:
                groups.save_offsets(*snapshot)
            total += moved
        if total:
            logger.debug("delivered %d delayed retr%s", total, "y" if total == 1 else "ies")
        return total

    def deliver_from_poll(self) -> None:
        """:meth:`deliver_due` for a consumer's poll: a failure is logged
        (the poll goes on) and delivery is tried again a little later."""
        try:
            self.deliver_due()
        except SourceClosedError:
            pass  # the poll reports it
        except Exception:
            logger.exception("delivering delayed retries failed; trying again in %g s", _DELIVER_RETRY_DELAY)
            with self._log.lock:
                self.next_due_ms = (self._clock.time() + _DELIVER_RETRY_DELAY) * 1000

    def _deliver_locked(self, now_ms: int) -> tuple[int, bool, bool]:
        """(lock held) Move up to ``_DELIVER_CHUNK`` messages due at
        ``now_ms`` from the schedule queues' heads to their retry topics,
        then advance the delivery offsets.  Returns (how many were moved,
        whether a delivery offset moved, whether more may be due)."""
        log = self._log
        t = log.get(SCHEDULE_TOPIC)
        if t is None:
            return 0, False, False
        committed = self._groups.group(SCHEDULE_GROUP).committed
        by_target: dict[str, list[MessageExt]] = {}
        advanced: list[tuple[MessageQueue, int]] = []
        budget = _DELIVER_CHUNK
        more = False
        broker_name = log.broker_name
        for q, queue_log in zip(t.queues, t.logs, strict=True):
            om = committed.get(q)
            start = pos = om.offset if om is not None else 0
            end = len(queue_log)
            while pos < end and _due_ms(queue_log[pos]) <= now_ms:
                if not budget:
                    more = True
                    break
                budget -= 1
                m = queue_log[pos]
                pos += 1
                props = dict(m.properties)
                target = props.pop(REAL_TOPIC, "")
                props.pop(TIMER_DELIVER_MS, None)
                try:
                    validate_topic(target)
                except ValueError:
                    logger.warning("scheduled message %s has no valid %s (%r); dropped", m.msg_id, REAL_TOPIC, target)
                    continue
                copy = MessageExt(
                    target,
                    0,
                    -1,
                    m.body,
                    m.keys,
                    m.tags,
                    props,
                    m.born_timestamp,
                    reconsume_times=m.reconsume_times,
                    broker_name=broker_name,
                )
                by_target.setdefault(target, []).append(copy)
            if pos != start:
                advanced.append((q, pos))
        moved = 0
        for target, msgs in by_target.items():
            tt = log.ensure_locked(target, 1)
            log.append_locked(tt, *log.encode(msgs, len(tt.queues)))
            moved += len(msgs)
        for q, pos in advanced:  # only once every copy is stored: at-least-once
            committed[q] = OffsetAndMetadata(pos)
        self.recompute_next_due_locked()
        return moved, bool(advanced), more

    def recompute_next_due_locked(self) -> None:
        """(lock held) :attr:`next_due_ms` := the earliest due time among the
        schedule queues' heads (+inf when nothing is scheduled)."""
        t = self._log.get(SCHEDULE_TOPIC)
        g = self._groups.find(SCHEDULE_GROUP)
        best = _INF
        if t is not None:
            for q, queue_log in zip(t.queues, t.logs, strict=True):
                om = g.committed.get(q) if g is not None else None
                pos = om.offset if om is not None else 0
                if pos < len(queue_log):
                    best = min(best, _due_ms(queue_log[pos]))
        self.next_due_ms = best
