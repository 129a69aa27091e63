"""lite_push on the Redis Streams source: read rate, scaling over processes,
and fail-over time.  Every run starts its own redis-server on a free
loopback port (``lite_push.sources.redis_server``) and stops it by its PID.

    # raw XRANGE paging (hiredis) vs lite_push with a no-op listener, same run
    .venv/bin/python benchmarks/bench_redis.py read --messages 200000 --repeat 3

    # a gen_load workload consumed by 1, 2 and 3 consumer processes of one group
    .venv/bin/python benchmarks/bench_redis.py scale --workload benchmarks/out/sms --procs 1,2,3 --lanes 16

    # kill -9 one of three members; time until each of its queues is consumed again
    .venv/bin/python benchmarks/bench_redis.py failover --repeat 3

``read``: N messages (``--body`` bytes, default 16; 10,000 keys) are stored in a topic of 8
queues.  Then, alternating in one process and one run: the **raw** reader
pages every queue's stream with XRANGE (``--count`` entries per call, one
pipeline per round over all queues, hiredis parsing, nothing decoded further),
and **lite_push** consumes the topic with a fresh group from the first
offset (KEY_ORDERLY, ``--lanes`` lanes, ``pull_batch_size`` = ``--count``,
a listener that does nothing) until ``stats().consumed`` reaches N.  Rates
are N over wall seconds; the ratio is per repetition (same run, same data).

``scale``: the workload (``gen_load.py`` Parquet) is stored by key hash, as
``harness.py`` stores it in the embedded broker; then P member processes
(``member`` below) start, wait for a go signal, join the group (FIRST_OFFSET,
KEY_ORDERLY, ``--lanes`` lanes each), sleep each message's ``cost_us``, and
log every delivery (``harness.Recorder``).  The rate is N over the seconds
from the go signal to the end of the last delivery.  ``--check`` runs the
Spark check (``check_log.py``) on the merged logs: lost, duplicates, key
order inversions and concurrent deliveries of a key across processes.

``failover``: three members share 8 queues of a backlog large enough that
every queue is still busy when one member is killed with SIGKILL at a random
moment in steady state; for each queue it owned, the time from the kill to the
first delivery of that queue by a survivor.  Run with the broker's defaults
(session 30 s, heartbeat 10 s, rebalance 20 s) and with ``--session``,
``--heartbeat``, ``--rebalance`` to see how they bound it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import redis
import redis.utils

from lite_push import ConsumeFromWhere, ConsumeMode, ConsumerConfig, LitePushConsumer
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer

TOPIC = "BENCH"


def _median_range(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


# -- read: raw XRANGE vs lite_push, no-op listener -------------------------------------


def _raw_read(client: redis.Redis, keys: list[str], count: int) -> int:
    pos = dict.fromkeys(keys, "-")
    n = 0
    while pos:
        pipe = client.pipeline(transaction=False)
        order = list(pos)
        for k in order:
            start = pos[k]
            pipe.xrange(k, start if start == "-" else f"({start}", "+", count=count)
        for k, entries in zip(order, pipe.execute(), strict=True):
            if entries:
                n += len(entries)
                pos[k] = entries[-1][0].decode()
            if len(entries) < count:
                del pos[k]
    return n


def _lite_read(broker: RedisBroker, total: int, lanes: int, count: int) -> float:
    group = f"read-{uuid.uuid4().hex[:8]}"
    consumer = LitePushConsumer(
        ConsumerConfig(group=group, lanes=lanes, pull_batch_size=count, commit_interval=1.0, poll_timeout=0.1),
        source=broker.pull_consumer(group, consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=lambda msgs: None,
    )
    consumer.subscribe(TOPIC)
    t0 = time.perf_counter()
    consumer.start()
    while consumer.stats().consumed < total:
        time.sleep(0.01)
    seconds = time.perf_counter() - t0
    consumer.shutdown(timeout=30)
    return seconds


def cmd_read(args: argparse.Namespace) -> int:
    if not redis.utils.HIREDIS_AVAILABLE:
        raise SystemExit("hiredis is not installed (pip install '.[redis]')")
    total, queues = args.messages, 8
    rows = []
    with RedisServer(appendonly=False) as server:
        broker = RedisBroker(server.url, namespace="bench")
        broker.create_topic(TOPIC, queues)
        rnd = random.Random(7)
        body = b"\0" * args.body
        for start in range(0, total, 20_000):
            broker.send_batch(TOPIC, [(body, f"k{rnd.randrange(10_000)}") for _ in range(min(20_000, total - start))])
        keys = [broker.queue_key(TOPIC, q, "log") for q in range(queues)]
        client = redis.Redis.from_url(server.url)
        for count in args.count:
            raw_rates, lite_rates, ratios = [], [], []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                n = _raw_read(client, keys, count)
                raw = n / (time.perf_counter() - t0)
                assert n == total, (n, total)
                lite = total / _lite_read(broker, total, args.lanes, count)
                raw_rates.append(raw)
                lite_rates.append(lite)
                ratios.append(lite / raw)
                print(json.dumps({"count": count, "raw": raw, "lite": lite, "ratio": lite / raw}), file=sys.stderr)
            rows.append((count, raw_rates, lite_rates, ratios))
        client.close()
        broker.close()
    print(
        f"{total:,} messages of {args.body} B, 8 queues, KEY_ORDERLY {args.lanes} lanes, no-op listener; "
        f"median (min-max) of {args.repeat}\n"
    )
    print("| XRANGE count / pull_batch_size | raw XRANGE msg/s | lite_push msg/s | lite_push / raw |")
    print("|---:|---:|---:|---:|")
    for count, raw_rates, lite_rates, ratios in rows:
        print(
            f"| {count} | {_median_range(raw_rates)} | {_median_range(lite_rates)} | "
            f"{statistics.median(ratios):.0%} ({min(ratios):.0%}-{max(ratios):.0%}) |"
        )
    return 0


# -- member: one consumer process (scale, failover) -------------------------------------


def cmd_member(args: argparse.Namespace) -> int:
    """Wait for the go key, consume until SIGTERM, write the log."""
    import pyarrow.parquet as pq
    from harness import Recorder

    keys = pq.read_table(args.workload, columns=["seq", "key"]).sort_by("seq").column("key").to_pylist()
    costs_t = pq.read_table(args.workload, columns=["seq", "cost_us"]).sort_by("seq")
    costs = costs_t.column("cost_us").to_pylist()
    broker = RedisBroker(
        args.url,
        namespace=args.namespace,
        session_timeout=args.session,
        heartbeat_interval=args.heartbeat,
        rebalance_interval=args.rebalance,
    )
    rec = Recorder(costs)
    consumer = LitePushConsumer(
        ConsumerConfig(group="bench", mode=ConsumeMode.KEY_ORDERLY, lanes=args.lanes, commit_interval=0.2),
        source=broker.pull_consumer("bench", consume_from=ConsumeFromWhere.FIRST_OFFSET, client_id=args.client_id),
        listener=rec,
    )
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    ready = redis.Redis.from_url(args.url)
    ready.rpush(f"{args.namespace}:ready", args.client_id)
    ready.blpop([f"{args.namespace}:go:{args.client_id}"], timeout=600)
    consumer.subscribe(TOPIC)
    consumer.start()
    while not stop:
        time.sleep(0.05)
    consumer.shutdown(timeout=30)
    broker.close()
    if args.log:
        table = rec.table(args.run, keys)
        Path(args.log).mkdir(parents=True, exist_ok=True)
        pq.write_table(table, Path(args.log) / f"{args.run}-{args.client_id}.parquet")
    return 0


def _spawn(
    url: str,
    ns: str,
    workload: Path,
    cid: str,
    lanes: int,
    run: str,
    log: Path | None,
    session: float,
    heartbeat: float,
    rebalance: float,
) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "member",
        "--url",
        url,
        "--namespace",
        ns,
        "--workload",
        str(workload),
        "--client-id",
        cid,
        "--lanes",
        str(lanes),
        "--run",
        run,
        "--session",
        str(session),
        "--heartbeat",
        str(heartbeat),
        "--rebalance",
        str(rebalance),
    ]
    if log is not None:
        cmd += ["--log", str(log)]
    return subprocess.Popen(cmd)


def _load(broker: RedisBroker, workload: Path, queues: int) -> int:
    from harness import load

    class Chunked:  # send in chunks: one call per 20,000 messages
        def __init__(self, b: RedisBroker) -> None:
            self.b = b

        def create_topic(self, topic: str, queue_count: int) -> None:
            self.b.create_topic(topic, queue_count)

        def send_batch(self, topic: str, items: list[tuple[bytes, str]]) -> None:
            for i in range(0, len(items), 20_000):
                self.b.send_batch(topic, items[i : i + 20_000])

    keys, _costs, _fails = load(Chunked(broker), workload, queues)  # type: ignore[arg-type]
    return len(keys)


def _start_members(
    server: RedisServer,
    ns: str,
    workload: Path,
    n: int,
    lanes: int,
    run: str,
    log: Path | None,
    session: float,
    heartbeat: float,
    rebalance: float,
) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    cids = [f"m{i}" for i in range(n)]
    procs = [_spawn(server.url, ns, workload, c, lanes, run, log, session, heartbeat, rebalance) for c in cids]
    client = redis.Redis.from_url(server.url)
    for _ in cids:  # every member imported, connected and waiting
        if client.blpop([f"{ns}:ready"], timeout=120) is None:
            raise SystemExit("a member did not start")
    client.close()
    return procs, cids


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(120)


def _committed_total(broker: RedisBroker) -> int:
    total = 0
    for q in broker.queues(TOPIC):
        c = broker.committed("bench", q)
        total += c.offset if c is not None else 0
    return total


def cmd_scale(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    meta = json.loads((args.workload / "_workload.json").read_text())
    queues = int(meta["queues"])
    log_root = Path(tempfile.mkdtemp(prefix="lite-push-redis-scale-")) if args.log is None else args.log
    results: list[dict[str, object]] = []
    for rep in range(args.repeat):
        for n in args.procs:
            run = f"redis-{n}p-{args.lanes}"
            ns = f"scale-{uuid.uuid4().hex[:6]}"
            log = log_root / f"{run}-r{rep}"
            with RedisServer() as server:  # AOF, fsync always: the default durable server
                broker = RedisBroker(server.url, namespace=ns)
                total = _load(broker, args.workload, queues)
                procs, cids = _start_members(server, ns, args.workload, n, args.lanes, run, log, 30.0, 10.0, 20.0)
                go_ns = time.perf_counter_ns()
                for c in cids:
                    broker.client.rpush(f"{ns}:go:{c}", 1)
                while _committed_total(broker) < total:
                    time.sleep(0.05)
                _stop(procs)
                broker.close()
            table = pq.read_table(log)
            last = max(table.column("end_ns").to_pylist())
            seconds = (last - go_ns) / 1e9
            res = {
                "run": run,
                "procs": n,
                "lanes": args.lanes,
                "messages": total,
                "deliveries": table.num_rows,
                "seconds": seconds,
                "rate": total / seconds,
                "log": str(log),
            }
            print(json.dumps(res), file=sys.stderr)
            results.append(res)
    checks: dict[str, dict[str, object]] = {}
    if args.check:
        from check_log import check
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.master("local[2]").appName("redis-scale-check").getOrCreate()
        try:
            for r in results:
                for row in check(spark, args.workload, [r["log"]]):
                    checks[str(r["log"])] = row
        finally:
            spark.stop()
    base: dict[int, float] = {}
    for r in results:
        if r["procs"] == min(args.procs):
            base.setdefault(0, float(r["rate"]))  # type: ignore[arg-type]
    print(
        f"workload {args.workload.name}: {results[0]['messages']:,} messages, {queues} queues; "
        f"KEY_ORDERLY {args.lanes} lanes per process; repeat {args.repeat}\n"
    )
    print("| processes | msg/s | vs 1 process | deliveries | check |")
    print("|---:|---:|---:|---:|---|")
    by_n: dict[int, list[dict[str, object]]] = {}
    for r in results:
        by_n.setdefault(int(r["procs"]), []).append(r)  # type: ignore[call-overload]
    one = statistics.median(float(r["rate"]) for r in by_n[min(by_n)])  # type: ignore[arg-type]
    for n, rs in sorted(by_n.items()):
        rates = [float(r["rate"]) for r in rs]  # type: ignore[arg-type]
        cells = []
        for r in rs:
            c = checks.get(str(r["log"]))
            if c is not None:
                cells.append(
                    f"lost {c['lost']}, dup {c['duplicates']}, inversions {c['inversions']}, "
                    f"concurrent {c['concurrent']}"
                )
        print(
            f"| {n} | {_median_range(rates)} | {statistics.median(rates) / one:.2f}x | "
            f"{'/'.join(str(r['deliveries']) for r in rs)} | {'; '.join(cells) or '-'} |"
        )
    return 0


def cmd_failover(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    gaps: list[float] = []
    takes: list[float] = []
    lines = []
    for rep in range(args.repeat):
        ns = f"fo-{uuid.uuid4().hex[:6]}"
        log = Path(tempfile.mkdtemp(prefix="lite-push-redis-failover-"))
        with RedisServer() as server:
            broker = RedisBroker(server.url, namespace=ns)
            total = _load(broker, args.workload, 8)
            procs, cids = _start_members(
                server, ns, args.workload, 3, args.lanes, "failover", log, args.session, args.heartbeat, args.rebalance
            )
            for c in cids:
                broker.client.rpush(f"{ns}:go:{c}", 1)
            # steady state: past the first heartbeats, at a random phase of the victim's heartbeat
            time.sleep(args.settle + random.uniform(0, args.heartbeat))
            victim = procs[rep % 3]
            victim_id = cids[rep % 3]
            owned = [
                q
                for q in broker.queues(TOPIC)
                if broker.client.get(broker.group_key("bench", f"owner:{TOPIC}#{q.queue_id}")) == victim_id.encode()
            ]
            kill_ns = time.perf_counter_ns()
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(10)
            deadline = time.monotonic() + args.session * 3 + args.rebalance + 30
            taken_at: dict[int, float] = {}
            while time.monotonic() < deadline and len(taken_at) < len(owned):
                for q in owned:
                    t = broker.client.get(broker.group_key("bench", f"owner:{TOPIC}#{q.queue_id}"))
                    if t is not None and t != victim_id.encode() and q.queue_id not in taken_at:
                        taken_at[q.queue_id] = (time.perf_counter_ns() - kill_ns) / 1e9
                time.sleep(0.02)
            time.sleep(1.0)  # a little consumption on the moved queues
            _stop([p for p in procs if p is not victim])
            committed = _committed_total(broker)
            broker.close()
        table = pq.read_table(log).to_pydict()
        firsts = []
        for q in owned:
            pairs = zip(table["start_ns"], table["queue"], strict=True)
            starts = [s for s, qq in pairs if qq == q.queue_id and s > kill_ns]
            if not starts:
                raise SystemExit(f"queue {q.queue_id} was not consumed again after the kill")
            firsts.append((min(starts) - kill_ns) / 1e9)
        gaps += firsts
        takes += [taken_at[q.queue_id] for q in owned]
        lines.append(
            f"| {rep + 1} | {victim_id} | {', '.join(str(q.queue_id) for q in owned)} | "
            f"{', '.join(f'{taken_at[q.queue_id]:.1f}' for q in owned)} | "
            f"{', '.join(f'{g:.1f}' for g in firsts)} | {committed:,} of {total:,} |"
        )
    print(
        f"session {args.session} s, heartbeat {args.heartbeat} s, rebalance {args.rebalance} s; "
        f"3 members, 8 queues, KEY_ORDERLY {args.lanes} lanes each\n"
    )
    print(
        "| try | killed | its queues | s until a survivor owned each | s until its first delivery there "
        "| committed at stop |"
    )
    print("|---:|---|---|---|---|---|")
    print("\n".join(lines))
    print(
        f"\nowned again: median {statistics.median(takes):.1f} s, max {max(takes):.1f} s; "
        f"consumed again: median {statistics.median(gaps):.1f} s, max {max(gaps):.1f} s"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("read", help="raw XRANGE vs lite_push, no-op listener")
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--lanes", type=int, default=16)
    p.add_argument("--count", type=lambda s: [int(x) for x in s.split(",")], default=[32, 256])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--body", type=int, default=16, help="body bytes")
    p = sub.add_parser("scale", help="a workload over 1..P member processes")
    p.add_argument("--workload", type=Path, required=True)
    p.add_argument("--procs", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3])
    p.add_argument("--lanes", type=int, default=16)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--log", type=Path)
    p.add_argument("--check", action="store_true", help="Spark check of the merged logs")
    p = sub.add_parser("failover", help="kill -9 one of three members")
    p.add_argument("--workload", type=Path, required=True)
    p.add_argument("--lanes", type=int, default=16)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--session", type=float, default=30.0)
    p.add_argument("--heartbeat", type=float, default=10.0)
    p.add_argument("--rebalance", type=float, default=20.0)
    p.add_argument("--settle", type=float, default=3.0, help="seconds of consumption before the kill (plus jitter)")
    p = sub.add_parser("member", help="(internal) one consumer process")
    for name, kind in (
        ("--url", str),
        ("--namespace", str),
        ("--workload", Path),
        ("--client-id", str),
        ("--lanes", int),
        ("--run", str),
        ("--log", str),
        ("--session", float),
        ("--heartbeat", float),
        ("--rebalance", float),
    ):
        p.add_argument(name, type=kind)
    args = parser.parse_args(argv)
    return {"read": cmd_read, "scale": cmd_scale, "failover": cmd_failover, "member": cmd_member}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
