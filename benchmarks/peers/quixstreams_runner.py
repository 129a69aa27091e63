"""quixstreams as a runner of ``bench_peers.py``: N replicas of one
``Application`` in one consumer group, each handling its partitions one
message at a time.

quixstreams 3.28.1 (confluent-kafka 2.12.2: it requires < 2.13), Python
3.12.  An ``Application`` runs one poll loop that takes one message, runs
the ``StreamingDataFrame`` over it, stores its offset and polls again: its
callbacks are plain functions, with no async or thread-pool step.  Its docs
scale it out instead: "partitions are automatically assigned and
re-assigned by Kafka broker to consumer apps in the same consumer group"
(``advanced/stateful-processing.md``), "designed to run and scale
resiliently via container orchestration (like Kubernetes)"
(``introduction.md``): more replicas of the app, one per partition at most.
So this runner launches ``processes`` replicas (forked after ``import
quixstreams``), each

    app = Application(bootstrap, consumer_group=G, auto_offset_reset="earliest",
                      processing_guarantee="at-least-once", auto_create_topics=False,
                      use_changelog_topics=False, commit_interval, commit_every,
                      consumer_extra_config={group.instance.id, session.timeout.ms,
                                             heartbeat.interval.ms})
    app.dataframe(app.topic(T, key/value_deserializer="bytes")).update(handle)
    app.run()

``handle`` does ``time.sleep(cost)`` between two ``perf_counter_ns``.  The
topic exists and nothing is stateful (no changelog topic).  quixstreams reads
every topic's configuration through DescribeConfigs, which the mock cluster
does not answer ("DescribeConfigs (KIP-133) not supported by broker"), so
the app gets a ``TopicManager`` (a constructor argument) whose
``TopicAdmin`` takes partitions and replicas from the cluster metadata
instead: :class:`MetadataTopicAdmin`.  At-least-once: quixstreams commits
the offsets of handled messages every ``commit_interval`` s, on a revoke
and when the app stops.

The replicas wait, forked, until the launcher's ``t0`` (``perf_counter_ns``
just before it lets them make their apps: replicas already deployed,
starting together); process start and imports are not timed.  They share a
table of handled seqs; once every seq was handled (or at ``--cap`` /
``--timeout``) the launcher tells them to stop: a thread in each sends its
calls, its CPU from ``t0`` (every thread of it) and its peak RSS, then calls
``app.stop()`` (quixstreams' way to stop an app run under threading): the
loop ends, the checkpoint is committed, the consumer closes.  ``cpu_s`` is
the launcher's plus the replicas', ``peak_rss_kb`` the sum of all their
peaks (N processes, N footprints).  A replica that fails leaves the others
running (as in a deployment); its error goes into ``error``.

**The group on the mock cluster.**  Several members in one group meet three
things librdkafka's mock does unlike a Kafka broker: a rebalance waits
``session.timeout.ms`` - 1 s (a broker completes it once every member has
rejoined); while it does, OffsetCommit is refused (REBALANCE_IN_PROGRESS; a
broker takes commits while it prepares a rebalance), and quixstreams stops
an app whose commit fails (``CheckpointConsumerCommitError``, or
``PartitionAssignmentError`` from the commit of a revoke); and a follower
whose SyncGroup arrives after the leader's gets INVALID_REQUEST and makes
the group rebalance again.  So the replicas must form the group's first
generation together, which takes the cluster's initial rebalance delay
(``MockKafkaCluster(rebalance_delay_ms=...)``, Kafka's
``group.initial.rebalance.delay.ms``, 3 s on a broker by default):
``bench_peers.py`` runs this peer on a mock cluster of its own with 3,000
ms (``catalog.REBALANCE_DELAY_MS``; every other Kafka peer shares one
without a delay), and the wait is in its "start ms", not its msg/s (rated
from its first call's start, as every peer's).  With 0,
the first replica forms the group alone and the others' joins rebalance it:
every run of 7 (8 replicas, 2,000 messages of 10 ms) had replicas fail;
those that finished ran at 68-189 msg/s with 88-900 duplicates.  With a delay the first generation has
every replica, but the SyncGroup race above still hits some runs (seen in
the cgrp debug log: "SyncGroup error: Broker: Invalid request", then
replicas failing one after another and the last ones finishing the work,
~27 s, ~600 duplicates): clean runs with 500 ms 3 of 4, with 1,000 ms 12 of
17, with 3,000 ms 19 of 21; through ``bench_peers.py`` (5 shapes, 20 s
cap, 3,000 ms) 17 of 20, the 3 hit on ``io1``, ``io5`` and ``kpipe-100ms``
(that one with every replica failed: 152 handled, nothing committed).  A run that was hit completes all the same
(the launcher keeps the replicas left) and says so in ``error``; one
replica (``processes=1``) has no group to form and is never hit.  Static
membership (``group.instance.id``, on by default) keeps replicas that stop
first from leaving the group (a leave would rebalance it under the others'
last commits); ``session_timeout_ms`` 3,000 and ``heartbeat_interval_ms``
1,000 keep a rebalance short if one happens.

Settings (``--set``): ``processes`` (0: one per partition of the topic),
``commit_interval`` (5.0 s, quixstreams' default), ``commit_every`` (0),
``static_membership`` (true), ``session_timeout_ms`` (3,000),
``heartbeat_interval_ms`` (1,000).  Tried with ``try_runner.py``, mock
cluster with a 1,000 ms initial rebalance delay, 8 partitions, 1,000 keys
uniform, this 2-core machine with other benchmarks running; msg/s after the
first call (at ~1.17 s: the delay), rough, one run each: 10 ms: 1 process
~98, 2 ~191, 4 ~371, 8 ~724 (each replica one message at a time: 8 x 100
at best); 8 processes at 1 ms ~6,860, at 100 ms ~69.  Every run clean: no
loss, duplicate, order violation or overlap; no commit past an unhandled
message.  Chosen: one replica per partition.

Key order: **kept, per partition**: a partition is read by one replica, in
offset order, one message at a time, and a key's messages are in one
partition.  A partition that moves (a rebalance) resumes from its last
commit, so messages may be handled twice (duplicates), not out of order.
"""

