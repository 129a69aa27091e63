"""How long a Kafka member's ownership of its partitions is certain (fencing).

librdkafka heartbeats from a thread of its own; the application never sees a
heartbeat.  Its statistics do say, per broker connection, how long ago
something was last received (``rxidle``); on the group coordinator's
connection that is the last heartbeat (or commit) answer.  A member the
coordinator answered at ``t`` was a member when the request left, one round
trip earlier, so no other member can own its partitions before that moment
plus ``session.timeout.ms``.  librdkafka reports statistics every
:data:`STATS_INTERVAL` from inside ``consume`` (the owning thread).

An assignment arrives with the coordinator's answer to the join, so it
renews ownership too (less one statistics interval, to be safe).
"""

from __future__ import annotations

import math
import time

import orjson

__all__ = ["STATS_INTERVAL", "Ownership"]

#: How often librdkafka reports statistics (seconds).
STATS_INTERVAL = 0.5


class Ownership:
    """The moment (``time.monotonic()``) until which the member's
    partitions are certainly its own."""

    __slots__ = ("session_timeout", "until")

    def __init__(self, session_timeout: float) -> None:
        self.session_timeout = session_timeout
        self.until = -math.inf

    def left(self) -> float:
        """Seconds from now until ownership may lapse (negative once it may have)."""
        return self.until - time.monotonic()

    def assigned(self) -> None:
        """The coordinator has just answered a join with an assignment."""
        self._renewed(time.monotonic() - STATS_INTERVAL)

    def on_stats(self, raw: str, now: float | None = None) -> None:
        """librdkafka's statistics JSON: renew from the coordinator's last
        answer, less the longest round trip of that connection.  Statistics
        of a member not in a stable group (state other than ``up``) or
        without a connected coordinator renew nothing."""
        now = time.monotonic() if now is None else now
        try:
            stats = orjson.loads(raw)
            if stats.get("cgrp", {}).get("state") != "up":
                return
            coord = next(
                (
                    b
                    for b in stats.get("brokers", {}).values()
                    if b.get("nodeid") == -1 and b.get("state") == "UP" and b.get("rxidle", -1) >= 0
                ),
                None,
            )
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            return
        if coord is None:
            return
        rtt = (coord.get("rtt") or {}).get("max", 0) or 0
        self._renewed(now - coord["rxidle"] / 1e6 - rtt / 1e6)

    def _renewed(self, answered: float) -> None:
        self.until = max(self.until, answered + self.session_timeout)
