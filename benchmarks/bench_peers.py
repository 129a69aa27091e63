"""Side by side with the Python consumers users pick instead (issue 31):
every peer on the same brokers, the same messages, one run.

    .venv/bin/python benchmarks/bench_peers.py --markdown --chart benchmarks/charts/peers.png   # the whole grid
    .venv/bin/python benchmarks/bench_peers.py --shapes kpipe-10ms --peers lite_push_kafka,serial --repeat 1
    .venv/bin/python benchmarks/bench_peers.py --set lite_push_kafka:lanes=4096 --set pyrallel:max_in_flight=4000

Brokers: one librdkafka mock cluster (``MockKafkaCluster``, one broker) for
every Kafka peer and one ``redis-server`` (``RedisServer``, no AOF) for the
Redis peers, both started here on 127.0.0.1 and stopped by their PID at the
end.  A peer that asks for an initial rebalance delay (``peers/catalog.py``'s
``REBALANCE_DELAY_MS``: quixstreams, 3,000 ms, so its replicas form their
group's first generation together) runs on one more mock cluster with that
delay, started only when such a peer is selected and filled like the first.
Peers (``peers/catalog.py``): every ``peers/<name>_runner.py``, each run
as a subprocess by the python of its own venv (``peers/venvs.py`` makes
``benchmarks/out/peers/<name>-venv`` from ``peers/<name>.requirements.txt``
when missing; lite_push's runners and the floor use this project's python),
plus the peers of ``peers/UNRUNNABLE.md``, whose rows give their reason; so
does a peer whose venv cannot be made.  A variant of ``catalog.ON_REQUEST``
runs only when ``--peers`` names it.  The floor (``floor_runner.py``, issue
40) reads no broker: it gets the messages' keys by file and runs each key's
messages in ``seq`` order on a task per key, so every other row can be read
against it.  The protocol a runner follows is ``peers/runner_protocol.py``'s
docstring.

Per shape (``peers/shapes.py``: ``kpipe-1ms``, ``kpipe-10ms``,
``kpipe-100ms``, ``io5``, ``io1``), the messages are stored once before any
peer runs (a backlog; ``peers/loading.py``): a Kafka topic of the shape's
partition count (a key's partition ``queue_of(key, partitions)``), lite_push's
Redis topic of as many queues, and one Redis stream in faststream's format.
``--messages`` takes one count for every shape or ``SHAPE=N`` pairs.
Then ``--repeat`` rounds; in each, every peer consumes its topic from the
start with a group of its own, one peer at a time, the order rotated each
round.  A runner stops when it handled every message, or ``--cap`` seconds
after it started (a capped run: its rate is over what it handled, its
``lost`` from what its group committed), or at ``--timeout`` (an error).
After it exits, its group's committed offsets are read
(``peers/committed.py``) and the run is checked (``peers/measure.py``: rate,
share of the hot-key bound, p99 latency, CPU, peak RSS, lost, duplicates,
order violations, same-key overlaps).  ``--json`` keeps every run,
``--markdown`` prints RESULTS.md's table (``peers/report.py``), ``--chart``
draws throughput per peer per shape with the bound.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from bench_kafka import rounds_order
from peers.catalog import ON_REQUEST, Peer, discover, unrunnable
from peers.committed import kafka_acked, lite_push_redis_acked, stream_group_acked
from peers.launch import launch
from peers.loading import Placement, fill_faststream_redis, fill_lite_push_redis, place_nowhere, produce_kafka
from peers.measure import measure
from peers.report import chart, markdown, summarize
from peers.shapes import SHAPES, Messages, messages_of
from peers.venvs import VenvError, peer_python

WORK = HERE / "out" / "peers"


def _pairs(values: list[str], what: str) -> dict[str, list[str]]:
    """``PEER:KEY=VALUE`` (``--set``) or ``PEER=PATH`` (``--python``) by peer."""
    out: dict[str, list[str]] = {}
    for value in values:
        peer, sep, rest = value.partition(":" if what == "--set" else "=")
        if not sep or not peer or not rest or (what == "--set" and "=" not in rest):
            form = "PEER:KEY=VALUE" if what == "--set" else "PEER=PATH"
            raise SystemExit(f"{what} {value!r}: expected {form}")
        out.setdefault(peer, []).append(rest)
    return out


def _messages(value: str) -> dict[str, int]:
    """``--messages``: ``N`` (every shape, key ``"*"``) or ``SHAPE=N,...``."""
    out = {}
    try:
        for part in value.split(","):
            shape, sep, count = part.strip().rpartition("=")
            out[shape if sep else "*"] = int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: N or SHAPE=N[,SHAPE=N...]") from None
    if any(n < 1 for n in out.values()):
        raise argparse.ArgumentTypeError(f"{value!r}: counts are 1 or more")
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated (default {','.join(SHAPES)})")
    parser.add_argument("--peers", help="comma-separated (default: every runner and UNRUNNABLE.md's peers)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the table gives medians (default 3)")
    parser.add_argument("--cap", type=float, default=20.0, help="seconds after which a run stops (default 20)")
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds before a run is an error (default 120; killed 60 s later)"
    )
    parser.add_argument(
        "--messages",
        type=_messages,
        default={},
        help="messages per shape instead of its default: N for every shape, or SHAPE=N[,SHAPE=N...]",
    )
    parser.add_argument("--set", action="append", default=[], metavar="PEER:KEY=VALUE", help="a peer's setting")
    parser.add_argument("--python", action="append", default=[], metavar="PEER=PATH", help="run PEER with PATH")
    parser.add_argument("--json", type=Path, help="every run (default benchmarks/out/peers/bench_peers-<time>.json)")
    parser.add_argument("--markdown", action="store_true", help="print RESULTS.md's table on stdout")
    parser.add_argument("--chart", type=Path, help="write the throughput chart (PNG) here")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.cap <= 0:
        raise SystemExit("--repeat >= 1 and --cap > 0")
    return args


def _pythons(peers: dict[str, Peer], overrides: dict[str, list[str]], not_run: dict[str, str]) -> dict[str, str]:
    """Each runnable peer's python; a peer whose venv fails goes to ``not_run``."""
    out = {}
    for name, peer in peers.items():
        if name in overrides:
            out[name] = overrides[name][-1]
        elif peer.requirements is None:
            out[name] = sys.executable
        else:
            try:
                out[name] = str(peer_python(peer.base or name))
            except VenvError as e:
                not_run[name] = str(e)
    return out


