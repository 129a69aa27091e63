"""What message-grain balancing (``Balance.MESSAGE``) costs in round trips
and server time, against queue balancing, on one redis-server (issue 28,
item 3).

    .venv/bin/python benchmarks/grain_costs.py --messages 20000

1. **Per message, one consumer**: a LitePushConsumer (no-op listener, 8
   lanes) consumes ``--messages`` messages of a 4-queue topic, once balanced
   by queue and once by message; every round trip the process makes to Redis
   is counted (redis-py's ``Pipeline.execute`` and every command sent outside
   a pipeline), and from the server's ``INFO``: the commands it ran (those
   inside scripts too) and its CPU time (``used_cpu_user + used_cpu_sys``,
   of the consuming only: the messages are stored before).  Printed per
   1,000 messages.
2. **Each call alone**, on raw members (``RedisPullConsumer``), timed
   client-side over many calls: a DISPATCH of 32 new messages, a DISPATCH
   that finds nothing, an ACK of 32, a session renewal of a paused queue
   (RENEW), and the DISPATCH that reclaims a lapsed member's 1,000
   delivered messages (its first call after the session ran out).
3. **Where the server's time goes**, by message: each command's share of
   the server's time in the last run balanced by message (``INFO
   commandstats``: ``evalsha`` is the scripts' whole time, the commands
   the scripts call are counted again under their own names), in µs per
   message.
4. **On a Redis Cluster** (``--cluster``, three masters started here): the
   same consumer on a topic of 6 queues, by queue and by message; each
   shard's CPU per message of the queues it serves (every script touches
   one queue's slot, so a shard's cost is its queues' messages), less the
   CPU the node spends idle over as long (the cluster bus, measured for 2 s
   before), and its time in commands (``INFO commandstats``: scripts and
   lone commands, no networking).  A cluster client runs the poll's steps
   one by one (no pipelined scripts), so a request carries one command:
   its msg/s is not comparable with the single server's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from redis.client import Pipeline

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lite_push import Balance, ConsumerConfig, LitePushConsumer, MessageQueue, OffsetAndMetadata
from lite_push.sources import ConsumeFromWhere
from lite_push.sources.redis import RedisBroker, grain_scripts
from lite_push.sources.redis.message_grain import grain_keys
from lite_push.sources.redis_server import RedisCluster, RedisServer

FIRST = ConsumeFromWhere.FIRST_OFFSET


class Trips:
    """Counts round trips: pipeline executions and lone commands."""

    def __init__(self) -> None:
        self.n = 0
        self._pipe = Pipeline.execute
        self._cmd = redis.Redis.execute_command

    def __enter__(self) -> Trips:
        trips = self
        pipe, cmd = self._pipe, self._cmd

        def execute(p: Any, *a: Any, **k: Any) -> Any:
            trips.n += 1
            return pipe(p, *a, **k)

        def execute_command(c: Any, *a: Any, **k: Any) -> Any:
            trips.n += 1
            return cmd(c, *a, **k)

        Pipeline.execute = execute  # type: ignore[method-assign]
        redis.Redis.execute_command = execute_command  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        Pipeline.execute = self._pipe  # type: ignore[method-assign]
        redis.Redis.execute_command = self._cmd  # type: ignore[method-assign]


def _calls(client: redis.Redis) -> int:
    """Commands the server ran since the last reset, those inside scripts too."""
    return sum(int(v["calls"]) for v in client.info("commandstats").values())


def _cpu(client: redis.Redis) -> float:
    """The server's CPU seconds so far (user + system)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _counting(broker: RedisBroker, balance: Balance) -> tuple[LitePushConsumer, list[int]]:
    """The measured consumer of topic T (no-op listener, 8 lanes), not
    started, and its count of messages consumed (``[n]``)."""
    done = [0]

    def listener(msgs: list[Any]) -> None:
        done[0] += len(msgs)

    consumer = LitePushConsumer(
        ConsumerConfig(group="g", lanes=8, poll_timeout=0.05, revoke_timeout=5.0, commit_interval=0.05),
        source=broker.pull_consumer("g", consume_from=FIRST, balance=balance),
        listener=listener,
    )
    consumer.subscribe("T")
    return consumer, done


