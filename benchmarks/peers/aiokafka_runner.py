"""Run plain aiokafka once over a topic and write down every handler call.

A peer runner of issue 31 (the protocol: ``benchmarks/RESULTS.md``'s
side-by-side section and ``bench_kafka.py``), run by the python of its own
venv (``aiokafka.requirements.txt``); it imports only the standard library,
aiokafka and uvloop.

    benchmarks/out/peers/aiokafka-venv/bin/python benchmarks/peers/aiokafka_runner.py \\
        --bootstrap 127.0.0.1:PORT --topic T --group G --costs FILE --out OUT.json \\
        --timeout 300 [--cap 60] [--set mode=keys --set max_in_flight=20000 ...]

aiokafka 0.14.0 (pure-Python Kafka protocol) talks to librdkafka's mock
cluster as it is: it negotiates each request's version from the broker's
ApiVersions answer (``api_version`` is a deprecated no-op since 0.13) and
used Metadata v5, FindCoordinator v1, JoinGroup v5, SyncGroup v3, Fetch v11,
ListOffsets v3, OffsetFetch v3, OffsetCommit v3, LeaveGroup v1 there.

aiokafka has no parallel-processing layer of its own: its docs show one
``AIOKafkaConsumer`` with ``getmany()`` batches and manual commits of
``{tp: last_offset + 1}`` after handling (at-least-once).  For many keys of
I/O-bound work with per-key order the runner does what an experienced
asyncio user writes on top of that, one event loop, one consumer.

``mode=lean`` (default; issue 40's hand-written loop, ``consume_lean``):

* ``getmany(timeout_ms=100, max_records=2000)`` in one loop; each message
  goes at once to its key: a key with queued messages has a
  ``collections.deque`` and one task draining it, made when its first
  message is queued and ended when the deque is empty.  A key runs one
  message at a time in offset order (per-key order, kept by the runner, not
  by aiokafka); different keys run concurrently.
* Commits: per partition a set of finished offsets and a commit pointer;
  every ``commit_interval_ms`` (1 s) and at the end, each pointer moves on
  while it is in the set, and the pointers that moved are committed: never
  past an unhandled message.  (Offsets are taken as contiguous, as they are
  in a topic without transactions or compaction, such as the mock's.)
  ``enable_auto_commit`` is off.
* Backpressure: at most ``max_in_flight`` messages fetched and not yet
  handled (a soft bound: a whole ``getmany`` batch is taken); the loop
  waits for room before the next ``getmany``: an int per message.

``mode=keys`` (the default before issue 40): the same per-key deques and
tasks, behind two classes, with per message a ``[offset, done]`` entry in
a per-partition deque of offsets in fetch order (the watermark: the lowest
not done), a task done-callback and an ``Event`` check; commits checked
between two ``getmany``.  ``mode=chains``: a task per message that first
awaits its key's previous task (a dict key -> last task).  Chains cost an
extra task step per message that finds its predecessor still running, so
they are 2-3x slower once the loop is CPU-bound (below).

``mode=gather`` is the naive form: ``asyncio.gather`` over each whole
``getmany`` batch (no per-key chaining: a key's messages overlap and may
end out of order), then commit the batch's last offsets + 1 and fetch the
next.  ``keeps_key_order`` is false there; the checker counts its overlaps.

The handler (every mode) is ``runner_protocol.AsyncCalls.handle``: it
awaits ``asyncio.sleep(cost)`` and records ``(seq, start_ns, end_ns)``, the
same bookkeeping as lite_push's listener.  The run stops once every ``seq``
was handled; at ``--cap`` (or the timeout) fetching stops, the calls in
flight are cancelled and what finished is committed.  Then
``consumer.stop()`` (it leaves the group).  One consumer in the group: a
rebalance mid-run is not handled (none comes).

Settings (``--set KEY=VALUE``):

  mode                lean | keys | chains | gather (default lean)
  max_in_flight       messages fetched and not handled, at most; 0 = no bound (20000)
  max_records         getmany's max_records, 0 = all that was fetched (2000)
  commit_interval_ms  how often the commit pointers are committed (1000)
  loop                uvloop | asyncio (uvloop)

Lean against the earlier keys (issue 40), ``bench_peers.py``'s variant
``aiokafka@keys`` (``mode=keys``, ``max_records=0``, as before), four rounds
alternating, the median and each round; CPU per message is the runner
process's from client creation to the last call, over the messages
(load average 0.2 at the start, the other engineer's tests running later):

    .venv/bin/python benchmarks/bench_peers.py --shapes kpipe-1ms,kpipe-10ms \
        --peers aiokafka,aiokafka@keys --repeat 4 --messages kpipe-1ms=150000,kpipe-10ms=300000

  shape (messages)     mode   msg/s (median; rounds)                       CPU us/msg (median; rounds)
  kpipe-1ms (150k)     keys    95,100 (102,608 96,766 90,802 93,435)      11.54 (10.94 11.30 11.79 11.97)
                       lean   104,367 (108,320 101,138 100,228 107,595)    9.92 (9.67 10.18 10.17 9.54)
  kpipe-10ms (300k)    keys    53,573 (54,014 54,152 51,073 53,132)       14.21 (14.01 13.82 15.19 14.41)
                       lean    62,746 (63,510 62,996 58,732 62,495)       11.64 (11.68 11.60 13.25 11.19)

Lean is 1.10x and 1.17x the old loop at 14 % and 18 % less CPU per
message; every run kept per-key order and lost nothing.  On this machine
the floor (``floor_runner.py``: the same handler on a task per key, no
source) costs 5-5.8 us per message, so lean's own reading, routing and
committing is about 4-5 us a message (issue 40 measured 5.6-6.7 against a
floor of 2.15 on a faster machine).  Unbounded (``max_in_flight=0``) was no
faster (74,000-93,000 against 93,000-101,000, one run each, ``try_runner.py``).

What the modes gave before issue 40 (``keys`` with ``max_records=0``; a
driver since folded into ``try_runner.py``; io5 and io1 through
``bench_peers.py --peers ... --shapes io5,io1``; one run each, this 2-core
machine with other benchmarks running: rough; msg/s from client creation to the last
call; KPipe's shape is 8 partitions, 1,000 uniform keys, every message the
same cost):

  shape                     keys      keys 2000  chains   gather (no order)   bound
  io5 (2,000 x 5 ms)       10,125      9,972      9,380   79,203              11,111
  io1 (20,000 x 1 ms zipf)  5,611      5,617      5,368   48,917               6,590
  KPipe 1 ms, 100k        116,841     91,974     32,976   95,694             704,225
  KPipe 10 ms, 50k         56,708     52,364     28,604   86,408              70,423
  KPipe 100 ms, 20k         5,616      5,534      5,448   24,648               5,714

("keys 2000": ``max_in_flight=2000``; with 100,000 it was 111k at 1 ms.)
``loop=asyncio`` instead of uvloop: 77k at 1 ms, 52k at 10 ms.  Every
key-ordered run: nothing lost, no duplicate, no order violation, no overlap,
no commit past an unhandled message; gather overlaps on every key.  At 1
and 10 ms the loop is CPU-bound (8-10 us of CPU per message with keys on
uvloop).  io1 is held at ~85 % by its hot key: 3,035 calls of 1.14 ms each
(``asyncio.sleep(0.001)`` on a busy loop), lite_push's limit there too.
Chosen then: ``mode=keys``, ``max_in_flight=20000``, uvloop, on every
shape; since issue 40, ``mode=lean`` (above).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib.metadata
import logging
import sys
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
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
    "mode": "lean",
    "max_in_flight": 20000,
    "max_records": 2000,
    "commit_interval_ms": 1000,
    "loop": "uvloop",
}

#: The settings that take one of a few values.
CHOICES = {"mode": ("lean", "keys", "chains", "gather"), "loop": ("uvloop", "asyncio")}


async def consume_lean(
    consumer: AIOKafkaConsumer, calls: AsyncCalls, settings: dict[str, Any], deadline: float
) -> None:
    """``mode=lean``: the per-key loop an experienced asyncio user writes by
    hand (see the module docstring), in one function.

    A key with queued messages has a deque (``queues``) and one task
    draining it; the task ends, and the key's entries go, when the deque is
    empty.  A queued item is ``(value, offset, finished)``: ``finished`` is
    its partition's set of handled offsets above the commit pointer.  The
    committer moves each partition's pointer on while it is in the set and
    commits the pointers that moved."""
    handle = calls.handle
    create_task = asyncio.create_task
    queues: dict[bytes | None, collections.deque[tuple[bytes, int, set[int]]]] = {}
    tasks: dict[bytes | None, asyncio.Task[None]] = {}  # the loop keeps only weak references to tasks
    finished: dict[TopicPartition, set[int]] = {}
    pointer: dict[TopicPartition, int] = {}  # per partition, the lowest offset not known to be handled
    committed: dict[TopicPartition, int] = {}
    limit = settings["max_in_flight"] or sys.maxsize
    below = limit - 1
    max_records = settings["max_records"] or None
    in_flight = 0
    room = asyncio.Event()
    room.set()

    async def drain(key: bytes | None, queue: collections.deque[tuple[bytes, int, set[int]]]) -> None:
        nonlocal in_flight
        while queue:
            value, offset, done = queue[0]
            await handle(value)
            queue.popleft()
            done.add(offset)
            in_flight -= 1
            if in_flight == below:  # just under the limit again (it falls one at a time)
                room.set()
        del queues[key], tasks[key]

    async def commit() -> None:
        moved = {}
        for tp, done in finished.items():
            at = pointer[tp]
            while at in done:
                done.remove(at)
                at += 1
            pointer[tp] = at
            if committed.get(tp) != at:
                moved[tp] = at
        if moved:
            await consumer.commit(moved)
            committed.update(moved)

    async def committer() -> None:
        interval = settings["commit_interval_ms"] / 1e3
        while True:
            await asyncio.sleep(interval)
            await commit()

    commits = create_task(committer())
    try:
        while not calls.all_handled.is_set() and time.monotonic() < deadline:
            if in_flight >= limit:
                room.clear()
                try:
                    await asyncio.wait_for(room.wait(), 0.1)
                except TimeoutError:
                    continue
            batch = await consumer.getmany(timeout_ms=100, max_records=max_records)
            for tp, messages in batch.items():
                done = finished.get(tp)
                if done is None:
                    done = finished[tp] = set()
                    pointer[tp] = messages[0].offset
                in_flight += len(messages)
                for msg in messages:
                    key = msg.key
                    queue = queues.get(key)
                    if queue is None:
                        queue = queues[key] = collections.deque(((msg.value, msg.offset, done),))
                        tasks[key] = create_task(drain(key, queue))
                    else:
                        queue.append((msg.value, msg.offset, done))
    finally:
        commits.cancel()
        for task in list(tasks.values()):
            task.cancel()  # only at the cap or a timeout: every message was handled otherwise
        await asyncio.gather(commits, *tasks.values(), return_exceptions=True)
        await commit()


class Watermarks:
    """Per partition, the offsets fetched and not yet committable, in fetch
    order; :meth:`safe` is what may be committed: the lowest unhandled
    offset, or one past the last fetched when every one was handled."""

    def __init__(self) -> None:
        self._pending: dict[TopicPartition, collections.deque[list[Any]]] = collections.defaultdict(collections.deque)
        self._next: dict[TopicPartition, int] = {}

    def add(self, tp: TopicPartition, offset: int) -> list[Any]:
        """Track ``offset``; the caller sets ``entry[1] = True`` once it is handled."""
        entry = [offset, False]
        self._pending[tp].append(entry)
        self._next[tp] = offset + 1
        return entry

    def safe(self) -> dict[TopicPartition, int]:
        out = {}
        for tp, pending in self._pending.items():
            while pending and pending[0][1]:
                pending.popleft()
            out[tp] = pending[0][0] if pending else self._next[tp]
        return out


class Window:
    """The messages fetched and not yet handled: how many (backpressure at
    ``limit``) and, per partition, which offsets (:class:`Watermarks`)."""

    def __init__(self, consumer: AIOKafkaConsumer, limit: int) -> None:
        self.consumer = consumer
        self.limit = limit
        self.in_flight = 0
        self.room = asyncio.Event()
        self.room.set()
        self.marks = Watermarks()
        self._committed: dict[TopicPartition, int] = {}

    def taken(self, count: int) -> None:
        self.in_flight += count
        if self.in_flight >= self.limit:
            self.room.clear()

    def done(self, entry: list[Any]) -> None:
        entry[1] = True
        self.in_flight -= 1
        if self.in_flight < self.limit:
            self.room.set()

    async def commit(self) -> None:
        """Commit each partition's watermark where it moved."""
        offsets = {tp: o for tp, o in self.marks.safe().items() if self._committed.get(tp) != o}
        if offsets:
            await self.consumer.commit(offsets)
            self._committed.update(offsets)


