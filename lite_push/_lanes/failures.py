"""What happens to a message whose listener call failed.

* :class:`FailurePolicy` is the one classification of a failure, used by
  every path that calls a listener (a lane's hot and slow paths, its due
  keys, the QUEUE_ORDERLY baseline): :meth:`FailurePolicy.classify` turns an
  exception or a result into a :class:`Failure` (dead-letter now, for
  ``NonRetryableError`` and ``ConsumeResult.DLQ_NOW``, or retry later, with
  the reason and exception text that travel with the message), and
  :meth:`FailurePolicy.verdict` decides per message, by mode and attempt
  count: :attr:`Verdict.DEAD_LETTER`, :attr:`Verdict.PARK` (KEY_ORDERLY: the
  key waits ``suspend_ms``) or :attr:`Verdict.SEND_BACK` (CONCURRENTLY: the
  retry topic, at a growing delay level).  With ``dead_letter_order="key"``
  its :class:`~lite_push._lanes.held_keys.HeldKeys` marks each dead letter as
  holding its key (:meth:`FailurePolicy.dead_letter`) and makes the dead
  letter of a later message that must wait behind a held key
  (:meth:`FailurePolicy.behind`).
* :class:`Outbox` carries messages from the lanes to the pull thread, which is
  the only thread that stores them in the source: dead letters and
  send-backs go out in one source call per kind per loop, and a message's
  offset is completed only once the source stored it.
* :class:`Parked` is a key waiting for its retry in one lane.
"""

from __future__ import annotations

import enum
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from .._errors import NonRetryableError
from .._state.process_queue import ProcessQueue
from .._tracing import verdict_event
from .._types import ConsumeResult, MessageExt
from .held_keys import HeldKeys

__all__ = ["MAX_EXCEPTION_TEXT", "Failure", "FailurePolicy", "Outbox", "Parked", "SendItem", "Verdict"]

_RETRY = (ConsumeResult.RETRY_LATER, ConsumeResult.SUSPEND_CURRENT_QUEUE_A_MOMENT)
#: Longest exception text stored with a dead letter.
MAX_EXCEPTION_TEXT = 4000


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed listener call: whether it asks for the dead-letter queue at
    once, why (``reason``, one line) and the exception's traceback text."""

    dead_now: bool
    reason: str
    exception: str = ""


class Verdict(enum.Enum):
    """What becomes of one message of a failed call."""

    #: Retries used up, or the listener said so: the dead-letter queue.
    DEAD_LETTER = "dead letter"
    #: KEY_ORDERLY: the key waits ``suspend_ms``, then the message runs again.
    PARK = "park"
    #: CONCURRENTLY: back to the retry topic at the next delay level.
    SEND_BACK = "send back"


