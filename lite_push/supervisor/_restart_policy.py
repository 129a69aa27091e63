"""When a member process that died is started again, and when to give up.

Pure bookkeeping, no processes and no clock of its own: the supervisor
(:mod:`lite_push.supervisor`) passes the time in, so the rules are tested
with a :class:`~lite_push.ManualClock` and no sleeping.

* Back-off: the ``n``-th death in a row waits ``backoff * 2 ** (n - 1)``
  seconds, at most ``backoff_max``, before the member is started again.
* Stability: a run that lasted ``stable_after`` seconds or more ends the
  series, so its death counts as the first again.
* Crash loop: a member that dies ``max_start_failures`` times in a row
  without ever becoming ready (its consumer started) is not started again:
  :meth:`RestartTracker.died` returns ``None`` and the supervisor stops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._errors import ConfigError

__all__ = ["RestartPolicy", "RestartTracker", "check_seconds"]


def check_seconds(name: str, value: object) -> float:
    """``value`` as seconds; :class:`~lite_push.ConfigError` naming ``name``
    unless it is a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(name, f"must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """The restart rules of a supervisor's members (see the module
    docstring); invalid values raise :class:`~lite_push.ConfigError` naming
    the argument (``restart_backoff``, ``restart_backoff_max``,
    ``stable_after``, ``max_start_failures``)."""

    backoff: float = 1.0
    backoff_max: float = 30.0
    stable_after: float = 60.0
    max_start_failures: int = 5

    def __post_init__(self) -> None:
        check_seconds("restart_backoff", self.backoff)
        check_seconds("restart_backoff_max", self.backoff_max)
        check_seconds("stable_after", self.stable_after)
        if self.backoff_max < self.backoff:
            raise ConfigError(
                "restart_backoff_max",
                f"must be >= restart_backoff ({self.backoff!r}), got {self.backoff_max!r}",
            )
        if type(self.max_start_failures) is not int or self.max_start_failures < 1:
            raise ConfigError("max_start_failures", f"must be an int >= 1, got {self.max_start_failures!r}")

    def delay(self, deaths_in_a_row: int) -> float:
        """The back-off before the next start after ``deaths_in_a_row``
        (>= 1) consecutive deaths."""
        if deaths_in_a_row < 1:
            raise ValueError(f"deaths_in_a_row must be >= 1, got {deaths_in_a_row}")
        # 2 ** 64 is past any cap; a bigger exponent would only overflow
        return min(self.backoff_max, self.backoff * 2.0 ** min(deaths_in_a_row - 1, 64))


class RestartTracker:
    """One member's series of deaths under ``policy``; the supervisor calls
    :meth:`started` when it starts the member's process, :meth:`ready` when
    the member says its consumer started, and :meth:`died` when the process
    ended without being asked to."""

    __slots__ = ("_ready", "_started_at", "deaths_in_a_row", "policy", "start_failures")

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        #: Deaths since the last run that lasted ``stable_after`` (the back-off's exponent).
        self.deaths_in_a_row = 0
        #: Deaths in a row of runs that never became ready.
        self.start_failures = 0
        self._started_at: float | None = None
        self._ready = False

    def started(self, now: float) -> None:
        """A process of the member was started at ``now``."""
        self._started_at = now
        self._ready = False

    def ready(self) -> None:
        """The running process's consumer started: the member is not crash-looping."""
        self._ready = True
        self.start_failures = 0

    def died(self, now: float) -> float | None:
        """The running process died at ``now``: the seconds to wait before
        starting it again, or ``None`` when it failed to become ready
        ``max_start_failures`` times in a row (give up)."""
        started_at = self._started_at
        self._started_at = None
        if started_at is not None and now - started_at >= self.policy.stable_after:
            self.deaths_in_a_row = 0  # it ran long enough: a new series
        self.deaths_in_a_row += 1
        if not self._ready:
            self.start_failures += 1
            if self.start_failures >= self.policy.max_start_failures:
                return None
        self._ready = False
        return self.policy.delay(self.deaths_in_a_row)
