"""The asyncio executor's own behaviour: async listeners over a thousand
lanes keep key order, the hand-off into the loop is batched, a blocking
listener is detected and logged, embedding in an application's loop and
``run()`` stand-alone, and clear errors for a listener of the wrong kind.
(The runtime's shared semantics run on every executor in test_consumer.py
and test_failures.py.)"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections import defaultdict

import pytest
from helpers import wait_until

from lite_push import (
    AsyncLitePushConsumer,
    ConfigError,
    ConsumeFromWhere,
    ConsumeMode,
    ConsumerConfig,
    EmbeddedBroker,
    LitePushConsumer,
    LitePushError,
    MessageExt,
)

LOOPS = ["asyncio", "uvloop"]


def _run(kind: str, coro) -> object:  # type: ignore[no-untyped-def]
    if kind == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def _count(caplog: pytest.LogCaptureFixture, text: str, level: int) -> int:
    """Records at ``level`` saying ``text`` so far."""
    return sum(text in r.getMessage() and r.levelno == level for r in list(caplog.records))


async def _logged(caplog: pytest.LogCaptureFixture, text: str, level: int, more_than: int = 0) -> None:
    """Wait (on the running loop, at most 10 s) until more than
    ``more_than`` records at ``level`` said ``text``: the watchdog has looked
    at a block and judged it."""
    deadline = time.monotonic() + 10.0
    while _count(caplog, text, level) <= more_than:
        if time.monotonic() > deadline:
            raise AssertionError(f"no new record saying {text!r} within 10 s: {caplog.text[-2000:]}")
        await asyncio.sleep(0.01)


def _consumer(broker: EmbeddedBroker, listener, **cfg) -> AsyncLitePushConsumer:  # type: ignore[no-untyped-def]
    cfg.setdefault("poll_timeout", 0.02)
    cfg.setdefault("commit_interval", 0.05)
    c = AsyncLitePushConsumer(
        ConsumerConfig(group="g", executor="asyncio", **cfg),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener,
    )
    c.subscribe("T")
    return c


class AsyncRecorder:
    """Records deliveries and keys that were ever in the listener twice."""

    def __init__(self, seed: int = 7, delay: float = 0.001) -> None:
        self.active: set[str | None] = set()
        self.overlaps: list[str | None] = []
        self.order: dict[str | None, list[tuple[int, int]]] = defaultdict(list)
        self.count = 0
        self.rng = random.Random(seed)
        self.delay = delay

    async def __call__(self, msgs: list[MessageExt]) -> None:
        for m in msgs:  # one loop thread: no lock needed
            if m.keys in self.active:
                self.overlaps.append(m.keys)
            self.active.add(m.keys)
            self.order[m.keys].append((m.queue_id, m.queue_offset))
        await asyncio.sleep(self.rng.random() * self.delay)
        for m in msgs:
            self.active.discard(m.keys)
        self.count += len(msgs)


@pytest.mark.parametrize("kind", LOOPS)
@pytest.mark.parametrize("lanes", [1, 64, 1024])
def test_async_lanes_keep_key_order_with_random_delays(kind: str, lanes: int) -> None:
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=8)
    total = 6000
    broker.send_batch("T", [(b"x", f"k{i % 500}") for i in range(total)])
    rec = AsyncRecorder()

    async def main() -> None:
        async with _consumer(broker, rec, lanes=lanes) as c:
            while c.stats().consumed < total:
                await asyncio.sleep(0.01)
            queues = broker.queues("T")
            while sum(c.stats().committed.get(q, 0) for q in queues) < total:
                await asyncio.sleep(0.01)

    _run(kind, asyncio.wait_for(main(), 60))
    assert rec.overlaps == []
    assert rec.count == total
    for key, seq in rec.order.items():
        for qid in {q for q, _ in seq}:
            offs = [o for q, o in seq if q == qid]
            assert offs == sorted(offs) and len(set(offs)) == len(offs), key


def test_the_source_is_read_and_routed_on_the_loops_own_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pull side is a task on the loop: the source is read and every
    dispatch routed there (a message crosses no thread); the helper thread
    only waits for the source when nothing is ready, and nothing is handed
    into the loop from another thread per dispatch."""
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=4)
    total = 4000
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(total)])
    threads: dict[str, list[int]] = defaultdict(list)
    source_class = type(broker.pull_consumer("probe"))

    def counted(name: str, real):  # type: ignore[no-untyped-def]
        def call(*args, **kw):  # type: ignore[no-untyped-def]
            threads[name].append(threading.get_ident())
            return real(*args, **kw)

        return call

    from lite_push._pull.dispatch import Dispatcher

    monkeypatch.setattr(source_class, "poll_nowait", counted("poll_nowait", source_class.poll_nowait))
    monkeypatch.setattr(source_class, "poll", counted("poll", source_class.poll))
    monkeypatch.setattr(Dispatcher, "route_pending", counted("route", Dispatcher.route_pending))
    handed: list[str] = []

    async def listener(msgs: list[MessageExt]) -> None:
        await asyncio.sleep(0)

    async def main() -> int:
        c = _consumer(broker, listener, lanes=1024)
        loop = asyncio.get_running_loop()
        real = loop.call_soon_threadsafe

        def counting(cb, *args, **kw):  # type: ignore[no-untyped-def]
            handed.append(getattr(cb, "__qualname__", repr(cb)))
            return real(cb, *args, **kw)

        monkeypatch.setattr(loop, "call_soon_threadsafe", counting)
        async with c:
            while c.stats().consumed < total:
                await asyncio.sleep(0.01)
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert threads["route"] and set(threads["route"]) == {loop_thread}
    assert threads["poll_nowait"] and set(threads["poll_nowait"]) == {loop_thread}
    assert loop_thread not in set(threads["poll"])  # a blocking poll runs on the helper thread
    # No lane is started from another thread while consuming: the hand-offs
    # into the loop are the helper's answers (its calls' results), not lanes.
    assert not [h for h in handed if "start_lanes" in h], handed