from __future__ import annotations

import argparse
import array
import ctypes
import faulthandler
import gc
import importlib.metadata as md
import logging
import multiprocessing
import resource
import signal
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from confluent_kafka.admin import AdminClient
from quixstreams import Application
from quixstreams.models.topics import TopicAdmin, TopicConfig, TopicManager
from runner_protocol import load_costs, parse_args, settings_of, write_record  # beside this file: stdlib only

PACKAGE = "quixstreams"
DEFAULTS: dict[str, Any] = {
    "processes": 0,  # 0: one replica per partition of the topic
    "commit_interval": 5.0,
    "commit_every": 0,
    "static_membership": True,
    "session_timeout_ms": 3000,
    "heartbeat_interval_ms": 1000,
}
PR_SET_PDEATHSIG = 1  # linux/prctl.h
#: How long a replica may take to stop, commit and send its calls back.
STOP_GRACE_S = 30.0


def checked_settings(pairs: list[str]) -> dict[str, Any]:
    """:data:`DEFAULTS` with ``--set`` pairs (``runner_protocol.settings_of``)."""
    out = settings_of(pairs, DEFAULTS)
    if out["processes"] < 0:
        raise SystemExit("--set processes=N with N >= 1 (or 0: one per partition)")
    return out


class MetadataTopicAdmin(TopicAdmin):
    """quixstreams' ``TopicAdmin`` but for how it inspects a topic: the
    partitions and replicas from the cluster's metadata, no DescribeConfigs
    (the mock cluster does not answer it) and so no topic configs (they
    only matter to the changelog and repartition topics it would create)."""

    def inspect_topics(self, topic_names: list[str], timeout: float = 30) -> dict[str, TopicConfig | None]:
        cluster = self.list_topics(timeout=timeout)
        return {
            name: TopicConfig(
                num_partitions=len(cluster[name].partitions),
                replication_factor=len(cluster[name].partitions[0].replicas),
            )
            if name in cluster
            else None
            for name in topic_names
        }


