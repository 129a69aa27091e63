"""The demo: produce to the embedded broker, consume in KEY_ORDERLY mode,
report throughput and check per-key order.

``python -m lite_push.demo --help``.  :func:`run_once` is also what the
benchmarks use to time one configuration.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from ._config import ConsumeMode, ConsumerConfig
from ._consumer import LitePushConsumer
from ._router import ROUTER_IMPL, lane_of
from ._types import MessageExt
from .sources import ConsumeFromWhere, EmbeddedBroker

__all__ = ["RunResult", "account_keys", "fill_broker", "lane_balance", "main", "run_once"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunResult:
    """Outcome of consuming one topic to the end with one configuration."""

    label: str
    messages: int
    seconds: float
    #: Deliveries of a key that ran before an earlier offset of that key.
    inversions: int
    #: Messages never delivered.
    lost: int
    #: Deliveries beyond the first.
    duplicates: int

    @property
    def rate(self) -> float:
        """Messages per second."""
        return self.messages / self.seconds if self.seconds > 0 else float("inf")


def account_keys(count: int, seed: int = 42) -> list[str]:
    """``count`` distinct 16-digit account numbers (seeded), the shape of the
    bank-SMS keys the design comes from."""
    rng = random.Random(seed)
    out: dict[str, None] = {}
    while len(out) < count:
        out[str(rng.randrange(10**15, 10**16))] = None
    return list(out)


def lane_balance(keys: list[str], lanes: int) -> float:
    """Busiest lane's share of the keys over the mean share (>= 1): with
    evenly loaded keys, the throughput of ``lanes`` lanes is at most
    ``lanes / balance`` times one lane's."""
    counts = Counter(lane_of(k, lanes) for k in keys)
    return max(counts.values()) * lanes / len(keys)


def fill_broker(
    broker: EmbeddedBroker, topic: str, messages: int, queues: int, keys: int | list[str], body_size: int = 64
) -> list[str]:
    """Create ``topic`` and send ``messages``, cycling over ``keys`` (a list,
    or a count of :func:`account_keys`); the queue is chosen by key hash, as
    RocketMQ's hash selector does.  Returns the keys."""
    key_list = account_keys(keys) if isinstance(keys, int) else keys
    n = len(key_list)
    broker.create_topic(topic, queue_count=queues)
    body = b"x" * body_size
    broker.send_batch(topic, ((body, key_list[i % n]) for i in range(messages)))
    return key_list


class _Checker:
    """Per-lane order bookkeeping, lock-free: in KEY_ORDERLY mode a key only
    ever runs on one lane thread, so each thread keeps its own last offsets."""

    def __init__(self, work: Callable[[], None] | None) -> None:
        self._local = threading.local()
        self._all: list[tuple[dict[tuple[str | None, int], int], list[int], list[tuple[int, int]]]] = []
        self._lock = threading.Lock()
        self._work = work

    def __call__(self, msgs: list[MessageExt]) -> None:
        local = self._local
        try:
            last, bad, seen = local.last, local.bad, local.seen
        except AttributeError:
            last, bad, seen = local.last, local.bad, local.seen = {}, [0], []
            with self._lock:
                self._all.append((last, bad, seen))
        for m in msgs:
            k = (m.keys, m.queue_id)
            off = m.queue_offset
            if last.get(k, -1) >= off:
                bad[0] += 1
            last[k] = off
            seen.append((m.queue_id, off))
        if self._work is not None:
            self._work()

    def totals(self) -> tuple[int, int, set[tuple[int, int]]]:
        with self._lock:
            inversions = sum(b[0] for _, b, _ in self._all)
            deliveries = sum(len(s) for _, _, s in self._all)
            unique = set().union(*(set(s) for _, _, s in self._all)) if self._all else set()
        return inversions, deliveries, unique


def run_once(
    broker: EmbeddedBroker,
    topic: str,
    label: str,
    config: ConsumerConfig,
    work: Callable[[], None] | None = None,
    *,
    check: bool = True,
    progress: Callable[[LitePushConsumer, int], None] | None = None,
) -> RunResult:
    """Consume ``topic`` from the first offset with ``config`` until every
    message is done; time it and check order, loss and duplicates."""
    total = sum(broker.max_offset(q) - broker.min_offset(q) for q in broker.queues(topic))
    checker = _Checker(work) if check else None
    listener: Callable[[list[MessageExt]], None]
    if checker is not None:
        listener = checker
    elif work is None:
        listener = _noop
    else:
        def listener(msgs: list[MessageExt], _work: Callable[[], None] = work) -> None:
            for _ in msgs:
                _work()

    source = broker.pull_consumer(config.group, consume_from=ConsumeFromWhere.FIRST_OFFSET)
    consumer = LitePushConsumer(config, source=source, listener=listener)
    consumer.subscribe(topic)
    t0 = time.perf_counter()
    consumer.start()
    while True:
        consumed = consumer.stats().consumed
        if consumed >= total:
            break
        if progress is not None:
            progress(consumer, total)
        time.sleep(0.002 if total < 50_000 else 0.02)
    seconds = time.perf_counter() - t0
    consumer.shutdown(timeout=30)
    if checker is None:
        return RunResult(label, total, seconds, 0, 0, 0)
    inversions, deliveries, unique = checker.totals()
    return RunResult(label, total, seconds, inversions, total - len(unique), deliveries - len(unique))


def _noop(msgs: list[MessageExt]) -> None:
    return None


def main(argv: list[str] | None = None) -> int:
    """Run the demo; return the exit status (1 when the check fails)."""
    parser = argparse.ArgumentParser(prog="lite-push demo", description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--lanes", type=int, default=64)
    parser.add_argument("--io-ms", type=float, default=1.0, help="simulated I/O per message (sleep), ms")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    broker = EmbeddedBroker()
    t0 = time.perf_counter()
    keys = fill_broker(broker, "DEMO", args.messages, args.queues, args.keys)
    print(
        f"produced {args.messages:,} messages over {args.queues} queues and {args.keys:,} keys "
        f"in {time.perf_counter() - t0:.2f}s (router: {ROUTER_IMPL})"
    )
    delay = args.io_ms / 1000.0
    work = (lambda: time.sleep(delay)) if delay > 0 else None
    last = [time.monotonic()]

    def progress(consumer: LitePushConsumer, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 1.0:
            last[0] = now
            st = consumer.stats()
            print(
                f"  consumed {st.consumed:>9,}/{total:,}  in flight {sum(st.in_flight.values()):>6,}  "
                f"paused queues {len(st.paused)}",
                flush=True,
            )

    config = ConsumerConfig(group="demo", mode=ConsumeMode.KEY_ORDERLY, lanes=args.lanes)
    result = run_once(broker, "DEMO", f"KEY_ORDERLY lanes={args.lanes}", config, work, progress=progress)
    balance = lane_balance(keys, args.lanes)
    ideal = args.lanes / delay / balance if delay > 0 else float("inf")
    print(
        f"{result.label}: {result.messages:,} messages in {result.seconds:.2f}s = {result.rate:,.0f} msg/s"
        + (
            f" ({result.rate / ideal:.0%} of the {ideal:,.0f} msg/s that {args.lanes} lanes x {args.io_ms} ms allow"
            f" with the busiest lane holding {balance:.2f}x the mean share of keys)"
            if delay > 0
            else ""
        )
    )
    ok = result.inversions == 0 and result.lost == 0
    print(
        f"ordering check: {result.inversions} per-key order inversions, {result.lost} lost, "
        f"{result.duplicates} duplicates -> {'OK' if ok else 'FAILED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