@pytest.mark.parametrize("kind", LOOPS)
def test_an_idle_lane_has_no_task(kind: str) -> None:
    """A lane's task runs while the lane has work: with 1,024 lanes and 20
    keys no more than 20 lane tasks ever run at once, none once everything
    is consumed, and new work starts them again."""
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=4)
    broker.send_batch("T", [(b"x", f"k{i % 20}") for i in range(2000)])
    rec = AsyncRecorder(delay=0.002)
    most = 0

    def lane_tasks() -> int:
        return sum(t.get_name().startswith("lite-push-lane-") for t in asyncio.all_tasks())

    async def main() -> None:
        nonlocal most
        async with _consumer(broker, rec, lanes=1024) as c:
            while c.stats().consumed < 2000:
                most = max(most, lane_tasks())
                await asyncio.sleep(0.001)
            deadline = time.monotonic() + 10
            while lane_tasks() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert lane_tasks() == 0
            broker.send_batch("T", [(b"y", f"k{i % 3}") for i in range(30)])
            while c.stats().consumed < 2030:
                await asyncio.sleep(0.01)

    _run(kind, asyncio.wait_for(main(), 60))
    assert 1 <= most <= 20, most
    assert rec.overlaps == [] and rec.count == 2030


@pytest.mark.parametrize("kind", LOOPS)
def test_a_listener_blocking_the_loop_is_logged_with_its_duration(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(20)])

    async def listener(msgs: list[MessageExt]) -> None:
        if msgs[0].queue_offset == 10:
            time.sleep(0.4)  # the mistake: a blocking call in an async listener
        await asyncio.sleep(0)

    async def main() -> AsyncLitePushConsumer:
        async with _consumer(broker, listener, lanes=4, loop_block_threshold=0.1) as c:
            while c.stats().consumed < 20:
                await asyncio.sleep(0.01)
            # the watchdog sees the loop turn again and reports the block
            await _logged(caplog, "blocked the event loop", logging.WARNING)
        return c

    with caplog.at_level(logging.WARNING, logger="lite_push"):
        c = _run(kind, main())
    blocked = [r.getMessage() for r in caplog.records if "blocked the event loop" in r.getMessage()]
    assert len(blocked) == 1, blocked
    assert "offset 10" in blocked[0] and "listener" in blocked[0], blocked[0]
    assert 0.3 <= c.longest_block <= 1.0  # type: ignore[attr-defined]
    ms = int(blocked[0].split("for ")[1].split(" ms")[0])
    assert 300 <= ms <= 1000


