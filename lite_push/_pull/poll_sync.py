"""After each poll: what changed since, handed to the pull side before what
the poll returned is routed.

* **Fences** (every poll): each owned queue's fence moves to where the
  source says its ownership stops being certain (``PullSource.owned_for``),
  less ``fence_margin``; a lane calls no listener for a queue past its fence
  (``_lanes.call_gate``).
* **Key pauses** (every poll): the keys the application paused or resumed
  since go to every lane (``_pull.key_pauses``), so the lanes hold a key
  paused before the poll returned.
* **Steals** (once a turn, before routing): keys waiting behind a stuck
  call move to other lanes (``_pull.lane_steal``).

Pull side only.
"""

from __future__ import annotations

from .._clock import Clock
from .._state.process_queue import ProcessQueue
from .._types import MessageQueue
from ..sources.contract import PullSource
from .key_pauses import KeyPauseSync
from .lane_steal import LaneStealer

__all__ = ["PollSync"]


class PollSync:
    """Fences, key pauses and steals after a poll (see the module docstring)."""

    __slots__ = ("_clock", "_key_pauses", "_margin", "_owned", "_source", "_stealer")

    def __init__(
        self,
        source: PullSource,
        *,
        clock: Clock,
        owned: dict[MessageQueue, ProcessQueue],
        fence_margin: float,
        key_pauses: KeyPauseSync | None = None,
        stealer: LaneStealer | None = None,
    ) -> None:
        self._source = source
        #: Fences are on the consumer's clock.
        self._clock = clock
        #: The owned queues (assignment writes them, inside ``poll``).
        self._owned = owned
        #: ``fence_margin``: seconds before the source's end of certainty.
        self._margin = fence_margin
        #: Hands the lanes the keys the application paused or resumed
        #: (``None``: QUEUE_ORDERLY, which has no lanes).
        self._key_pauses = key_pauses
        #: Moves keys off lanes stuck in a listener call (``None``: never).
        self._stealer = stealer

    def turn(self) -> None:
        """A turn's poll returned: fences, key pauses, then steals."""
        self.polled()
        if self._stealer is not None and self._stealer.pending:
            self._stealer.run()  # keys waiting behind a stuck call move to other lanes

    def polled(self) -> None:
        """A poll returned (the turn's, or one gathering more): fences and
        key pauses."""
        self.renew_fences()
        if self._key_pauses is not None:  # the lanes hold a key paused before the poll returned
            self._key_pauses.apply()

    def renew_fences(self) -> None:
        """Move each owned queue's fence to where the source says its
        ownership stops being certain, less ``fence_margin``."""
        left = self._source.owned_for()
        if left:
            now = self._clock.monotonic() - self._margin
            pqs = self._owned
            for q, seconds in left.items():
                pq = pqs.get(q)
                if pq is not None and not pq.dropped:
                    pq.owned_until = now + seconds
