"""Micro-benchmarks of the compiled kernels against their pure-Python twins.

    .venv/bin/python benchmarks/bench_kernels.py            # full (about a minute)
    .venv/bin/python benchmarks/bench_kernels.py --quick    # smoke run

Both twins of each kernel run in the same process on the same inputs; a twin
that is not built is reported as "not built" and the rest still runs.  The
twins are imported directly (``lite_push._kernels.router_py`` / ``_router_c``,
``lite_push._kernels.offsets_py`` / ``_offsets_c``), not through the selectors, so
``LITE_PUSH_NO_EXTENSIONS`` does not matter here.

* **route**: what the runtime calls, ``KeyRouter.route``: one call routes a
  1,000-message batch of real ``MessageExt`` objects (keys drawn from 10,000
  random 16-digit account numbers) into per-lane segments, reading
  ``message.keys``; ns per message.  Per placement:

  - ``hash``, ``java`` (fixed lanes, cached per key): ``route`` alone, on a
    router whose cache is warm (as in a running consumer); releases are
    no-ops for them, so they are not timed.  Also one batch routed over and
    over (every key in cache), as before.
  - ``load``: ``route``, then the release of the same messages -- the
    runtime's whole per-message router cost: the pull thread routes a
    dispatch, each lane hands back its segments (appended to a deque, as
    the lanes do) and the pull thread releases them (``release_from``)
    before the next dispatch.  So every batch starts from an empty table
    and each key is placed on the least-loaded lane on its first message.
    Also at 1,024 lanes, and in the asyncio executor's shape: dispatches
    of 4,096 messages (``DISPATCH_BUDGET``) of 1,000 keys over 2,048
    lanes, each message's key a str of its own (as a decoder makes them),
    forty dispatches' messages (about 25 MB), shuffled so that neighbours
    in a dispatch are apart in memory (as in a heap that frees and reuses):
    each pass reads them from memory, as the pull side does a dispatch
    after they were read.
* **java_hash**: ns per call on one 16-digit key, loop included; the
  ``len(key)`` row is the same loop around a trivial builtin, for scale.
* **tracker**: ns per message over 1,000,000 messages: ``add_batch`` of 32
  messages, then ``complete_batch`` of the same 32 in shuffled chunks of 4
  (one chunk per lane finishing), batch after batch; and the same with
  ``add_many`` / ``complete_many`` on lists of offsets; and the runtime's
  own shape, a 1,024-message dispatch completed in lane segments of 64.

Every case is timed with ``time.perf_counter_ns`` ``--repeat`` times (5) with
the garbage collector off; the table gives the best and the median, and the
Python twin's median over the compiled twin's.  It is printed as Markdown,
ready for ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import platform
import random
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from types import ModuleType
from typing import Any

from lite_push import MessageExt

#: The twins, compiled first: (kernel, label, module name).
TWINS = {
    "router": [("c", "lite_push._kernels.router_c"), ("py", "lite_push._kernels.router_py")],
    "offsets": [("c", "lite_push._kernels.offsets_c"), ("py", "lite_push._kernels.offsets_py")],
}

ACCOUNTS = 10_000
BATCH = 1_000
DISPATCH = 4_096
TRACKER_BATCH = 32
LANE_CHUNK = 4


def load(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        print(f"{name}: not built ({exc})", file=sys.stderr)
        return None


def timed(run: Callable[[], int], repeat: int, per: int) -> list[float]:
    """``run`` returns nanoseconds spent; give ns per unit for each repeat."""
    out = []
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            out.append(run() / per)
        finally:
            gc.enable()
    return out


# --- the cases --------------------------------------------------------------------------


def route_case(router: ModuleType, batches: list[list[MessageExt]], n: int, placement: str) -> Callable[[], int]:
    """``KeyRouter(n, placement).route``, one group per batch, keys read
    from ``message.keys``.  Fixed placements: route only, the key cache warm
    from a first pass (as in a running consumer).  ``load``: route, then
    release every lane's segments of that batch through a deque, as the
    lanes and the pull thread do (the table is empty again after each
    batch)."""
    kr = router.KeyRouter(n, placement)
    route = kr.route
    if placement != "load":
        for batch in batches:
            route([(None, batch, 0)])

        def run() -> int:
            clock = time.perf_counter_ns
            t0 = clock()
            for batch in batches:
                route([(None, batch, 0)])
            return clock() - t0

        return run

    release_from = kr.release_from
    box: deque[tuple[int, list[MessageExt]]] = deque()
    append = box.append

    def run_load() -> int:
        clock = time.perf_counter_ns
        t0 = clock()
        for batch in batches:
            segments, _ = route([(None, batch, 0)])
            for lane, segs in enumerate(segments):
                if segs is not None:
                    for _, items in segs:
                        append((lane, items))
            release_from(box)
        ns = clock() - t0
        assert kr.placed_keys() == 0 and not any(kr.loads())
        return ns

    return run_load


def call_case(fn: Callable[[str], Any], key: str, calls: int) -> Callable[[], int]:
    loops = range(calls)

    def run() -> int:
        t0 = time.perf_counter_ns()
        for _ in loops:
            fn(key)
        return time.perf_counter_ns() - t0

    return run


def tracker_case(tracker_cls: type, plan: list[tuple[list[Any], list[list[Any]]]], *, batch: bool) -> Callable[[], int]:
    """Add each planned batch, then complete it chunk by chunk: with
    ``add_batch``/``complete_batch`` on messages (``batch``), else with
    ``add_many``/``complete_many`` on offset lists."""

    def run() -> int:
        t = tracker_cls(0)
        add, complete = (t.add_batch, t.complete_batch) if batch else (t.add_many, t.complete_many)
        t0 = time.perf_counter_ns()
        for items, chunks in plan:
            add(items)
            for chunk in chunks:
                complete(chunk)
        ns = time.perf_counter_ns() - t0
        assert t.in_flight == 0
        return ns

    return run


# --- the table ---------------------------------------------------------------------------


def fmt(ns: float) -> str:
    return f"{ns:,.0f}" if ns >= 100 else f"{ns:,.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per case (default 5)")
    parser.add_argument("--seed", type=int, default=7, help="seed of keys and shuffles")
    args = parser.parse_args()
    route_batches = 10 if args.quick else 100
    hash_calls = 100_000 if args.quick else 1_000_000
    tracker_messages = 100_000 if args.quick else 1_000_000

    rng = random.Random(args.seed)
    twins = {kernel: [(label, load(name)) for label, name in pairs] for kernel, pairs in TWINS.items()}

    accounts = [str(rng.randrange(10**15, 10**16)) for _ in range(ACCOUNTS)]
    offset = 0
    batches = []
    for _ in range(route_batches):
        batch = []
        for _ in range(BATCH):
            batch.append(MessageExt("BENCH", 0, offset, b"x" * 100, keys=rng.choice(accounts)))
            offset += 1
        batches.append(batch)

    print(f"building {tracker_messages:,} messages for the tracker cases", file=sys.stderr)
    body = b"x" * 100
    messages = [MessageExt("BENCH", 0, off, body, keys=None) for off in range(tracker_messages)]
    msg_plan = []
    int_plan = []
    for i in range(0, tracker_messages, TRACKER_BATCH):
        batch = messages[i : i + TRACKER_BATCH]
        order = batch[:]
        rng.shuffle(order)
        chunks = [order[j : j + LANE_CHUNK] for j in range(0, len(order), LANE_CHUNK)]
        msg_plan.append((batch, chunks))
        int_plan.append(([m.queue_offset for m in batch], [[m.queue_offset for m in c] for c in chunks]))

    # (case, unit, [(twin label, run or None)], units per run)
    cases: list[tuple[str, str, list[tuple[str, Callable[[], int] | None]], int]] = []
    keys_routed = route_batches * BATCH
    route_plan = [("load", n, "route + release") for n in (16, 64, 1024)]
    route_plan += [(placement, n, "route") for placement in ("hash", "java") for n in (16, 64)]
    for placement, n, what in route_plan:
        name = f"KeyRouter {placement}: {what}, {BATCH:,}-msg batch, n={n}"
        runs = [(label, route_case(m, batches, n, placement) if m else None) for label, m in twins["router"]]
        cases.append((name, "msg", runs, keys_routed))
    # The asyncio shape: 4,096-message dispatches of 1,000 keys, 2,048 lanes.
    few = accounts[:1_000]
    dispatches = []
    for _ in range(10 if args.quick else 40):
        batch = []
        for _ in range(DISPATCH):
            key = rng.choice(few)
            batch.append(MessageExt("BENCH", 0, offset, b"x" * 64, keys=key[:8] + key[8:]))
            offset += 1
        rng.shuffle(batch)  # apart in memory, as in a heap that frees and reuses
        dispatches.append(batch)
    name = f"KeyRouter load: route + release, {DISPATCH:,}-msg dispatches of 1,000 keys (out of cache), n=2048"
    runs = [(label, route_case(m, dispatches, 2048, "load") if m else None) for label, m in twins["router"]]
    cases.append((name, "msg", runs, len(dispatches) * DISPATCH))
    hot = [batches[0]] * len(batches)
    for placement in ("hash", "java"):
        name = f"KeyRouter {placement}: route, one {BATCH:,}-msg batch repeated (in cache), n=16"
        runs = [(label, route_case(m, hot, 16, placement) if m else None) for label, m in twins["router"]]
        cases.append((name, "msg", runs, keys_routed))
    key16 = accounts[0]
    runs = [(label, call_case(m.java_hash, key16, hash_calls) if m else None) for label, m in twins["router"]]
    cases.append(("java_hash, 16-digit key", "call", runs, hash_calls))
    cases.append(("len(key), same loop (baseline)", "call", [("-", call_case(len, key16, hash_calls))], hash_calls))
    runs = [
        (label, tracker_case(m.OffsetTracker, msg_plan, batch=True) if m else None) for label, m in twins["offsets"]
    ]
    cases.append(("tracker add_batch(32) + complete_batch(4) x 8", "msg", runs, tracker_messages))
    runs = [
        (label, tracker_case(m.OffsetTracker, int_plan, batch=False) if m else None) for label, m in twins["offsets"]
    ]
    cases.append(("tracker add_many(32) + complete_many(4) x 8", "msg", runs, tracker_messages))
    # The runtime's own shape after gathering: a dispatch of ~1,024 messages,
    # completed per lane segment (~64 with 16 lanes).
    big_plan = []
    for i in range(0, tracker_messages, 1024):
        batch = messages[i : i + 1024]
        order = batch[:]
        rng.shuffle(order)
        big_plan.append((batch, [order[j : j + 64] for j in range(0, len(order), 64)]))
    runs = [
        (label, tracker_case(m.OffsetTracker, big_plan, batch=True) if m else None) for label, m in twins["offsets"]
    ]
    cases.append(("tracker add_batch(1,024) + complete_batch(64) x 16", "msg", runs, tracker_messages))

    rows = []
    for name, unit, runs, per in cases:
        results: dict[str, list[float] | None] = {}
        for label, run in runs:
            if run is not None:
                print(f"{name} [{label}] ...", file=sys.stderr)
            results[label] = timed(run, args.repeat, per) if run is not None else None
        medians = {label: statistics.median(got) for label, got in results.items() if got}
        ratio = f"{medians['py'] / medians['c']:.1f}x" if {"c", "py"} <= medians.keys() else ""
        for label, got in results.items():
            if got is None:
                rows.append(f"| {name} | {unit} | {label} | not built | not built | |")
            else:
                shown = ratio if label == "c" else ""
                rows.append(f"| {name} | {unit} | {label} | {fmt(min(got))} | {fmt(medians[label])} | {shown} |")

    built = "; ".join(
        f"{kernel}: " + ", ".join(f"{label} {'built' if m else 'NOT BUILT'}" for label, m in pairs)
        for kernel, pairs in twins.items()
    )
    print(
        f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; {built}; "
        f"--repeat {args.repeat}{' --quick' if args.quick else ''}"
    )
    print()
    print("| case | ns per | twin | best ns | median ns | py / c (median) |")
    print("|---|---|---|---:|---:|---:|")
    for row in rows:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