def _blocked(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in list(caplog.records) if "blocked the event loop" in r.getMessage()]


@pytest.mark.parametrize("kind", LOOPS)
@pytest.mark.parametrize("awaits", [True, False], ids=["awaits", "never-awaits"])
def test_two_blocks_in_a_row_are_each_reported(kind: str, awaits: bool, caplog: pytest.LogCaptureFixture) -> None:
    """Two listener calls one after the other (one key: one lane), each
    blocking: two reports, each naming its own message, whether the loop
    turns between them (the listener awaits after blocking: the lane's next
    step is queued ahead of the watchdog's timer) or not at all."""
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    broker.send_batch("T", [(b"x", "k") for _ in range(10)])

    async def listener(msgs: list[MessageExt]) -> None:
        if msgs[0].queue_offset in (5, 6):
            time.sleep(0.4)
            if not awaits:
                return
        await asyncio.sleep(0)

    async def main() -> AsyncLitePushConsumer:
        async with _consumer(broker, listener, lanes=4, loop_block_threshold=0.1) as c:
            while c.stats().consumed < 10:
                await asyncio.sleep(0.01)
            await _logged(caplog, "blocked the event loop", logging.WARNING, more_than=1)
        return c

    with caplog.at_level(logging.WARNING, logger="lite_push"):
        c = _run(kind, main())
    blocked = _blocked(caplog)
    assert len(blocked) == 2, blocked
    assert "offset 5 " in blocked[0] and "offset 6 " in blocked[1], blocked
    assert c.watchdog.blocks == 2  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", LOOPS)
