"""What happens to a message whose listener call failed.

* :func:`classify` turns an exception or a result into a decision: retry
  later, or dead-letter now (``NonRetryableError``, ``ConsumeResult.DLQ_NOW``),
  with the reason and the exception text that travel with the message.
* :class:`RetryTimer` is the single timer of a consumer: lanes add the parked
  keys they hold (and the pull thread adds local retries), the pull thread
  pops what is due on the injectable clock and hands it to the lanes.  No
  thread sleeps per parked key.
* :class:`Outbox` carries messages from the lanes to the pull thread, which is
  the only thread that talks to the source: dead letters and send-backs go
  out in one source call per kind per loop, and a message's offset is
  completed only once the source stored it.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from ._errors import NonRetryableError
from ._process_queue import ProcessQueue
from ._types import ConsumeResult, MessageExt

__all__ = ["Outbox", "Parked", "RetryTimer", "SendItem", "classify", "local_entry"]

_RETRY = (ConsumeResult.RETRY_LATER, ConsumeResult.SUSPEND_CURRENT_QUEUE_A_MOMENT)
#: Longest exception text stored with a dead letter.
MAX_EXCEPTION_TEXT = 4000


def classify(exc: BaseException | None, result: object) -> tuple[bool, str, str]:
    """``(dead_letter_now, reason, exception_text)`` for a failed call that
    raised ``exc`` (or returned ``result`` when ``exc`` is None)."""
    if exc is not None:
        text = "".join(traceback.format_exception(exc)).strip()
        if len(text) > MAX_EXCEPTION_TEXT:
            text = "..." + text[-(MAX_EXCEPTION_TEXT - 3) :]
        reason = f"listener raised {type(exc).__name__}: {exc}"
        return isinstance(exc, NonRetryableError), reason, text
    if result is ConsumeResult.DLQ_NOW:
        return True, "listener returned DLQ_NOW", ""
    if result in _RETRY:
        return False, f"listener returned {result.name}", ""
    return False, f"listener returned {result!r}, not a ConsumeResult or None; treated as RETRY_LATER", ""


class Parked:
    """A key waiting for its retry, in one lane: ``items`` are its messages
    in order, the head being the one to retry (already a copy with
    ``reconsume_times`` incremented).  Owned by the lane's thread."""

    __slots__ = ("items", "gen", "reason", "exception")

    def __init__(self, gen: int, reason: str, exception: str) -> None:
        self.items: list[tuple[ProcessQueue, MessageExt]] = []
        #: Matches the timer entry that will wake this park (stale entries
        #: of an earlier park of the same key are ignored).
        self.gen = gen
        self.reason = reason
        self.exception = exception


class RetryTimer:
    """A heap of ``(due, seq, lane, token)``; thread-safe (one lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = itertools.count()

    def add(self, due: float, lane: int, token: object) -> bool:
        """Wake ``token`` in lane ``lane`` (-1: the pull thread's own) at
        ``due`` (the consumer clock's monotonic seconds).  Returns whether it
        is now the earliest entry (the pull thread may be waiting past it)."""
        entry = (due, next(self._seq), lane, token)
        with self._lock:
            heapq.heappush(self._heap, entry)
            return self._heap[0] is entry

    def pop_due(self, now: float) -> list[tuple[int, object]]:
        """Remove and return the ``(lane, token)`` entries due at ``now``."""
        out: list[tuple[int, object]] = []
        with self._lock:
            heap = self._heap
            while heap and heap[0][0] <= now:
                _, _, lane, token = heapq.heappop(heap)
                out.append((lane, token))
        return out

    def take_local(self, owners: Callable[[object], bool]) -> list[object]:
        """Remove and return the pull thread's own tokens (lane -1) for
        which ``owners(token)`` holds, due or not (a revoked queue's local
        retries)."""
        with self._lock:
            taken = [e for e in self._heap if e[2] < 0 and owners(e[3])]
            if not taken:
                return []
            self._heap = [e for e in self._heap if not (e[2] < 0 and owners(e[3]))]
            heapq.heapify(self._heap)
        return [e[3] for e in taken]

    def next_due(self) -> float | None:
        """The earliest due time, or None when nothing is waiting."""
        with self._lock:
            return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._heap)


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


class Outbox:
    """Lanes put, the pull thread takes everything at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[SendItem] = []

    def put(self, items: list[SendItem]) -> None:
        with self._lock:
            self._items += items

    def take(self) -> list[SendItem]:
        with self._lock:
            items = self._items
            self._items = []
        return items

    def __bool__(self) -> bool:
        return bool(self._items)  # a racy read is fine: the pull thread looks again next loop


def local_entry(token: object) -> tuple[ProcessQueue, MessageExt]:
    """The queue and message of one of the pull thread's timer tokens: a
    local retry ``(pq, message)`` or a send-back held for its delay (a
    :class:`SendItem`)."""
    if isinstance(token, SendItem):
        return token.pq, token.message
    return token  # type: ignore[return-value]
