"""Admission (asyncio executor): lanes are let into listener calls as fast
as the loop turns, the ones with the most work first; new keys go to the
lanes admitted (the router's ``limit``, both twins); keys keep their order
and nothing is lost either way; ``loop_turn_target=0`` turns it off."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict, deque
from types import ModuleType

import pytest
from conftest import compiled_twin

from lite_push import (
    AsyncLitePushConsumer,
    ConfigError,
    ConsumeFromWhere,
    ConsumeMode,
    ConsumerConfig,
    EmbeddedBroker,
    MessageExt,
)
from lite_push._exec.admission import ADMISSION_MIN, LATENCY_SHARE, Admission
from lite_push._kernels import router_py as _router_py


def _msgs(keys: list[str | None], queue: int = 0, start: int = 0) -> list[MessageExt]:
    return [MessageExt("T", queue, start + i, b"", keys=k) for i, k in enumerate(keys)]


# -- the router's limit -------------------------------------------------------------


def test_new_keys_go_to_the_least_loaded_lane_under_the_limit(router: ModuleType) -> None:
    r = router.KeyRouter(8, "load")
    r.limit = 3
    _, counts = r.route([("q", _msgs([f"a{i}" for i in range(30)]), 0)])
    assert counts == [10, 10, 10, 0, 0, 0, 0, 0]
    # a key with work stays on its lane whatever the limit
    r.limit = 1
    _, counts = r.route([("q", _msgs(["a1", "a2", "new"], start=30), 0)])
    assert counts == [1, 1, 1, 0, 0, 0, 0, 0]  # a1 on lane 1, a2 on lane 2, the new key on lane 0
    assert (r.lane_of_key("a1"), r.lane_of_key("a2"), r.lane_of_key("new")) == (1, 2, 0)
    # raised again: the lanes past the old limit take new keys (they are the least loaded)
    r.limit = 8
    _, counts = r.route([("q", _msgs([f"b{i}" for i in range(5)], start=40), 0)])
    assert counts[3:] == [1, 1, 1, 1, 1]
    r.limit = 0
    assert r.limit == 1
    r.limit = 99
    assert r.limit == 8


def test_fixed_placements_ignore_the_limit(router: ModuleType) -> None:
    for placement in ("hash", "java"):
        a, b = router.KeyRouter(16, placement), router.KeyRouter(16, placement)
        a.limit = 2
        items = _msgs([f"k{i}" for i in range(200)])
        assert a.route([("q", items, 0)]) == b.route([("q", items, 0)])


def test_twins_place_keys_alike_while_the_limit_moves() -> None:
    router = compiled_twin("router_c")
    rnd = random.Random(3)
    for trial in range(60):
        n = rnd.choice([1, 2, 5, 64, 300])
        rc, rp = router.KeyRouter(n, "load"), _router_py.KeyRouter(n, "load")
        held: list[tuple[int, list[MessageExt]]] = []
        for step in range(40):
            if rnd.random() < 0.4:
                rc.limit = rp.limit = rnd.randrange(0, n + 2)
            groups = []
            for q in range(3):
                pool = [None, "", *(f"k{rnd.randrange(80)}" for _ in range(6))]
                keys = [rnd.choice(pool) for _ in range(rnd.randrange(12))]
                groups.append((q, _msgs(keys, q, step * 100), q % n))
            out = rc.route(groups)
            assert out == rp.route(groups), (trial, step)
            held += [(lane, sub) for lane, segs in enumerate(out[0]) for _, sub in segs or []]
            rnd.shuffle(held)
            k = rnd.randrange(len(held) + 1)
            assert rc.release_from(deque(held[:k])) == rp.release_from(deque(held[:k]))
            held = held[k:]
            assert rc.loads() == rp.loads() and rc.placed_keys() == rp.placed_keys()


# -- admission itself ---------------------------------------------------------------


def test_slots_go_to_the_waiting_lanes_with_the_most_work() -> None:
    async def main() -> None:
        adm = Admission(3, loop=asyncio.get_running_loop(), target=0.0015)
        adm.limit = 2
        assert adm.enter(1) is None and adm.enter(1) is None and adm.active == 2
        small, big = adm.enter(1), adm.enter(500)
        assert small is not None and big is not None and adm.waiting == 2
        adm.leave()
        assert big.done() and not small.done()  # 500 messages of head start
        adm.leave()
        assert small.done() and adm.active == 2
        adm.leave()
        adm.leave()
        assert adm.active == 0

    asyncio.run(main())


def test_the_limit_follows_the_length_of_a_turn() -> None:
    async def main() -> None:
        adm = Admission(1024, loop=asyncio.get_running_loop(), target=0.0015)
        for _ in range(60):
            adm.turned(0.010)  # the loop turns every 10 ms: too many lanes
        assert adm.limit == ADMISSION_MIN
        waiters = [adm.enter(1) for _ in range(ADMISSION_MIN + 50)]
        assert sum(w is None for w in waiters) == ADMISSION_MIN
        adm.turned(0.0012)  # under the target but not by half: no change
        assert adm.limit == ADMISSION_MIN
        for _ in range(100):
            adm.turned(0.0001)  # time to spare: more lanes, up to all of them
        assert adm.limit == 1024 and all(w is None or w.done() for w in waiters)
        assert adm.active == ADMISSION_MIN + 50
        small = Admission(16, loop=asyncio.get_running_loop(), target=0.0015)
        for _ in range(60):
            small.turned(0.010)
        assert small.limit == 16  # never fewer than ADMISSION_MIN: 16 lanes are never limited

    asyncio.run(main())


class FakeClocks:
    """Wall time and the loop thread's CPU, moved by the test."""

    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 10.0

    def step(self, wall: float, cpu: float) -> None:
        self.wall += wall
        self.cpu += cpu


