"""What one lane gives back to the rest of the consumer.

A lane worker finishes with each message it took in one of three ways, and
:class:`Handback` does the bookkeeping of each, per batch:

- **completed**: the process queue marks it finished (the commit may pass
  it) and the lane's ``consumed`` counter counts it;
- **skipped**: left unfinished, so it runs again (a revoked queue, the
  shutdown deadline, a lane that stops);
- **handed off**: a dead letter or a send-back, put in the
  :class:`~lite_push._lanes.failures.Outbox` for the pull thread to store.
  The messages that follow a held key into the dead-letter topic
  (``dead_letter_order="key"``) gather here and go with the next hand-off,
  or when the lane is about to wait.

Each way also releases the messages to the router (load placement: a key
with nothing left on this lane may go to another).  It also reports whether
the lane is busy (holds work, started or not: the ``lanes_busy`` gauge) and,
when the lane stops, leaves what it still holds unfinished.  Lane thread or
task only.
"""

from __future__ import annotations

from collections.abc import Callable

from .._state.process_queue import ProcessQueue
from .._state.shared import Counters, per_queue
from .._types import MessageExt
from .failures import FailurePolicy, Outbox, SendItem
from .held_keys import NOTHING_HELD

#: Hands the router what a lane is done with: ``(lane index, messages)``.
Release = Callable[[tuple[int, list[MessageExt]]], None]


class Handback:
    """The completions, skips and hand-offs of lane ``index``, and whether
    it is busy."""

    __slots__ = ("_counters", "_held_out", "_outbox", "_policy", "_release", "held", "index")

    def __init__(
        self,
        index: int,
        *,
        counters: Counters,
        outbox: Outbox,
        policy: FailurePolicy,
        release: Release | None = None,
    ) -> None:
        self.index = index
        #: ``consumed`` and ``busy`` of this lane are written here.
        self._counters = counters
        #: Dead letters and send-backs, to the pull thread.
        self._outbox = outbox
        #: Says whether a message's key is held in its queue (and makes its dead letter).
        self._policy = policy
        #: Load placement's release to the router (``None``: a fixed
        #: placement, or not KEY_ORDERLY).
        self._release = release
        #: The policy's held keys (``dead_letter_order="key"``): while
        #: ``held.keys`` is empty, a lane looks no further.
        self.held = NOTHING_HELD if policy.held is None else policy.held
        # Dead letters of held keys' messages, handed off in a batch.
        self._held_out: list[SendItem] = []

    def idle(self) -> None:
        """The lane's task is about to wait for work: what it gathered goes
        now."""
        self.flush()
        self._counters.busy[self.index] = False

    def busy(self) -> None:
        """The lane's task holds work it has not started (waiting for a
        slot, or just taken)."""
        self._counters.busy[self.index] = True

    def took(self) -> None:
        """The lane's task took work: what it gathered before goes now."""
        self.flush()
        self._counters.busy[self.index] = True

    def stop(self, items: list[tuple[ProcessQueue, MessageExt]]) -> None:
        """The lane's task stops: ``items`` (its parked messages) and what it
        gathered behind held keys stay unfinished (uncommitted)."""
        self._counters.busy[self.index] = False
        items = items + self.take_gathered()
        for pq, ms in per_queue(items).items():
            pq.skip(ms)
        self.done_with([m for _, m in items])

    def done_with(self, msgs: list[MessageExt]) -> None:
        """The lane will not touch ``msgs`` again: tell the router."""
        if self._release is not None and msgs:
            self._release((self.index, msgs))

    def skip(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Leave ``msgs`` unfinished (uncommitted: they run again)."""
        pq.skip(msgs)
        self.done_with(msgs)

    def complete(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """``msgs`` finished: the commit may pass them."""
        pq.complete(msgs)
        self._counters.consumed[self.index] += len(msgs)
        self.done_with(msgs)

    def hand_off(self, out: list[SendItem]) -> None:
        """Store ``out`` elsewhere (with the held keys' dead letters gathered
        so far): the pull thread takes it from the outbox."""
        if self._held_out:
            out = self._held_out + out
            self._held_out = []
        self._outbox.put(out)
        self.done_with([item.message for item in out])

    def flush(self) -> None:
        """Hand off the held keys' dead letters gathered so far."""
        if self._held_out:
            self.hand_off([])

    def hold_behind(self, pq: ProcessQueue, m: MessageExt, out: list[SendItem] | None = None) -> bool:
        """If ``m``'s key is held in its queue, ``m`` goes to the dead-letter
        queue behind it (into ``out``, else gathered here): say so."""
        item = self._policy.behind(pq, m)
        if item is None:
            return False
        (self._held_out if out is None else out).append(item)
        return True

    def take_gathered(self) -> list[tuple[ProcessQueue, MessageExt]]:
        """The held keys' messages gathered and not handed off (the lane
        stops: they stay unfinished)."""
        items = [(it.pq, it.message) for it in self._held_out]
        self._held_out = []
        return items