def _run_until(consumer: LitePushConsumer, done: list[int], n: int) -> float:
    """Start ``consumer``, stop it once it consumed ``n``: the seconds from
    its start to the last one counted."""
    t0 = time.perf_counter()
    consumer.start()
    while done[0] < n:
        time.sleep(0.005)
    wall = time.perf_counter() - t0
    consumer.shutdown(10)
    return wall


def per_message(url: str, n: int, balance: Balance) -> dict[str, float]:
    broker = RedisBroker(url, namespace=f"gc-{uuid.uuid4().hex[:8]}", session_timeout=10.0, heartbeat_interval=1.0)
    broker.create_topic("T", 4)
    broker.send_batch("T", [(b"x" * 64, f"k{i % 2000}") for i in range(n)])
    consumer, done = _counting(broker, balance)
    client = broker.conn.client
    client.config_resetstat()
    cpu0 = _cpu(client)
    with Trips() as trips:
        wall = _run_until(consumer, done, n)
    cpu = _cpu(client) - cpu0
    calls = _calls(client)
    stats = client.info("commandstats")
    by_command = {name.removeprefix("cmdstat_"): float(v["usec"]) / n for name, v in stats.items()}
    broker.close()
    k = n / 1000
    return {"trips": trips.n / k, "calls": calls / k, "usec": cpu * 1e6 / k, "rate": n / wall, "by_command": by_command}


