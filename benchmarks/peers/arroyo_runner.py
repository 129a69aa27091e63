"""sentry-arroyo as a runner of ``bench_peers.py``: a ``StreamProcessor``
whose strategy runs every message's blocking I/O on a thread pool.

sentry-arroyo 2.48.0 (confluent-kafka 2.16.1), Python 3.12.  Arroyo's docs
(``architecture.rst``: "all IO should be done in separate threads and heavy
cpu work should be done in separate processes"; ``RunTaskInThreads``: "This
strategy can be used to run IO-bound tasks in parallel") give I/O-bound work
to ``RunTaskInThreads``, and CPU-bound work to
``RunTaskWithMultiprocessing``.  So, per assignment, the factory builds

    RunTaskInThreads(work, concurrency, max_pending_futures)   # strategy=threads
      -> RunTask(record) -> CommitOffsets(commit)

``work`` runs on the pool's threads: ``time.sleep(cost)`` between two
``perf_counter_ns``, returning ``(seq, start_ns, end_ns)``; ``record`` (the
processor's thread) keeps it.  ``RunTaskInThreads`` forwards results in
submission order, so ``CommitOffsets`` only ever commits a prefix of handled
messages (at-least-once); the processor's commit policy is arroyo's
``ONCE_PER_SECOND`` and the consumer is arroyo's ``KafkaConsumer`` on
``build_kafka_consumer_configuration`` (``auto_offset_reset`` earliest, its
defaults otherwise: librdkafka's auto commit of the offsets arroyo stores).
``strategy=processes`` swaps the first step for
``RunTaskWithMultiprocessing(work, max_batch_size, max_batch_time,
MultiprocessingPool(processes))``, the docs' CPU-bound step, for comparison.

Settings (``--set``): ``strategy`` (threads), ``concurrency`` (256),
``max_pending_futures`` (0: 4 x concurrency), ``processes`` (8),
``max_batch_size`` (16), ``max_batch_time`` (0.05 s).  Tried with
``try_runner.py`` on the mock cluster, 8 partitions, 1,000 keys uniform,
constant cost, this 2-core machine with other benchmarks running (rough,
one run each):

* 10 ms, 8,000-10,000 messages: concurrency 8 ~770 msg/s, 64 ~5,800, 256
  ~10,200, 512 ~10,700, 1,024 ~7,500; ``max_pending_futures`` 256 ~7,200,
  1,000 ~8,800, 1,024 (the default 4 x 256) ~10,100;
* 1 ms, 20,000 messages: 8 ~2,900, 64 ~11,900, 256 ~13,000, 1,024 ~10,700;
* 100 ms, 4,000 messages: 256 ~2,250, 1,024 ~6,100 (1.8 x the hot-key
  bound: with no key order, a hot key's messages run side by side);
* ``strategy=processes`` (8 processes, batches of 16), 10 ms: ~430 msg/s,
  first call after 0.8 s (the pool starts), 236 order violations.

What bounds it from 64 threads on is the processor's one thread, which
polls, submits and forwards every message (CPU ~1 s per 10,000 messages),
beside the pool's threads waking up under the GIL.  Chosen: threads,
concurrency 256 (1,024 for 100 ms messages, where the pool is the bound).

Key order: **none**.  ``RunTaskInThreads`` hands every message to the pool
as it arrives; two messages of one key (one partition) run at once on two
threads whenever both are in flight, and the later one may finish first.
Only the commits stay in partition order.  The checker counts it as
overlaps (thousands per run above); its order violations stay near 0,
because the pool starts its work in submission order and the checker
orders a key's calls by their start.  (``RunTaskWithMultiprocessing`` runs
a batch serially in one process, but batches of one partition in parallel
processes: no key order either.)

Run as ``python arroyo_runner.py --bootstrap HOST:PORT --topic T --group G
--costs FILE --out OUT.json --timeout S [--cap S] [--set KEY=VALUE ...]``
(the runner protocol of ``bench_peers.py``).  ``cpu_s`` is this process's
CPU (every thread) from ``t0`` to the last message recorded, plus for
``strategy=processes`` its pool's, read once the pool was shut down;
``peak_rss_kb`` this process's peak plus its largest child's.
"""

from __future__ import annotations

import array
import functools
import importlib.metadata as md
import logging
import resource
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from arroyo.backends.kafka import KafkaConsumer, KafkaPayload
from arroyo.backends.kafka.configuration import build_kafka_consumer_configuration
from arroyo.commit import ONCE_PER_SECOND
from arroyo.processing import StreamProcessor
from arroyo.processing.strategies import (
    CommitOffsets,
    ProcessingStrategy,
    ProcessingStrategyFactory,
    RunTask,
    RunTaskInThreads,
    RunTaskWithMultiprocessing,
)
from arroyo.processing.strategies.run_task_with_multiprocessing import MultiprocessingPool
from arroyo.types import Commit, Message, Partition, Topic
from runner_protocol import Calls, parse_args, settings_of, write_record  # beside this file: stdlib only

PACKAGE = "sentry-arroyo"
DEFAULTS: dict[str, Any] = {
    "strategy": "threads",
    "concurrency": 256,
    "max_pending_futures": 0,
    "processes": 8,
    "max_batch_size": 16,
    "max_batch_time": 0.05,
}

