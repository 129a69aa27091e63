"""The one-line status ``lite-push consume`` prints every few seconds on a
terminal (``--progress on`` prints it anywhere, ``off`` never):

    consumed 182,304 (+12,410/s)  lag 3,120  in flight 512  paused 1 of 8 queues  dead letters 0

The rate is over the last interval; the lag is the sum over owned queues of
the source's end offset less the committed one (queues whose end the source
cannot tell are left out); ``in flight`` the unfinished messages; ``paused``
the queues flow control or the application holds back.  A listener call
that has run ``SLOW_CALL`` seconds or more is named at the end of the line
(the oldest one: its key, queue, offset and age), since a stuck call does
not make ``/healthz`` fail (the process is alive)::

    ...  dead letters 0  longest call: key 'acct-7' (orders@embedded#2 offset 9,120) has run 73.4 s on lane 3
"""

from __future__ import annotations

import time
from typing import IO

from .._core.snapshots import ConsumerStats
from ..sources import PullSource

__all__ = ["SLOW_CALL", "STATUS_INTERVAL", "Status"]

#: Seconds between two status lines.
STATUS_INTERVAL = 5.0
#: A call that has run this many seconds is named on the status line.
SLOW_CALL = 5.0


class Status:
    """Prints a status line every ``interval`` seconds when :meth:`tick` is
    called often enough (the command's wait loop)."""

    def __init__(
        self, out: IO[str], source: PullSource, interval: float = STATUS_INTERVAL, start: float | None = None
    ) -> None:
        """``start``: when counting begins (``time.monotonic()`` by default)."""
        self._out = out
        self._source = source
        self.interval = interval
        self._last_at = time.monotonic() if start is None else start
        self._last_consumed = 0

    def tick(self, stats: ConsumerStats, now: float | None = None) -> bool:
        """Print a line if an interval has passed; return whether it did."""
        now = time.monotonic() if now is None else now
        elapsed = now - self._last_at
        if elapsed < self.interval:
            return False
        self._out.write(self.line(stats, elapsed) + "\n")
        self._out.flush()
        self._last_at = now
        self._last_consumed = stats.consumed
        return True

    def line(self, stats: ConsumerStats, elapsed: float) -> str:
        """The status of ``stats``, its rate over ``elapsed`` seconds."""
        rate = (stats.consumed - self._last_consumed) / elapsed if elapsed > 0 else 0.0
        try:
            ends = self._source.end_offsets(list(stats.committed))
        except Exception:  # the line must print, whatever the source does
            ends = {}
        lag = sum(max(0, end - stats.committed[q]) for q, end in ends.items() if q in stats.committed)
        owned = len(stats.in_flight)
        line = (
            f"consumed {stats.consumed:,} (+{rate:,.0f}/s)  lag {lag:,}  "
            f"in flight {sum(stats.in_flight.values()):,}  paused {len(stats.paused)} of {owned} queues  "
            f"dead letters {stats.dead_lettered:,}"
        )
        call = stats.longest_call
        if call is not None and call.seconds >= SLOW_CALL:
            line += f"  longest call: {call.describe()}"
        return line
