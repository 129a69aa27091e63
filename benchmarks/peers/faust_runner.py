"""Run a faust-streaming worker once over a topic and write down every handler call.

A peer runner of issue 31 (the protocol: ``benchmarks/RESULTS.md``'s
side-by-side section and ``bench_kafka.py``), run by the python of its own
venv (``faust.requirements.txt``); it imports only the standard library and
faust-streaming (with its aiokafka and mode-streaming).

    benchmarks/out/peers/faust-venv/bin/python benchmarks/peers/faust_runner.py \\
        --bootstrap 127.0.0.1:PORT --topic T --group G --costs FILE --out OUT.json \\
        --timeout 300 [--cap 60] [--set concurrency=256 ...]

faust-streaming 0.15.3 (on aiokafka 0.14.0, mode-streaming 0.7.1) runs
against librdkafka's mock cluster once it is told not to create topics:
``topic_allow_declare=False`` and ``topic_disable_leader=True`` (either one
alone is enough here; with neither, the worker dies at start with
``aiokafka.errors.IncompatibleBrokerVersion: CreateTopicsRequest cannot be
used if the API version is unknown``: the mock does not offer CreateTopics
and faust declares its leader-election topic).  No tables, so no changelog;
``store="memory://"``, ``web_enabled=False``, the data dir a temporary one.

How it runs, as faust's docs put it: an ``App`` (its id is the consumer
group) with one agent on the topic (``key_type``/``value_type`` bytes, raw
serializers), ``async for value in stream: await asyncio.sleep(cost)``; an
event is acked when the agent asks for the next one, and faust commits per
partition up to the first offset not yet acked (every
``broker_commit_interval`` s or ``broker_commit_every`` messages, and when
the worker stops).  The worker is faust's programmatic ``faust.Worker(app)``
+ ``execute_from_commandline()`` (what ``faust worker`` runs); an app task
waits until every ``seq`` was handled (or ``--cap`` / ``--timeout``) and
sends this process SIGTERM, the worker's graceful stop: it waits for the
agents' current events, commits, leaves the group.

Parallel I/O-bound work is faust's agent ``concurrency=N`` (its docs: N
actors of the agent on each worker, processing the stream's events
concurrently and in no particular order).  The N actors share one channel,
so events start in offset order but a key's events run at once and may end
out of order: per-key order is NOT kept for N > 1 (the checker counts the
overlaps).  ``concurrency=1`` keeps order by running one event at a time for
the whole worker; ``isolated_partitions=1`` (concurrency 1) gives each
partition its own actor: per-partition order, so per-key order, with
parallelism up to the partition count.

Settings (``--set KEY=VALUE``):

  concurrency             agent actors (default 1000)
  isolated_partitions     1: an actor per partition (needs concurrency=1) (0)
  stream_buffer_maxsize   faust's per-stream prefetch (4096, faust's)
  broker_commit_every     (10000, faust's)
  broker_commit_interval  seconds (2.8, faust's)
  loop                    uvloop | asyncio (uvloop; via mode.loop.use)
  loglevel                the worker's log level (WARNING)

What they gave (a driver since folded into ``try_runner.py``; io5 and io1
through ``bench_peers.py --peers ... --shapes io5,io1``; one run each, 2-core machine with other
benchmarks running: rough).  Every run first calls the handler ~1.4 s after
the app is made, 1.0 s of it a fixed ``sleep(1.0)`` in faust's
``TableManager.on_start`` (there even without tables), so short runs are
dominated by it: the figures are msg/s over the whole run / msg/s after the
first call.  Caps at 10-12 s.

  shape                       c=1          isolated     c=64           c=256          c=1000
  io5 (2,000 x 5 ms, 4 p.)    161/188 cap  379/510      1,302/10,915   1,203/7,070    1,164/7,503
  io1 (20,000 x 1 ms, zipf)   666/773 cap  2,930/3,679  6,524/11,652   6,120/10,639   6,005/10,472
  KPipe 10 ms, 30k            80/93 cap*   564/740*     4,023/4,926    5,761/7,925    4,846/6,620
  (the rows above on asyncio's loop; uvloop below)
  io5                                                                  1,309/13,219
  io1                                                                  6,382/11,724
  KPipe 10 ms, 30k                                                     8,148/13,352   7,669/12,092
  KPipe 100 ms, 20k                                                    2,138/2,500    3,755/5,265
  KPipe 1 ms, 50k                                      9,945/13,719                   9,967/14,500

(KPipe: 8 partitions, 1,000 uniform keys; * of 5,000 messages; c=1000 on
asyncio's loop at 100 ms: 4,186/6,031.)  Past ~64 actors faust is CPU-bound
near one core at 10-14k events/s after the first call (100-200 us of CPU
per event); at 100 ms it needs the actors (256 x 10/s caps it at 2,560/s).
A larger ``stream_buffer_maxsize`` did not help (10 ms, after the first
call: c=256 asyncio 131,072 gave 8,882 vs 7,925; c=256 uvloop 131,072 6,790
vs 12,205; c=1000 uvloop 16,384 7,363 vs 12,092).  Every run: nothing
lost, no duplicate, no commit past an unhandled message; c > 1 overlaps on
many keys (io1 c=64: 5,140 overlapping calls), c=1 and isolated none.
Chosen: ``concurrency=1000``, uvloop (best or within noise of it on every
shape; c=256 is as good at 1-10 ms but caps 100 ms at 2.5k/s).
``concurrency=1 isolated_partitions=1`` is the best faust setting that
keeps per-key order: the orchestrator should run both.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import logging
import os
import signal
import sys
import tempfile
import time
from typing import Any

from runner_protocol import (
    AsyncCalls,  # beside this file: standard library only
    cpu_seconds,
    load_costs,
    parse_args,
    peak_rss_kb,
    settings_of,
    write_record,
)

#: Each setting's default; ``--set`` values are parsed to the default's type.
DEFAULTS: dict[str, Any] = {
    "concurrency": 1000,
    "isolated_partitions": 0,
    "stream_buffer_maxsize": 4096,
    "broker_commit_every": 10000,
    "broker_commit_interval": 2.8,
    "loop": "uvloop",
    "loglevel": "WARNING",
}


def parse_settings(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs over :data:`DEFAULTS`, each value of its default's type."""
    settings = settings_of(pairs, DEFAULTS, {"loop": ("uvloop", "asyncio")})
    if settings["concurrency"] < 1:
        raise SystemExit(f"--set concurrency={settings['concurrency']}: at least 1")
    if settings["isolated_partitions"] and settings["concurrency"] != 1:
        raise SystemExit("--set isolated_partitions=1 needs concurrency=1 (faust refuses both)")
    return settings


