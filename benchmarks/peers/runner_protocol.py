"""The runner protocol of ``bench_peers.py`` (issue 31), standard library only.

A runner is ``benchmarks/peers/<name>_runner.py``, run by the python of its
peer's venv; it may import this module (its own directory is ``sys.path[0]``
when it runs as a script) and nothing else outside the standard library and
its peer's packages.  It is started as

    python <name>_runner.py (--bootstrap HOST:PORT | --redis redis://HOST:PORT | --keys FILE)
        --topic T --group G --costs FILE --out OUT.json --timeout S [--cap S] [--set KEY=VALUE ...]

and consumes the backlog of ``T`` (produced before it starts) with group
``G``.  A message's value starts with its ``seq`` (8 bytes big endian);
``--costs`` holds each message's cost in microseconds by ``seq``
(``array('q').tobytes()``, native order).  A runner that reads no broker
(``peers/catalog.py``'s ``NO_BROKER``: the floor, issue 40) is given instead
what the broker would have carried besides the ``seq``: each message's key
by ``seq``, ``--keys FILE`` (a JSON list of strings, :func:`load_keys`),
which the orchestrator writes for it alone; it "consumes" the messages in
``seq`` order, and ``T`` and ``G`` only name its run.  The keys come by file
rather than from the shape's name because the runner then needs nothing of
the benchmarks' load generator and runs any message list the orchestrator
has, a test's too.  The handler does the cost as the
peer's recommended parallel I/O (awaited or blocking sleep) and records
``(seq, start_ns, end_ns)`` with ``perf_counter_ns`` around it
(:class:`Calls`).  The runner stops when every ``seq`` was handled, at
``--cap`` seconds after ``t0`` (``"capped": true``), or at ``--timeout``
(an ``"error"``), each time gracefully: the peer commits as it normally does,
so the orchestrator reads the group's committed offsets afterwards.

OUT.json (:func:`write_out`): ``t0_ns`` (``perf_counter_ns`` just before the
peer's client is made), ``wall_minus_perf_ns``, ``cpu_s`` (this process and
its children, ``t0`` to the last message handled), ``peak_rss_kb``,
``capped``, ``error``, ``config`` (``package``, ``python``, the settings,
``keeps_key_order``) and the calls as three lists ``seq``, ``start_ns``,
``end_ns``.  Two figures of the whole process, from this module's import
to the record (so start-up included), say where CPU went beyond the calls:
``gc`` (the cyclic garbage collector's collections per generation and their
CPU seconds, each timed on the collecting thread) and ``context_switches``
(voluntary and involuntary, of every thread: ``getrusage``).
"""

from __future__ import annotations

import argparse
import array
import asyncio
import gc
import json
import resource
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "AsyncCalls",
    "Calls",
    "GcTimes",
    "Usage",
    "cpu_seconds",
    "load_costs",
    "load_keys",
    "parse_args",
    "peak_rss_kb",
    "settings_of",
    "write_out",
    "write_record",
]


def parse_args(description: str, broker: str) -> argparse.Namespace:
    """The protocol's arguments; ``broker`` is ``"kafka"`` (``--bootstrap``),
    ``"redis"`` (``--redis``) or ``"none"`` (``--keys``: no broker)."""
    parser = argparse.ArgumentParser(description=description)
    if broker == "kafka":
        parser.add_argument("--bootstrap", required=True, help="HOST:PORT of the Kafka cluster")
    elif broker == "redis":
        parser.add_argument("--redis", required=True, help="redis://HOST:PORT")
    elif broker == "none":
        parser.add_argument("--keys", type=Path, required=True, help="JSON list: each message's key by seq")
    else:
        raise ValueError(f"broker must be 'kafka', 'redis' or 'none', got {broker!r}")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--costs", type=Path, required=True, help="int64 cost in microseconds by seq")
    parser.add_argument("--out", type=Path, required=True, help="OUT.json")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before the run is given up")
    parser.add_argument("--cap", type=float, help="seconds after t0 at which the run stops (not an error)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a peer setting")
    return parser.parse_args()