def test_a_block_just_before_shutdown_is_reported_before_shutdown_returns(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The listener blocks on the last message and the application stops
    the consumer at once.  The watchdog's thread is held from looking again
    after the block (as when the shutdown is quicker than its next look):
    closing it still has the block reported, before shutdown returns."""
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(10)])

    class LateWatch(threading.Event):
        # the watchdog's wait: once the block is over, it does not come
        # back before the watch is closed
        def __init__(self) -> None:
            super().__init__()
            self.over = threading.Event()
            self.parked = threading.Event()

        def wait(self, timeout: float | None = None) -> bool:
            if self.over.is_set():
                self.parked.set()
                return super().wait()
            return super().wait(timeout)

    watch = LateWatch()
    done = asyncio.Event()  # (bound to the loop that first waits on it)

    async def listener(msgs: list[MessageExt]) -> None:
        if msgs[0].queue_offset == 9:
            time.sleep(0.4)
            watch.over.set()
            assert watch.parked.wait(10.0)  # the loop turns only once the watchdog waits for good
            done.set()
        await asyncio.sleep(0)

    async def main() -> list[str]:
        c = _consumer(broker, listener, lanes=4, loop_block_threshold=0.1)
        c.watchdog.stop = watch
        async with c:
            await done.wait()
        return _blocked(caplog)  # shutdown has returned

    with caplog.at_level(logging.WARNING, logger="lite_push"):
        blocked = _run(kind, main())
    assert len(blocked) == 1, blocked
    assert "offset 9 " in blocked[0] and "still blocked" not in blocked[0], blocked


def test_a_block_outside_the_listeners_is_not_blamed_on_one(caplog: pytest.LogCaptureFixture) -> None:
    """The application's own code blocking the loop (here a callback) is
    not reported as a listener's block: only a debug line says the loop did
    not turn."""
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(20)])

    async def listener(msgs: list[MessageExt]) -> None:
        await asyncio.sleep(0.001)

    async def main() -> None:
        async with _consumer(broker, listener, lanes=4, loop_block_threshold=0.1) as c:
            while c.stats().consumed < 10:
                await asyncio.sleep(0.001)
            before = _count(caplog, "did not turn", logging.DEBUG)
            asyncio.get_running_loop().call_soon(time.sleep, 0.4)
            await asyncio.sleep(0.01)  # returns once the block is over
            # the watchdog sees the loop turn again and judges this block: not a listener's
            await _logged(caplog, "did not turn", logging.DEBUG, more_than=before)
            while c.stats().consumed < 20:
                await asyncio.sleep(0.01)

    with caplog.at_level(logging.DEBUG, logger="lite_push"):
        asyncio.run(main())
    assert not [r for r in caplog.records if "blocked the event loop" in r.getMessage()]
    assert [r for r in caplog.records if "did not turn" in r.getMessage() and r.levelno == logging.DEBUG]


def test_a_stall_of_the_whole_process_is_not_blamed_on_the_listener(caplog: pytest.LogCaptureFixture) -> None:
    """When the watchdog thread itself did not run while the loop was
    blocked (a VM pause, a long GC, C code holding the GIL), the process
    stalled: that is logged at debug, and no listener is blamed."""
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(20)])
    in_listener = threading.Event()

    class StalledWatch(threading.Event):
        # the watchdog's tick wait: while the listener blocks, it "is not
        # scheduled" for 0.6 s, as under a stall of the whole process
        def __init__(self) -> None:
            super().__init__()
            self.stalled = False
            #: The watchdog's waits since the stall: each starts a turn of
            #: its loop, after the one before was judged.
            self.waits_since = 0

        def wait(self, timeout: float | None = None) -> bool:
            if in_listener.is_set():
                in_listener.clear()
                time.sleep(0.6)
                self.stalled = True
            elif self.stalled:
                self.waits_since += 1
            return super().wait(timeout)

    async def listener(msgs: list[MessageExt]) -> None:
        if msgs[0].queue_offset == 10:
            in_listener.set()
            time.sleep(0.4)
        await asyncio.sleep(0)

    async def main() -> None:
        c = _consumer(broker, listener, lanes=4, loop_block_threshold=0.1)
        c.watchdog.stop = watch = StalledWatch()
        async with c:
            while c.stats().consumed < 20:
                await asyncio.sleep(0.01)
            # the watchdog is back, judged the turn of the stall and one more
            deadline = time.monotonic() + 10.0
            while watch.waits_since < 2:
                assert time.monotonic() < deadline, "the watchdog did not go on after the stall"
                await asyncio.sleep(0.01)

    with caplog.at_level(logging.DEBUG, logger="lite_push"):
        asyncio.run(main())
    assert not [r for r in caplog.records if "blocked the event loop" in r.getMessage()]
    assert [r for r in caplog.records if "process stalled" in r.getMessage() and r.levelno == logging.DEBUG]


def test_a_listener_that_awaits_is_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    broker.send_batch("T", [(b"x", "k") for _ in range(5)])

    async def listener(msgs: list[MessageExt]) -> None:
        await asyncio.sleep(0.3)  # long, but awaiting: the loop keeps turning

    async def main() -> None:
        async with _consumer(broker, listener, lanes=2, loop_block_threshold=0.1) as c:
            while c.stats().consumed < 5:
                await asyncio.sleep(0.01)

    with caplog.at_level(logging.WARNING, logger="lite_push"):
        asyncio.run(main())
    assert not [r for r in caplog.records if "blocked the event loop" in r.getMessage()]


def test_run_stand_alone_until_an_awaitable_then_drains_and_commits() -> None:
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=2)
    broker.send_batch("T", [(b"x", f"k{i % 10}") for i in range(500)])
    rec = AsyncRecorder(delay=0.0005)
    c = _consumer(broker, rec, lanes=32)

    async def until_done() -> None:
        while c.stats().consumed < 500:
            await asyncio.sleep(0.01)

    c.run(until_done())  # uvloop when installed
    assert rec.count == 500 and rec.overlaps == []
    check = broker.pull_consumer("g")
    assert sum(check.committed(q).offset for q in broker.queues("T")) == 500  # type: ignore[union-attr]
    check.close()


def test_plain_code_runs_an_async_listener_on_a_loop_of_the_consumers_own() -> None:
    # LitePushConsumer with executor="asyncio": start() is a plain call (not
    # a coroutine) that starts an event loop on a thread of its own; the
    # lanes run there with the same guarantees; shutdown() drains, commits
    # and stops that loop.
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=4)
    total = 2000
    broker.send_batch("T", [(b"x", f"k{i % 100}") for i in range(total)])
    rec = AsyncRecorder(delay=0.0005)
    loops: set[int] = set()

    async def listener(msgs: list[MessageExt]) -> None:
        loops.add(id(asyncio.get_running_loop()))
        await rec(msgs)

    c = LitePushConsumer(
        ConsumerConfig(group="g", executor="asyncio", lanes=64, poll_timeout=0.02, commit_interval=0.05),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener,
    )
    assert not isinstance(c, AsyncLitePushConsumer)
    c.subscribe("T")
    before = {t.name for t in threading.enumerate()}
    assert c.start() is None  # type: ignore[func-returns-value]
    loop_threads = [t for t in threading.enumerate() if t.name == "lite-push-loop-g"]
    assert len(loop_threads) == 1 and "lite-push-loop-g" not in before
    assert wait_until(lambda: c.stats().consumed == total)
    assert c.shutdown() is True
    assert not loop_threads[0].is_alive()  # the consumer's loop stopped with it
    assert rec.count == total and rec.overlaps == [] and len(loops) == 1
    for key, seq in rec.order.items():
        for qid in {q for q, _ in seq}:
            offs = [o for q, o in seq if q == qid]
            assert offs == sorted(offs), key
    check = broker.pull_consumer("g")
    assert sum(check.committed(q).offset for q in broker.queues("T")) == total  # type: ignore[union-attr]
    check.close()


def test_the_wrong_kind_of_listener_or_consumer_is_a_clear_error() -> None:
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)

    def plain(msgs: list[MessageExt]) -> None:
        return None

    async def coro(msgs: list[MessageExt]) -> None:
        return None

    # an executor named explicitly must fit the listener: the error names executor
    with pytest.raises(ConfigError, match="'asyncio' runs an `async def` listener, but .*plain") as info:
        LitePushConsumer(
            ConsumerConfig(group="g", executor="asyncio"), source=broker.pull_consumer("g"), listener=plain
        )
    assert info.value.field == "executor"
    with pytest.raises(ConfigError, match="'thread' runs a plain listener, but .*async def") as info:
        LitePushConsumer(ConsumerConfig(group="g", executor="thread"), source=broker.pull_consumer("g"), listener=coro)
    assert info.value.field == "executor"
    with pytest.raises(ConfigError, match="executor") as info:
        AsyncLitePushConsumer(
            ConsumerConfig(group="g", executor="thread"), source=broker.pull_consumer("g"), listener=coro
        )
    assert info.value.field == "executor"
    with pytest.raises(ConfigError, match="needs an `async def` listener") as info:
        AsyncLitePushConsumer(ConsumerConfig(group="g"), source=broker.pull_consumer("g"), listener=plain)
    assert info.value.field == "listener"
    with pytest.raises(ConfigError, match="executor"):
        ConsumerConfig(group="g", executor="fibers")
    with pytest.raises(ConfigError, match="threads only"):
        ConsumerConfig(group="g", executor="asyncio", mode=ConsumeMode.QUEUE_ORDERLY)
    with pytest.raises(ConfigError, match="threads only") as info:  # unset: the async def listener would pick asyncio
        LitePushConsumer(
            ConsumerConfig(group="g", mode=ConsumeMode.QUEUE_ORDERLY), source=broker.pull_consumer("g"), listener=coro
        )
    assert info.value.field == "listener"
    with pytest.raises(ConfigError, match="lanes"):
        ConsumerConfig(group="g", executor="thread", lanes=2048)  # threads: at most 1024
    with pytest.raises(ConfigError, match="at most 1024 on threads") as info:  # unset: a plain listener picks threads
        LitePushConsumer(ConsumerConfig(group="g", lanes=2048), source=broker.pull_consumer("g"), listener=plain)
    assert info.value.field == "lanes"
    ConsumerConfig(group="g", executor="asyncio", lanes=4096)
    c = _consumer(broker, coro)
    with pytest.raises(LitePushError, match="async with"):
        with c:
            pass
    asyncio.run(c.shutdown())  # never started: closes the source