class Chains:
    """``mode=chains``: a task per message, awaiting its key's previous task."""

    def __init__(self, calls: AsyncCalls, window: Window) -> None:
        self.calls, self.window = calls, window
        self.last_of_key: dict[bytes | None, asyncio.Task[None]] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    def submit(self, key: bytes | None, value: bytes, entry: list[Any]) -> None:
        task = asyncio.create_task(self._run(self.last_of_key.get(key), value, entry))
        self.last_of_key[key] = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, before: asyncio.Task[None] | None, value: bytes, entry: list[Any]) -> None:
        if before is not None and not before.done():
            await before  # the key's previous message first (the handler raises nothing)
        await self.calls.handle(value)
        self.window.done(entry)


class KeyWorkers:
    """``mode=keys``: per key a deque of its messages and, while it is not
    empty, one task draining it in order."""

    def __init__(self, calls: AsyncCalls, window: Window) -> None:
        self.calls, self.window = calls, window
        self.queues: dict[bytes | None, collections.deque[tuple[bytes, list[Any]]]] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    def submit(self, key: bytes | None, value: bytes, entry: list[Any]) -> None:
        queue = self.queues.get(key)
        if queue is not None:
            queue.append((value, entry))
            return
        self.queues[key] = collections.deque([(value, entry)])
        task = asyncio.create_task(self._drain(key))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _drain(self, key: bytes | None) -> None:
        queue = self.queues[key]
        while queue:
            value, entry = queue[0]
            await self.calls.handle(value)
            queue.popleft()
            self.window.done(entry)
        del self.queues[key]


