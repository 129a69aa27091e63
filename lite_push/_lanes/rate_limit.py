"""Rate limits: the consumer's ``max_rate`` and the per-key minimum interval.

* :class:`RateLimiter` spaces the starts of listener calls so that the
  consumer as a whole starts at most ``max_rate`` messages per second.  It
  hands out *reservations* (Guava's ``SmoothBursty`` scheme): a call of
  ``n`` messages takes the next ``n`` free slots, ``1 / rate`` seconds
  apart, and waits only until the first of them; slots left unused while the
  consumer was idle are kept up to ``burst`` messages.  So in any interval
  of ``T`` seconds at most ``rate * T + burst + n`` messages start, where
  ``n`` is the largest call.  One lock per reservation; a lane that must wait
  is told how long, and its executor waits without holding anything
  (a thread on the abort event, a coroutine with ``asyncio.sleep``).
* :class:`KeyPacer` remembers when each key's last listener call started,
  for ``key_min_interval``: KEY_ORDERLY lanes hold a key's next message on
  the consumer's timer (as they park a failed key) until the interval since
  its last start has passed, and go on with their other keys meanwhile.  A
  key runs on one lane at a time and moves to another only after its lane
  released it, so a plain dict shared by the lanes is enough (each key's
  entry has one writer at a time, and the hand-over through the router orders
  the writes); the pull thread drops what is older than the interval by
  swapping two generations (:meth:`KeyPacer.rotate`), so its memory is the
  keys started within the last two rotation periods.

Both read the consumer's injectable clock.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Hashable

from .._state.shared import KeyOf
from .._types import MessageExt

__all__ = ["BURST_SECONDS", "KeyPacer", "RateLimiter"]

#: Seconds of unused rate a limiter keeps for a burst after an idle spell
#: (at least one message).
BURST_SECONDS = 0.1
#: A wait shorter than this is no wait (rounding in the slot arithmetic).
NEGLIGIBLE = 1e-6


class RateLimiter:
    """At most ``rate`` message starts per second, shared by every lane.

    :meth:`reserve` is thread-safe; the counters it keeps (``delayed``:
    messages that had to wait; ``waited``: seconds they waited, per call)
    are read by ``stats()`` and the metrics without the lock.
    """

    __slots__ = ("_lock", "_monotonic", "_next", "_slot", "_store", "burst", "delayed", "rate", "waited")

    def __init__(self, rate: float, monotonic: Callable[[], float]) -> None:
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"rate must be a positive number, got {rate!r}")
        self.rate = float(rate)
        #: Messages that may start at once after an idle spell.
        self.burst = max(1, math.ceil(rate * BURST_SECONDS))
        self._slot = 1.0 / self.rate
        self._store = self.burst * self._slot
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._next = -math.inf  # when the next free slot is
        self.delayed = 0
        self.waited = 0.0

    def reserve(self, n: int, now: float | None = None) -> float:
        """Take ``n`` slots; return how many seconds after ``now`` (default:
        the clock's now) the caller starts (0.0: at once).  The caller waits
        until ``now`` plus that, on the same clock: a timer that fires early
        (uvloop's are in whole milliseconds, measured from the start of the
        loop's turn) is no reason to start early."""
        if now is None:
            now = self._monotonic()
        with self._lock:
            first = max(self._next, now - self._store)
            self._next = first + n * self._slot
            wait = first - now
            if wait > NEGLIGIBLE:
                self.delayed += n
                self.waited += wait
                return wait
        return 0.0


class KeyPacer:
    """When each key's last listener call started (see the module
    docstring).  Lanes call :meth:`due` and :meth:`started`; the pull
    thread calls :meth:`rotate`."""

    __slots__ = ("_current", "_key_of", "_next_rotation", "_previous", "interval", "period")

    def __init__(self, interval: float, *, key_of: KeyOf | None = None) -> None:
        if not (interval > 0 and math.isfinite(interval)):
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        self.interval = float(interval)
        #: The router's key of a message (``None``: ``message.keys``).
        self._key_of = key_of
        #: Seconds between rotations: an entry lives at least this long.  The
        #: margin over the interval covers a write that raced a rotation (a
        #: lane preempted between reading the generation and writing to it).
        self.period = self.interval + max(self.interval, 0.1)
        self._current: dict[Hashable, float] = {}
        self._previous: dict[Hashable, float] = {}
        self._next_rotation = -math.inf

    def key(self, msg: MessageExt) -> str | None:
        """The key ``msg`` is paced by (``None``: a keyless message, not
        paced)."""
        return (msg.keys if self._key_of is None else self._key_of(msg)) or None

    def due(self, key: Hashable, now: float) -> float:
        """When ``key`` may start again: 0.0 if it may now, else the time
        (the clock's ``monotonic``) its interval ends."""
        last = self._current.get(key)
        if last is None:
            last = self._previous.get(key)
            if last is None:
                return 0.0
        at = last + self.interval
        return at if at > now else 0.0

    def started(self, key: Hashable, now: float) -> None:
        """``key``'s listener call starts at ``now``."""
        self._current[key] = now

    def started_all(self, keys: list[Hashable], now: float) -> None:
        """The calls of ``keys`` (one chunk) start at ``now``."""
        current = self._current
        for key in keys:
            current[key] = now

    def rotate(self, now: float) -> None:
        """Drop entries older than the interval (at most once per
        ``period``): the current generation becomes the previous one, and
        what was previous is dropped.  An entry written at ``t`` is kept
        until at least ``t + period``; a write that races a rotation lands in
        the generation that just became previous, which is kept one period
        more (``period`` exceeds the interval by a margin for that)."""
        if now < self._next_rotation:
            return
        self._previous = self._current
        self._current = {}
        self._next_rotation = now + self.period

    def __len__(self) -> int:
        """Keys remembered (both generations; a key may be in each)."""
        return len(self._current) + len(self._previous)
