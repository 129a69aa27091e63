"""Run one consumer configuration on a generated workload and log every
delivery.

    .venv/bin/python benchmarks/harness.py --workload DIR --mode KEY_ORDERLY --lanes 64 --log OUT
    .venv/bin/python benchmarks/harness.py --workload DIR --mode KEY_ORDERLY --lanes 64 --no-failures

The workload (``gen_load.py``'s Parquet: ``seq``, ``key``, ``cost_us``,
``body_size`` and, if present, ``fail_times``) is loaded into an in-memory embedded broker by key hash, as a
RocketMQ producer with the hash selector would; then one consumer consumes it
to the end.  Every message's body starts with its ``seq`` (8 bytes, big
endian), so a delivery maps back to the workload row.  The listener sleeps
``cost_us`` per message (simulated I/O) and records ``(seq, start_ns,
end_ns, attempt)`` in per-thread columns (``recorders.py``).

Poisoned messages: while a message's ``reconsume_times`` is below its
``fail_times``, the listener raises ``RuntimeError("poisoned")`` at once (no
sleep, no log row), which the runtime treats as "retry later".  So the log
holds successful attempts only.  ``--no-failures`` ignores ``fail_times``
(the run's label gets the suffix ``-nofail``, e.g. ``KEY_ORDERLY-64-nofail``),
for the same workload's baseline without failures.  The runtime's warning per
failed attempt is silenced unless ``--log-level WARNING`` (the JSON line
counts them as ``retried``).

It prints one JSON line with: messages/s, end-to-end latency percentiles
(from the moment the message was available to this run -- all messages are
loaded before the run starts, so that is the run's start -- to the end of its
listener call), CPU seconds and peak RSS of this process; ``healthy_rate``:
the messages of non-poisoned keys (``fail_times`` 0 in the workload, also
under ``--no-failures``, so both runs measure the same messages) over the
seconds from the run's start to the end of the last of them; ``retried``,
``dead_lettered`` (final ``ConsumerStats``) and ``parked_max`` (the largest
``stats().parked`` seen while polling every 10 ms), and writes the
consumption log as Parquet (``run``, ``seq``, ``key``, ``queue``,
``offset``, ``lane``, ``start_ns``, ``end_ns``, ``attempt``).  Run it as its
own process per configuration, so RSS and CPU belong to that run alone.

``--placement load|hash|java`` (KEY_ORDERLY; default ``load``) is
``ConsumerConfig.lane_placement``: which lane a key goes to.  A placement
other than the default is appended to the run's label
(``KEY_ORDERLY-64-hash``, ``KEY_ORDERLY-256-uvloop-java``).  The JSON line
says ``placement`` (``null`` for modes that place no keys), ``bound_rate``:
the best rate the run's partitioning allows on this data
(``partition.partition_bound`` with the run's placement: the busiest fixed
lane for ``hash`` and ``java``, ``N / max(hottest key's cost, total / lanes)``
for ``load``), and ``hot_key_rate``: ``N / (hottest key's total cost)``, the
hot-key bound no key-ordered run beats with any number of lanes
(``partition.hot_key_rate``).

``--bare`` (asyncio executors, KEY_ORDERLY) runs no consumer: the same
listener awaited by ``--lanes`` coroutines over the messages partitioned by
``--placement`` (:func:`bare_loop`), which is what the event loop can do
with this listener at all -- the ceiling for the asyncio executor's runs.
``hash`` and ``java`` are the runtime's fixed lanes.  ``load`` places keys
at run time, which a partition made up front cannot copy; the bare loop
uses an offline greedy split instead: each key, in order of first
appearance (``seq``), with all its messages, to the lane with the least
total cost assigned so far (``partition.greedy_lanes``).
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pyarrow.dataset as ds
import pyarrow.parquet as pq
from partition import PLACEMENTS, hot_key_rate, lanes_of_keys, partition_bound
from recorders import AsyncRecorder, Recorder

from lite_push import (
    AsyncLitePushConsumer,
    ConsumeFromWhere,
    ConsumeMode,
    ConsumerConfig,
    ConsumerStats,
    EmbeddedBroker,
    LitePushConsumer,
    MessageExt,
)

TOPIC = "BENCH"


def load(broker: EmbeddedBroker, workload_dir: Path, queues: int) -> tuple[list[str], list[int], list[int]]:
    """Send the workload's rows in ``seq`` order; return keys, costs and
    ``fail_times`` by seq (all 0 if the workload has no such column, as
    before it existed)."""
    columns = ["seq", "key", "cost_us", "body_size"]
    if "fail_times" in ds.dataset(workload_dir, format="parquet").schema.names:
        columns.append("fail_times")
    table = pq.read_table(workload_dir, columns=columns).sort_by("seq")
    seqs = table.column("seq").to_pylist()
    keys = table.column("key").to_pylist()
    costs = table.column("cost_us").to_pylist()
    sizes = table.column("body_size").to_pylist()
    fails = table.column("fail_times").to_pylist() if "fail_times" in columns else [0] * len(seqs)
    if seqs != list(range(len(seqs))):
        raise SystemExit(f"{workload_dir}: seq must run 0..{len(seqs) - 1}")
    broker.create_topic(TOPIC, queue_count=queues)
    pads = {}
    items = []
    for seq, key, size in zip(seqs, keys, sizes, strict=True):
        pad = pads.get(size)
        if pad is None:
            pad = pads[size] = b"\0" * max(0, size - 8)
        items.append((seq.to_bytes(8, "big") + pad, key))
    broker.send_batch(TOPIC, items)
    return keys, costs, fails


class _Scraper:
    """Scrapes a registry every second in a thread, as Prometheus would
    (more often than its usual 15 s), so the collector's cost is counted."""

    def __init__(self, registry: object) -> None:
        from prometheus_client import generate_latest

        self._stop = threading.Event()
        self.scrapes = 0

        def run() -> None:
            while not self._stop.wait(1.0):
                generate_latest(registry)  # type: ignore[arg-type]
                self.scrapes += 1

        self._thread = threading.Thread(target=run, name="bench-scraper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def bare_loop(
    broker: EmbeddedBroker, rec: AsyncRecorder, lanes: int, total: int, executor: str, placement: str = "load"
) -> tuple[float, float, int]:
    """The event loop's ceiling for this listener and partitioning, with no
    lite_push on the way: every message is read up front, put in its key's
    lane under ``placement`` (``hash``, ``java``: the runtime's fixed lane;
    ``load``: the offline greedy split, see the module docstring), in queue
    then offset order so each key keeps its order, and ``lanes`` coroutines
    await the listener for their messages one by one.  Returns ``(seconds,
    cpu seconds, start in perf_counter_ns)``."""
    import asyncio

    pc = broker.pull_consumer("bench-bare", consume_from=ConsumeFromWhere.FIRST_OFFSET)
    pc.subscribe(TOPIC)
    msgs: list[MessageExt] = []
    while len(msgs) < total:
        for batch in pc.poll(1.0, 1024):
            msgs.extend(batch.messages)
    pc.close()
    seq_of = {id(m): int.from_bytes(m.body[:8], "big") for m in msgs}
    by_seq = sorted(msgs, key=lambda m: seq_of[id(m)])
    costs = rec.costs
    lane_map = lanes_of_keys([m.keys or "" for m in by_seq], [costs[seq_of[id(m)]] for m in by_seq], lanes, placement)
    msgs.sort(key=lambda m: (m.queue_id, m.queue_offset))
    parts: list[list[MessageExt]] = [[] for _ in range(lanes)]
    for m in msgs:
        parts[lane_map[m.keys or ""]].append(m)

    async def lane(part: list[MessageExt]) -> None:
        for m in part:
            await rec([m])

    async def main() -> tuple[float, float, int]:
        cpu0 = time.process_time()
        t0 = time.perf_counter_ns()
        await asyncio.gather(*(lane(p) for p in parts if p))
        return (time.perf_counter_ns() - t0) / 1e9, time.process_time() - cpu0, t0

    if executor == "uvloop":
        import uvloop

        return uvloop.run(main())
    return asyncio.run(main())