def settings_of(
    pairs: list[str], defaults: Mapping[str, Any], choices: Mapping[str, Sequence[str]] | None = None
) -> dict[str, Any]:
    """``defaults`` with ``KEY=VALUE`` pairs applied, each value converted to
    its default's type (``bool``: true/false/1/0; a key of ``choices`` must
    take one of its values); an unknown key or a bad value exits naming it."""
    out = dict(defaults)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in defaults:
            raise SystemExit(f"--set {pair!r}: KEY=VALUE with KEY one of {sorted(defaults)}")
        if choices and key in choices and value not in choices[key]:
            raise SystemExit(f"--set {pair!r}: {key} is one of {tuple(choices[key])}")
        kind = type(defaults[key])
        try:
            if kind is bool:
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(value)
                out[key] = value.lower() in ("true", "1")
            elif defaults[key] is None:
                out[key] = value
            else:
                out[key] = kind(value)
        except ValueError:
            raise SystemExit(f"--set {pair!r}: {key} takes a {kind.__name__}") from None
    return out


def load_costs(path: Path) -> array.array[int]:
    """Each message's cost in microseconds, by ``seq``."""
    costs = array.array("q")
    costs.frombytes(path.read_bytes())
    return costs


def load_keys(path: Path) -> list[str]:
    """Each message's key, by ``seq`` (``--keys``, a runner without a broker)."""
    keys = json.loads(path.read_text())
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise SystemExit(f"--keys {path}: expected a JSON list of strings")
    return keys


class Calls:
    """Every handler call ``(seq, start_ns, end_ns)``, in three int64
    columns, and how many distinct ``seq`` were handled.  ``record`` is
    called from one thread at a time (the event loop, or under the caller's
    lock when handlers run on threads)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.seq = array.array("q")
        self.start_ns = array.array("q")
        self.end_ns = array.array("q")
        self._seen = bytearray(total)
        self.distinct = 0

    def record(self, seq: int, start_ns: int, end_ns: int) -> None:
        self.seq.append(seq)
        self.start_ns.append(start_ns)
        self.end_ns.append(end_ns)
        if 0 <= seq < self.total and not self._seen[seq]:
            self._seen[seq] = 1
            self.distinct += 1

    @property
    def done(self) -> bool:
        """Every ``seq`` handled at least once."""
        return self.distinct >= self.total


class AsyncCalls(Calls):
    """The calls of an ``async def`` handler: :meth:`handle` awaits a
    message's cost and records the call; ``all_handled`` is set (and
    ``cpu_at_end`` taken) once every ``seq`` was handled."""

    def __init__(self, costs: array.array[int]) -> None:
        super().__init__(len(costs))
        self.costs = costs
        self.all_handled = asyncio.Event()
        self.cpu_at_end = 0.0

    async def handle(self, value: bytes) -> None:
        """The work of one message (its value starts with its ``seq``)."""
        seq = int.from_bytes(value[:8], "big")
        start = time.perf_counter_ns()
        cost = self.costs[seq]
        if cost:
            await asyncio.sleep(cost / 1e6)
        self.record(seq, start, time.perf_counter_ns())
        if self.done and not self.all_handled.is_set():
            self.cpu_at_end = cpu_seconds()
            self.all_handled.set()


class GcTimes:
    """The cyclic GC's collections and CPU seconds per generation, from
    :meth:`install` (or the last :meth:`reset`) on, by the thread that ran
    them (a ``gc.callbacks`` entry; the CPU is the collecting thread's,
    ``time.thread_time``)."""

    def __init__(self) -> None:
        #: (generation, thread name) -> [collections, CPU seconds].
        self.rows: dict[tuple[int, str], list[float]] = {}
        self._began: dict[int, float] = {}

    def install(self) -> None:
        gc.callbacks.append(self._on)

    def uninstall(self) -> None:
        gc.callbacks.remove(self._on)

    def reset(self) -> None:
        """Count from now on."""
        self.rows = {}

    def _on(self, phase: str, info: Mapping[str, int]) -> None:
        me = threading.get_ident()
        if phase == "start":
            self._began[me] = time.thread_time()
            return
        began = self._began.pop(me, None)
        if began is not None:
            row = self.rows.setdefault((info["generation"], threading.current_thread().name), [0, 0.0])
            row[0] += 1
            row[1] += time.thread_time() - began

    @property
    def collections(self) -> list[int]:
        """Collections per generation, every thread's."""
        return [int(sum(r[0] for (g, _), r in self.rows.items() if g == gen)) for gen in range(3)]

    @property
    def seconds(self) -> list[float]:
        """CPU seconds per generation, every thread's."""
        return [sum(r[1] for (g, _), r in self.rows.items() if g == gen) for gen in range(3)]

    def summary(self) -> dict[str, Any]:
        return {"collections": self.collections, "seconds": [round(s, 4) for s in self.seconds]}


