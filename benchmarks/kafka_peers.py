"""The three consumers of ``bench_kafka.py``, each run once over a topic the
benchmark produced, and the producer that fills it.

* :func:`run_serial` -- one ``confluent_kafka.Consumer``: poll a message,
  ``time.sleep`` its cost, store its offset (``enable.auto.offset.store``
  off, ``store_offsets`` after the handler: at-least-once; librdkafka's
  auto commit every 5 s commits what was stored), a final synchronous
  commit at the end.
* :func:`run_lite_push` -- lite_push's Kafka source with an ``async def``
  listener (``recorders.AsyncRecorder``, the harness's: it awaits
  ``asyncio.sleep`` of the message's cost), KEY_ORDERLY, ``lanes`` lanes
  on the asyncio executor, on uvloop or asyncio's own loop as the harness
  runs it (``uvloop.run`` / ``asyncio.run`` around an
  ``AsyncLitePushConsumer``).
* :func:`run_pyrallel` -- pyrallel-consumer 1.0.0 in a subprocess
  (``peers/pyrallel_runner.py``, ``bench_peers.py``'s runner) with a venv of
  its own (:func:`pyrallel_python` makes it when missing from
  ``peers/pyrallel.requirements.txt``: the package needs Python >= 3.12,
  this project's venv is 3.11).

Each returns a :class:`Run`: ``t0_ns`` (``perf_counter_ns`` just before the
consumer's Kafka client is made -- ``Consumer(...)`` for the serial loop,
``KafkaBroker.pull_consumer`` for lite_push, ``PyrallelConsumer.start()``
for pyrallel, which makes its clients there -- so connecting and joining
the group are timed alike) and one ``(seq, start_ns, end_ns)`` row per
handler call.  Every message's value is its ``seq`` as 8 bytes big
endian, padded to the workload's ``body_size``, as the harness writes it.
"""

from __future__ import annotations

import array
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from confluent_kafka import Consumer, KafkaError, Producer
from workloads import queue_of

__all__ = [
    "PYRALLEL_VERSION",
    "Run",
    "produce",
    "pyrallel_python",
    "run_lite_push",
    "run_pyrallel",
    "run_serial",
]

PYRALLEL_VERSION = "1.0.0"
#: pyrallel's runner (the one ``bench_peers.py`` runs too).
RUNNER = HERE / "peers" / "pyrallel_runner.py"
#: lite_push's ``KafkaBroker(session_timeout=...)``: librdkafka's default session.timeout.ms.
SESSION_TIMEOUT = 45.0


@dataclass
class Run:
    """One consumer's run: its handler calls, by ``seq``."""

    consumer: str
    t0_ns: int = 0
    seq: array.array[int] = field(default_factory=lambda: array.array("q"))
    start_ns: array.array[int] = field(default_factory=lambda: array.array("q"))
    end_ns: array.array[int] = field(default_factory=lambda: array.array("q"))
    #: CPU seconds of the consumer's process from ``t0`` to the last message
    #: seen handled (every thread of it, librdkafka's too).
    cpu_s: float = 0.0
    #: What went wrong (a timeout, a crash), or None.
    error: str | None = None
    #: How it was configured, for the report.
    config: dict[str, object] = field(default_factory=dict)


