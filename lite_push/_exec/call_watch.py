"""The call watch: a thread that looks at every lane's listener call.

Each lane shows the call in progress (``Lane.call``: its messages and when
it started, on the consumer's clock), written by the lane's task around
each call; nothing else is measured on the hot path.  Every
``WATCH_INTERVAL`` the watch reads them all and:

* logs, once per call, a WARNING for a call older than
  ``slow_call_warning`` (its key, queue and offset);
* asks the stealer (``_pull.lane_steal``) to move what waits behind a call older
  than ``steal_after``;
* learns the call times: a call it saw and that has ended since took at
  least the age it last saw.  ``steal_after="auto"`` is ``STEAL_MULTIPLE``
  times the 99th percentile of the last ``SAMPLES`` of these, and at least
  ``STEAL_FLOOR``.  (Calls shorter than the interval are seen seldom, so
  the estimate leans to the long calls: it errs on the late side.)

:func:`longest_call` (a watch's :meth:`CallWatch.longest`) names the oldest
call in progress for ``stats()`` and the metrics, read at the moment they are
asked for.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from .._lanes.lanes import Call, Lane
from .._state.shared import KeyOf
from .._types import MessageQueue

__all__ = [
    "SAMPLES",
    "STEAL_FLOOR",
    "STEAL_MULTIPLE",
    "WATCH_INTERVAL",
    "CallInProgress",
    "CallWatch",
    "longest_call",
]

logger = logging.getLogger(__name__)

#: Seconds between two looks at the lanes (the watch's own wait).
WATCH_INTERVAL = 0.1
#: ``steal_after="auto"``: never sooner than this many seconds.
STEAL_FLOOR = 0.5
#: ``steal_after="auto"``: this many times the recent 99th percentile.
STEAL_MULTIPLE = 10.0
#: ``steal_after="auto"``: how many ended calls the percentile is over.
SAMPLES = 512


@dataclass(frozen=True, slots=True)
class CallInProgress:
    """A listener call that is running (``stats().longest_call``)."""

    #: The lane it runs on.
    lane: int
    #: The key of its first message (``None``: keyless).
    key: Hashable | None
    #: The queue and offset of its first message.
    queue: MessageQueue
    offset: int
    #: How many messages the call holds.
    messages: int
    #: How long it has run (seconds, the consumer's clock).
    seconds: float

    def describe(self) -> str:
        """One line naming the call, for logs and status lines."""
        where = f"{self.queue} offset {self.offset:,}"
        return f"key {self.key!r} ({where}) has run {self.seconds:.1f} s on lane {self.lane}"


def _named(lane: int, call: Call, now: float, key_of: KeyOf | None) -> CallInProgress:
    first = call[0][0]
    key = first.keys if key_of is None else key_of(first)
    return CallInProgress(lane, key or None, first.queue, first.queue_offset, len(call[0]), max(0.0, now - call[1]))


def longest_call(lanes: list[Lane], now: float, key_of: KeyOf | None = None) -> CallInProgress | None:
    """(any thread) The call in progress that started first, or ``None``."""
    oldest: tuple[int, Call] | None = None
    for lane in lanes:
        call = lane.call
        if call is not None and (oldest is None or call[1] < oldest[1][1]):
            oldest = (lane.index, call)
    return None if oldest is None else _named(oldest[0], oldest[1], now, key_of)


class CallWatch:
    """Watches the lanes' calls (see the module docstring).  ``request``:
    the stealer's (``None``: keys never move)."""

    def __init__(
        self,
        group: str,
        *,
        lanes: list[Lane],
        monotonic: Callable[[], float],
        steal_after: float | str | None,
        slow_call_warning: float | None,
        request: Callable[[int, Call], None] | None = None,
        key_of: KeyOf | None = None,
    ) -> None:
        self._group = group
        self._lanes = lanes
        self._monotonic = monotonic
        self._steal_after = steal_after if request is not None else None
        self._warning = slow_call_warning
        self._request = request
        self._key_of = key_of
        n = len(lanes)
        #: Per lane: the call seen last and its age then.
        self._seen: list[tuple[Call, float] | None] = [None] * n
        #: Per lane: the call already warned about / asked to steal from.
        self._warned: list[Call | None] = [None] * n
        self._asked: list[tuple[Call, int] | None] = [None] * n
        self._samples: deque[float] = deque(maxlen=SAMPLES)
        self._threshold = STEAL_FLOOR if steal_after == "auto" else steal_after
        self._fresh = False  # samples arrived since the threshold was computed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Orders :meth:`start` and :meth:`close`: a consumer that fails
        #: while it starts closes the watch from its pull thread.
        self._life = threading.Lock()
        #: Calls logged for passing ``slow_call_warning`` (any thread reads).
        self.warnings = 0

    @property
    def threshold(self) -> float | None:
        """Seconds after which a call's lane is stolen from (``None``: never)."""
        return None if self._steal_after is None else self._threshold  # type: ignore[return-value]

    def longest(self) -> CallInProgress | None:
        """(any thread) The call in progress on the watched lanes that started
        first, aged on the consumer's clock now, or ``None``."""
        return longest_call(self._lanes, self._monotonic(), self._key_of)

    def start(self) -> None:
        """Watch on a daemon thread until :meth:`close`."""
        if self._steal_after is None and self._warning is None:
            return  # nothing to watch for
        with self._life:
            if self._stop.is_set():
                return  # closed before it started
            self._thread = threading.Thread(target=self._run, name=f"lite-push-calls-{self._group}", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop watching (any thread; before :meth:`start` too, which then
        starts nothing)."""
        with self._life:
            self._stop.set()
            thread = self._thread
        if thread is not None:
            thread.join(1.0)

    def _run(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL):
            try:
                self.check()
            except Exception:  # a bug here must not stop the consumer: say it once per look
                logger.exception("consumer %r: the call watch failed", self._group)

    def check(self) -> None:
        """One look at every lane (the watch's thread; tests call it)."""
        now = self._monotonic()
        warning = self._warning
        threshold = self.threshold
        request = self._request
        for i, lane in enumerate(self._lanes):
            call = lane.call
            seen = self._seen[i]
            if seen is not None and seen[0] is not call:
                self._samples.append(seen[1])  # it ended: it ran at least this long
                self._fresh = True
            if call is None:
                self._seen[i] = None
                continue
            age = now - call[1]
            self._seen[i] = (call, age)
            if warning is not None and age >= warning and self._warned[i] is not call:
                self._warned[i] = call
                self.warnings += 1
                logger.warning(
                    "consumer %r: a listener call has run longer than slow_call_warning (%.0f s): %s",
                    self._group,
                    warning,
                    _named(i, call, now, self._key_of).describe(),
                )
            if threshold is not None and request is not None and age >= threshold:
                asked = self._asked[i]
                # Once per call for what it holds, then again whenever more queues up.
                if asked is None or asked[0] is not call or lane.depth > asked[1]:
                    self._asked[i] = (call, lane.depth)
                    request(i, call)
        if self._fresh and self._steal_after == "auto":
            self._fresh = False
            ordered = sorted(self._samples)
            p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
            self._threshold = max(STEAL_FLOOR, STEAL_MULTIPLE * p99)
