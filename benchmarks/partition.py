"""How a run's messages split over lanes under each key placement, and the
bound that split puts on the run's rate.

Pure Python (the hashes come from ``lite_push._kernels.router``; no consumer runs).
The placements are ``ConsumerConfig.lane_placement``'s:

* ``"java"`` -- a fixed lane, ``lane_of(key, n)`` (Java's
  ``String.hashCode``, floorMod), the Java client's lane;
* ``"hash"`` -- a fixed lane, ``mixed_hash(key) % n`` (fmix32 over Java's
  hash);
* ``"load"`` -- dynamic: a key with work in the consumer stays on its lane,
  a key with none goes to the least-loaded lane.  Which lane a key ends up
  on depends on timing, so there is no fixed partition to measure; the bound
  is the best *any* key-ordered consumer with ``n`` lanes can do
  (:func:`partition_bound`), and where a fixed split is needed (the harness's
  ``--bare`` ceiling) :func:`greedy_lanes` gives an offline one.

All costs are in microseconds, as the generator's ``cost_us`` column; rates
in messages per second.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from lite_push._kernels.router import lane_of, mixed_hash

__all__ = [
    "MODES",
    "PLACEMENTS",
    "balanced_bound",
    "fixed_lane",
    "greedy_lanes",
    "hot_key_rate",
    "key_costs",
    "lanes_of_keys",
    "partition_bound",
]

#: The values of ``placement`` (``ConsumerConfig.lane_placement``).
PLACEMENTS = ("load", "hash", "java")
#: The modes :func:`partition_bound` knows.
MODES = ("KEY_ORDERLY", "QUEUE_ORDERLY", "CONCURRENTLY")


def _check(keys: Sequence[str], costs_us: Sequence[int], n: int, placement: str) -> None:
    if len(keys) != len(costs_us):
        raise ValueError(f"keys and costs_us differ in length ({len(keys)} != {len(costs_us)})")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")


def fixed_lane(key: str, n: int, placement: str) -> int:
    """The lane of ``key`` among ``n`` under a fixed placement (``"hash"``
    or ``"java"``)."""
    if placement == "java":
        return lane_of(key, n)
    if placement == "hash":
        return mixed_hash(key) % n
    raise ValueError(f"placement {placement!r} is not fixed (use 'hash' or 'java')")


def key_costs(keys: Sequence[str], costs_us: Sequence[int]) -> dict[str, int]:
    """Each key's total cost, keys in order of first appearance."""
    totals: dict[str, int] = {}
    get = totals.get
    for key, cost in zip(keys, costs_us, strict=True):
        totals[key] = get(key, 0) + cost
    return totals


def greedy_lanes(keys: Sequence[str], costs_us: Sequence[int], n: int) -> dict[str, int]:
    """An offline stand-in for ``"load"`` placement: each key, in order of
    first appearance, goes whole (all its messages) to the lane with the
    least total cost assigned so far, ties to the lowest index.  It knows
    every key's total cost in advance, which the runtime does not, and it
    never moves a key; it is a reasonable split, not the runtime's."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    heap = [(0, i) for i in range(n)]  # sorted: already a heap
    lanes: dict[str, int] = {}
    for key, cost in key_costs(keys, costs_us).items():
        load, lane = heap[0]
        lanes[key] = lane
        heapq.heapreplace(heap, (load + cost, lane))
    return lanes


def lanes_of_keys(keys: Sequence[str], costs_us: Sequence[int], n: int, placement: str) -> dict[str, int]:
    """Every key's lane among ``n``: its fixed lane (``"hash"``, ``"java"``)
    or the offline greedy split (``"load"``, :func:`greedy_lanes`)."""
    _check(keys, costs_us, n, placement)
    if placement == "load":
        return greedy_lanes(keys, costs_us, n)
    return {key: fixed_lane(key, n, placement) for key in dict.fromkeys(keys)}


def hot_key_rate(keys: Sequence[str], costs_us: Sequence[int]) -> float:
    """The hot-key bound on this exact data: ``N / (hottest key's total
    cost)``.  A key's messages run one after another, so no key-ordered
    consumer, however many lanes it has, is faster.  ``inf`` without cost."""
    if len(keys) != len(costs_us):
        raise ValueError(f"keys and costs_us differ in length ({len(keys)} != {len(costs_us)})")
    hottest = max(key_costs(keys, costs_us).values(), default=0)
    return len(keys) / (hottest / 1e6) if hottest else float("inf")


def balanced_bound(keys: Sequence[str], costs_us: Sequence[int], n: int) -> float:
    """The best any key-ordered consumer with ``n`` lanes can do on this
    data: ``N / max(hottest key's total cost, total cost / n)`` (``inf``
    without cost).  Both limits hold for any partition, static or dynamic:
    a key runs serially, and ``n`` lanes run at most ``n`` messages at once."""
    _check(keys, costs_us, n, "load")
    total = sum(costs_us)
    if total == 0:
        return float("inf")
    hottest = max(key_costs(keys, costs_us).values())
    return len(keys) / (max(hottest, total / n) / 1e6)


def partition_bound(
    keys: Sequence[str], costs_us: Sequence[int], queues: int, mode: str, n: int, placement: str = "java"
) -> float:
    """The best rate (msg/s) a run can reach on this exact data, given how
    its work is partitioned; ``inf`` when the data has no cost.

    Where ``workloads.skew_bound`` reasons about the hottest *key*'s expected
    share, this looks at the real partitions of the generated messages
    (``keys[i]`` and ``costs_us[i]`` for message ``i``):

    * ``KEY_ORDERLY`` with ``n`` lanes, by ``placement``:

      - ``"java"`` (the default, the only placement before issue 17): a key
        always goes to lane ``lane_of(key, n)``, so the run needs at least
        the busiest lane's total cost.  This includes the hot-key limit (a
        key lives in one lane) and the hash's imbalance between lanes;
      - ``"hash"``: the same with lane ``mixed_hash(key) % n``;
      - ``"load"``: keys move between lanes while they have no work queued,
        so there is no fixed partition; the bound is the best any
        key-ordered consumer with ``n`` lanes can do,
        ``N / max(hottest key's total cost, total cost / n)``
        (:func:`balanced_bound`).

    * ``QUEUE_ORDERLY`` with ``n`` threads: a queue runs one message at a time,
      so at least the busiest queue's total cost (queue ``lane_of(key,
      queues)``, as the producer's hash selector), and at least the total
      cost over ``n`` threads.
    * ``CONCURRENTLY`` with ``n`` lanes: the total cost over ``n`` lanes.

    ``placement`` only matters for ``KEY_ORDERLY``.  Overheads (the runtime,
    the GIL, sleep overshoot) come on top; the benchmark reports each run's
    rate as a fraction of this bound.
    """
    _check(keys, costs_us, n, placement)
    total = sum(costs_us)
    if total == 0:
        return float("inf")
    if mode == "CONCURRENTLY":
        need = total / n
    elif mode == "KEY_ORDERLY" and placement == "load":
        return balanced_bound(keys, costs_us, n)
    elif mode in ("KEY_ORDERLY", "QUEUE_ORDERLY"):
        if mode == "KEY_ORDERLY":
            parts, how = n, placement
        else:
            parts, how = queues, "java"
        load = [0] * parts
        for key, cost in key_costs(keys, costs_us).items():
            load[fixed_lane(key, parts, how)] += cost
        need = max(load)
        if mode == "QUEUE_ORDERLY":
            need = max(need, total / n)
    else:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    return len(keys) / (need / 1e6)