def partitions_of(bootstrap: str, topic: str) -> int:
    """How many partitions ``topic`` has (cluster metadata).  The client is
    gone when this returns, so the launcher forks with no librdkafka thread."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    count = len(admin.list_topics(topic, timeout=30).topics[topic].partitions)
    del admin
    gc.collect()
    return count


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Shared:
    """What the launcher and its replicas share: the handled-seq table, its
    count, and two flags, ``go`` (make the apps) and ``stop``.  The flags
    are polled, not ``multiprocessing.Event``s: setting an Event waits for
    every process asleep on it to wake, and a replica that died asleep
    never does."""

    def __init__(self, ctx: Any, total: int) -> None:
        self.total = total
        self.seen = ctx.RawArray("b", total)
        self.distinct = ctx.RawValue("q", 0)  # read without the lock
        self.lock = ctx.Lock()
        self.go = ctx.RawValue("b", 0)
        self.stop = ctx.RawValue("b", 0)

    def handled(self, seq: int) -> None:
        """Count ``seq`` as handled (once)."""
        if self.seen[seq]:
            return
        with self.lock:
            if not self.seen[seq]:
                self.seen[seq] = 1
                self.distinct.value += 1

    @property
    def done(self) -> bool:
        """Every seq handled at least once."""
        return self.distinct.value >= self.total

    @staticmethod
    def wait(flag: Any, poll_s: float = 0.002) -> None:
        while not flag.value:
            time.sleep(poll_s)


class Calls:
    """A replica's handler calls, appended on its main thread; a snapshot
    may be taken from another thread (the first ``n`` calls are whole once
    all three columns have ``n`` entries: ``end_ns`` is appended first)."""

    def __init__(self) -> None:
        self.seq = array.array("q")
        self.start_ns = array.array("q")
        self.end_ns = array.array("q")
        self.sent = 0

    def take(self) -> tuple[array.array[int], array.array[int], array.array[int]]:
        """The calls not sent yet."""
        n = min(len(self.seq), len(self.start_ns), len(self.end_ns))
        part = self.seq[self.sent : n], self.start_ns[self.sent : n], self.end_ns[self.sent : n]
        self.sent = n
        return part


def make_app(index: int, args: argparse.Namespace, settings: dict[str, Any], state_dir: str) -> Application:
    """Replica ``index``'s ``Application`` (see the module docstring)."""
    consumer_config: dict[str, Any] = {
        "session.timeout.ms": settings["session_timeout_ms"],
        "heartbeat.interval.ms": settings["heartbeat_interval_ms"],
    }
    if settings["static_membership"]:
        consumer_config["group.instance.id"] = f"{args.group}-replica-{index}"
    return Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        processing_guarantee="at-least-once",
        auto_create_topics=False,
        use_changelog_topics=False,
        commit_interval=settings["commit_interval"],
        commit_every=settings["commit_every"],
        state_dir=f"{state_dir}/replica-{index}",  # each replica's own disk (one directory races on mkdir)
        loglevel="ERROR",
        consumer_extra_config=consumer_config,
        topic_manager=TopicManager(
            MetadataTopicAdmin(args.bootstrap), consumer_group=args.group, auto_create_topics=False
        ),
    )


