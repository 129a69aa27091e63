"""The floor of issue 40: a task per key awaiting each message's cost, with
no source, as a runner of ``bench_peers.py``.

    .venv/bin/python benchmarks/peers/floor_runner.py --keys KEYS.json --topic T --group G \\
        --costs FILE --out OUT.json --timeout 300 [--cap 60] [--set loop=asyncio ...]

It reads no broker (``peers/catalog.py``'s ``NO_BROKER``): the orchestrator
gives it each message's key by ``seq`` (``--keys``, see
``runner_protocol.py``), and it runs the messages in ``seq`` order, as the
lean per-key loop of ``aiokafka_runner.py`` (``mode=lean``) runs what it
fetched, without the fetching and the commits: the messages go in batches
of ``max_records`` (2,000, its ``getmany``'s) in ``seq`` order, with a turn
of the event loop between two batches, at most ``max_in_flight`` (20,000)
queued and not yet handled; a key with queued messages has a deque and one
task draining it, made when its first message is queued and ended when its
deque is empty, so tasks come and go as they do in the loop.  The handler is
the one every asyncio runner shares (``runner_protocol.AsyncCalls.handle``:
``await asyncio.sleep(cost)`` and the same record as lite_push's listener),
given the 8-byte ``seq`` a message's value starts with (made before ``t0``:
the broker's work).  On uvloop by default.

So it is this machine's limit for the wait pattern every peer runs -- a
task per key, each message an awaited sleep and a record -- and each peer's
CPU per message less the floor's is what the peer spends on reading,
routing and committing.  Measured like every peer (``peers/measure.py``):
msg/s from the first call's start to the last call's end, CPU from ``t0``
(just before the first batch) to the last call; its lost, duplicates, order
violations and overlaps come from its calls (it commits nothing, so only a
complete run can lose a message: one it never handled).

Settings (``--set KEY=VALUE``): ``max_records`` (2000), ``max_in_flight``
(20000; 0: no bound, every message queued at once), ``loop`` (``uvloop`` or
``asyncio``).
"""

from __future__ import annotations

import asyncio
import collections
import importlib.metadata
import sys
from typing import Any

from runner_protocol import AsyncCalls, Usage, load_costs, load_keys, parse_args, settings_of, write_out

DEFAULTS: dict[str, Any] = {"max_records": 2000, "max_in_flight": 20000, "loop": "uvloop"}
CHOICES = {"loop": ("uvloop", "asyncio")}


async def run_floor(
    keys: list[str], values: list[bytes], calls: AsyncCalls, settings: dict[str, Any], usage: Usage, limit_s: float
) -> bool:
    """Run every message; False when ``limit_s`` seconds passed first (the
    calls in flight are then cancelled)."""
    handle = calls.handle
    create_task = asyncio.create_task
    queues: dict[str, collections.deque[bytes]] = {}
    tasks: dict[str, asyncio.Task[None]] = {}
    limit = settings["max_in_flight"] or sys.maxsize
    below = limit - 1
    batch = settings["max_records"]
    in_flight = 0
    room = asyncio.Event()
    room.set()

    async def drain(key: str, queue: collections.deque[bytes]) -> None:
        nonlocal in_flight
        while queue:
            await handle(queue[0])
            queue.popleft()
            in_flight -= 1
            if in_flight == below:  # just under the limit again (it falls one at a time)
                room.set()
        del queues[key], tasks[key]

    async def feed() -> None:
        nonlocal in_flight
        total = len(keys)
        for first in range(0, total, batch):
            if in_flight >= limit:
                room.clear()
                await room.wait()
            last = min(total, first + batch)
            in_flight += last - first
            for seq in range(first, last):
                key = keys[seq]
                queue = queues.get(key)
                if queue is None:
                    queue = queues[key] = collections.deque((values[seq],))
                    tasks[key] = create_task(drain(key, queue))
                else:
                    queue.append(values[seq])
            await asyncio.sleep(0)  # a turn of the loop, as between two fetches
        await calls.all_handled.wait()

    usage.start()
    try:
        await asyncio.wait_for(feed(), limit_s)
        return True
    except TimeoutError:
        return False
    finally:
        for task in list(tasks.values()):
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], "none")
    settings = settings_of(args.set, DEFAULTS, CHOICES)
    costs = load_costs(args.costs)
    keys = load_keys(args.keys)
    if len(keys) != len(costs):
        raise SystemExit(f"--keys has {len(keys)} keys, --costs {len(costs)} costs")
    values = [seq.to_bytes(8, "big") for seq in range(len(keys))]
    calls = AsyncCalls(costs)
    usage = Usage()
    limit_s = min(args.cap, args.timeout) if args.cap is not None else args.timeout
    if settings["loop"] == "uvloop":
        import uvloop

        finished = uvloop.run(run_floor(keys, values, calls, settings, usage, limit_s))
    else:
        finished = asyncio.run(run_floor(keys, values, calls, settings, usage, limit_s))
    capped = not finished and args.cap is not None and args.cap <= args.timeout
    error = None
    if not finished and not capped:
        error = f"timeout after {args.timeout:g}s ({calls.distinct} of {calls.total} handled)"
    if calls.all_handled.is_set():
        usage.stop(calls.cpu_at_end)  # the CPU mark of the last call
    version = importlib.metadata.version
    write_out(
        args.out,
        usage,
        calls,
        capped=capped,
        error=error,
        config={
            "package": "floor (no source)",
            **settings,
            "uvloop": f"uvloop=={version('uvloop')}" if settings["loop"] == "uvloop" else None,
            "handler": "async def: await asyncio.sleep(cost)",
            "keeps_key_order": True,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
