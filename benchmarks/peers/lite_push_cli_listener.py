"""The listener ``lite-push consume`` runs in the command-line runners
(``lite_push_cli.py``): ``--listener lite_push_cli_listener:listener``.

An ``async def`` listener, so the command picks the asyncio executor by
itself.  Its bookkeeping is ``lite_push_consume.py``'s listener's, line for
line: per message, the ``seq`` from the body's first 8 bytes, the start
clock, ``await asyncio.sleep(cost)``, and the record ``(seq, start_ns,
end_ns)`` into ``runner_protocol.Calls``.  One thing more, once per call:
when every ``seq`` has been handled it calls ``on_done`` (the runner takes
the CPU mark and sends its own process SIGTERM, so the command stops as a
user's would: drain, commit, exit).

The runner calls :func:`arm` before it runs the command; the command then
imports this module (already imported: the same module object) and takes
:data:`listener`, the closure :func:`arm` made.
"""

from __future__ import annotations

import array
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from runner_protocol import Calls

__all__ = ["arm", "listener"]


async def _not_armed(msgs: list[Any]) -> None:
    raise RuntimeError("lite_push_cli_listener.arm() was not called before the command ran")


#: The listener the command runs (``arm`` replaces it).
listener: Callable[[list[Any]], Awaitable[None]] = _not_armed


def arm(costs: array.array[int], calls: Calls, on_done: Callable[[], None]) -> None:
    """Make :data:`listener`: ``costs`` by ``seq``, ``calls`` to record into,
    ``on_done`` called once, by the call that finds every ``seq`` handled."""
    global listener
    record = calls.record
    clock = time.perf_counter_ns
    sleep = asyncio.sleep
    total = calls.total
    done = False

    async def armed(msgs: list[Any]) -> None:
        nonlocal done
        for m in msgs:
            seq = int.from_bytes(m.body[:8], "big")
            start = clock()
            cost = costs[seq]
            if cost:
                await sleep(cost / 1e6)
            record(seq, start, clock())
        if calls.distinct >= total and not done:
            done = True
            on_done()

    listener = armed