def run_worker(args: argparse.Namespace, settings: dict[str, Any], calls: AsyncCalls, datadir: str) -> dict[str, Any]:
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
        loop = type(asyncio.get_running_loop())
        state["event_loop"] = f"{loop.__module__}.{loop.__qualname__}"
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
    state.setdefault("cpu_s", (calls.cpu_at_end if calls.all_handled.is_set() else cpu_seconds()) - cpu0)
    return {"t0_ns": t0, **state}


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], "kafka")
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    settings = parse_settings(args.set)
    costs = load_costs(args.costs)
    wall_minus_perf = time.time_ns() - time.perf_counter_ns()
    calls = AsyncCalls(costs)
    with tempfile.TemporaryDirectory(prefix="faust-runner-") as datadir:
        result = run_worker(args, settings, calls, datadir)
    version = importlib.metadata.version
    config = {
        "package": f"faust-streaming=={version('faust-streaming')}",
        "aiokafka": version("aiokafka"),
        "python": sys.version.split()[0],
        **settings,
        "uvloop": f"uvloop=={version('uvloop')}" if settings["loop"] == "uvloop" else None,
        "event_loop": result.pop("event_loop", None),  # the loop the app ran on, seen from inside
        "agent": "async for value in stream: await asyncio.sleep(cost)",
        "topic_allow_declare": False,
        "topic_disable_leader": True,
        "tables": None,
        "keeps_key_order": settings["concurrency"] == 1,  # one actor (per partition when isolated)
    }
    run_fields = {**result, "wall_minus_perf_ns": wall_minus_perf, "peak_rss_kb": peak_rss_kb()}
    write_record(args.out, run_fields, config, calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