async def consume_keyed(
    consumer: AIOKafkaConsumer, calls: AsyncCalls, settings: dict[str, Any], deadline: float
) -> None:
    """Per-key order over ``getmany`` batches, many keys at once (see the
    module docstring): ``Chains`` or ``KeyWorkers`` as ``mode`` says."""
    window = Window(consumer, settings["max_in_flight"])
    keyed = Chains(calls, window) if settings["mode"] == "chains" else KeyWorkers(calls, window)
    interval = settings["commit_interval_ms"] / 1e3
    next_commit = time.monotonic() + interval
    try:
        while not calls.all_handled.is_set() and time.monotonic() < deadline:
            if time.monotonic() >= next_commit:
                await window.commit()
                next_commit = time.monotonic() + interval
            if not window.room.is_set():
                try:
                    await asyncio.wait_for(window.room.wait(), 0.1)
                except TimeoutError:
                    continue
            batch = await consumer.getmany(timeout_ms=100, max_records=settings["max_records"] or None)
            for tp, messages in batch.items():
                window.taken(len(messages))
                for msg in messages:
                    keyed.submit(msg.key, msg.value, window.marks.add(tp, msg.offset))
    finally:
        for task in list(keyed.tasks):
            task.cancel()  # only at the cap or a timeout: every message was handled otherwise
        await asyncio.gather(*keyed.tasks, return_exceptions=True)
        await window.commit()