class Brokers:
    """The mock clusters and the redis-server of the run, and each shape's
    filled topics (:meth:`fill`).

    One mock cluster without an initial rebalance delay for every Kafka
    peer, and one more per delay a selected peer asks for
    (``Peer.rebalance_delay_ms``: quixstreams' 3,000 ms), started only then.
    Each shape's topic is created and produced into every cluster in use
    (same name, keys and partitions; its own :class:`Placement` per cluster,
    since offsets and send times are the producer's); a peer reads, and its
    group's commit is read, on its own cluster.  A filled topic's slot
    (:meth:`slot`) is the peer's source, ``kafka@<ms>ms`` for a delayed
    cluster."""

    def __init__(self, stack: ExitStack, kafka_delays: set[int], redis_: bool) -> None:
        self.clusters: dict[int, Any] = {}  # initial rebalance delay (ms) -> its MockKafkaCluster
        self.redis_url = ""
        if kafka_delays:
            from lite_push.sources.kafka.mock_cluster import MockKafkaCluster

            for delay in sorted(kafka_delays):
                cluster = stack.enter_context(MockKafkaCluster(brokers=1, rebalance_delay_ms=delay))
                self.clusters[delay] = cluster
                why = f" (initial rebalance delay {delay:,} ms)" if delay else ""
                print(f"mock Kafka cluster pid {cluster.pid} on {cluster.bootstrap}{why}", file=sys.stderr)
        if redis_:
            import redis

            from lite_push.sources.redis import RedisBroker
            from lite_push.sources.redis_server import RedisServer

            server = stack.enter_context(RedisServer(appendonly=False))
            self.redis_url = server.url
            self.client = stack.enter_context(redis.Redis.from_url(server.url))
            self.broker = stack.enter_context(RedisBroker(server.url))
            print(f"redis-server pid {server.pid} on {server.url}", file=sys.stderr)

    @staticmethod
    def slot(peer: Peer) -> str:
        """Which filled topic ``peer`` reads: its source, and for a Kafka
        peer on a delayed cluster ``kafka@<ms>ms``."""
        if peer.source == "kafka" and peer.rebalance_delay_ms:
            return f"kafka@{peer.rebalance_delay_ms}ms"
        return peer.source

    def cluster_of(self, peer: Peer) -> Any:
        return self.clusters[peer.rebalance_delay_ms]

    def fill(self, msgs: Messages, slots: set[str], stamp: str) -> dict[str, tuple[str, Placement]]:
        """Store the shape's messages once per slot (:meth:`slot`): ``slot -> (topic, placement)``."""
        w = msgs.workload
        out: dict[str, tuple[str, Placement]] = {}
        for delay, cluster in self.clusters.items():
            slot = f"kafka@{delay}ms" if delay else "kafka"
            if slot in slots:
                topic = f"peers-{w.name}-{stamp}"
                cluster.create_topic(topic, w.queues)
                out[slot] = (topic, produce_kafka(cluster.bootstrap, topic, msgs.keys, w.queues, w.body_size))
        if "lite_push_redis" in slots:
            topic = f"peers-{w.name}-{stamp}"
            placed = fill_lite_push_redis(self.broker, topic, msgs.keys, w.queues, w.body_size)
            out["lite_push_redis"] = (topic, placed)
        if "none" in slots:
            out["none"] = (f"nowhere-{w.name}-{stamp}", place_nowhere(msgs.keys, w.queues))
        if "faststream_redis" in slots:
            from peers.redis_streams import fill_faststream_stream  # faststream's runner's module

            stream = f"faststream-{w.name}-{stamp}"
            placed = fill_faststream_redis(self.client, stream, msgs.keys, w.body_size, fill_faststream_stream)
            out["faststream_redis"] = (stream, placed)
        for slot, (topic, placed) in out.items():
            if slot == "none":
                continue
            print(f"{w.name}: {len(msgs.keys):,} messages to {slot} {topic} in {placed.seconds:.1f}s", file=sys.stderr)
        return out

    def broker_args(self, peer: Peer) -> list[str]:
        if peer.broker == "kafka":
            return ["--bootstrap", self.cluster_of(peer).bootstrap]
        if peer.broker == "none":
            return []  # launch adds --keys
        return ["--redis", self.redis_url]

    def acked(self, peer: Peer, topic: str, group: str, placed: Placement) -> bytearray | None:
        """What the peer's group committed (None when it cannot be read;
        nothing for a peer without a broker)."""
        if peer.source == "none":
            return bytearray(len(placed.part))
        try:
            if peer.source == "kafka":
                return kafka_acked(self.cluster_of(peer).bootstrap, topic, group, placed)
            if peer.source == "lite_push_redis":
                return lite_push_redis_acked(self.broker, topic, group, placed)
            return stream_group_acked(self.client, topic, group, placed)
        except Exception as e:  # the row says '-', and here why
            print(f"  {peer.name}: committed offsets not read ({type(e).__name__}: {e})", file=sys.stderr)
            return None

    def clear_redis(self) -> None:
        if self.redis_url:
            self.client.flushall()


