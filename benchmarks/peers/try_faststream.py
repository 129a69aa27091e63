"""Try the faststream runners alone, before the orchestrator runs them.

Run with the project's venv from the repository root:

    PYTHONPATH=$PWD .venv/bin/python benchmarks/peers/try_faststream.py kafka \\
        --messages 3000 --cost-ms 10 --set mode=per_partition

``kafka``: librdkafka's mock cluster, a topic of ``--partitions``
partitions filled with ``kafka_peers.produce``; ``redis``: a
``RedisServer(appendonly=False)``, one stream filled with
``redis_streams.fill_faststream_stream``.  ``--keys`` keys drawn uniformly,
every message costs ``--cost-ms``.  The runner runs with the python of
``benchmarks/out/peers/faststream_<broker>-venv`` (made from the
requirements file when missing); its OUT.json is checked with
``bench_kafka.check`` and summed up on one line, with the group's
acknowledgements against the handled messages: Kafka, every ``seq`` below
its partition's committed offset; Redis, every entry delivered and no
longer pending (``redis_streams.committed_position``).  "acked but
unhandled" must be 0.
"""

from __future__ import annotations

import argparse
import array
import json
import random
import subprocess
import sys
import time
from pathlib import Path

PEERS = Path(__file__).resolve().parent
BENCH = PEERS.parent
for path in (str(BENCH), str(PEERS)):
    if path not in sys.path:
        sys.path.insert(0, path)

from bench_kafka import check
from partition import hot_key_rate


def venv_python(name: str) -> Path:
    """The runner's venv python, made from its requirements file when missing."""
    venv = BENCH / "out" / "peers" / f"{name}-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        requirements = PEERS / f"{name}.requirements.txt"
        version = requirements.read_text().splitlines()[0].split()[-1]
        base = Path.home() / ".pyenv" / "versions"
        interpreter = next(iter(sorted(base.glob(f"{version}.*"), reverse=True)), None)
        if interpreter is None:
            raise SystemExit(f"no Python {version} under {base}")
        subprocess.run([interpreter / "bin" / "python", "-m", "venv", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", "-r", requirements], check=True)
    return python


def kafka_acked_seqs(bootstrap: str, topic: str, group: str, partitions: int) -> set[int]:
    """The seqs below the group's committed offset of their partition (read
    with the group's id, never joining it nor committing)."""
    from confluent_kafka import Consumer, TopicPartition

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        committed = {tp.partition: tp.offset for tp in reader.committed(parts, timeout=10)}
        reader.assign([TopicPartition(topic, p, 0) for p in range(partitions) if committed[p] > 0])
        left = {p: o for p, o in committed.items() if o > 0}
        seqs: set[int] = set()
        while left:
            msg = reader.poll(5.0)
            if msg is None:
                raise RuntimeError(f"reading {topic} back: nothing for 5 s, {left} left")
            if msg.error() or msg.offset() >= left.get(msg.partition(), 0):
                continue
            seqs.add(int.from_bytes(msg.value()[:8], "big"))
            if msg.offset() + 1 >= left[msg.partition()]:
                del left[msg.partition()]
        return seqs
    finally:
        reader.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("broker", choices=["kafka", "redis"])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--cost-ms", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--cap", type=float)
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()

    rng = random.Random(31)
    keys = [f"key-{rng.randrange(args.keys)}" for _ in range(args.messages)]
    costs = [round(args.cost_ms * 1000)] * args.messages
    work = BENCH / "out" / "peers" / "try"
    work.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%H%M%S")
    costs_file = work / f"costs-{stamp}.bin"
    costs_file.write_bytes(array.array("q", costs).tobytes())
    out = work / f"{args.broker}-{stamp}.json"
    name = f"faststream_{args.broker}"
    python = venv_python(name)
    topic, group = f"t-{stamp}", f"g-{stamp}"
    common = [
        "--topic",
        topic,
        "--group",
        group,
        "--costs",
        str(costs_file),
        "--out",
        str(out),
        "--timeout",
        str(args.timeout),
        *(["--cap", str(args.cap)] if args.cap else []),
        *(x for s in args.set for x in ("--set", s)),
    ]
    runner = str(PEERS / f"{name}_runner.py")
    if args.broker == "kafka":
        from kafka_peers import produce

        from lite_push.sources.kafka.mock_cluster import MockKafkaCluster

        with MockKafkaCluster() as cluster:
            cluster.create_topic(topic, args.partitions)
            produce(cluster.bootstrap, topic, keys, args.partitions, 64)
            t = time.perf_counter()
            done = subprocess.run([python, runner, "--bootstrap", cluster.bootstrap, *common])
            wall = time.perf_counter() - t
            committed = kafka_acked_seqs(cluster.bootstrap, topic, group, args.partitions)
    else:
        import redis
        from redis_streams import committed_position, fill_faststream_stream

        from lite_push.sources.redis_server import RedisServer

        pad = b"\0" * 56
        with RedisServer(appendonly=False) as server:
            client = redis.Redis.from_url(server.url)
            fill_faststream_stream(client, topic, [(k, s.to_bytes(8, "big") + pad) for s, k in enumerate(keys)])
            t = time.perf_counter()
            done = subprocess.run([python, runner, "--redis", server.url, *common])
            wall = time.perf_counter() - t
            position = committed_position(client, topic, group)
            client.close()
    result = json.loads(out.read_text())
    found = check(keys, result["seq"], result["start_ns"], result["end_ns"])
    if args.broker == "redis":
        acked_past = len(set(position.acknowledged_seqs) - set(result["seq"]))
        pending = len(position.pending_ids)
    else:
        acked_past, pending = len(committed - set(result["seq"])), args.messages - len(committed)
    handled = args.messages - found.lost
    secs = (max(result["end_ns"]) - result["t0_ns"]) / 1e9 if result["end_ns"] else float("nan")
    first = (min(result["start_ns"]) - result["t0_ns"]) / 1e9 if result["start_ns"] else float("nan")
    print(
        f"{name} {' '.join(args.set)}: rc {done.returncode}, {handled / secs:,.0f} msg/s "
        f"({handled / secs / hot_key_rate(keys, costs):.0%} of hot-key bound), {secs:.2f} s (first call {first:.2f} s, "
        f"process {wall:.1f} s), CPU {result['cpu_s']:.2f} s, RSS {result['peak_rss_kb'] / 1024:.0f} MiB, "
        f"{found}, capped {result['capped']}, error {result['error']}"
        + f", acked but unhandled {acked_past}, not acked {pending}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