def _timed(fn: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def calls_alone(url: str) -> dict[str, float]:
    broker = RedisBroker(url, namespace=f"gc-{uuid.uuid4().hex[:8]}", session_timeout=1.0, heartbeat_interval=0.2)
    broker.create_topic("T", 1)
    q = MessageQueue("T", broker.namespace, 0)
    out: dict[str, float] = {}
    a = broker.pull_consumer("g", consume_from=FIRST, balance=Balance.MESSAGE)
    a.subscribe("T")
    a.poll(0.01)
    reps = 200
    broker.send_batch("T", [(b"x" * 64, f"k{i}") for i in range(32 * reps)])
    got: list[int] = []

    def dispatch() -> None:
        for b in a.poll(0.0, 32):
            got.extend(m.queue_offset for m in b.messages)

    out["DISPATCH of 32 new messages (poll)"] = _timed(dispatch, reps)
    acks = iter(range(32, 32 * reps + 1, 32))
    out["ACK of 32 (commit)"] = _timed(lambda: a.commit({q: OffsetAndMetadata(next(acks))}), reps)
    out["DISPATCH finding nothing (poll)"] = _timed(lambda: a.poll(0.0, 32), reps)
    # a lapsed member's 1,000 delivered messages, reclaimed by the next dispatch of another
    broker.send_batch("T", [(b"x" * 64, f"r{i}") for i in range(1000)])
    victim = broker.pull_consumer("g", consume_from=FIRST, balance=Balance.MESSAGE)
    victim.subscribe("T")
    victim.poll(0.01)
    while sum(len(b.messages) for b in victim.poll(0.0, 1000)):
        pass
    time.sleep(1.2)
    t = time.perf_counter()
    a.poll(0.0, 32)
    out["DISPATCH reclaiming 1,000 delivered messages"] = (time.perf_counter() - t) * 1e6
    renew = broker.conn.client.register_script(grain_scripts.RENEW)
    keys = grain_keys(broker.conn, "g", q)
    out["RENEW (a paused queue's session)"] = _timed(lambda: renew(keys=keys, args=["m/1", 1000]), reps)
    a.close()
    victim.close()
    broker.close()
    return out


def per_shard(cluster: RedisCluster, n: int, balance: Balance, queues: int = 6) -> list[dict[str, float]]:
    """One consumer on a cluster: per shard, the messages of its queues and
    its CPU µs and commands per message."""
    client = redis.RedisCluster.from_url(cluster.url)
    nodes = [redis.Redis(host="127.0.0.1", port=p) for p in cluster.ports]
    broker = RedisBroker(client, namespace=f"gc-{uuid.uuid4().hex[:8]}", session_timeout=10.0, heartbeat_interval=1.0)
    try:
        broker.create_topic("T", queues)
        broker.send_batch("T", [(b"x" * 64, f"k{i % 2000}") for i in range(n)])
        by_port: dict[int, int] = dict.fromkeys(cluster.ports, 0)
        for q in range(queues):
            log = broker.queue_key("T", q, "log")
            by_port[client.get_node_from_key(log).port] += int(client.xlen(log))
        consumer, done = _counting(broker, balance)
        # each node's CPU with nothing to do (the cluster bus, cron), per second
        idle0, t_idle = [_cpu(node) for node in nodes], time.perf_counter()
        time.sleep(2.0)
        idle = [(_cpu(node) - c) / (time.perf_counter() - t_idle) for node, c in zip(nodes, idle0, strict=True)]
        for node in nodes:
            node.config_resetstat()
        cpu0 = [_cpu(node) for node in nodes]
        wall = _run_until(consumer, done, n)
        out = []
        for node, port, c0, rest in zip(nodes, cluster.ports, cpu0, idle, strict=True):
            m = max(1, by_port[port])
            stats = node.info("commandstats")
            cmd = sum(float(v["usec"]) for k, v in stats.items() if "info" not in k and "config" not in k)
            out.append(
                {
                    "messages": by_port[port],
                    "usec": (_cpu(node) - c0 - rest * wall) * 1e6 / m,
                    "cmd": cmd / m,
                    "calls": _calls(node) / m,
                    "rate": n / wall,
                }
            )
        return out
    finally:
        broker.close()
        client.close()
        for node in nodes:
            node.close()


def cluster_table(messages: int) -> None:
    with RedisCluster() as cluster:
        print(
            "| balance | shard | messages of its queues | server CPU µs / msg (less idle) | in commands µs / msg"
            " | server commands / msg | msg/s |"
        )
        print("|---|---|---:|---:|---:|---:|---:|")
        for balance in (Balance.QUEUE, Balance.MESSAGE, Balance.QUEUE, Balance.MESSAGE):
            for i, r in enumerate(per_shard(cluster, messages, balance)):
                print(
                    f"| {balance.value} | {i + 1} | {r['messages']:,} | {r['usec']:.2f} | {r['cmd']:.2f} |"
                    f" {r['calls']:.2f} | {r['rate']:,.0f} |"
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--cluster", action="store_true", help="measure on a three-master Redis Cluster instead")
    args = ap.parse_args()
    if args.cluster:
        cluster_table(args.messages)
        return
    with RedisServer(appendonly=False) as server:
        print("| balance | round trips / 1k msg | server commands / 1k msg | server CPU µs / 1k msg | msg/s |")
        print("|---|---:|---:|---:|---:|")
        by_command: dict[str, float] = {}
        for balance in (Balance.QUEUE, Balance.MESSAGE, Balance.QUEUE, Balance.MESSAGE):
            r = per_message(server.url, args.messages, balance)
            print(f"| {balance.value} | {r['trips']:.1f} | {r['calls']:.1f} | {r['usec']:.0f} | {r['rate']:,.0f} |")
            by_command = r["by_command"]
        print()
        print("| call | median µs (client side, one round trip) |")
        print("|---|---:|")
        for name, us in calls_alone(server.url).items():
            print(f"| {name} | {us:.0f} |")
        print()
        print("| command (last MESSAGE run) | server µs / message |")
        print("|---|---:|")
        for name, us in sorted(by_command.items(), key=lambda kv: -kv[1])[:10]:
            print(f"| {name} | {us:.2f} |")


if __name__ == "__main__":
    main()