#: This process's collections, from this module's import on.
GC_TIMES = GcTimes()
GC_TIMES.install()


def context_switches() -> list[int]:
    """Voluntary and involuntary context switches of this process so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return [own.ru_nvcsw, own.ru_nivcsw]


def cpu_seconds() -> float:
    """User + system CPU of this process (every thread) and its waited-for children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class Usage:
    """``t0`` and the process's CPU from it: :meth:`start` just before the
    peer's client is made, :meth:`stop` when the last message is handled
    (or the run stops); :meth:`over` says whether ``seconds`` passed."""

    def __init__(self) -> None:
        self.t0_ns = 0
        self.wall_minus_perf_ns = 0
        self._cpu0 = 0.0
        self.cpu_s: float | None = None

    def start(self) -> int:
        self.wall_minus_perf_ns = time.time_ns() - time.perf_counter_ns()
        self._cpu0 = cpu_seconds()
        self.t0_ns = time.perf_counter_ns()
        return self.t0_ns

    def stop(self, cpu_now: float | None = None) -> None:
        """Take the CPU mark (once): now, or at ``cpu_now``, a
        :func:`cpu_seconds` reading taken earlier (``AsyncCalls.cpu_at_end``)."""
        if self.cpu_s is None:
            self.cpu_s = (cpu_seconds() if cpu_now is None else cpu_now) - self._cpu0

    def over(self, seconds: float | None) -> bool:
        return seconds is not None and time.perf_counter_ns() - self.t0_ns > seconds * 1e9


def peak_rss_kb() -> int:
    """The largest resident set of this process or any waited-for child (KiB)."""
    return max(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    )


def write_record(path: Path, run: Mapping[str, Any], config: Mapping[str, Any], calls: Any) -> None:
    """Write OUT.json: ``run``'s own measurements (``t0_ns``,
    ``wall_minus_perf_ns``, ``cpu_s``, ``peak_rss_kb``, ``capped``,
    ``error``), the process's ``gc`` and ``context_switches``, its ``config`` (with the python version unless it names
    one) and the three columns of ``calls`` (anything with ``seq``,
    ``start_ns`` and ``end_ns`` arrays)."""
    path.write_text(
        json.dumps(
            {
                **run,
                "gc": GC_TIMES.summary(),
                "context_switches": context_switches(),
                "config": {"python": sys.version.split()[0], **config},
                "seq": calls.seq.tolist(),
                "start_ns": calls.start_ns.tolist(),
                "end_ns": calls.end_ns.tolist(),
            }
        )
    )


def write_out(
    path: Path, usage: Usage, calls: Calls, *, capped: bool, error: str | None, config: Mapping[str, Any]
) -> None:
    """Write OUT.json from a :class:`Usage` (see :func:`write_record`)."""
    usage.stop()
    run = {
        "t0_ns": usage.t0_ns,
        "wall_minus_perf_ns": usage.wall_minus_perf_ns,
        "cpu_s": usage.cpu_s,
        "peak_rss_kb": peak_rss_kb(),
        "capped": capped,
        "error": error,
    }
    write_record(path, run, config, calls)
