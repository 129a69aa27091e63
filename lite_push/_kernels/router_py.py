"""Pure-Python twin of the router (see ``_kernels/router.py``).

Two jobs, kept apart:

* **The producer's queue choice** -- :func:`java_hash` is Java's
  ``String.hashCode``: ``s[0]*31^(n-1) + ... + s[n-1]`` over the string's
  UTF-16 code units, wrapped to a signed 32-bit int.  Characters outside the
  Basic Multilingual Plane are two code units (a surrogate pair), so the hash
  is taken over the UTF-16 encoding, not over Python's code points.
  :func:`lane_of` is ``floorMod(hashCode, n)``: the same queue (or lane) the
  Java client picks for the same key.
* **A key's lane** -- :class:`KeyRouter`, one per consumer, called by the pull
  thread only.  Lanes are local to one process, so they need not match Java.

  ``placement="load"`` (the default) is key-level scheduling: a key with
  messages queued or in flight stays on the lane that has them (all that
  per-key order needs: one lane, one task, FIFO); a key with none goes to the
  *least-loaded* lane, the one with the fewest messages routed to it and not
  yet released, ties to the lowest index.  The runtime releases what a lane
  is done with (completed, dead-lettered, or skipped for a revoked queue),
  per segment, through :meth:`KeyRouter.release_from`; when a key's last
  message is released it has no work and is placed anew when it comes back.
  Its table entry is kept for that (no allocation per message for a key
  that recurs) until keys without work outnumber those with work by
  ``SWEEP_SLACK``; then they are swept, so the table stays bounded by the
  work in the consumer (which flow control bounds).

  ``max_segment`` (0: no limit) caps the messages of one segment: a lane's
  share of a queue's batch is cut into runs of at most that many, so a lane
  completes (and releases) its work in steps that small.  Otherwise a lane
  handed 60 messages of one queue counts as loaded by all 60 until the last
  one is done, and new keys avoid it while it is about to be idle.

  The least-loaded lane comes from a *lazy heap* of ``(load, lane)``
  entries.  Invariant: every lane has an entry whose load is at most its
  current load.  Routing a message only raises a load (no heap work); a
  release lowers one and pushes the new ``(load, lane)``.  To find the
  minimum, look at the top: if it is exact, it is the answer (every lane's
  true ``(load, lane)`` is at least its smallest entry, which is at least
  the top); if it is low (the lane got messages since), replace it with the
  exact one; if it is high (the lane was released since, so it has a lower
  entry too), drop it.  The heap is rebuilt when it grows past
  ``2 * lanes + HEAP_SLACK`` entries.  The answer is defined as the minimum
  of ``(load, lane)``, not by the heap's shape, so the compiled twin gives
  the same placements for the same sequence of routes and releases.

  A *stalled* lane (:meth:`KeyRouter.stall`: its task is stuck in a
  listener call, see ``_pull.lane_steal``) gets no new key: its entries are
  dropped from the heap like those of a lane past the limit, and pushed
  again by :meth:`KeyRouter.unstall`.  Keys with work on it stay.  When
  every lane under the limit is stalled, the least-loaded of them is taken
  all the same (a scan: no lane is better).

  ``placement="hash"``: a fixed lane, ``mixed_hash(key) % lanes``, where
  :func:`mixed_hash` is MurmurHash3's 32-bit finaliser over Java's hash (its
  low bits are well mixed, unlike ``hashCode``'s for sequential ids).
  ``placement="java"``: ``lane_of(key, lanes)``, exact lane parity with the
  Java runtime.  Fixed placements track nothing, so releases are ignored.
"""

from __future__ import annotations

import heapq
import sys
from array import array
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

__all__ = [
    "HEAP_SLACK",
    "PLACEMENTS",
    "ROUTE_CACHE_LIMIT",
    "SWEEP_SLACK",
    "KeyRouter",
    "java_hash",
    "lane_of",
    "mixed_hash",
]