def progress_line(rnd: int, row: dict[str, Any]) -> str:
    if "seconds" not in row:
        return f"  round {rnd + 1} {row['peer']:18s} ERROR {row['error']}"
    line = (
        f"  round {rnd + 1} {row['peer']:18s} {row['rate']:>9,.0f} msg/s ({row['of_bound']:.0%} of bound) "
        f"{row['handled']:,} handled{' (capped)' if row['capped'] else ''}, "
        f"first call at {row['first_call_ms'] or 0:,.0f} ms, p99 {row['p99_ms'] or 0:,.0f} ms, "
        f"CPU {row['cpu_s'] or 0:.1f} s, RSS {row['peak_rss_mb'] or 0:.0f} MB, committed {row['committed']}, "
        f"lost {row['lost']} "
        f"dup {row['duplicates']} order {row['order_violations']} overlap {row['overlaps']}"
    )
    return line + (f"  ERROR {row['error']}" if row["error"] else "")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    found, not_run = discover(), unrunnable()
    everyone = [*(p for p in found if p not in ON_REQUEST), *not_run]
    wanted = [p.strip() for p in args.peers.split(",") if p.strip()] if args.peers else everyone
    unknown = set(wanted) - set(found) - set(not_run)
    if unknown or not wanted:
        raise SystemExit(f"--peers: unknown {sorted(unknown)}; known: {', '.join([*found, *not_run])}")
    not_run = {p: r for p, r in not_run.items() if p in wanted and p not in found}
    settings, overrides = _pairs(args.set, "--set"), _pairs(args.python, "--python")
    pythons = _pythons({p: found[p] for p in wanted if p in found}, overrides, not_run)
    peers = [found[p] for p in wanted if p in pythons]
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "loadavg_at_start": os.getloadavg(),
        "not_run": not_run,
        "shapes": {},
    }
    t_start = time.perf_counter()
    with ExitStack() as stack:
        delays = {p.rebalance_delay_ms for p in peers if p.broker == "kafka"}
        brokers = Brokers(stack, delays, any(p.broker == "redis" for p in peers))
        for shape in shapes:
            msgs = messages_of(shape, args.messages.get(shape, args.messages.get("*")))
            print(f"{shape}: hot-key bound {msgs.hot_key_rate:,.0f} msg/s", file=sys.stderr)
            slots = {brokers.slot(p) for p in peers}
            try:
                filled = brokers.fill(msgs, slots, stamp)
            except ImportError as e:  # faststream's filler is not there: its peers do not run
                missing = {p.name: f"no Redis stream filler ({e})" for p in peers if p.source == "faststream_redis"}
                not_run.update(missing)
                filled = brokers.fill(msgs, slots - {"faststream_redis"}, stamp)
            runnable = [p for p in peers if brokers.slot(p) in filled]
            runs: dict[str, list[dict[str, Any]]] = {p.name: [] for p in runnable}
            for rnd in range(args.repeat):
                for name in rounds_order([p.name for p in runnable], rnd):
                    peer = found[name]
                    topic, placed = filled[brokers.slot(peer)]
                    group = f"{name}-{shape}-{stamp}-{rnd}"
                    gc.collect()
                    result = launch(
                        pythons[name],
                        peer.runner,
                        brokers.broker_args(peer),
                        topic=topic,
                        group=group,
                        costs_us=msgs.costs_us,
                        work_dir=WORK / "runs",
                        timeout=args.timeout,
                        cap=args.cap,
                        settings=[*peer.settings, *settings.get(name, [])],
                        project_python=peer.requirements is None,
                        keys=msgs.keys if peer.broker == "none" else None,
                    )
                    acked = brokers.acked(peer, topic, group, placed)
                    try:
                        row = measure(name, result.data, result.error, msgs.keys, placed, acked, msgs.hot_key_rate)
                    except (KeyError, TypeError, ValueError) as e:  # an OUT.json not to the protocol
                        error = f"OUT.json not to the protocol: {type(e).__name__}: {e}"
                        row = measure(name, None, error, msgs.keys, placed, acked, msgs.hot_key_rate)
                    row |= {"round": rnd, "wall_s": result.wall_s}
                    runs[name].append(row)
                    print(progress_line(rnd, row), file=sys.stderr)
            out["shapes"][shape] = {
                "messages": len(msgs.keys),
                "partitions": msgs.workload.queues,
                "workload": msgs.workload.to_dict(),
                "hot_key_rate": msgs.hot_key_rate,
                "summary": {name: summarize(rows, msgs.hot_key_rate) for name, rows in runs.items()},
                "runs": runs,
            }
            brokers.clear_redis()
    out["seconds"] = time.perf_counter() - t_start
    path = args.json or WORK / f"bench_peers-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=str))
    print(f"every run: {path} ({out['seconds']:.0f} s in all)", file=sys.stderr)
    if args.markdown:
        print(markdown(out["shapes"], not_run))
    if args.chart:
        chart(out["shapes"], args.chart)
        print(f"chart: {args.chart}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
