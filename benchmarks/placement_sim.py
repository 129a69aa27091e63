"""Simulate key placement policies on the benchmark workloads: how close
each gets to the partition bound when the runtime itself costs nothing.

    .venv/bin/python benchmarks/placement_sim.py                       # the default table (10-20 s)
    .venv/bin/python benchmarks/placement_sim.py --workloads io5,io1 --lanes 16,1024
    .venv/bin/python benchmarks/placement_sim.py --window 4x           # the simple window model, lanes*4

No consumer runs.  The messages are the generator's exactly: ``redraw.py``
recomputes ``gen_load.py``'s keys and costs per ``seq`` in pure Python (the
same hashes; tested equal to Spark's output), and each goes to queue
``lane_of(key, queues)`` as the harness's producer sends it, in ``seq``
order.  The policies place keys on ``N`` lanes:

* ``least-loaded`` -- ``lite_push._kernels.router.KeyRouter(N, "load")`` itself: a
  key with messages routed and not released stays on its lane; a new key
  goes to the lane with the fewest such messages, ties to the lowest index;
* ``two-choices`` -- the same rule, but a new key looks at two lanes drawn
  from a seeded RNG and takes the one with fewer messages (the first on a
  tie);
* ``hash``, ``java`` -- ``KeyRouter(N, "hash")`` / ``KeyRouter(N, "java")``:
  fixed lanes (``mixed_hash(key) % N``, ``lane_of(key, N)``).

The model (a discrete-event simulation in integer microseconds):

* **Lanes.**  Each lane is a FIFO served one message at a time; a message
  takes its ``cost_us``.  A lane takes everything queued in it at once
  (``Lane.take``) and runs it segment by segment; a *segment* is one
  queue's messages routed to the lane by one dispatch.  When a segment is
  done its messages are complete: they leave their queue's count and are
  released to the router (the runtime releases per segment too), so a key
  is "placed" until the segment holding its last routed message ends.
* **The pull thread** costs no time.  It dispatches whenever its queues
  allow: it polls the unpaused queues round robin, up to 32 messages per
  queue per poll (``pull_batch_size``; each poll starts one queue further
  on, as the embedded source does), and keeps polling while it holds fewer
  than ``min(DISPATCH_BUDGET, lane_capacity)`` = 1,000 messages (so a
  dispatch has up to 1,000 + one poll, 1,024 with 8 queues); then it routes
  them all at once.
* **Backpressure**, the default ``--window flow``, is the runtime's flow
  control at its defaults: a queue pauses once more than 1,000 of its
  messages are unfinished (``pull_threshold_for_queue``) or when a
  dispatch leaves a lane it fed holding more than 1,000 untaken messages
  (``lane_capacity``); it resumes once both are at or under half.  So up to
  about 1,000 messages per queue are in the consumer.  ``--window W``
  (or ``Kx`` for ``K * lanes``) replaces it with a cruder model: a dispatch
  happens whenever fewer than ``W`` messages are unfinished in total, with
  no per-queue or per-lane limit.

Not modelled: the pull thread's and the lanes' own CPU time, the GIL, sleep
overshoot, retries.  So the simulated rate is what the placement alone
allows: each row's share of the partition bound ``N / max(hottest key's
total cost, total cost / lanes)`` (``partition.balanced_bound``, the best
any key-ordered consumer with that many lanes can do) is the placement's
loss, not the runtime's.
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the benchmark modules import each other flat: ``import workloads``
    sys.path.insert(0, str(HERE))

from partition import balanced_bound, hot_key_rate
from redraw import draw
from workloads import get_workload

from lite_push._kernels.router import KeyRouter, lane_of

__all__ = ["POLICIES", "Model", "SimResult", "TwoChoices", "main", "make_router", "simulate"]

#: The placement policies, in table order.
POLICIES = ("least-loaded", "two-choices", "hash", "java")
DEFAULT_WORKLOADS = ("sms", "sms-seq", "io5", "io1", "pc-bench", "zipf11", "hotkey")
DEFAULT_LANES = (16, 64, 128, 256)


@dataclass(frozen=True)
class Model:
    """The pull side's parameters (the runtime's defaults; see the module
    docstring)."""

    #: The pull thread gathers polls until it holds this many messages.
    budget: int = 1000
    #: Messages per queue per poll (``pull_batch_size``).
    poll_batch: int = 32
    #: A queue pauses above this many unfinished messages (``pull_threshold_for_queue``).
    queue_threshold: int = 1000
    #: A queue pauses when a lane it fed holds more untaken messages than this (``lane_capacity``).
    lane_capacity: int = 1000
    #: ``None``: the flow control above.  Else dispatch while fewer than this
    #: many messages are unfinished in total, with no other limit.
    window: int | None = None
    #: Complete and release each message as it ends, not each segment (not
    #: what the runtime does: a what-if for the release granularity).
    per_message: bool = False
    #: ``KeyRouter(max_segment=...)``: most messages per segment (0: no limit).
    max_segment: int = 0


@dataclass(frozen=True)
class SimResult:
    """One simulated run."""

    messages: int
    #: Simulated time from the first dispatch to the last completion (µs).
    makespan_us: int
    dispatches: int
    #: The most messages unfinished at once.
    max_in_flight: int

    @property
    def rate(self) -> float:
        """Messages per simulated second (``inf`` with no cost)."""
        return self.messages / (self.makespan_us / 1e6) if self.makespan_us else float("inf")


class Router(Protocol):
    def route(self, groups: Sequence[tuple[Any, Sequence[int], int]]) -> tuple[list[Any], list[int]]: ...

    def release(self, lane: int, items: Sequence[int]) -> None: ...


class TwoChoices:
    """``two-choices``: :class:`KeyRouter`'s load rule, but a new key goes
    to the less loaded of two lanes drawn with ``random.Random(seed)`` (the
    first on a tie) instead of the least-loaded of all."""

    def __init__(self, lanes: int, key_of: Callable[[int], str], seed: int = 0) -> None:
        self.lanes = lanes
        self._key_of = key_of
        self._rng = random.Random(seed)
        self._table: dict[str, list[int]] = {}
        self._loads = [0] * lanes

    def route(self, groups: Sequence[tuple[Any, Sequence[int], int]]) -> tuple[list[Any], list[int]]:
        n = self.lanes
        segments: list[Any] = [None] * n
        counts = [0] * n
        table, loads, key_of, pick = self._table, self._loads, self._key_of, self._rng.randrange
        for tag, items, _ in groups:
            current: dict[int, list[int]] = {}
            for item in items:
                key = key_of(item)
                placed = table.get(key)
                if placed is None:
                    a, b = pick(n), pick(n)
                    lane = b if loads[b] < loads[a] else a
                    table[key] = [lane, 1]
                else:
                    lane = placed[0]
                    placed[1] += 1
                loads[lane] += 1
                sub = current.get(lane)
                if sub is None:
                    sub = current[lane] = []
                    if segments[lane] is None:
                        segments[lane] = []
                    segments[lane].append((tag, sub))
                sub.append(item)
                counts[lane] += 1
        return segments, counts

    def release(self, lane: int, items: Sequence[int]) -> None:
        table = self._table
        for item in items:
            key = self._key_of(item)
            placed = table[key]
            placed[1] -= 1
            if not placed[1]:
                del table[key]
        self._loads[lane] -= len(items)


def make_router(policy: str, lanes: int, keys: Sequence[str], seed: int = 0, max_segment: int = 0) -> Router:
    """The router of ``policy`` over message indices into ``keys``
    (``max_segment``: the KeyRouter's segment cap; two-choices has none)."""
    key_of = keys.__getitem__
    if policy == "two-choices":
        return TwoChoices(lanes, key_of, seed)
    placement = {"least-loaded": "load", "hash": "hash", "java": "java"}.get(policy)
    if placement is None:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    return KeyRouter(lanes, placement, key_of, max_segment)  # type: ignore[return-value]


def simulate(
    keys: Sequence[str],
    costs_us: Sequence[int],
    queues: int,
    lanes: int,
    policy: str,
    model: Model | None = None,
    seed: int = 0,
) -> SimResult:
    """Simulate one run of ``policy`` on ``lanes`` lanes over the messages
    ``keys[i]`` / ``costs_us[i]`` (sent in index order to queue
    ``lane_of(key, queues)``); see the module docstring for the model."""
    if len(keys) != len(costs_us):
        raise ValueError(f"keys and costs_us differ in length ({len(keys)} != {len(costs_us)})")
    if lanes < 1 or queues < 1:
        raise ValueError(f"lanes and queues must be >= 1, got {lanes}, {queues}")
    m = model or Model()
    router = make_router(policy, lanes, keys, seed, m.max_segment)
    release = router.release if policy in ("least-loaded", "two-choices") else None
    logs: list[list[int]] = [[] for _ in range(queues)]
    for i, key in enumerate(keys):
        logs[lane_of(key, queues)].append(i)
    pos = [0] * queues
    unfinished = [0] * queues
    paused = [False] * queues
    blocked: list[set[int]] = [set() for _ in range(queues)]
    queued: list[list[tuple[int, list[int], int]]] = [[] for _ in range(lanes)]  # untaken segments
    depth = [0] * lanes
    taken: list[deque[tuple[int, list[int], int]]] = [deque() for _ in range(lanes)]
    running: list[tuple[int, list[int], int] | None] = [None] * lanes
    events: list[tuple[int, int]] = []  # (finish time, lane): one per running lane
    state = {"rr": 0, "in_flight": 0, "max": 0, "dispatches": 0, "left": len(keys)}
    q_low, lane_low = m.queue_threshold // 2, m.lane_capacity // 2

    def start(lane: int, now: int) -> None:
        """Run the lane's next segment, taking everything queued if its
        taken list is empty; else the lane goes idle.  ``per_message``:
        split the segment into one-message segments first."""
        if not taken[lane] and queued[lane]:
            taken[lane].extend(queued[lane])
            queued[lane] = []
            depth[lane] = 0
        if taken[lane]:
            seg = taken[lane].popleft()
            if m.per_message and len(seg[1]) > 1:
                q, items, _ = seg
                taken[lane].extendleft((q, [i], costs_us[i]) for i in reversed(items[1:]))
                seg = (q, items[:1], costs_us[items[0]])
            running[lane] = seg
            heapq.heappush(events, (now + seg[2], lane))
        else:
            running[lane] = None

    def gather() -> list[tuple[int, list[int], int]]:
        """Poll round robin until the budget is reached or nothing is ready."""
        groups: dict[int, list[int]] = {}
        total = 0
        while total < m.budget:
            active = [q for q in range(queues) if not paused[q] and pos[q] < len(logs[q])]
            if not active:
                break
            first = state["rr"] % len(active)
            state["rr"] = first + 1
            for j in range(len(active)):
                q = active[(first + j) % len(active)]
                batch = logs[q][pos[q] : pos[q] + m.poll_batch]
                pos[q] += len(batch)
                unfinished[q] += len(batch)
                groups.setdefault(q, []).extend(batch)
                total += len(batch)
                if m.window is None and unfinished[q] > m.queue_threshold:
                    paused[q] = True
        state["left"] -= total
        state["in_flight"] += total
        state["max"] = max(state["max"], state["in_flight"])
        return [(q, items, 0) for q, items in groups.items()]

    def dispatch(now: int) -> None:
        """The pull thread's turns at time ``now``: resume, then dispatch
        until every queue is paused or drained (or the window is full)."""
        if m.window is None:
            for q in range(queues):
                if blocked[q]:
                    blocked[q] = {i for i in blocked[q] if depth[i] > lane_low}
                if paused[q] and not blocked[q] and unfinished[q] <= q_low:
                    paused[q] = False
        while state["left"] and (m.window is None or state["in_flight"] < m.window):
            groups = gather()
            if not groups:
                break
            state["dispatches"] += 1
            segments, counts = router.route(groups)
            for lane, segs in enumerate(segments):
                if segs is None:
                    continue
                for q, items in segs:
                    queued[lane].append((q, items, sum(costs_us[i] for i in items)))
                depth[lane] += counts[lane]
                if m.window is None and depth[lane] > m.lane_capacity:
                    for q, _ in segs:
                        blocked[q].add(lane)
                        paused[q] = True
                if running[lane] is None:
                    start(lane, now)

    now = 0
    dispatch(now)
    while events:
        now, lane = heapq.heappop(events)
        seg = running[lane]
        assert seg is not None
        q, items, _ = seg
        unfinished[q] -= len(items)
        state["in_flight"] -= len(items)
        if release is not None:
            release(lane, items)
        start(lane, now)
        dispatch(now)
    if state["left"] or state["in_flight"]:
        raise AssertionError(f"simulation stalled with {state['left']} unread, {state['in_flight']} in flight")
    return SimResult(len(keys), now, state["dispatches"], state["max"])


def _window(text: str, lanes: int) -> int | None:
    if text == "flow":
        return None
    return int(text[:-1]) * lanes if text.endswith("x") else int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS), help="comma-separated workload names")
    parser.add_argument("--lanes", default=",".join(map(str, DEFAULT_LANES)), help="comma-separated lane counts")
    parser.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, of {', '.join(POLICIES)}")
    parser.add_argument(
        "--window", default="flow", help="flow (the runtime's flow control, default), W messages, or Kx (K * lanes)"
    )
    parser.add_argument(
        "--per-message",
        action="store_true",
        help="release each message as it ends, not each segment (a what-if; the runtime releases per segment)",
    )
    parser.add_argument(
        "--max-segment", type=int, default=0, help="KeyRouter's segment cap (the runtime's MAX_SEGMENT; 0: none)"
    )
    parser.add_argument("--seed", type=int, default=0, help="two-choices' RNG seed")
    args = parser.parse_args(argv)
    try:
        workloads = [get_workload(w.strip()) for w in args.workloads.split(",")]
        lane_counts = [int(n) for n in args.lanes.split(",")]
        policies = [p.strip() for p in args.policies.split(",")]
        _window(args.window, 1)
    except (KeyError, ValueError) as exc:
        parser.error(str(exc))
    if bad := [p for p in policies if p not in POLICIES]:
        parser.error(f"unknown policies {bad}; known: {', '.join(POLICIES)}")
    if any(n < 1 for n in lane_counts):
        parser.error("lane counts must be >= 1")

    t0 = time.perf_counter()
    print(
        f"Simulated (`benchmarks/placement_sim.py --window {args.window}"
        f"{' --per-message' if args.per_message else ''}"
        f"{f' --max-segment {args.max_segment}' if args.max_segment else ''}`): msg/s with no runtime cost, and in "
        "brackets its share of the bound N / max(hottest key's cost, total cost / lanes).\n"
    )
    print("| workload | lanes | bound msg/s | hot-key bound msg/s | " + " | ".join(policies) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(policies))
    for w in workloads:
        keys, costs = draw(w)
        hot = hot_key_rate(keys, costs)
        for n in lane_counts:
            bound = balanced_bound(keys, costs, n)
            model = Model(window=_window(args.window, n), per_message=args.per_message, max_segment=args.max_segment)
            cells = []
            for policy in policies:
                r = simulate(keys, costs, w.queues, n, policy, model, args.seed)
                cells.append(f"{r.rate:,.0f} ({r.rate / bound:.0%})")
            print(f"| {w.name} | {n} | {bound:,.0f} | {hot:,.0f} | " + " | ".join(cells) + " |", flush=True)
    print(f"\n{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
