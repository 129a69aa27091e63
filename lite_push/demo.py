"""The demo: produce to the embedded broker, consume in KEY_ORDERLY mode,
report throughput and check per-key order.

``python -m lite_push.demo --help`` (or ``lite-push demo``, which also
serves Prometheus metrics by default).  :func:`run_once` is also what the
benchmarks use to time one configuration; :func:`run_demo` is the demo
itself, :class:`LiveStats` its once-a-second stats line.
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
from typing import TextIO

from ._config import ConsumeMode, ConsumerConfig
from ._consumer import ConsumerStats, LitePushConsumer
from ._kernels.router import ROUTER_IMPL, java_hash, mixed_hash
from ._types import MessageExt
from .sources import ConsumeFromWhere, EmbeddedBroker

__all__ = [
    "LiveStats",
    "RateBound",
    "RunResult",
    "account_keys",
    "add_arguments",
    "count_arg",
    "fill_broker",
    "lane_balance",
    "main",
    "non_negative_number",
    "rate_bound",
    "run_args",
    "run_demo",
    "run_once",
]

logger = logging.getLogger(__name__)

#: Lane placements that fix each key's lane (``ConsumerConfig.lane_placement``).
FIXED_PLACEMENTS = ("hash", "java")


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


def lane_balance(keys: list[str], lanes: int, placement: str = "java") -> float:
    """Busiest lane's share of the keys over the mean share (>= 1) when each
    key has a fixed lane: ``placement`` ``"java"`` (``String.hashCode`` mod
    ``lanes``) or ``"hash"`` (the mixed hash mod ``lanes``).  With evenly
    loaded keys, the throughput of ``lanes`` lanes is at most ``lanes /
    balance`` times one lane's."""
    if placement not in FIXED_PLACEMENTS:
        raise ValueError(f"placement must be one of {FIXED_PLACEMENTS} (a key's fixed lane), got {placement!r}")
    lane = mixed_hash if placement == "hash" else java_hash
    counts = Counter(lane(k) % lanes for k in keys)
    return max(counts.values()) * lanes / len(keys)


@dataclass(frozen=True, slots=True)
class RateBound:
    """The most messages per second ``lanes`` lanes can run when every
    message takes at least ``delay`` seconds, and why."""

    #: Messages per second.
    rate: float
    #: The reason, to follow "the ... msg/s that": ``"64 lanes x 1.0 ms
    #: allow"``, with the busiest lane's share for a fixed placement.
    reason: str


def rate_bound(keys: list[str], messages: int, lanes: int, delay: float, placement: str) -> RateBound:
    """The throughput no run of the demo can beat: ``messages`` cycling over
    ``keys`` (as :func:`fill_broker` sends them) on ``lanes`` lanes, each
    message taking at least ``delay`` seconds (> 0), placed on lanes by
    ``placement`` (``ConsumerConfig.lane_placement``).

    ``"load"`` moves a key with no work to the least-loaded lane, so no
    lane need run more than its share: the bound is ``lanes / delay``.
    ``"hash"`` and ``"java"`` fix each key's lane, so the busiest lane runs
    every message of its keys, one after another: the bound is ``messages /
    (busiest lane's messages x delay)``, the same or lower.  Either way a
    run takes at least ``messages / bound`` seconds of sleeps, so its rate
    is at most the bound."""
    if delay <= 0:
        raise ValueError(f"delay must be > 0, got {delay}")
    if placement == "load" or messages == 0:
        return RateBound(lanes / delay, f"{lanes} lanes x {delay * 1000:g} ms allow")
    lane = mixed_hash if placement == "hash" else java_hash
    n = len(keys)
    per_lane: Counter[int] = Counter()
    for i, key in enumerate(keys):
        per_lane[lane(key) % lanes] += messages // n + (1 if i < messages % n else 0)  # key i's messages
    busiest = max(per_lane.values())
    share = busiest * lanes / messages
    return RateBound(
        messages / (busiest * delay),
        f"{lanes} lanes x {delay * 1000:g} ms allow with {placement} placement, the busiest lane holding "
        f"{share:.2f}x the mean share of messages",
    )


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
    on_start: Callable[[LitePushConsumer], None] | None = None,
) -> RunResult:
    """Consume ``topic`` from the first offset with ``config`` until every
    message is done; time it and check order, loss and duplicates.
    ``progress(consumer, total)`` is called every few milliseconds while it
    runs, ``on_start(consumer)`` once, right after the consumer started."""
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
    if on_start is not None:
        on_start(consumer)
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


