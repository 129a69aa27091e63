"""A lane's parked keys: keys waiting on the consumer's timer.

KEY_ORDERLY parks a key whose call failed: its message waits ``suspend_ms``
(a copy with ``reconsume_times`` incremented), and the key's later messages
in the lane queue up behind it, in order, while the lane goes on with its
other keys.  ``key_min_interval`` holds a key the same way, without a
failed attempt.  Each park puts one :class:`~lite_push._timer.DueKey` on
the timer; its generation tells a live park from a stale entry of an earlier
park of the same key.  A message without a key parks its queue (keyless
messages keep queue order, so they wait together).

One :class:`ParkedKeys` per lane, used by that lane's task only: no lock.
The lane's ``parked`` and ``paced`` counters are written here.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence

from ._failures import Failure, Parked
from ._process_queue import ProcessQueue
from ._shared import Counters, KeyOf
from ._timer import DueKey, RetryTimer
from ._types import MessageExt

__all__ = ["PACED", "ParkedKeys"]

#: The reason of a key held for its minimum interval (not a failure).
PACED = "key interval"

Item = tuple[ProcessQueue, MessageExt]


class ParkedKeys:
    """The parked keys of lane ``index`` (see the module docstring)."""

    __slots__ = ("_counters", "_generations", "_index", "_key_of", "_monotonic", "_suspend", "_timer", "keys")

    def __init__(
        self,
        index: int,
        timer: RetryTimer,
        generations: Iterator[int],
        counters: Counters,
        *,
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
        #: Key -> its park.  The executors' hot path reads it: empty, no
        #: segment waits behind a parked key.
        self.keys: dict[Hashable, Parked] = {}

    def key(self, pq: ProcessQueue, msg: MessageExt) -> Hashable:
        """What a failure parks: the message's key, or its queue when it has
        none."""
        key = msg.keys if self._key_of is None else self._key_of(msg)
        return key if key else pq.queue

    def queue_behind(self, pq: ProcessQueue, msg: MessageExt) -> bool:
        """If ``msg``'s key is parked, queue ``msg`` behind it and say so."""
        p = self.keys.get(self.key(pq, msg))
        if p is None:
            return False
        p.items.append((pq, msg))
        self._counters.parked[self._index] += 1
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

    def hold(self, items: list[Item], key: Hashable, at: float, new: int) -> None:
        """Hold ``key`` until ``at`` for its minimum interval (not a failed
        attempt: its messages run as they are), with ``items`` waiting (the
        last ``new`` of them were not parked before)."""
        p = self.keys[key] = Parked(next(self._generations), PACED, "")
        p.items = items
        self._counters.parked[self._index] += new
        self._counters.paced[self._index] += 1
        self._timer.add(at, DueKey(self._index, key, p.gen))

    def take(self, key: Hashable, gen: int) -> Parked | None:
        """Remove and return ``key``'s park if ``gen`` is still it (else the
        timer entry was stale: the key was purged or parked again)."""
        p = self.keys.get(key)
        if p is None or p.gen != gen:
            return None
        del self.keys[key]
        return p

    def unparked(self, n: int) -> None:
        """``n`` parked messages left their parks (run, handed off or skipped)."""
        self._counters.parked[self._index] -= n

    def purge(self) -> list[Item]:
        """Remove and return the parked messages of dropped (revoked) queues."""
        dropped: list[Item] = []
        for key in list(self.keys):
            p = self.keys[key]
            keep = [(pq, m) for pq, m in p.items if not pq.dropped]
            dropped += [(pq, m) for pq, m in p.items if pq.dropped]
            if keep:
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
        return items
