"""Injectable time, so time-dependent logic is tested without real sleeps."""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    """What lite_push asks of time."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""

    def time(self) -> float:
        """Seconds since the epoch."""

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``event``; return whether it is set."""


class SystemClock:
    """The real clock (``time``'s own functions: lanes read ``monotonic``
    before every listener call)."""

    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.wait(timeout)


class ManualClock:
    """A clock that moves only when told (:meth:`advance`) or when someone
    waits on it: :meth:`wait` advances time by the whole timeout at once
    (unless the event is already set), so code that backs off runs instantly
    in tests while still seeing time pass."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``."""
        with self._lock:
            self._now += seconds

    def wait(self, event: threading.Event, timeout: float) -> bool:
        if event.is_set():
            return True
        self.advance(max(0.0, timeout))
        return event.is_set()


SYSTEM_CLOCK = SystemClock()