def _run_probes(adm: Admission, clocks: FakeClocks, latency: float, turn: float, probes: int) -> None:
    """``probes`` looks at a loop whose ``adm.active`` lanes each make a
    call of ``latency`` seconds plus a turn, every 5 ms; the loop's CPU is
    what the turns take."""
    for _ in range(probes):
        clocks.step(0.005, 0.004)
        adm.calls += round(adm.active * 0.005 / (latency + turn))
        adm.turned(turn)


@pytest.mark.parametrize(("latency", "limited"), [(0.001, True), (0.010, False), (0.100, False)])
def test_turns_short_against_the_listeners_latency_leave_every_lane_in(latency: float, limited: bool) -> None:
    """Turns of 3 ms: past the 1.5 ms target, so with a 1 ms listener the
    limit comes down; with a 10 ms or 100 ms listener a lane resumed 3 ms
    late loses little, and admission lets every lane with work in (it cut
    a 10 ms listener's throughput by a third before it weighed latency)."""

    async def main() -> None:
        clocks = FakeClocks()
        adm = Admission(
            2048,
            loop=asyncio.get_running_loop(),
            target=0.0015,
            monotonic=lambda: clocks.wall,
            thread_time=lambda: clocks.cpu,
        )
        for _ in range(1000):
            assert adm.enter(1) is None or adm.limit < 1000
        _run_probes(adm, clocks, latency, 0.003, 80)
        if limited:
            assert adm.limit < 1000
        else:
            assert adm.limit == 2048 and adm.waiting == 0
            assert LATENCY_SHARE * latency > 0.003  # the reason

    asyncio.run(main())


def test_a_turn_spent_waiting_for_the_gil_does_not_count() -> None:
    """A turn is weighed by the loop thread's CPU when that is less than
    its wall time: 10 ms of wall time of which 0.2 ms on the loop's CPU
    (the rest waiting for the GIL held by the pull thread, or the cyclic GC
    run by it) leaves the limit alone; 10 ms on the CPU brings it down."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        waited = Admission(1024, loop=loop, target=0.0015)
        busy = Admission(1024, loop=loop, target=0.0015)
        for _ in range(40):
            waited.turned(0.010, 0.0002)
            busy.turned(0.010, 0.010)
        assert waited.limit == 1024 and waited.turn < 0.0015
        assert busy.limit == ADMISSION_MIN

    asyncio.run(main())


# -- end to end ---------------------------------------------------------------------


@pytest.mark.parametrize(("target", "failing"), [(0.0015, False), (0.0, False), (0.0015, True)])
def test_a_saturated_loop_admits_fewer_lanes_and_keeps_key_order(target: float, failing: bool) -> None:
    """1,024 lanes with a 1 ms awaited listener saturate the loop: admission
    lets fewer lanes in, and keys keep their order and exclusivity (with
    ``failing``, one message in 50 fails its first attempt, so keys park
    and are retried on the slow path while lanes wait for slots)."""
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=8)
    total = 20_000
    rnd = random.Random(5)
    broker.send_batch("T", [(b"x", f"k{rnd.randrange(3000)}") for _ in range(total)])
    order: dict[str | None, list[tuple[int, int]]] = defaultdict(list)
    active: set[str | None] = set()
    overlaps: list[str | None] = []
    limits: list[int] = []

    async def listener(msgs: list[MessageExt]) -> None:
        (m,) = msgs
        if m.keys in active:
            overlaps.append(m.keys)
        active.add(m.keys)
        try:
            await asyncio.sleep(0.001)
            if failing and m.queue_offset % 50 == 7 and m.reconsume_times == 0:
                raise RuntimeError("first attempt fails")
            order[m.keys].append((m.queue_id, m.queue_offset))
        finally:
            active.discard(m.keys)

    async def main() -> None:
        c = AsyncLitePushConsumer(
            ConsumerConfig(
                group="g",
                mode=ConsumeMode.KEY_ORDERLY,
                executor="asyncio",
                lanes=1024,
                loop_turn_target=target,
                suspend_ms=5,
            ),
            source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
            listener=listener,
        )
        c.subscribe("T")
        async with c:
            while (st := c.stats()).consumed < total:
                limits.append(st.lanes_admitted)
                await asyncio.sleep(0.01)

    asyncio.run(asyncio.wait_for(main(), 120))
    assert overlaps == []
    assert sum(len(v) for v in order.values()) == total
    for key, seen in order.items():
        for qid in {q for q, _ in seen}:
            offs = [o for q, o in seen if q == qid]
            assert offs == sorted(offs) and len(set(offs)) == len(offs), key
    if target:
        assert min(limits) < 1024  # a thousand 1 ms sleeps a turn is more than the loop turns in 1.5 ms
    else:
        assert set(limits) == {1024}  # admission off: every lane with work runs


def test_loop_turn_target_is_checked() -> None:
    with pytest.raises(ConfigError, match="loop_turn_target"):
        ConsumerConfig(group="g", executor="asyncio", loop_turn_target=-1.0)
    assert ConsumerConfig(group="g", executor="asyncio", loop_turn_target=0).loop_turn_target == 0
