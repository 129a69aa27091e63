"""What the two faststream runners share: the runner protocol's arguments,
the handler's record of calls, the run's clock and CPU, and OUT.json.

Standard library only (and ``runner_protocol`` beside it, for the
arguments, the settings and the CPU): it is imported by
``faststream_kafka_runner.py`` and ``faststream_redis_runner.py`` from their
own directory (``sys.path[0]`` when run as scripts), under the python of a
faststream venv.

The protocol (``bench_peers``' runners, issue 31): arguments
``(--bootstrap HOST:PORT | --redis URL) --topic T --group G --costs FILE
--out OUT.json --timeout S [--cap S] [--set KEY=VALUE ...]``; a message's
value starts with its ``seq`` (8 bytes big endian); ``--costs`` is each
message's cost in microseconds by ``seq`` (``array('q')``, native order).
"""

from __future__ import annotations

import argparse
import array
import asyncio
import importlib.metadata
import json
import logging
import resource
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from runner_protocol import cpu_seconds, parse_args, settings_of  # beside this file: standard library only

__all__ = ["Run", "describe", "main_of"]


class Run:
    """One run: the handler's calls ``(seq, start_ns, end_ns)`` in three
    int64 columns, ``t0`` and the CPU from it, and the event set once every
    ``seq`` was handled at least once.  Everything runs on one event loop:
    :meth:`handle` is the handler's body, awaited by faststream."""

    def __init__(self, costs_path: Path) -> None:
        self.costs = array.array("q")
        self.costs.frombytes(costs_path.read_bytes())
        self.total = len(self.costs)
        self.seq = array.array("q")
        self.start_ns = array.array("q")
        self.end_ns = array.array("q")
        self._seen = bytearray(self.total)
        self.distinct = 0
        self.all_handled = asyncio.Event()
        self.t0_ns = 0
        self.wall_minus_perf_ns = 0
        self._cpu0 = 0.0
        self.cpu_s: float | None = None

    def start(self) -> None:
        """Just before the peer's broker/app is made: ``t0`` and the CPU
        baseline."""
        self.wall_minus_perf_ns = time.time_ns() - time.perf_counter_ns()
        self._cpu0 = cpu_seconds()
        self.t0_ns = time.perf_counter_ns()

    def stop_clock(self) -> None:
        """The CPU from ``t0`` until now (the first call wins: when the
        last message was handled, or when the run gave up)."""
        if self.cpu_s is None:
            self.cpu_s = cpu_seconds() - self._cpu0

    async def handle(self, value: bytes) -> None:
        """The I/O-bound work of one message: await its cost, record the call."""
        seq = int.from_bytes(value[:8], "big")
        start = time.perf_counter_ns()
        cost = self.costs[seq] if 0 <= seq < self.total else 0
        if cost:
            await asyncio.sleep(cost / 1e6)
        self.end_ns.append(time.perf_counter_ns())
        self.seq.append(seq)
        self.start_ns.append(start)
        if 0 <= seq < self.total and not self._seen[seq]:
            self._seen[seq] = 1
            self.distinct += 1
            if self.distinct >= self.total:
                self.stop_clock()
                self.all_handled.set()

    async def handle_batch(self, values: Sequence[bytes], keys: Sequence[object] | None = None) -> None:
        """A batch of messages, all at once (``asyncio.gather``); with
        ``keys`` (``keys[i]``: the key of ``values[i]``), a key's messages
        one after another in batch order, the keys' chains at once."""
        if keys is None:
            await asyncio.gather(*(self.handle(value) for value in values))
            return
        chains: dict[object, list[bytes]] = defaultdict(list)
        for key, value in zip(keys, values, strict=True):
            chains[key].append(value)
        await asyncio.gather(*(self._chain(chain) for chain in chains.values()))

    async def _chain(self, values: list[bytes]) -> None:
        for value in values:
            await self.handle(value)

    async def wait(self, timeout: float, cap: float | None) -> tuple[bool, str | None]:
        """Wait until every ``seq`` was handled, ``cap`` seconds after
        ``t0`` (capped) or ``timeout`` seconds after it (an error);
        returns ``(capped, error)``."""
        limit = timeout if cap is None else min(cap, timeout)
        left = limit - (time.perf_counter_ns() - self.t0_ns) / 1e9
        try:
            await asyncio.wait_for(self.all_handled.wait(), max(left, 0.0))
        except TimeoutError:
            self.stop_clock()
            if cap is not None and cap <= timeout:
                return True, None
            return False, f"timeout after {timeout:g}s ({self.distinct} of {self.total} handled)"
        return False, None

    def write(self, path: Path, *, capped: bool, error: str | None, config: Mapping[str, Any]) -> None:
        """OUT.json: the protocol's fields and every call."""
        self.stop_clock()
        peak = max(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
        )
        out = {
            "t0_ns": self.t0_ns,
            "wall_minus_perf_ns": self.wall_minus_perf_ns,
            "cpu_s": self.cpu_s,
            "peak_rss_kb": peak,
            "capped": capped,
            "error": error,
            "config": {"python": sys.version.split()[0], **config},
            "seq": self.seq.tolist(),
            "start_ns": self.start_ns.tolist(),
            "end_ns": self.end_ns.tolist(),
        }
        path.write_text(json.dumps(out))


def describe(exc: BaseException) -> str:
    """One line for OUT.json's ``error``: the exception, or the first
    exception inside a group (anyio's task groups wrap what failed)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def main_of(
    broker: str,
    description: str,
    defaults: Mapping[str, Any],
    choices: Mapping[str, Sequence[str]],
    main_async: Callable[[argparse.Namespace, dict[str, Any], Run], Awaitable[tuple[bool, str | None]]],
    client_config: Callable[[dict[str, Any]], Mapping[str, Any]],
) -> int:
    """A faststream runner's ``main``: the protocol's arguments for
    ``broker``, the settings, ``main_async(args, settings, run)`` on
    asyncio's own loop (it says whether the run was capped and what went
    wrong), then OUT.json with the package, ``client_config(settings)``
    (the client and every setting) and the handler; exit status 1 when
    the run failed."""
    args = parse_args(description, broker)
    settings = settings_of(args.set, defaults, choices)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    run = Run(args.costs)
    error: str | None
    try:
        capped, error = asyncio.run(main_async(args, settings, run))
    except Exception as exc:  # the run's record says what broke, stderr has the traceback
        traceback.print_exc()
        capped, error = False, describe(exc)
    config = {
        "package": f"faststream=={importlib.metadata.version('faststream')}",
        **client_config(settings),
        "handler": "async def: await asyncio.sleep(cost)",
        "loop": "asyncio.run (default loop)",
    }
    run.write(args.out, capped=capped, error=error, config=config)
    return 0 if error is None else 1
