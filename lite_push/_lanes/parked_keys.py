"""A lane's parked keys: keys waiting on the consumer's timer.

KEY_ORDERLY parks a key whose call failed: its message waits ``suspend_ms``
(a copy with ``reconsume_times`` incremented), and the key's later messages
in the lane queue up behind it, in order, while the lane goes on with its
other keys.  ``key_min_interval`` holds a key the same way, without a
failed attempt.  Each park puts one :class:`~lite_push._state.timer.DueKey` on
the timer; its generation tells a live park from a stale entry of an earlier
park of the same key.  A message without a key parks its queue (keyless
messages keep queue order, so they wait together).

**Keys the application paused** (``consumer.pause_keys``) are parks without
a timer entry.  Every lane is handed the whole paused set
(:meth:`ParkedKeys.apply_pauses`), but a lane makes a park for a paused key
only when a message of it arrives: a lane holds parks for the paused keys
it has messages of, not for every paused key (a thousand lanes times a
thousand paused keys would be a million parks).  While any key is paused
the lane's ``keys`` holds one more entry, :data:`PAUSE_MARK`, which no
message's key equals: the executors send every segment the slow way while
``keys`` is not empty, and the slow way asks :meth:`queue_behind` about each
message.  A key parked for a retry or its interval when it is paused keeps
its park, now paused as well: its timer entry, when it comes, only notes
that it came (``pending``), and the resume runs it at once.

One :class:`ParkedKeys` per lane, used by that lane's task only: no lock.
The lane's ``parked``, ``paced`` and ``key_paused`` counters are written
here.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence

from .._state.process_queue import ProcessQueue
from .._state.shared import Counters, KeyOf
from .._state.timer import DueKey, RetryTimer
from .._types import MessageExt
from .failures import Failure, Parked

__all__ = ["PACED", "PAUSED", "PAUSE_MARK", "ParkedKeys"]

#: The reason of a key paced to its minimum interval (not a failure).
PACED = "key interval"
#: The reason of a key the application paused.
PAUSED = "paused by the application"


class _PauseMark:
    """The type of :data:`PAUSE_MARK`: equal only to itself."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PAUSE_MARK"


#: The entry a lane's ``keys`` holds while any key is paused (see the module
#: docstring): no message's key (a ``str``, or its queue) equals it.
PAUSE_MARK = _PauseMark()

Item = tuple[ProcessQueue, MessageExt]


def _parked_of(changed: frozenset[Hashable], keys: dict[Hashable, Parked]) -> list[Hashable]:
    """The keys of ``changed`` that have a park in ``keys``."""
    if len(changed) <= len(keys):
        return [k for k in changed if k in keys]
    return [k for k in keys if k in changed]


