"""Whether a Kafka member still reaches its cluster, told in lite_push's own
words: one WARNING when every broker connection it had is down, one INFO
line when one is up again.

librdkafka says so itself, once per failed attempt, but its lines are at
DEBUG (``client_log``): they are noise to a command that fails anyway with
its own one-line error, and a running member needs one line per outage, not
one per reconnect.  Its statistics (every ``STATS_INTERVAL``, from inside
the group client's ``consume``) give each broker connection's state: the
brokers learned from the cluster and the bootstrap servers count, the
logical (group coordinator) and internal ones do not.  A cluster never
reached is not an outage: the member warns only after a broker was up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import orjson

__all__ = ["Reachability"]

logger = logging.getLogger(__name__)

#: The ``source`` of a real broker connection in librdkafka's statistics.
_REAL = frozenset({"learned", "configured"})


class Reachability:
    """Fed the group client's statistics (:meth:`on_stats`); logs when the
    member loses its last broker connection and when it has one again.
    ``who`` names the member in the log (text: the client holds this
    object, which must not hold the member); ``clock`` measures the outage."""

    __slots__ = ("_clock", "_down_since", "_seen_up", "_who")

    def __init__(self, who: object, clock: Callable[[], float] = time.monotonic) -> None:
        self._who = who
        self._clock = clock
        self._seen_up = False
        #: When the outage began (``None``: none now).
        self._down_since: float | None = None

    @property
    def down(self) -> bool:
        """Whether the member is in an outage: a broker was up, none is now."""
        return self._down_since is not None

    def on_stats(self, raw: str) -> None:
        """librdkafka's statistics JSON (anything unreadable is ignored)."""
        try:
            brokers = [b for b in orjson.loads(raw).get("brokers", {}).values() if b.get("source") in _REAL]
            states = {str(b.get("name")): str(b.get("state")) for b in brokers}
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            return
        if not states:
            return
        if "UP" in states.values():
            if not self._seen_up:
                logger.debug("%s: Kafka brokers reached (%s)", self._who, _listed(states))
            if self._down_since is not None:
                outage = self._clock() - self._down_since
                logger.info("%s: Kafka brokers reachable again after %.1f s", self._who, outage)
                self._down_since = None
            self._seen_up = True
        elif self._seen_up and self._down_since is None:
            self._down_since = self._clock()
            logger.warning("%s: no Kafka broker reachable (%s); librdkafka keeps retrying", self._who, _listed(states))


def _listed(states: dict[str, str]) -> str:
    """``name STATE, ...`` of broker connections."""
    return ", ".join(f"{name} {state}" for name, state in sorted(states.items()))
