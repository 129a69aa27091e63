"""Run a faust-streaming worker once over a topic and write down every handler call.

A peer runner of issue 31 (the protocol: ``benchmarks/RESULTS.md``'s
side-by-side section and ``bench_kafka.py``), run by the python of its own
venv (``faust.requirements.txt``); it imports only the standard library and
faust-streaming (with its aiokafka and mode-streaming).

    benchmarks/out/peers/faust-venv/bin/python benchmarks/peers/faust_runner.py \\
        --bootstrap 127.0.0.1:PORT --topic T --group G --costs FILE --out OUT.json \\
        --timeout 300 [--cap 60] [--set concurrency=256 ...]

SEE_BELOW
"""

from __future__ import annotations

import argparse
import array
import asyncio
import importlib.metadata
import json
import logging
import os
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Each setting's default; ``--set`` values are parsed to the default's type.
DEFAULTS: dict[str, Any] = {
    "concurrency": 256,
    "isolated_partitions": 0,
    "stream_buffer_maxsize": 4096,
    "broker_commit_every": 10000,
    "broker_commit_interval": 2.8,
    "loop": "asyncio",
    "loglevel": "WARNING",
}


def parse_settings(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs over :data:`DEFAULTS`, each value of its default's type."""
    settings = dict(DEFAULTS)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in DEFAULTS:
            raise SystemExit(f"--set {pair!r}: expected KEY=VALUE with KEY one of {sorted(DEFAULTS)}")
        settings[key] = type(DEFAULTS[key])(value)
    if settings["loop"] not in ("uvloop", "asyncio") or settings["concurrency"] < 1:
        raise SystemExit(f"--set: loop is uvloop|asyncio, concurrency >= 1 (got {settings})")
    if settings["isolated_partitions"] and settings["concurrency"] != 1:
        raise SystemExit("--set isolated_partitions=1 needs concurrency=1 (faust refuses both)")
    return settings


def cpu_seconds() -> float:
    """User + system CPU of this process (every thread) and its children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class Calls:
    """The handler calls of a run, and when every ``seq`` was handled."""

    def __init__(self, costs: array.array[int]) -> None:
        self.costs = costs
        self.seq, self.start_ns, self.end_ns = array.array("q"), array.array("q"), array.array("q")
        self._seen = bytearray(len(costs))
        self.distinct = 0
        self.all_handled = asyncio.Event()
        self.cpu_at_end = 0.0

    async def handle(self, value: bytes) -> None:
        """The work of one message: await its cost, record the call."""
        seq = int.from_bytes(value[:8], "big")
        start = time.perf_counter_ns()
        cost = self.costs[seq]
        if cost:
            await asyncio.sleep(cost / 1e6)
        self.end_ns.append(time.perf_counter_ns())
        self.seq.append(seq)
        self.start_ns.append(start)
        if not self._seen[seq]:
            self._seen[seq] = 1
            self.distinct += 1
            if self.distinct == len(self.costs):
                self.cpu_at_end = cpu_seconds()
                self.all_handled.set()


def run_worker(args: argparse.Namespace, settings: dict[str, Any], calls: Calls, datadir: str) -> dict[str, Any]:
    """Make the app, run a faust ``Worker`` until every seq was handled, the
    cap or the timeout (then it stops itself with SIGTERM, as ``faust
    worker`` is stopped), and say how it went."""
    if settings["loop"] == "uvloop":
        import mode.loop

        mode.loop.use("uvloop")
    import faust

    limit = min(args.cap, args.timeout) if args.cap is not None else args.timeout
    state: dict[str, Any] = {"capped": False, "error": None}
    cpu0 = cpu_seconds()
    t0 = time.perf_counter_ns()
    app = faust.App(
        args.group,  # the app id is the consumer group
        broker=f"kafka://{args.bootstrap}",
        datadir=datadir,
        store="memory://",
        web_enabled=False,
        topic_allow_declare=False,  # no topic creation (the mock has no CreateTopics)
        topic_disable_leader=True,  # no leader-election topic either
        consumer_auto_offset_reset="earliest",
        stream_buffer_maxsize=settings["stream_buffer_maxsize"],
        broker_commit_every=settings["broker_commit_every"],
        broker_commit_interval=settings["broker_commit_interval"],
    )
    topic = app.topic(args.topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")

    @app.agent(topic, concurrency=settings["concurrency"], isolated_partitions=bool(settings["isolated_partitions"]))
    async def handler(stream: Any) -> None:
        async for value in stream:  # acked when the next one is asked for: at-least-once
            await calls.handle(value)

    @app.task
    async def stop_when_done() -> None:
        try:
            await asyncio.wait_for(calls.all_handled.wait(), max(0.0, limit - (time.perf_counter_ns() - t0) / 1e9))
        except TimeoutError:
            if args.cap is not None and args.cap <= args.timeout:
                state["capped"] = True
            else:
                state["error"] = f"timeout after {args.timeout:g}s ({calls.distinct} of {len(calls.costs)} handled)"
            state["cpu_s"] = cpu_seconds() - cpu0
        os.kill(os.getpid(), signal.SIGTERM)  # the worker's own graceful stop: it commits what was acked

    worker = faust.Worker(app, loglevel=settings["loglevel"], quiet=True, redirect_stdouts=False)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        if exc.code not in (0, None) and state["error"] is None:
            state["error"] = f"faust worker exited {exc.code}"
    state.setdefault("cpu_s", calls.cpu_at_end - cpu0)
    return {"t0_ns": t0, **state}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--costs", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--cap", type=float)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    settings = parse_settings(args.set)
    costs = array.array("q")
    costs.frombytes(args.costs.read_bytes())
    wall_minus_perf = time.time_ns() - time.perf_counter_ns()
    calls = Calls(costs)
    with tempfile.TemporaryDirectory(prefix="faust-runner-") as datadir:
        result = run_worker(args, settings, calls, datadir)
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    version = importlib.metadata.version
    config = {
        "package": f"faust-streaming=={version('faust-streaming')}",
        "aiokafka": version("aiokafka"),
        "python": sys.version.split()[0],
        **settings,
        "uvloop": f"uvloop=={version('uvloop')}" if settings["loop"] == "uvloop" else None,
        "agent": "async for value in stream: await asyncio.sleep(cost)",
        "topic_allow_declare": False,
        "topic_disable_leader": True,
        "tables": None,
        "keeps_key_order": settings["concurrency"] == 1,  # one actor (per partition when isolated)
    }
    args.out.write_text(
        json.dumps(
            {
                **result,
                "wall_minus_perf_ns": wall_minus_perf,
                "peak_rss_kb": max(own.ru_maxrss, kids.ru_maxrss),
                "config": config,
                "seq": calls.seq.tolist(),
                "start_ns": calls.start_ns.tolist(),
                "end_ns": calls.end_ns.tolist(),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