class FailurePolicy:
    """The failure rules of one consumer (see the module docstring)."""

    __slots__ = ("held", "keyed", "max_reconsume_times", "retry_start_level")

    def __init__(
        self, keyed: bool, *, max_reconsume_times: int, retry_start_level: int, held: HeldKeys | None = None
    ) -> None:
        #: Whether a failure parks its key (KEY_ORDERLY, and the baseline's
        #: suspended queue) rather than sending the message back.
        self.keyed = keyed
        #: Retries before the dead-letter queue (negative: no limit).
        self.max_reconsume_times = max_reconsume_times
        #: The delay level of a first send-back.
        self.retry_start_level = retry_start_level
        #: ``dead_letter_order="key"``: the keys dead letters hold (``None``:
        #: a dead letter lets its key move on).
        self.held = held

    @staticmethod
    def classify(exc: BaseException | None, result: object) -> Failure:
        """The :class:`Failure` of a call that raised ``exc`` (or returned
        ``result`` when ``exc`` is None)."""
        if exc is not None:
            text = "".join(traceback.format_exception(exc)).strip()
            if len(text) > MAX_EXCEPTION_TEXT:
                text = "..." + text[-(MAX_EXCEPTION_TEXT - 3) :]
            return Failure(isinstance(exc, NonRetryableError), f"listener raised {type(exc).__name__}: {exc}", text)
        if result is ConsumeResult.DLQ_NOW:
            return Failure(True, "listener returned DLQ_NOW")
        if isinstance(result, ConsumeResult) and result in _RETRY:
            return Failure(False, f"listener returned {result.name}")
        return Failure(False, f"listener returned {result!r}, not a ConsumeResult or None; treated as RETRY_LATER")

    def verdict(self, message: MessageExt, failure: Failure) -> Verdict:
        """What becomes of ``message`` after ``failure``."""
        limit = self.max_reconsume_times
        if failure.dead_now or 0 <= limit <= message.reconsume_times:
            verdict = Verdict.DEAD_LETTER
        else:
            verdict = Verdict.PARK if self.keyed else Verdict.SEND_BACK
        verdict_event(verdict.name.lower(), message)  # on the failed call's span, when traced
        return verdict

    def dead_letter(self, pq: ProcessQueue, message: MessageExt, failure: Failure) -> SendItem:
        """The outbox item that stores ``message`` in the dead-letter queue
        (with ``dead_letter_order="key"``, its key held from now on)."""
        if self.held is not None:
            message = self.held.letter(pq, message)
        return SendItem(pq, message, True, failure.reason, failure.exception)

    def behind(self, pq: ProcessQueue, message: MessageExt) -> SendItem | None:
        """``dead_letter_order="key"``: the outbox item that stores
        ``message`` in the dead-letter queue because its key is held there
        (it is not run), or ``None`` to run it."""
        held = self.held
        found = None if held is None else held.behind(pq, message)
        return None if found is None else SendItem(pq, found[0], True, found[1], behind=True)

    def send_back(self, pq: ProcessQueue, message: MessageExt, failure: Failure) -> SendItem:
        """The outbox item that stores ``message`` back in the retry topic
        at its next delay level."""
        level = self.retry_start_level + message.reconsume_times
        return SendItem(pq, message, False, failure.reason, failure.exception, level)


class Parked:
    """A key waiting for its retry, in one lane: ``items`` are its messages
    in order, the head being the one to retry (already a copy with
    ``reconsume_times`` incremented).  Owned by the lane's task.

    A key the application paused (``consumer.pause_keys``) is a park too:
    ``paused`` holds it whatever its timer says, and a park made for the
    pause alone has no timer entry (``pending`` False)."""

    __slots__ = ("items", "gen", "reason", "exception", "paused", "pending")

    def __init__(self, gen: int, reason: str, exception: str, *, paused: bool = False) -> None:
        self.items: list[tuple[ProcessQueue, MessageExt]] = []
        #: Matches the timer entry that will wake this park (stale entries
        #: of an earlier park of the same key are ignored).
        self.gen = gen
        self.reason = reason
        self.exception = exception
        #: Held by the application until it resumes the key.
        self.paused = paused
        #: Whether a timer entry of this park is still to come (False: it
        #: came while the key was paused, or the park has none): a resume
        #: runs the key at once only then.
        self.pending = not paused


@dataclass(slots=True)
class SendItem:
    """A message the pull thread must store in the source: in the
    dead-letter queue (``dead_letter``) or back in the retry topic at
    ``delay_level``.  ``pq`` is the queue whose offset it completes."""

    pq: ProcessQueue
    message: MessageExt
    dead_letter: bool
    reason: str
    exception: str = ""
    delay_level: int = 0
    #: A dead letter stored because its key is held, not because it failed.
    behind: bool = False


class Outbox:
    """Lanes (and the baseline's pool) put, the pull thread takes everything
    at once.  ``wake`` cuts the pull thread's poll short after a put, so it
    stores the items without waiting out its poll timeout."""

    __slots__ = ("_items", "_lock", "_wake")

    def __init__(self, wake: Callable[[], None]) -> None:
        #: Guards ``_items``: one put per failed chunk, one take per turn.
        self._lock = threading.Lock()
        self._items: list[SendItem] = []
        self._wake = wake

    def put(self, items: list[SendItem]) -> None:
        """Hand ``items`` to the pull thread (any thread)."""
        with self._lock:
            self._items += items
        self._wake()

    def take(self) -> list[SendItem]:
        """Everything put so far (pull thread)."""
        with self._lock:
            items = self._items
            self._items = []
        return items

    def __bool__(self) -> bool:
        return bool(self._items)  # a racy read is fine: the pull thread looks again next loop