def _record_spans(ratio: float) -> None:
    """The process's tracer provider: the SDK's, sampling ``ratio`` of the
    traces that have no sampled parent (the SDK's default sampler when 1),
    batching to an exporter that drops every span."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)


def run_one(
    workload_dir: Path,
    mode: ConsumeMode,
    lanes: int,
    queues: int,
    log_dir: Path | None,
    progress: bool,
    no_failures: bool = False,
    executor: str = "thread",
    bare: bool = False,
    metrics: bool = False,
    placement: str = "load",
    loop_turn_target: float | None = None,
    tracing: float | None = None,
) -> dict[str, object]:
    """Consume the workload once with ``mode`` and ``lanes`` (pool threads
    for QUEUE_ORDERLY) on ``executor`` (``thread``, or ``asyncio`` /
    ``uvloop``: lanes as coroutines on that loop); the result dict is the
    harness's JSON line.  ``bare``: no consumer, the loop's ceiling
    (:func:`bare_loop`; label ``LOOP-<lanes>-<executor>``).  ``metrics``:
    the consumer records Prometheus metrics into a registry scraped every
    second meanwhile (label suffix ``-metrics``).  ``placement``: the
    KEY_ORDERLY lane placement (label suffix ``-<placement>`` unless
    ``load``); other modes place no keys and take only the default.
    ``loop_turn_target``: the asyncio executor's admission target (``None``:
    the default; label suffix ``-turn<seconds>`` otherwise, ``-turn0``: off).
    ``tracing``: ``ConsumerConfig.tracing`` on, with the OpenTelemetry SDK's
    provider sampling that ratio of the traces and a batch processor whose
    exporter drops the spans (what recording costs, without an exporter's
    I/O; label suffix ``-tracing``, ``-tracing<ratio>`` below 1)."""
    if placement not in PLACEMENTS:
        raise SystemExit(f"--placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    keyed = mode is ConsumeMode.KEY_ORDERLY
    if not keyed and placement != "load":
        raise SystemExit(f"--placement {placement} needs --mode KEY_ORDERLY ({mode.name} places no keys on lanes)")
    broker = EmbeddedBroker()
    keys, costs, fails = load(broker, workload_dir, queues)
    total = len(keys)
    is_async = executor != "thread"
    if bare and (not is_async or not keyed or (any(fails) and not no_failures)):
        raise SystemExit("--bare needs --mode KEY_ORDERLY, an asyncio or uvloop executor, and no failing messages")
    rec: Recorder | AsyncRecorder = (AsyncRecorder if is_async else Recorder)(costs, None if no_failures else fails)
    suffix = "" if placement == "load" else f"-{placement}"
    bound = partition_bound(keys, costs, queues, mode.name, lanes, placement)
    hot_rate = hot_key_rate(keys, costs)
    placed = placement if keyed else None
    if bare:
        assert isinstance(rec, AsyncRecorder)
        seconds, cpu, t0_ns = bare_loop(broker, rec, lanes, total, executor, placement)
        return _result(
            rec,
            keys,
            fails,
            f"LOOP-{lanes}-{executor}{suffix}",
            "LOOP",
            executor,
            lanes,
            queues,
            total,
            seconds,
            cpu,
            t0_ns,
            0,
            0,
            0,
            log_dir,
            bound,
            placement=placed,
            hot_rate=hot_rate,
        )
    if mode is ConsumeMode.QUEUE_ORDERLY:
        config = ConsumerConfig(group="bench", mode=mode, consume_thread_min=lanes, consume_thread_max=lanes)
        label = f"QUEUE_ORDERLY-{lanes}"
    else:
        turn = {} if loop_turn_target is None else {"loop_turn_target": loop_turn_target}
        config = ConsumerConfig(
            group="bench",
            mode=mode,
            lanes=lanes,
            executor="asyncio" if is_async else "thread",
            lane_placement=placement,
            **turn,  # type: ignore[arg-type]
        )
        label = f"{mode.name}-{lanes}" + (f"-{executor}" if is_async else "") + suffix
        if loop_turn_target is not None:
            label += f"-turn{loop_turn_target:g}"
    if no_failures:
        label += "-nofail"
    if tracing is not None:
        if not 0 <= tracing <= 1:
            raise SystemExit(f"--tracing RATIO must be in [0, 1], got {tracing:g}")
        _record_spans(tracing)
        config = replace(config, tracing=True)
        label += "-tracing" + ("" if tracing == 1 else f"{tracing:g}")
    registry = None
    if metrics:
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry()
        label += "-metrics"
    # async lanes run on this process's loop (asyncio.run / uvloop.run below)
    consumer = (AsyncLitePushConsumer if is_async else LitePushConsumer)(
        config,
        source=broker.pull_consumer("bench", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=rec,
        registry=registry,
    )
    scraper = _Scraper(registry) if registry is not None else None
    consumer.subscribe(TOPIC)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, desc=label, unit="msg", file=sys.stderr, leave=False, mininterval=0.5)
    cpu0 = time.process_time()
    t0_ns = time.perf_counter_ns()
    parked_max = 0

    def progress_done() -> bool:
        nonlocal shown, parked_max
        stats = consumer.stats()
        parked_max = max(parked_max, stats.parked)
        done = stats.consumed + stats.dead_lettered  # a dead letter is finished too
        if bar is not None and done > shown:
            bar.update(done - shown)
            shown = done
        return done >= total

    shown = 0
    if is_async:
        import asyncio

        assert isinstance(consumer, AsyncLitePushConsumer)
        aconsumer = consumer

        async def main() -> tuple[float, float, object]:
            await aconsumer.start()
            while not progress_done():
                await asyncio.sleep(0.01)
            seconds = (time.perf_counter_ns() - t0_ns) / 1e9
            cpu = time.process_time() - cpu0
            final = consumer.stats()
            await aconsumer.shutdown(timeout=30)
            return seconds, cpu, final

        if executor == "uvloop":
            import uvloop

            seconds, cpu, final_any = uvloop.run(main())
        else:
            seconds, cpu, final_any = asyncio.run(main())
        final = cast(ConsumerStats, final_any)
    else:
        assert isinstance(consumer, LitePushConsumer)
        consumer.start()
        while not progress_done():
            time.sleep(0.01)
        seconds = (time.perf_counter_ns() - t0_ns) / 1e9
        cpu = time.process_time() - cpu0
        final = consumer.stats()
        consumer.shutdown(timeout=30)
    if bar is not None:
        bar.close()
    if scraper is not None:
        scraper.stop()
    return _result(
        rec,
        keys,
        fails,
        label,
        mode.name,
        executor if mode is not ConsumeMode.QUEUE_ORDERLY else "thread",
        lanes,
        queues,
        total,
        seconds,
        cpu,
        t0_ns,
        final.retried,
        final.dead_lettered,
        parked_max,
        log_dir,
        bound,
        failures=not no_failures and any(fails),
        placement=placed,
        hot_rate=hot_rate,
    )


def _result(
    rec: Recorder | AsyncRecorder,
    keys: list[str],
    fails: list[int],
    label: str,
    mode: str,
    executor: str,
    lanes: int,
    queues: int,
    total: int,
    seconds: float,
    cpu: float,
    t0_ns: int,
    retried: int,
    dead_lettered: int,
    parked_max: int,
    log_dir: Path | None,
    bound: float,
    failures: bool = False,
    placement: str | None = None,
    hot_rate: float = float("inf"),
) -> dict[str, object]:
    """Write the run's log (if ``log_dir``) and build its JSON line;
    ``bound`` and ``hot_rate`` (msg/s) are written as ``null`` when
    infinite (no cost).

    The run's ``seconds`` are from its start to the end of the last listener
    call logged: the caller's ``seconds`` (when its progress loop saw the
    last message counted, ``detected_seconds`` in the line) is late by up
    to that loop's 10 ms, which is 5 % of a 0.2 s run such as ``io5``."""
    table = rec.table(label, keys)
    end_ns = table.column("end_ns").to_pylist()
    detected = seconds
    if end_ns:
        seconds = (max(end_ns) - t0_ns) / 1e9
    ends = sorted((e - t0_ns) / 1e6 for e in end_ns)
    # healthy: messages of keys that never fail (by the workload, even under
    # --no-failures, so that run measures the same messages)
    healthy = sum(1 for f in fails if f == 0)
    seqs = table.column("seq").to_pylist()
    healthy_end = max((e for s, e in zip(seqs, end_ns, strict=True) if fails[s] == 0), default=None)
    healthy_seconds = (healthy_end - t0_ns) / 1e9 if healthy_end is not None else 0.0

    def pct(p: float) -> float:
        return ends[min(len(ends) - 1, int(p * len(ends)))] if ends else 0.0

    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, log_dir / f"{label}.parquet")
    return {
        "run": label,
        "mode": mode,
        "executor": executor,
        "lanes": lanes,
        "messages": total,
        "seconds": seconds,
        "detected_seconds": detected,
        "rate": total / seconds,
        "healthy_messages": healthy,
        "healthy_seconds": healthy_seconds,
        "healthy_rate": healthy / healthy_seconds if healthy_seconds > 0 else None,
        "retried": retried,
        "dead_lettered": dead_lettered,
        "parked_max": parked_max,
        "failures": failures,
        "placement": placement,
        "bound_rate": bound if bound != float("inf") else None,
        "hot_key_rate": hot_rate if hot_rate != float("inf") else None,
        "latency_ms_p50": pct(0.50),
        "latency_ms_p95": pct(0.95),
        "latency_ms_p99": pct(0.99),
        "cpu_seconds": cpu,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=Path, required=True, help="directory written by gen_load.py")
    parser.add_argument("--mode", choices=[m.name for m in ConsumeMode], required=True)
    parser.add_argument("--lanes", type=int, required=True, help="lanes, or pool threads for QUEUE_ORDERLY")
    parser.add_argument("--queues", type=int, help="queue count (default: the workload's)")
    parser.add_argument("--log", type=Path, help="directory for the consumption log (Parquet)")
    parser.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    parser.add_argument(
        "--executor",
        default="thread",
        choices=["thread", "asyncio", "uvloop"],
        help="lane threads, or lane coroutines on asyncio's default loop or on uvloop",
    )
    parser.add_argument(
        "--placement",
        default="load",
        choices=list(PLACEMENTS),
        help="KEY_ORDERLY lane placement (ConsumerConfig.lane_placement; default load; label suffix otherwise)",
    )
    parser.add_argument(
        "--loop-turn-target",
        type=float,
        metavar="S",
        help="asyncio executor: ConsumerConfig.loop_turn_target (0: admission off; label suffix -turnS)",
    )
    parser.add_argument(
        "--bare",
        action="store_true",
        help="no consumer: the loop's ceiling for this listener over --placement's partitioning "
        "(label LOOP-N-EXECUTOR; load: an offline greedy split)",
    )
    parser.add_argument(
        "--metrics", action="store_true", help="record Prometheus metrics, scraped every second (label suffix -metrics)"
    )
    parser.add_argument(
        "--no-failures", action="store_true", help="ignore the workload's fail_times (label suffix -nofail)"
    )
    parser.add_argument(
        "--tracing",
        nargs="?",
        type=float,
        const=1.0,
        default=None,
        metavar="RATIO",
        help="OpenTelemetry spans, recorded and dropped; RATIO (default 1): the sampled share of traces "
        "without a parent (label suffix -tracing, -tracingRATIO below 1)",
    )
    parser.add_argument(
        "--log-level",
        default="ERROR",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="lite_push log level on stderr (default ERROR: no line per failed attempt)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    queues = args.queues
    if queues is None:
        meta = json.loads((args.workload / "_workload.json").read_text())
        queues = int(meta["queues"])
    result = run_one(
        args.workload,
        ConsumeMode[args.mode],
        args.lanes,
        queues,
        args.log,
        args.progress,
        args.no_failures,
        args.executor,
        args.bare,
        args.metrics,
        args.placement,
        args.loop_turn_target,
        args.tracing,
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