async def consume_gather(
    consumer: AIOKafkaConsumer, calls: AsyncCalls, settings: dict[str, Any], deadline: float
) -> None:
    """The naive form: the whole batch at once, commit after it."""
    while not calls.all_handled.is_set() and time.monotonic() < deadline:
        batch = await consumer.getmany(timeout_ms=100, max_records=settings["max_records"] or None)
        if not batch:
            continue
        handling = asyncio.gather(*(calls.handle(m.value) for msgs in batch.values() for m in msgs))
        try:
            await asyncio.wait_for(asyncio.shield(handling), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            handling.cancel()  # the cap: this batch is not committed
            await asyncio.gather(handling, return_exceptions=True)
            return
        await consumer.commit({tp: msgs[-1].offset + 1 for tp, msgs in batch.items()})


async def run(args: argparse.Namespace, settings: dict[str, Any], calls: AsyncCalls) -> dict[str, Any]:
    """Consume until every seq was handled, the cap or the timeout."""
    limit = min(args.cap, args.timeout) if args.cap is not None else args.timeout
    cpu0 = cpu_seconds()
    t0 = time.perf_counter_ns()
    deadline = time.monotonic() + limit
    consumer = AIOKafkaConsumer(
        args.topic,
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    error = None
    try:
        await consumer.start()
        consume = {"lean": consume_lean, "gather": consume_gather}.get(settings["mode"], consume_keyed)
        await consume(consumer, calls, settings, deadline)
    except Exception as exc:  # a peer's failure is a result to report
        error = f"{type(exc).__name__}: {exc}"
    finally:
        await consumer.stop()
    capped = not calls.all_handled.is_set() and error is None
    if capped and not (args.cap is not None and args.cap <= args.timeout):
        error, capped = f"timeout after {args.timeout:g}s ({calls.distinct} of {len(calls.costs)} handled)", False
    end_cpu = calls.cpu_at_end if calls.all_handled.is_set() else cpu_seconds()
    return {"t0_ns": t0, "cpu_s": end_cpu - cpu0, "capped": capped, "error": error}


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], "kafka")
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    settings = settings_of(args.set, DEFAULTS, CHOICES)
    costs = load_costs(args.costs)
    wall_minus_perf = time.time_ns() - time.perf_counter_ns()
    calls = AsyncCalls(costs)
    if settings["loop"] == "uvloop":
        import uvloop

        result = uvloop.run(run(args, settings, calls))
    else:
        result = asyncio.run(run(args, settings, calls))
    version = importlib.metadata.version
    config = {
        "package": f"aiokafka=={version('aiokafka')}",
        "python": sys.version.split()[0],
        **settings,
        "uvloop": f"uvloop=={version('uvloop')}" if settings["loop"] == "uvloop" else None,
        "enable_auto_commit": False,
        "commit": "after each whole batch"
        if settings["mode"] == "gather"
        else "watermark (lowest unhandled offset per partition)",
        "handler": "async def: await asyncio.sleep(cost)",
        "keeps_key_order": settings["mode"] != "gather",
    }
    run_fields = {**result, "wall_minus_perf_ns": wall_minus_perf, "peak_rss_kb": peak_rss_kb()}
    write_record(args.out, run_fields, config, calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
