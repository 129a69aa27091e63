"""The call gate: what a lane checks before every listener call.

* **Shutdown**: after the deadline (``abort`` set) nothing starts; the
  lane skips what is left, uncommitted.
* **Fencing**: a call starts only while the queue's ownership is certain
  (``ProcessQueue.owned_until``, renewed by the pull thread from the
  source's heartbeats, on the consumer's clock).  Past it the steps yield
  :data:`~lite_push._lanes.steps.FENCED` until the fence moves (a late heartbeat
  that still found the queue ours) or the queue is dropped (the loss
  confirmed: its messages are skipped, uncommitted, for the next owner).
* **max_rate**: each call first reserves its start in the consumer's
  ``RateLimiter``; when it must wait the steps yield
  :data:`~lite_push._lanes.steps.PAUSE` and the executor waits until
  :attr:`CallGate.pause_until` (the consumer clock's ``monotonic``).

One gate per lane, used by that lane's task only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Generator

from .._clock import Clock
from .._state.process_queue import ProcessQueue
from .._types import MessageExt
from .rate_limit import RateLimiter
from .steps import FENCE_WAIT, FENCED, PAUSE

__all__ = ["CallGate"]

logger = logging.getLogger(__name__)

#: What a gate's checks yield (:data:`FENCED`, :data:`PAUSE`) and are sent.
Waits = Generator[list[MessageExt], object, bool]


class CallGate:
    """The checks before lane ``index``'s calls (see the module docstring)."""

    __slots__ = ("_abort", "_clock", "_group", "_index", "aborted", "limiter", "monotonic", "pause_until")

    def __init__(
        self, index: int, *, group: str, clock: Clock, abort: threading.Event, limiter: RateLimiter | None = None
    ) -> None:
        self._index = index
        self._group = group
        self._clock = clock
        #: Set at the shutdown deadline.
        self._abort = abort
        #: ``max_rate``'s limiter, shared by the lanes (``None``: no limit).
        self.limiter = limiter
        #: The consumer's clock, which fences are on (read before every call).
        self.monotonic = clock.monotonic
        #: After :data:`PAUSE`: when the call may start.
        self.pause_until = 0.0
        #: Whether the shutdown deadline passed (lanes skip what is left);
        #: the event's own method, called per segment on the hot path.
        self.aborted = abort.is_set

    def may_call(self, pq: ProcessQueue, n: int) -> Waits:
        """Before a call of ``n`` messages of ``pq``: reserve its start
        (``max_rate``), then return whether it may run: ``False`` after the
        shutdown deadline or for a queue lost past its fence (skip its
        messages)."""
        if self.limiter is not None:
            yield from self.reserve(n)
        if self._abort.is_set():
            return False
        if self.monotonic() >= pq.owned_until:
            return (yield from self.owner(pq))
        return True

    def reserve(self, n: int) -> Generator[list[MessageExt], object, None]:
        """``max_rate``: reserve the start of a call of ``n`` messages;
        yield :data:`PAUSE` when it must wait."""
        now = self.monotonic()
        wait = self.limiter.reserve(n, now) if self.limiter is not None else 0.0
        if wait > 0.0:
            self.pause_until = now + wait
            yield PAUSE

    def owner(self, pq: ProcessQueue) -> Waits:
        """Past ``pq``'s fence: yield :data:`FENCED` until it moves (return
        True) or the queue is dropped or the shutdown deadline passed
        (return False: skip its messages)."""
        said = False
        while True:
            if pq.dropped or self._abort.is_set():
                return False
            if self.monotonic() < pq.owned_until:
                if said:
                    logger.info("consumer %r: lane %d goes on with %s", self._group, self._index, pq.queue)
                return True
            if not said:
                said = True
                logger.warning(
                    "consumer %r: lane %d stops at %s: its ownership is not certain (no heartbeat for too long); "
                    "it waits until the source renews or revokes it",
                    self._group,
                    self._index,
                    pq.queue,
                )
            yield FENCED

    def wait_fenced(self) -> None:
        """Thread executor: wait :data:`FENCE_WAIT` (less at shutdown)
        after steps yielded :data:`FENCED`."""
        self._clock.wait(self._abort, FENCE_WAIT)

    def wait_paused(self) -> None:
        """Thread executor: wait until :attr:`pause_until` (less at shutdown)
        after steps yielded :data:`PAUSE`."""
        while (left := self.pause_until - self.monotonic()) > 0.0 and not self._clock.wait(self._abort, left):
            pass