class ParkedKeys:
    """The parked keys of lane ``index`` (see the module docstring)."""

    __slots__ = (
        "_counters",
        "_generations",
        "_index",
        "_key_of",
        "_monotonic",
        "_paused",
        "_suspend",
        "_timer",
        "keys",
    )

    def __init__(
        self,
        index: int,
        *,
        timer: RetryTimer,
        generations: Iterator[int],
        counters: Counters,
        monotonic: Callable[[], float],
        suspend: float,
        key_of: KeyOf | None = None,
    ) -> None:
        self._index = index
        self._timer = timer
        #: Park generations, shared by the lanes (``next()`` is atomic).
        self._generations = generations
        self._counters = counters
        self._monotonic = monotonic
        #: Seconds a failed key waits (``suspend_ms``).
        self._suspend = suspend
        #: ``None``: a message's key is ``message.keys``.
        self._key_of = key_of
        #: Key -> its park (and :data:`PAUSE_MARK` while keys are paused).
        #: The executors' hot path reads it: empty, no segment waits behind
        #: a parked key.  Changed in place only (the executors hold it).
        self.keys: dict[Hashable, Parked] = {}
        #: The keys the application paused, as this lane last heard.
        self._paused: frozenset[Hashable] = frozenset()

    def key(self, pq: ProcessQueue, msg: MessageExt) -> Hashable:
        """What a failure parks: the message's key, or its queue when it has
        none."""
        key = msg.keys if self._key_of is None else self._key_of(msg)
        return key if key else pq.queue

    def queue_behind(self, pq: ProcessQueue, msg: MessageExt) -> bool:
        """If ``msg``'s key is parked (or paused), queue ``msg`` behind it
        and say so."""
        key = self.key(pq, msg)
        p = self.keys.get(key)
        if p is None:
            if key not in self._paused:
                return False
            p = self.keys[key] = Parked(next(self._generations), PAUSED, "", paused=True)
        p.items.append((pq, msg))
        self._counters.parked[self._index] += 1
        if p.paused:
            self._counters.key_paused[self._index] += 1
        return True

    def park(self, pq: ProcessQueue, retry: MessageExt, failure: Failure, behind: Sequence[Item] = ()) -> None:
        """Park ``retry``'s key for ``suspend_ms``, with ``retry`` at its
        head and ``behind`` (already counted as parked) after it."""
        key = self.key(pq, retry)
        p = self.keys[key] = Parked(next(self._generations), failure.reason, failure.exception)
        p.items.append((pq, retry))
        p.items.extend(behind)
        self._counters.parked[self._index] += 1
        self._timer.add(self._monotonic() + self._suspend, DueKey(self._index, key, p.gen))

    def pace(self, items: list[Item], key: Hashable, at: float, new: int) -> None:
        """Pace ``key``: it waits until ``at`` for its minimum interval (not a failed
        attempt: its messages run as they are), with ``items`` waiting (the
        last ``new`` of them were not parked before)."""
        p = self.keys[key] = Parked(next(self._generations), PACED, "")
        p.items = items
        self._counters.parked[self._index] += new
        self._counters.paced[self._index] += 1
        self._timer.add(at, DueKey(self._index, key, p.gen))

    def take(self, key: Hashable, gen: int) -> Parked | None:
        """Remove and return ``key``'s park if ``gen`` is still it (else the
        timer entry was stale: the key was purged or parked again).  A
        paused park stays: ``None``, and the resume will run it."""
        p = self.keys.get(key)
        if p is None or p.gen != gen:
            return None
        if p.paused:
            p.pending = False  # its time came: the resume runs it at once
            return None
        del self.keys[key]
        return p

    def apply_pauses(
        self, paused: frozenset[Hashable], added: frozenset[Hashable], removed: frozenset[Hashable]
    ) -> list[tuple[Hashable, int]]:
        """The application's paused keys are now ``paused``: ``added`` were
        paused, ``removed`` resumed since the lane last heard.  Existing
        parks of ``added`` keys are paused too; ``removed`` keys' parks are let
        go.  Return ``(key, gen)`` of each resumed key to run now (its park
        has no timer entry to come), for :meth:`take`.  It costs the smaller
        of the change and the lane's parks."""
        self._paused = paused
        keys = self.keys
        waiting = self._counters.key_paused
        i = self._index
        for key in _parked_of(added, keys):
            p = keys[key]
            if not p.paused:
                p.paused = True
                waiting[i] += len(p.items)
        run: list[tuple[Hashable, int]] = []
        for key in _parked_of(removed, keys):
            p = keys[key]
            if p.paused:
                p.paused = False
                waiting[i] -= len(p.items)
                if not p.pending:
                    run.append((key, p.gen))
        if not paused:
            keys.pop(PAUSE_MARK, None)
        elif PAUSE_MARK not in keys:
            keys[PAUSE_MARK] = Parked(0, PAUSED, "", paused=True)
        return run

    def unparked(self, n: int) -> None:
        """``n`` parked messages left their parks (run, handed off or skipped)."""
        self._counters.parked[self._index] -= n

    def purge(self) -> list[Item]:
        """Remove and return the parked messages of dropped (revoked) queues;
        a paused key stays paused."""
        dropped: list[Item] = []
        for key in list(self.keys):
            p = self.keys[key]
            keep = [(pq, m) for pq, m in p.items if not pq.dropped]
            gone = len(p.items) - len(keep)
            if not gone:
                continue
            dropped += [(pq, m) for pq, m in p.items if pq.dropped]
            if p.paused:
                self._counters.key_paused[self._index] -= gone
            if keep or p.paused:
                p.items = keep
            else:
                del self.keys[key]
        self.unparked(len(dropped))
        return dropped

    def clear(self) -> list[Item]:
        """Remove and return every parked message (the lane stops)."""
        items = [item for p in self.keys.values() for item in p.items]
        self.keys.clear()
        self._counters.parked[self._index] = 0
        self._counters.key_paused[self._index] = 0
        return items
