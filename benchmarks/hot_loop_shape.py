"""What writing the lane's hot loop once would cost (issue 44, point 4).

The hot loop (one listener call per message, fenced, shown in ``lane.call``)
is written twice: ``_exec/thread_executor.run_lane`` calls the listener,
``_exec/async_executor.run_async_lane`` awaits it.  Python cannot share one
loop body between a call and an ``await``; written once, the loop becomes a
generator that yields each call and is sent its outcome, driven by each
executor (as the slow path already is: ``LaneWorker._slow_steps``).  This
measures both shapes with the same per-message work as the real loop (the
clock read, the fence check, ``lane.call`` set and cleared, the outcome
check) around a no-op listener: CPU per message, inline and driven, on
threads and on asyncio.

    .venv/bin/python benchmarks/hot_loop_shape.py               # segments of 4
    .venv/bin/python benchmarks/hot_loop_shape.py --segment 1   # of 1 (a thousand lanes)
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Generator
from typing import Any

N = 200_000
ROUNDS = 5


class Lane:
    __slots__ = ("call", "moving")

    def __init__(self) -> None:
        self.call: Any = None
        self.moving = False


def listener(call: list[int]) -> None:
    return None


async def async_listener(call: list[int]) -> None:
    return None


def segments(size: int) -> list[list[int]]:
    return [list(range(i, i + size)) for i in range(0, N, size)]


def inline(segs: list[list[int]], lane: Lane) -> int:
    mono = time.monotonic
    owned_until = float("inf")
    done = 0
    for msgs in segs:
        j = 0
        for msg in msgs:
            now = mono()
            if now >= owned_until:
                break
            call = [msg]
            lane.call = (call, now)
            result = listener(call)
            lane.call = None
            if result is not None:
                break
            j += 1
        done += j
    return done


def steps(msgs: list[int], lane: Lane) -> Generator[list[int], object, int]:
    mono = time.monotonic
    owned_until = float("inf")
    j = 0
    for msg in msgs:
        now = mono()
        if now >= owned_until:
            break
        call = [msg]
        lane.call = (call, now)
        result = yield call
        lane.call = None
        if result is not None:
            break
        j += 1
    return j


def driven(segs: list[list[int]], lane: Lane) -> int:
    done = 0
    for msgs in segs:
        gen = steps(msgs, lane)
        try:
            call = next(gen)
            while True:
                call = gen.send(listener(call))
        except StopIteration as stop:
            done += stop.value
    return done


async def ainline(segs: list[list[int]], lane: Lane) -> int:
    mono = time.monotonic
    owned_until = float("inf")
    done = 0
    for msgs in segs:
        j = 0
        for msg in msgs:
            now = mono()
            if now >= owned_until:
                break
            call = [msg]
            lane.call = (call, now)
            result = await async_listener(call)
            lane.call = None
            if result is not None:
                break
            j += 1
        done += j
    return done


async def adriven(segs: list[list[int]], lane: Lane) -> int:
    done = 0
    for msgs in segs:
        gen = steps(msgs, lane)
        try:
            call = next(gen)
            while True:
                call = gen.send(await async_listener(call))
        except StopIteration as stop:
            done += stop.value
    return done


def cpu_ns(run: Any, size: int) -> float:
    segs = segments(size)
    lane = Lane()
    t0 = time.process_time_ns()
    assert run(segs, lane) == N
    return (time.process_time_ns() - t0) / N


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segment", type=int, default=4, help="messages per segment (default 4)")
    size = parser.parse_args().segment
    rows: dict[str, list[float]] = {
        "threads, inline": [],
        "threads, driven": [],
        "asyncio, inline": [],
        "asyncio, driven": [],
    }
    for _ in range(ROUNDS):  # interleaved: the machine's drift hits every shape alike
        rows["threads, inline"].append(cpu_ns(inline, size))
        rows["threads, driven"].append(cpu_ns(driven, size))
        rows["asyncio, inline"].append(cpu_ns(lambda s, lane: asyncio.run(ainline(s, lane)), size))
        rows["asyncio, driven"].append(cpu_ns(lambda s, lane: asyncio.run(adriven(s, lane)), size))
    med = {k: sorted(v)[len(v) // 2] for k, v in rows.items()}
    print(f"{N:,} messages in segments of {size}, no-op listener, CPU ns per message (median of {ROUNDS}):")
    for k, v in med.items():
        print(f"  {k:16} {v:6.0f}   ({', '.join(f'{x:.0f}' for x in rows[k])})")
    for ex in ("threads", "asyncio"):
        extra = med[f"{ex}, driven"] - med[f"{ex}, inline"]
        print(f"  {ex}: written once (driven) costs {extra:+.0f} ns a message")


if __name__ == "__main__":
    main()