T = TypeVar("T")
K = TypeVar("K")

_MASK = 0xFFFFFFFF
#: The values of ``KeyRouter(placement=...)``.
PLACEMENTS = ("load", "hash", "java")
#: Fixed placements cache a key's lane; the cache is cleared past this many keys.
ROUTE_CACHE_LIMIT = 1 << 17
#: Load placement: the heap is rebuilt once it holds ``2 * lanes`` plus this
#: many entries.
HEAP_SLACK = 64
#: Load placement: keys with no work are kept (so a key that comes back
#: costs no allocation) until they outnumber those with work and this many.
SWEEP_SLACK = 16384

#: ``segments[i]``: ``None`` when lane ``i`` got nothing, else ``(tag, items)`` per group.
Segments = list["list[tuple[Any, list[Any]]] | None"]


def java_hash(key: str) -> int:
    """Java's ``String.hashCode`` of ``key`` (a signed 32-bit int)."""
    if not isinstance(key, str):
        raise TypeError(f"key must be str, not {type(key).__name__}")
    h = 0
    if key.isascii():
        units: Sequence[int] = key.encode("ascii")
    else:
        units = array("H", key.encode("utf-16-le", "surrogatepass"))
    for unit in units:
        h = (31 * h + unit) & _MASK
    return h - 0x100000000 if h & 0x80000000 else h


def lane_of(key: str, n: int) -> int:
    """The lane of ``key`` among ``n``: ``floorMod(hashCode, n)``, never
    negative (Java's ``Math.abs(h) % n`` is negative for ``Integer.MIN_VALUE``)."""
    if n <= 0:
        raise ValueError(f"lane count must be positive, got {n}")
    return java_hash(key) % n  # Python's % is floorMod


def mixed_hash(key: str) -> int:
    """MurmurHash3's 32-bit finaliser (``fmix32``) applied to Java's hash of
    ``key``: an unsigned 32-bit int whose every bit depends on every bit of
    the hash (``placement="hash"`` uses it modulo the lane count)."""
    h = java_hash(key) & _MASK
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    h ^= h >> 16
    return h