def produce(bootstrap: str, topic: str, keys: list[str], queues: int, body_size: int) -> float:
    """Send message ``seq`` (value: ``seq`` 8 bytes big endian + padding;
    key: ``keys[seq]`` as UTF-8) to partition ``queue_of(key, queues)`` --
    the harness's producer (Java's hash, floorMod), not Kafka's default
    partitioner -- in ``seq`` order; wait for every delivery.  Returns the
    seconds it took."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": False})
    failed: list[str] = []

    def report(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            failed.append(str(err))

    pad = b"\0" * max(0, body_size - 8)
    t0 = time.perf_counter()
    for seq, key in enumerate(keys):
        while True:
            try:
                producer.produce(
                    topic,
                    seq.to_bytes(8, "big") + pad,
                    key.encode(),
                    partition=queue_of(key, queues),
                    on_delivery=report,
                )
                break
            except BufferError:  # the local queue is full: let deliveries drain
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(60)
    if left or failed:
        raise RuntimeError(f"producing {topic}: {left} undelivered, {len(failed)} failed ({failed[:3]})")
    return time.perf_counter() - t0


# -- the serial loop ----------------------------------------------------------------


def run_serial(bootstrap: str, topic: str, group: str, costs: list[int], timeout: float) -> Run:
    """One ``confluent_kafka.Consumer``, one message at a time."""
    total = len(costs)
    conf: dict[str, str | int | bool] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.offset.store": False,
    }
    run = Run("serial", config={"client": "confluent_kafka.Consumer", "handler": "time.sleep", **conf})
    seen = bytearray(total)
    distinct = 0
    seqs, starts, ends = run.seq, run.start_ns, run.end_ns
    clock, sleep = time.perf_counter_ns, time.sleep
    cpu0 = time.process_time()
    run.t0_ns = t0 = clock()
    deadline = t0 + int(timeout * 1e9)
    consumer = Consumer(conf)
    consumer.subscribe([topic])
    try:
        while distinct < total:
            if clock() > deadline:
                run.error = f"timeout after {timeout:g}s ({distinct} of {total} handled)"
                break
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                continue  # partition EOF and the like (none expected)
            seq = int.from_bytes(msg.value()[:8], "big")  # type: ignore[index]
            start = clock()
            cost = costs[seq]
            if cost:
                sleep(cost / 1e6)
            ends.append(clock())
            seqs.append(seq)
            starts.append(start)
            consumer.store_offsets(msg)
            if not seen[seq]:
                seen[seq] = 1
                distinct += 1
        run.cpu_s = time.process_time() - cpu0
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return run


# -- lite_push --------------------------------------------------------------------


def run_lite_push(
    bootstrap: str,
    topic: str,
    group: str,
    costs: list[int],
    timeout: float,
    lanes: int,
    executor: str,
    create_topic: Callable[[str, int], None],
) -> Run:
    """lite_push on its Kafka source, KEY_ORDERLY, ``lanes`` async lanes on
    ``executor`` (``uvloop`` or ``asyncio``)."""
    import asyncio

    from recorders import AsyncRecorder

    from lite_push import AsyncLitePushConsumer, ConsumeFromWhere, ConsumeMode, ConsumerConfig
    from lite_push.sources.kafka import KafkaBroker

    total = len(costs)
    config = ConsumerConfig(group=group, mode=ConsumeMode.KEY_ORDERLY, lanes=lanes, executor="asyncio")
    run = Run(
        "lite_push",
        config={
            "mode": "KEY_ORDERLY",
            "lanes": lanes,
            "executor": executor,
            "lane_placement": config.lane_placement,
            "session_timeout": SESSION_TIMEOUT,
            "listener": "async def (recorders.AsyncRecorder: await asyncio.sleep(cost))",
        },
    )
    rec = AsyncRecorder(costs)
    # session_timeout: 45 s, KafkaBroker's default (librdkafka's); stated so the run records it
    broker = KafkaBroker(bootstrap, topic_creator=create_topic, session_timeout=SESSION_TIMEOUT)
    try:
        cpu0 = time.process_time()
        run.t0_ns = t0 = time.perf_counter_ns()
        source = broker.pull_consumer(group, consume_from=ConsumeFromWhere.FIRST_OFFSET)
        consumer = AsyncLitePushConsumer(config, source=source, listener=rec)
        consumer.subscribe(topic)  # the source subscribes its client: the group join begins

        async def main() -> None:
            await consumer.start()
            try:
                while True:
                    stats = consumer.stats()
                    if stats.consumed + stats.dead_lettered >= total:
                        break
                    if stats.failure is not None:
                        run.error = f"consumer failed: {stats.failure}"
                        break
                    if time.perf_counter_ns() - t0 > timeout * 1e9:
                        run.error = f"timeout after {timeout:g}s ({stats.consumed} of {total} consumed)"
                        break
                    await asyncio.sleep(0.01)
                run.cpu_s = time.process_time() - cpu0
            finally:
                await consumer.shutdown(timeout=30)

        if executor == "uvloop":
            import uvloop

            uvloop.run(main())
        else:
            asyncio.run(main())
    finally:
        broker.close()
    table = rec.table("lite_push", [""] * total)  # (its key column is not used here)
    run.seq.extend(table.column("seq").to_pylist())
    run.start_ns.extend(table.column("start_ns").to_pylist())
    run.end_ns.extend(table.column("end_ns").to_pylist())
    return run


# -- pyrallel-consumer ------------------------------------------------------------------


def pyrallel_python(python: str | None = None) -> Path:
    """The python of pyrallel's venv (``benchmarks/out/peers/pyrallel-venv``,
    made from ``peers/pyrallel.requirements.txt`` when missing or stale,
    with ``python`` or the Python 3.12 the file names; ``peers/venvs.py``)."""
    from peers.venvs import VenvError, peer_python

    try:
        return peer_python("pyrallel", base=python)
    except VenvError as e:
        raise SystemExit(f"pyrallel-consumer's venv: {e}") from None


def run_pyrallel(
    python: Path,
    bootstrap: str,
    topic: str,
    group: str,
    costs: list[int],
    timeout: float,
    work_dir: Path,
    max_in_flight: int | None = None,
) -> Run:
    """pyrallel-consumer in ``peers/pyrallel_runner.py`` under ``python``
    (the venv's), started by ``peers/launch.py`` (in ``work_dir``, with the
    settings' environment variables removed, so no ``.env`` file or
    ``KAFKA_*`` variable changes its configuration); its calls are read back
    from the runner's OUT.json."""
    from peers.launch import launch

    settings = [] if max_in_flight is None else [f"max_in_flight={max_in_flight}"]
    out = launch(
        python,
        RUNNER,
        ["--bootstrap", bootstrap],
        topic=topic,
        group=group,
        costs_us=costs,
        work_dir=work_dir,
        timeout=timeout,
        cap=None,
        settings=settings,
    )
    run = Run("pyrallel", error=out.error)
    if out.data is None:
        return run
    run.t0_ns = out.data["t0_ns"]
    run.cpu_s = out.data["cpu_s"]
    run.config = out.data["config"]
    run.seq.extend(out.data["seq"])
    run.start_ns.extend(out.data["start_ns"])
    run.end_ns.extend(out.data["end_ns"])
    return run