def replica(
    index: int,
    args: argparse.Namespace,
    settings: dict[str, Any],
    costs: array.array[int],
    shared: Shared,
    state_dir: str,
    conn: Connection,
) -> None:
    """One replica: wait for ``go``, run its app until ``stop``.  When told
    to stop it sends ``("stop", seq, start_ns, end_ns, cpu_s, peak_rss_kb,
    None)`` before stopping the app (so its calls arrive even if closing
    hangs), then ``("end", <calls since>, ..., error)`` once ``app.run()``
    returned; a replica whose app failed before sends only the ``"end"``."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # never outlive the launcher
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    calls = Calls()
    clock, sleep = time.perf_counter_ns, time.sleep
    lock = threading.Lock()  # one message at a time on the pipe
    shared.wait(shared.go)
    cpu0 = cpu_s()

    def send(kind: str, error: str | None) -> None:
        with lock:
            usage = cpu_s() - cpu0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            conn.send((kind, *calls.take(), *usage, error))

    error = None
    try:
        app = make_app(index, args, settings, state_dir)

        def handle(value: bytes) -> None:
            seq = int.from_bytes(value[:8], "big")
            start = clock()
            cost = costs[seq]
            if cost:
                sleep(cost / 1e6)
            calls.end_ns.append(clock())
            calls.seq.append(seq)
            calls.start_ns.append(start)
            shared.handled(seq)

        topic = app.topic(args.topic, key_deserializer="bytes", value_deserializer="bytes")
        app.dataframe(topic).update(handle)

        def stopper() -> None:
            shared.wait(shared.stop)
            send("stop", None)
            app.stop()

        threading.Thread(target=stopper, name="stopper", daemon=True).start()
        app.run()
    except Exception as exc:  # the replica's error goes back to the launcher
        error = f"{type(exc).__name__}: {exc}"
        print(f"replica {index}: {error}", file=sys.stderr, flush=True)
    send("end", error)
    conn.close()


def collect(
    procs: list[Any], conns: list[Connection], grace_s: float
) -> tuple[Calls, float, int, list[str], list[str]]:
    """Every replica's calls, CPU seconds and peak RSS once they were told
    to stop: ``(calls, cpu_s, rss_kb, errors, shutdown)``, ``errors`` what
    failed in a replica or its calls that never came, ``shutdown`` the
    replicas still closing after ``grace_s`` (they are killed: their calls
    up to the stop came with the ``"stop"`` message)."""
    calls = Calls()
    cpu, rss = 0.0, 0
    errors: list[str] = []
    shutdown: list[str] = []
    deadline = time.monotonic() + grace_s
    for i, (proc, conn) in enumerate(zip(procs, conns, strict=True)):
        ended, got = False, False
        while not ended:
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                break
            try:
                kind, r_seq, r_start, r_end, r_cpu, r_rss, r_error = conn.recv()
            except EOFError:
                break
            if not got:  # usage as of the first message: the stop (or the end of a replica that failed)
                cpu, rss = cpu + r_cpu, rss + r_rss
            got = True
            ended = kind == "end"
            calls.seq.extend(r_seq)
            calls.start_ns.extend(r_start)
            calls.end_ns.extend(r_end)
            if r_error:
                errors.append(f"replica {i}: {r_error}")
        if not got:
            errors.append(f"replica {i} sent no calls (exit code {proc.exitcode})")
        elif not ended:
            shutdown.append(f"replica {i} was still closing after {grace_s:g}s (killed)")
        if proc.is_alive() and not ended:
            proc.kill()  # SIGKILL: quixstreams takes SIGTERM as "stop" and would keep closing
    for proc in procs:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return calls, cpu, rss, errors, shutdown


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], "kafka")
    settings = checked_settings(args.set)
    if not settings["processes"]:
        settings["processes"] = partitions_of(args.bootstrap, args.topic)
    # the last resort if anything hangs: print every thread's stack and exit
    faulthandler.dump_traceback_later(args.timeout + STOP_GRACE_S + 60, exit=True)
    costs = load_costs(args.costs)
    ctx = multiprocessing.get_context("fork")
    shared = Shared(ctx, len(costs))

    with tempfile.TemporaryDirectory(prefix="quix-state-") as state_dir:
        procs, conns = [], []
        for index in range(settings["processes"]):
            ours, theirs = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=replica, args=(index, args, settings, costs, shared, state_dir, theirs), daemon=True
            )
            proc.start()
            theirs.close()
            procs.append(proc)
            conns.append(ours)

        wall_minus_perf = time.time_ns() - time.perf_counter_ns()
        cpu0 = cpu_s()
        t0 = time.perf_counter_ns()
        shared.go.value = 1
        capped, error = False, None
        limit = min(args.cap, args.timeout) if args.cap is not None else args.timeout
        while not shared.done:
            time.sleep(0.005)
            if time.perf_counter_ns() - t0 > limit * 1e9:
                if args.cap is not None and args.cap <= args.timeout:
                    capped = True
                else:
                    error = f"timeout after {args.timeout:g}s ({shared.distinct.value} of {shared.total} handled)"
                break
            if not any(p.is_alive() for p in procs):
                break  # every replica failed: their errors come with their calls
        own_cpu = cpu_s() - cpu0
        shared.stop.value = 1
        calls, replica_cpu, replica_rss, replica_errors, shutdown = collect(procs, conns, STOP_GRACE_S)
    if replica_errors:  # what went wrong in a replica says more than a timeout
        more = len(replica_errors) - 3
        error = "; ".join(replica_errors[:3]) + (f" (and {more} more)" if more > 0 else "")

    run = {
        "t0_ns": t0,
        "wall_minus_perf_ns": wall_minus_perf,
        "cpu_s": own_cpu + replica_cpu,
        "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + replica_rss,
        "capped": capped,
        "error": error,
    }
    config = {
        "package": f"{PACKAGE}=={md.version(PACKAGE)}",
        "confluent_kafka": md.version("confluent-kafka"),
        "python": sys.version.split()[0],
        **settings,
        "processing_guarantee": "at-least-once",
        "auto_offset_reset": "earliest",
        "handler": "time.sleep(cost) in StreamingDataFrame.update, one message at a time per replica",
        "peak_rss_kb": "the sum over the launcher and its replicas",
        "shutdown": shutdown,
        "keeps_key_order": True,
    }
    write_record(args.out, run, config, calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
