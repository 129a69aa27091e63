"""The failure sender: stores what the lanes handed off, then completes it.

Lanes never talk to the source.  A message that is to go to the dead-letter
queue, or back to the retry topic (CONCURRENTLY), is put in the consumer's
outbox (``Outbox.put``); the pull thread takes everything at once and
stores it here with one source call per kind.  Only once the source stored a
message is its offset completed, so a commit never passes a message that is
neither processed nor stored elsewhere:

* a dead letter the source refuses is tried again every
  ``SEND_RETRY_INTERVAL`` (its offset stays unfinished meanwhile);
* a send-back that fails is retried here, on the consumer's timer, as a
  local retry after ``suspend_ms``;
* a BROADCASTING member, and one balanced by message (whose unacknowledged
  message keeps its key held by the member), have no retry topic: it waits
  the delay level's time on the timer and runs the message again itself;
* a source without delayed delivery (Kafka: ``delayed_delivery`` is False)
  stores a send-back at once, so the sender holds it on the timer for its
  delay level first (:meth:`FailureSender.send_delayed` stores it when due);
  its offset stays unfinished, so uncommitted, until the copy is stored;
* the messages of a revoked queue are skipped: left unfinished and
  uncommitted, so the next owner runs them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .._errors import LitePushError
from .._lanes.failures import Outbox, SendItem
from .._state.process_queue import ProcessQueue
from .._state.shared import Counters, per_queue
from .._state.timer import DelayedSendBack, LocalRetry, RetryTimer
from .._types import MessageExt
from ..sources.contract import PullSource

__all__ = ["SEND_RETRY_INTERVAL", "FailureSender"]

logger = logging.getLogger(__name__)

#: Seconds before the pull thread tries again to store dead letters the
#: source refused.
SEND_RETRY_INTERVAL = 1.0


class FailureSender:
    """Dead letters and send-backs, stored by the pull thread."""

    __slots__ = (
        "_broadcasting",
        "_counters",
        "_group",
        "_outbox",
        "_source",
        "_suspend",
        "_timer",
        "_unsent",
        "_unsent_at",
    )

    def __init__(
        self,
        source: PullSource,
        *,
        outbox: Outbox,
        timer: RetryTimer,
        counters: Counters,
        group: str,
        suspend_ms: int,
        broadcasting: bool = False,
    ) -> None:
        self._source = source
        #: What the lanes handed off.
        self._outbox = outbox
        #: Send-backs delayed to their level, and local retries.
        self._timer = timer
        #: ``dead_lettered`` and ``sent_back`` are written here.
        self._counters = counters
        self._group = group
        #: Seconds before a send-back that failed runs again here.
        self._suspend = suspend_ms / 1000.0
        #: BROADCASTING: no retry topic; a send-back waits its delay on the
        #: timer and runs again here.
        self._broadcasting = broadcasting
        # Dead letters the source refused, tried again every SEND_RETRY_INTERVAL.
        self._unsent: list[SendItem] = []
        self._unsent_at = 0.0

    @property
    def pending(self) -> bool:
        """Whether anything waits to be stored (a racy read: the pull
        thread looks again on its next turn)."""
        return bool(self._outbox) or bool(self._unsent)

    def send(self, now: float, final: bool = False) -> None:
        """Store handed-off messages in the source and complete their
        offsets once stored.  ``final`` (shutdown): what cannot be stored
        now is skipped, so it stays uncommitted and is delivered again."""
        items = self._outbox.take()
        if self._unsent and (final or now >= self._unsent_at):
            items = self._unsent + items
            self._unsent = []
        live = _live(items)
        stored: list[tuple[ProcessQueue, MessageExt]] = []
        dead = [it for it in live if it.dead_letter]
        back = [it for it in live if not it.dead_letter]
        if back and (self._broadcasting or not self._source.delayed_delivery):
            # Wait the delay level's time on the timer, the offsets unfinished
            # meanwhile: BROADCASTING has no retry topic (the message runs
            # again here), a source without delayed delivery would store the
            # copy at once (it is stored when due, send_delayed).
            levels = self._source.delay_levels
            for it in back:
                due = now + levels[min(max(it.delay_level, 1), len(levels)) - 1]
                self._timer.add(due, LocalRetry(it.pq, it.message) if self._broadcasting else DelayedSendBack(it))
            back = []
        if dead:
            stored += self._dead_letters(dead, now)
        if back:
            stored += self._send_back(back, now, final)
        for pq, ms in per_queue(stored).items():
            pq.complete(ms)
        if final:
            for pq, ms in per_queue([(it.pq, it.message) for it in self._unsent]).items():
                pq.skip(ms)
            self._unsent = []

    def send_delayed(self, items: list[SendItem], now: float) -> None:
        """Send-backs delayed to their level (a source without delayed
        delivery), due now: store them in the retry topic and complete
        their offsets; a revoked queue's are skipped (the next owner runs
        them)."""
        live = _live(items)
        if live:
            for pq, ms in per_queue(self._send_back(live, now, False)).items():
                pq.complete(ms)

    def release(self, pqs: set[ProcessQueue]) -> None:
        """Queues being revoked: their dead letters waiting to be stored
        again are skipped at once (left uncommitted, so the next owner runs
        them), so the revoke does not wait for them."""
        mine = [it for it in self._unsent if it.pq in pqs]
        if mine:
            self._unsent = [it for it in self._unsent if it.pq not in pqs]
            for pq, ms in per_queue([(it.pq, it.message) for it in mine]).items():
                pq.skip(ms)

    def _dead_letters(self, dead: list[SendItem], now: float) -> list[tuple[ProcessQueue, MessageExt]]:
        group = self._group
        source = self._source
        stored = []
        errors = _store(dead, lambda: source.send_to_dlq([(it.message, it.reason, it.exception) for it in dead]))
        for it, err in zip(dead, errors, strict=True):
            if err is None:
                stored.append((it.pq, it.message))
                self._counters.dead_lettered += 1
                if it.behind:  # not a failure: its key is held (one line per held message would flood)
                    self._counters.held_behind += 1
                    logger.debug(
                        "consumer %r: %s offset %d held in the dead-letter queue: %s",
                        group,
                        it.pq.queue,
                        it.message.queue_offset,
                        it.reason,
                    )
                    continue
                logger.warning(
                    "consumer %r: %s offset %d sent to the dead-letter queue after %d attempt(s): %s",
                    group,
                    it.pq.queue,
                    it.message.queue_offset,
                    it.message.reconsume_times + 1,
                    it.reason,
                )
            else:
                self._unsent.append(it)
        if self._unsent:
            self._unsent_at = now + SEND_RETRY_INTERVAL
            logger.error(
                "consumer %r: %d dead letter(s) not stored (%s); their offsets stay uncommitted, retrying",
                group,
                len(self._unsent),
                next(e for e in errors if e is not None),
            )
        return stored

    def _send_back(self, back: list[SendItem], now: float, final: bool) -> list[tuple[ProcessQueue, MessageExt]]:
        source = self._source
        stored = []
        errors = _store(back, lambda: source.send_back([(it.message, it.delay_level) for it in back]))
        delay = self._suspend
        for it, err in zip(back, errors, strict=True):
            if err is None:
                stored.append((it.pq, it.message))
                self._counters.sent_back += 1
            elif final:
                self._unsent.append(it)  # skipped by send(): stays unfinished, delivered again
            else:
                logger.warning(
                    "consumer %r: send-back of %s offset %d failed (%s); retrying it here in %d ms",
                    self._group,
                    it.pq.queue,
                    it.message.queue_offset,
                    err,
                    round(delay * 1000),
                )
                self._timer.add(now + delay, LocalRetry(it.pq, it.message))
        return stored


def _live(items: list[SendItem]) -> list[SendItem]:
    """The items whose queue is still owned; a revoked queue's are skipped
    (left unfinished and uncommitted: the next owner replays them)."""
    for pq, ms in per_queue([(it.pq, it.message) for it in items if it.pq.dropped]).items():
        pq.skip(ms)
    return [it for it in items if not it.pq.dropped]


def _store(items: list[SendItem], call: Callable[[], list[BaseException | None]]) -> list[BaseException | None]:
    """One result per item: ``None`` (stored) or why not."""
    try:
        errors = call()
    except Exception as exc:  # the whole call failed: every item did
        return [exc] * len(items)
    if len(errors) != len(items):
        return [LitePushError(f"source returned {len(errors)} results for {len(items)} messages")] * len(items)
    return errors