class LiveStats:
    """The demo's live stats: a ``progress`` callback for :func:`run_once`
    that prints one line per ``interval`` seconds (of ``clock``) with the
    consumed count, the throughput since the last line, the lag (produced
    minus consumed, and produced minus committed), the messages in flight
    and the paused queues."""

    def __init__(
        self,
        out: TextIO | None = None,
        *,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._out = out
        self._interval = interval
        self._clock = clock
        self._t0 = clock()
        self._last_t = self._t0
        self._last_consumed = 0

    def __call__(self, consumer: LitePushConsumer, total: int) -> None:
        """Print a line when ``interval`` has passed since the last one."""
        now = self._clock()
        if now - self._last_t >= self._interval:
            self.line(consumer.stats(), total, now)

    def line(self, st: ConsumerStats, total: int, now: float) -> str:
        """Print (and return) the stats line of ``st`` at time ``now``."""
        elapsed = now - self._last_t
        rate = (st.consumed - self._last_consumed) / elapsed if elapsed > 0 else 0.0
        self._last_t, self._last_consumed = now, st.consumed
        committed = sum(st.committed.values())
        text = (
            f"  [{now - self._t0:6.1f}s] consumed {st.consumed:>9,}/{total:,}  {rate:>9,.0f} msg/s  "
            f"lag {total - st.consumed:>9,} (uncommitted {max(0, total - committed):,})  "
            f"in flight {sum(st.in_flight.values()):>6,}  paused queues {len(st.paused)}"
        )
        print(text, file=self._out or sys.stdout, flush=True)
        return text


def count_arg(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def non_negative_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser, *, metrics_port: int | None = None) -> None:
    """Add the demo's options to ``parser``; ``metrics_port`` is the
    default of ``--metrics-port`` (``None``: no metrics unless asked)."""
    parser.add_argument("--messages", type=count_arg(0), default=100_000, help="messages to produce (default 100000)")
    parser.add_argument("--queues", type=count_arg(1), default=8, help="queues of the topic (default 8)")
    parser.add_argument("--keys", type=count_arg(1), default=10_000, help="distinct ordering keys (default 10000)")
    parser.add_argument("--lanes", type=int, default=64, help="consumer lanes (default 64)")
    parser.add_argument(
        "--io-ms",
        type=non_negative_number,
        default=1.0,
        metavar="MS",
        help="simulated I/O per message (sleep), ms (default 1)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=metrics_port,
        metavar="PORT",
        help="serve Prometheus metrics on this port (0: any free port; default "
        + ("none" if metrics_port is None else str(metrics_port))
        + ")",
    )
    parser.add_argument(
        "--metrics-addr", default="127.0.0.1", metavar="ADDR", help="address the metrics endpoint binds (127.0.0.1)"
    )
    parser.add_argument("--no-metrics", action="store_true", help="serve no metrics")


def run_demo(
    messages: int = 100_000,
    queues: int = 8,
    keys: int = 10_000,
    lanes: int = 64,
    io_ms: float = 1.0,
    *,
    metrics_port: int | None = None,
    metrics_addr: str = "127.0.0.1",
    out: TextIO | None = None,
) -> int:
    """Produce ``messages`` to an in-memory embedded broker, consume them in
    KEY_ORDERLY mode with ``lanes`` lanes, printing live stats once a second
    to ``out`` (default stdout), and check per-key order.  With
    ``metrics_port`` the consumer serves Prometheus metrics there (its URL is
    printed).  Returns the exit status: 1 when the check fails.  Raises
    ``ConfigError`` (naming the field) for an invalid setting."""

    def say(text: str) -> None:
        print(text, file=out or sys.stdout, flush=True)

    config = ConsumerConfig(
        group="demo", mode=ConsumeMode.KEY_ORDERLY, lanes=lanes, metrics_port=metrics_port, metrics_addr=metrics_addr
    )
    broker = EmbeddedBroker()
    t0 = time.perf_counter()
    key_list = fill_broker(broker, "DEMO", messages, queues, keys)
    say(
        f"produced {messages:,} messages over {queues} queues and {keys:,} keys "
        f"in {time.perf_counter() - t0:.2f}s (router: {ROUTER_IMPL})"
    )
    delay = io_ms / 1000.0
    work = (lambda: time.sleep(delay)) if delay > 0 else None

    def started(consumer: LitePushConsumer) -> None:
        if metrics_port is None:
            return
        url = getattr(consumer, "metrics_url", None)
        if not isinstance(url, str):  # an exporter that does not report its URL
            url = f"http://{metrics_addr}:{metrics_port}/metrics"
        say(f"metrics: {url}")

    live = LiveStats(out)
    result = run_once(broker, "DEMO", f"KEY_ORDERLY lanes={lanes}", config, work, progress=live, on_start=started)
    committed = sum(c.offset for q in broker.queues("DEMO") if (c := broker.committed("demo", q)) is not None)
    say(
        f"  [final ] consumed {messages - result.lost:,}/{messages:,}  {result.rate:,.0f} msg/s  "
        f"lag {result.lost:,} (uncommitted {max(0, messages - committed):,})"
    )
    bound = rate_bound(key_list, messages, lanes, delay, config.lane_placement) if delay > 0 else None
    say(
        f"{result.label}: {result.messages:,} messages in {result.seconds:.2f}s = {result.rate:,.0f} msg/s"
        + (f" ({result.rate / bound.rate:.0%} of the {bound.rate:,.0f} msg/s that {bound.reason})" if bound else "")
    )
    ok = result.inversions == 0 and result.lost == 0
    say(
        f"ordering check: {result.inversions} per-key order inversions, {result.lost} lost, "
        f"{result.duplicates} duplicates -> {'OK' if ok else 'FAILED'}"
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Run the demo; return the exit status (1 when the check fails)."""
    parser = argparse.ArgumentParser(prog="lite-push demo", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_args(parser.parse_args(argv))


def run_args(args: argparse.Namespace) -> int:
    """Run the demo with the options :func:`add_arguments` declared
    (``python -m lite_push.demo`` and ``lite-push demo``)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_demo(
        args.messages,
        args.queues,
        args.keys,
        args.lanes,
        args.io_ms,
        metrics_port=None if args.no_metrics else args.metrics_port,
        metrics_addr=args.metrics_addr,
    )


if __name__ == "__main__":
    sys.exit(main())