class KeyRouter:
    """Routes each dispatch to lanes by key (see the module docstring).

    ``key_of`` reads a message's key (``None``: ``message.keys``); a key that
    is ``None`` or empty routes the message to its group's keyless lane.
    Not thread-safe: the pull thread is its only caller.  ``ValueError`` for
    a bad lane count or placement.
    """

    __slots__ = (
        "_cache",
        "_fixed",
        "_heap",
        "_key_of",
        "_limit",
        "_live",
        "_loads",
        "_stalled",
        "_table",
        "lanes",
        "max_segment",
        "placement",
    )

    def __init__(
        self, lanes: int, placement: str = "load", key_of: Callable[[Any], Any] | None = None, max_segment: int = 0
    ) -> None:
        if type(lanes) is not int or lanes <= 0:
            raise ValueError(f"lane count must be a positive int, got {lanes!r}")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        if type(max_segment) is not int or max_segment < 0:
            raise ValueError(f"max_segment must be an int >= 0, got {max_segment!r}")
        #: The number of lanes.
        self.lanes = lanes
        #: ``"load"``, ``"hash"`` or ``"java"``.
        self.placement = placement
        #: Most messages in one segment (0: no limit).
        self.max_segment = max_segment
        self._live = 0  # keys whose count is not 0
        self._key_of = key_of
        self._fixed = placement != "load"
        # Load placement: key -> [lane, messages routed and not released]
        # (count 0: no work; the lane means nothing then).
        self._table: dict[Hashable, list[int]] = {}
        self._loads = [0] * lanes
        self._heap = [(0, i) for i in range(lanes)]  # sorted, so already a heap
        self._limit = lanes
        self._stalled: set[int] = set()
        # Fixed placements: key -> lane.
        self._cache: dict[str, int] = {}

    @property
    def limit(self) -> int:
        """Load placement: a key with no work goes to the least-loaded of
        lanes ``0 .. limit - 1`` (keys with work stay where they are; set by
        the dispatcher, ``_pull.dispatch.placement_limit``; clamped to
        ``1 .. lanes``).  Fixed placements ignore it."""
        return self._limit

    @limit.setter
    def limit(self, value: int) -> None:
        v = min(self.lanes, max(1, int(value)))
        old = self._limit
        self._limit = v
        if v > old and not self._fixed:
            for i in range(old, v):  # their entries may have been dropped meanwhile
                if i not in self._stalled:
                    self._push(self._loads[i], i)

    def stall(self, lane: int) -> None:
        """Load placement: place no new key on ``lane`` until
        :meth:`unstall` (keys with work there stay).  ``IndexError`` out of
        range; fixed placements ignore it."""
        self._check_lane(lane)
        if not self._fixed:
            self._stalled.add(lane)

    def unstall(self, lane: int) -> None:
        """``lane`` takes new keys again."""
        self._check_lane(lane)
        if not self._fixed and lane in self._stalled:
            self._stalled.discard(lane)
            if lane < self._limit:
                self._push(self._loads[lane], lane)

    @property
    def stalled(self) -> frozenset[int]:
        """The lanes that take no new key (see :meth:`stall`)."""
        return frozenset(self._stalled)

    def _check_lane(self, lane: int) -> None:
        if not 0 <= lane < self.lanes:
            raise IndexError(f"lane {lane} out of range for {self.lanes} lanes")

    @property
    def tracks_load(self) -> bool:
        """Whether releases matter (``placement="load"``)."""
        return not self._fixed

    def route(self, groups: Sequence[tuple[K, Sequence[T], int]]) -> tuple[Segments, list[int]]:
        """Route a dispatch into per-lane *segments* in one call.

        ``groups`` holds ``(tag, items, keyless_lane)`` per batch (lite_push
        passes one per polled queue, tagged with its ProcessQueue).  Returns
        ``(segments, counts)``: ``segments[i]`` is ``None`` when lane ``i``
        got nothing, else the list of ``(tag, sub_items)`` routed to it, one
        per group in group order, items in their order; ``counts[i]`` is the
        number of items lane ``i`` got.  ``IndexError`` for a keyless lane
        out of range (nothing of that group is routed)."""
        n = self.lanes
        segments: Segments = [None] * n
        counts = [0] * n
        key_of = self._key_of
        fixed = self._fixed
        table = self._table
        loads = self._loads
        cap = self.max_segment or sys.maxsize
        for tag, items, keyless_lane in groups:
            if not 0 <= keyless_lane < n:
                raise IndexError(f"keyless lane {keyless_lane} out of range for {n} lanes")
            current: dict[int, list[T]] = {}
            for item in items:
                key = item.keys if key_of is None else key_of(item)  # type: ignore[attr-defined]
                if not key:
                    lane = keyless_lane
                elif fixed:
                    lane = self._fixed_lane(key)
                else:
                    placed = table.get(key)
                    if placed is None:
                        lane = self._least_loaded()
                        table[key] = [lane, 1]
                        self._live += 1
                    else:
                        if not placed[1]:  # back, with no work: placed anew
                            placed[0] = self._least_loaded()
                            self._live += 1
                        lane = placed[0]
                        placed[1] += 1
                if not fixed:
                    loads[lane] += 1
                sub = current.get(lane)
                if sub is None or len(sub) >= cap:
                    if sub is not None:  # a full segment: it is counted now
                        counts[lane] += len(sub)
                    sub = current[lane] = []
                    segs = segments[lane]
                    if segs is None:
                        segs = segments[lane] = []
                    segs.append((tag, sub))
                sub.append(item)
            for lane, sub in current.items():
                counts[lane] += len(sub)
        return segments, counts

    def release(self, lane: int, items: Sequence[Any]) -> None:
        """Lane ``lane`` is done with ``items`` (messages it was routed):
        lower its load; a key whose last message this was has no work left
        and may be placed anew.
        ``ValueError`` when an item's key is not placed on ``lane`` (a bug:
        the caller released something twice or on the wrong lane).  Fixed
        placements ignore releases."""
        if self._fixed:
            return
        n = self.lanes
        if not 0 <= lane < n:
            raise IndexError(f"lane {lane} out of range for {n} lanes")
        if not items:
            return
        key_of = self._key_of
        table = self._table
        for item in items:
            key = item.keys if key_of is None else key_of(item)
            if not key:
                continue
            placed = table.get(key)
            if placed is None or not placed[1] or placed[0] != lane:
                where = "not placed" if placed is None or not placed[1] else f"placed on lane {placed[0]}"
                raise ValueError(f"release of key {key!r} on lane {lane}: the key is {where}")
            placed[1] -= 1
            if not placed[1]:
                self._live -= 1
        load = self._loads[lane] - len(items)
        if load < 0:
            raise ValueError(f"release of {len(items)} message(s) on lane {lane}, which holds {self._loads[lane]}")
        self._loads[lane] = load
        self._push(load, lane)
        if len(table) - self._live > max(self._live, SWEEP_SLACK):
            self._table = {k: v for k, v in table.items() if v[1]}

    def release_from(self, box: deque[tuple[int, Any]]) -> int:
        """Release every ``(lane, items)`` in ``box`` (the lanes append to
        it, the pull thread drains it here); return how many items."""
        released = 0
        pop = box.popleft
        while box:
            lane, items = pop()
            self.release(lane, items)
            released += len(items)
        return released

    def loads(self) -> list[int]:
        """Per lane, the messages routed to it and not yet released (all 0
        with a fixed placement)."""
        return list(self._loads)

    def placed_keys(self) -> int:
        """How many keys have work routed and not released (0 with a fixed
        placement)."""
        return self._live

    def table_size(self) -> int:
        """Keys in the table, with work or kept without (at most the keys
        with work, doubled, plus ``SWEEP_SLACK``)."""
        return len(self._table)

    def lane_of_key(self, key: Hashable) -> int | None:
        """The lane ``key`` is placed on, or ``None`` when it has no work in
        the consumer (load placement); its fixed lane otherwise."""
        if self._fixed:
            return self._fixed_lane(key)  # type: ignore[arg-type]
        placed = self._table.get(key)
        return None if placed is None or not placed[1] else placed[0]

    # -- internals ----------------------------------------------------------------

    def _fixed_lane(self, key: str) -> int:
        cache = self._cache
        lane = cache.get(key)
        if lane is None:
            if len(cache) >= ROUTE_CACHE_LIMIT:
                cache.clear()
            h = mixed_hash(key) if self.placement == "hash" else java_hash(key)
            lane = cache[key] = h % self.lanes
        return lane

    def _push(self, load: int, lane: int) -> None:
        heap = self._heap
        if len(heap) >= 2 * self.lanes + HEAP_SLACK:  # rebuild: one exact entry per lane in use
            loads = self._loads
            heap[:] = [(loads[i], i) for i in range(self._limit)]
            heapq.heapify(heap)
        else:
            heapq.heappush(heap, (load, lane))

    def _least_loaded(self) -> int:
        """The lane with the fewest messages among the first ``limit``,
        ties to the lowest index."""
        heap = self._heap
        loads = self._loads
        limit = self._limit
        stalled = self._stalled
        while heap:
            load, lane = heap[0]
            now = loads[lane]
            if lane >= limit or lane in stalled:  # its entries go; re-pushed when the limit grows / unstalled
                heapq.heappop(heap)
            elif load == now:
                return lane
            elif load < now:
                heapq.heapreplace(heap, (now, lane))
            else:
                heapq.heappop(heap)
        # Every lane under the limit is stalled: the least-loaded of them.
        return min(range(limit), key=lambda i: (loads[i], i))