#: Each message's cost in microseconds, by seq: set in the main process, and
#: in each pool process by its initializer (strategy=processes).
COSTS = array.array("q")


def load_costs(path: str) -> None:
    """Fill :data:`COSTS` from the ``--costs`` file (also a pool initializer)."""
    del COSTS[:]
    COSTS.frombytes(Path(path).read_bytes())


def work(message: Message[KafkaPayload]) -> tuple[int, int, int]:
    """The handler: the message's cost as a blocking sleep, timed."""
    seq = int.from_bytes(message.payload.value[:8], "big")
    start = time.perf_counter_ns()
    cost = COSTS[seq]
    if cost:
        time.sleep(cost / 1e6)
    return seq, start, time.perf_counter_ns()


def cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class Recorder(Calls):
    """Every handler call, recorded on the processor's thread (arroyo's
    next step); ``done`` is set once every seq was handled, with the CPU
    used until then."""

    def __init__(self, total: int) -> None:
        super().__init__(total)
        self.cpu_at_done: float | None = None
        self.all_handled = threading.Event()

    def __call__(self, message: Message[tuple[int, int, int]]) -> None:
        self.record(*message.payload)
        if self.done and not self.all_handled.is_set():
            self.cpu_at_done = cpu_s(resource.RUSAGE_SELF)
            self.all_handled.set()


class Factory(ProcessingStrategyFactory[KafkaPayload]):
    """Builds the chain on every assignment (see the module docstring)."""

    def __init__(self, settings: Mapping[str, Any], recorder: Recorder, costs_path: str) -> None:
        self.settings = settings
        self.recorder = recorder
        self.pool: MultiprocessingPool | None = None
        if settings["strategy"] == "processes":
            self.pool = MultiprocessingPool(settings["processes"], functools.partial(load_costs, costs_path))

    def create_with_partitions(
        self, commit: Commit, partitions: Mapping[Partition, int]
    ) -> ProcessingStrategy[KafkaPayload]:
        s = self.settings
        tail: RunTask[Any, None] = RunTask(self.recorder, CommitOffsets(commit))
        if self.pool is not None:
            return RunTaskWithMultiprocessing(
                work, tail, max_batch_size=s["max_batch_size"], max_batch_time=s["max_batch_time"], pool=self.pool
            )
        pending = s["max_pending_futures"] or 4 * s["concurrency"]
        return RunTaskInThreads(work, concurrency=s["concurrency"], max_pending_futures=pending, next_step=tail)

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.close()


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], "kafka")
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    settings = settings_of(args.set, DEFAULTS, {"strategy": ("threads", "processes")})
    load_costs(args.costs)
    recorder = Recorder(len(COSTS))

    wall_minus_perf = time.time_ns() - time.perf_counter_ns()
    cpu0, kids0 = cpu_s(resource.RUSAGE_SELF), cpu_s(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter_ns()
    config = build_kafka_consumer_configuration(
        default_config={}, group_id=args.group, auto_offset_reset="earliest", bootstrap_servers=[args.bootstrap]
    )
    factory = Factory(settings, recorder, args.costs)
    processor = StreamProcessor(KafkaConsumer(config), Topic(args.topic), factory, commit_policy=ONCE_PER_SECOND)

    stop_at: dict[str, Any] = {"capped": False, "error": None}

    def watch() -> None:
        """Ask the processor to stop once everything was handled, at the cap
        or at the timeout (arroyo's own shutdown: join the strategy, which
        commits, then close the consumer)."""
        limit = min(args.cap if args.cap is not None else args.timeout, args.timeout)
        if not recorder.all_handled.wait(limit):
            if args.cap is not None and args.cap <= args.timeout:
                stop_at["capped"] = True
            else:
                stop_at["error"] = f"timeout after {args.timeout:g}s ({recorder.distinct} of {recorder.total} handled)"
        processor.signal_shutdown()

    threading.Thread(target=watch, name="stop-watch", daemon=True).start()
    try:
        processor.run()
    except Exception as exc:  # the run's error goes into OUT.json
        stop_at["error"] = stop_at["error"] or f"{type(exc).__name__}: {exc}"
    own = (recorder.cpu_at_done if recorder.cpu_at_done is not None else cpu_s(resource.RUSAGE_SELF)) - cpu0
    kids = cpu_s(resource.RUSAGE_CHILDREN) - kids0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    run = {
        "t0_ns": t0,
        "wall_minus_perf_ns": wall_minus_perf,
        "cpu_s": own + kids,
        "peak_rss_kb": rss,
        "capped": stop_at["capped"],
        "error": stop_at["error"],
    }
    described = {
        "package": f"{PACKAGE}=={md.version(PACKAGE)}",
        "confluent_kafka": md.version("confluent-kafka"),
        "python": sys.version.split()[0],
        **settings,
        "max_pending_futures": settings["max_pending_futures"] or 4 * settings["concurrency"],
        "commit_policy": "ONCE_PER_SECOND",
        "handler": "time.sleep(cost) on the strategy's threads (or pool processes)",
        "keeps_key_order": False,
    }
    write_record(args.out, run, described, recorder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
