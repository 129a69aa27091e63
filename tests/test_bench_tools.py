"""The benchmark tools around lane placement (issue 17), without Spark:
``Workload.key_format`` and the named workloads, ``partition`` (bounds per
placement), ``bench.parse_runs``, the harness's placement option,
``bench_kernels``' router cases and ``placement_sim``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

# the benchmark modules import each other flat (``import workloads``)
BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from partition import (  # noqa: E402  (benchmarks/ is put on sys.path above)
    balanced_bound,
    greedy_lanes,
    hot_key_rate,
    lanes_of_keys,
    partition_bound,
)
from workloads import KEY_SPACE, WORKLOADS, Workload, get_workload, key_string, keys_for  # noqa: E402

from lite_push._kernels.router import lane_of, mixed_hash  # noqa: E402

BASE = Workload("base", 1_000, 4, 10)


# -- Workload.key_format and the named workloads ----------------------------------


@pytest.mark.parametrize("bad", ["", "LUHN", "seq", None, 3])
def test_key_format_is_validated(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^key_format\b"):
        BASE.replace(key_format=bad)


def test_key_format_keys_and_json_roundtrip(tmp_path: Path) -> None:
    from gen_load import WORKLOAD_JSON, read_workload

    seq = BASE.replace(key_format="sequential")
    assert keys_for(seq) == tuple(f"acct-{r}" for r in range(10))
    assert keys_for(BASE)[0] != "acct-0" and len(keys_for(BASE)[0]) == 16
    assert key_string(7, 42, "sequential") == "acct-7" == key_string(7, 1, "sequential")
    with pytest.raises(ValueError, match="key_format"):
        key_string(1, 42, "nope")
    # the 16-digit limit binds Luhn ids only
    with pytest.raises(ValueError, match=r"^keys\b"):
        BASE.replace(keys=KEY_SPACE + 1)
    assert BASE.replace(keys=KEY_SPACE + 1, key_format="sequential").keys == KEY_SPACE + 1
    assert Workload.from_dict(seq.to_dict()) == seq and seq.to_dict()["key_format"] == "sequential"
    # a _workload.json written before the field existed loads as Luhn ids
    old = {k: v for k, v in get_workload("sms").to_dict().items() if k != "key_format"}
    (tmp_path / WORKLOAD_JSON).write_text(json.dumps(old))
    assert read_workload(tmp_path) == get_workload("sms") and read_workload(tmp_path).key_format == "luhn"


def test_issue_17_named_workloads() -> None:
    sms = get_workload("sms")
    assert get_workload("sms-seq") == sms.replace(name="sms-seq", key_format="sequential")
    assert get_workload("sms-seq-small") == sms.replace(name="sms-seq-small", key_format="sequential", messages=20_000)
    assert get_workload("sms-60k") == sms.replace(name="sms-60k", messages=60_000)
    assert keys_for(get_workload("sms-seq"))[0] == "acct-0"
    io5 = get_workload("io5")
    assert (io5.queues, io5.messages, io5.keys, io5.skew, io5.cost, io5.cost_ms) == (
        4,
        2_000,
        100,
        "uniform",
        "constant",
        5.0,
    )
    io1 = get_workload("io1")
    assert (io1.queues, io1.messages, io1.keys, io1.skew, io1.zipf_s, io1.cost, io1.cost_ms) == (
        8,
        20_000,
        10_000,
        "zipf",
        1.1,
        "constant",
        1.0,
    )
    assert all(w.key_format == "luhn" for name, w in WORKLOADS.items() if not name.startswith("sms-seq"))


# -- partition: bounds per placement -------------------------------------------------

# "a", "b", "c" hash (Java) to 97, 98, 99: java lanes at n=2 are 1, 0, 1.
KEYS = ["a", "b", "c", "a"]
COSTS = [1000, 2000, 3000, 1000]  # us: a 2 ms, b 2 ms, c 3 ms, total 7 ms


def test_partition_bound_per_placement() -> None:
    assert [lane_of(k, 2) for k in "abc"] == [1, 0, 1]
    # java: lane 1 holds a and c, 5 ms
    assert partition_bound(KEYS, COSTS, 1, "KEY_ORDERLY", 2) == pytest.approx(4 / 0.005)
    assert partition_bound(KEYS, COSTS, 1, "KEY_ORDERLY", 2, "java") == pytest.approx(4 / 0.005)
    # hash: the busiest mixed_hash lane
    loads = [0, 0]
    for k, c in zip(KEYS, COSTS, strict=True):
        loads[mixed_hash(k) % 2] += c
    assert partition_bound(KEYS, COSTS, 1, "KEY_ORDERLY", 2, "hash") == pytest.approx(4 / (max(loads) / 1e6))
    # load: max(hottest key 3 ms, total 7 ms / n)
    assert partition_bound(KEYS, COSTS, 1, "KEY_ORDERLY", 2, "load") == pytest.approx(4 / 0.0035)
    assert partition_bound(KEYS, COSTS, 1, "KEY_ORDERLY", 4, "load") == pytest.approx(4 / 0.003)
    assert balanced_bound(KEYS, COSTS, 1) == pytest.approx(4 / 0.007)
    assert hot_key_rate(KEYS, COSTS) == pytest.approx(4 / 0.003)
    assert hot_key_rate(KEYS, [0] * 4) == math.inf
    assert partition_bound(KEYS, [0] * 4, 1, "KEY_ORDERLY", 2, "load") == math.inf
    # placement does not matter to the other modes
    for placement in ("load", "hash", "java"):
        assert partition_bound(KEYS, COSTS, 1, "CONCURRENTLY", 2, placement) == pytest.approx(4 / 0.0035)
        assert partition_bound(KEYS, COSTS, 1, "QUEUE_ORDERLY", 20, placement) == pytest.approx(4 / 0.007)
    with pytest.raises(ValueError, match="placement"):
        partition_bound(KEYS, COSTS, 1, "KEY_ORDERLY", 2, "random")


def test_greedy_and_fixed_lanes_of_keys() -> None:
    # in order of first appearance: a (2 ms) -> 0, b (2 ms) -> 1, c (3 ms) -> the tie's lowest, 0
    assert greedy_lanes(KEYS, COSTS, 2) == {"a": 0, "b": 1, "c": 0}
    assert lanes_of_keys(KEYS, COSTS, 2, "load") == {"a": 0, "b": 1, "c": 0}
    assert lanes_of_keys(KEYS, COSTS, 2, "java") == {"a": 1, "b": 0, "c": 1}
    assert lanes_of_keys(KEYS, COSTS, 3, "hash") == {k: mixed_hash(k) % 3 for k in "abc"}


# -- bench.py's run specs --------------------------------------------------------------


def test_parse_runs() -> None:
    from bench import DEFAULT_POISON_RUNS, DEFAULT_RUNS, Run, parse_runs

    assert parse_runs("QUEUE_ORDERLY:20, KEY_ORDERLY:64@hash,KEY_ORDERLY:256:uvloop@java,LOOP:256:uvloop@load") == [
        Run("QUEUE_ORDERLY", 20, "load"),
        Run("KEY_ORDERLY", 64, "hash"),
        Run("KEY_ORDERLY:uvloop", 256, "java"),
        Run("LOOP:uvloop", 256, "load"),
    ]
    assert parse_runs("KEY_ORDERLY:8:thread,CONCURRENTLY:16") == [Run("KEY_ORDERLY", 8), Run("CONCURRENTLY", 16)]
    assert all(r.placement == "load" for r in parse_runs(DEFAULT_RUNS) + parse_runs(DEFAULT_POISON_RUNS))


@pytest.mark.parametrize(
    "bad",
    [
        "KEY_ORDERLY",
        "KEY_ORDERLY:0",
        "KEY_ORDERLY:x",
        "FAST:4",
        "KEY_ORDERLY:4:gevent",
        "QUEUE_ORDERLY:20:uvloop",
        "LOOP:64",
        "KEY_ORDERLY:64@",
        "KEY_ORDERLY:64@random",
        "KEY_ORDERLY:64@java@hash",
        "QUEUE_ORDERLY:20@java",
        "CONCURRENTLY:16@hash",
        "KEY_ORDERLY:64,KEY_ORDERLY:64@load",
    ],
)
def test_parse_runs_rejects_bad_entries(bad: str) -> None:
    from bench import parse_runs

    with pytest.raises(SystemExit, match="--runs"):
        parse_runs(bad)


# -- the harness ------------------------------------------------------------------------


def _tiny_workload(tmp_path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    keys = ["b", "d", "b", "d", "f", "b"]
    out = tmp_path / "workload"
    out.mkdir()
    pq.write_table(
        pa.table(
            {
                "seq": pa.array(range(len(keys)), pa.int64()),
                "key": keys,
                "cost_us": pa.array([200] * len(keys), pa.int32()),
                "body_size": pa.array([16] * len(keys), pa.int32()),
            }
        ),
        out / "part-0.parquet",
    )
    return out


@pytest.mark.parametrize(("placement", "label"), [("load", "KEY_ORDERLY-2"), ("java", "KEY_ORDERLY-2-java")])
def test_harness_runs_a_placement(tmp_path: Path, placement: str, label: str) -> None:
    import pyarrow.parquet as pq
    from harness import run_one

    from lite_push import ConsumeMode

    wl = _tiny_workload(tmp_path)
    result = run_one(wl, ConsumeMode.KEY_ORDERLY, 2, 2, tmp_path / "logs", False, placement=placement)
    keys = ["b", "d", "b", "d", "f", "b"]
    costs = [200] * 6
    assert result["run"] == label and result["placement"] == placement and result["messages"] == 6
    assert result["bound_rate"] == pytest.approx(partition_bound(keys, costs, 2, "KEY_ORDERLY", 2, placement))
    assert result["hot_key_rate"] == pytest.approx(6 / 0.0006)
    log = pq.read_table(tmp_path / "logs" / f"{label}.parquet")
    assert sorted(log.column("seq").to_pylist()) == list(range(6))
    if placement == "java":  # the thread lanes log their index: each key on its Java lane
        lanes = dict(zip(log.column("key").to_pylist(), log.column("lane").to_pylist(), strict=True))
        assert lanes == {k: lane_of(k, 2) for k in "bdf"}


def test_harness_refuses_a_placement_without_keyed_lanes(tmp_path: Path) -> None:
    from harness import run_one

    from lite_push import ConsumeMode

    with pytest.raises(SystemExit, match="placement"):
        run_one(_tiny_workload(tmp_path), ConsumeMode.QUEUE_ORDERLY, 2, 2, None, False, placement="hash")


def test_bare_loop_uses_the_placement() -> None:
    from harness import TOPIC, bare_loop
    from recorders import AsyncRecorder

    from lite_push import EmbeddedBroker

    keys = ["b", "d"] * 4
    broker = EmbeddedBroker()
    broker.create_topic(TOPIC, queue_count=1)
    broker.send_batch(TOPIC, [(seq.to_bytes(8, "big"), key) for seq, key in enumerate(keys)])
    times = {}
    for placement in ("load", "java"):
        rec = AsyncRecorder([20_000] * 8)  # 20 ms each
        seconds, _, _ = bare_loop(broker, rec, 2, 8, "asyncio", placement)
        times[placement] = seconds
        assert sorted(rec.table("r", keys).column("seq").to_pylist()) == list(range(8))
    # java puts b and d on one lane (8 x 20 ms), the greedy split on two (4 x 20 ms)
    assert times["java"] >= 0.16 and times["load"] < times["java"]


# -- bench_kernels' router cases -----------------------------------------------------


@pytest.mark.parametrize("module", ["lite_push._kernels.router_py", "lite_push._kernels.router_c"])
@pytest.mark.parametrize("placement", ["load", "hash", "java"])
def test_kernel_route_cases_run(module: str, placement: str) -> None:
    import importlib

    import bench_kernels

    from lite_push import MessageExt

    router = importlib.import_module(module)
    made: list[_WatchedRouter] = []

    def key_router(n: int, placement: str) -> _WatchedRouter:
        made.append(_WatchedRouter(router.KeyRouter(n, placement)))
        return made[-1]

    batches = [[MessageExt("T", 0, i * 10 + j, b"", keys=f"k{(i + j) % 7}") for j in range(10)] for i in range(3)]
    run = bench_kernels.route_case(SimpleNamespace(KeyRouter=key_router), batches, 4, placement)  # type: ignore[arg-type]
    (kr,) = made
    warm = kr.routed  # fixed placements route once to warm the key cache
    for n in (1, 2):  # twice: each run must find the router as the last one left it, empty
        run()
        assert kr.routed == warm + 30 * n  # every message of every batch was routed
        # nothing left tracked: every key released, every lane's load back to 0
        assert kr.router.placed_keys() == 0 and kr.router.loads() == [0] * 4
    if placement == "load":  # and it was not empty all along: keys were tracked between route and release
        assert kr.peak_keys == 7


class _WatchedRouter:
    """A KeyRouter as ``route_case`` uses it, counting what it routes and
    the most keys it tracked at once."""

    def __init__(self, router: Any) -> None:
        self.router = router
        self.routed = 0
        self.peak_keys = 0

    def route(self, groups: Any) -> Any:
        segments, counts = self.router.route(groups)
        self.routed += sum(counts)
        self.peak_keys = max(self.peak_keys, self.router.placed_keys())
        return segments, counts

    def __getattr__(self, name: str) -> Any:  # release_from, placed_keys, loads
        return getattr(self.router, name)


# -- placement_sim -----------------------------------------------------------------------


def test_least_loaded_beats_a_colliding_hash() -> None:
    from placement_sim import POLICIES, simulate

    # "b" and "d" share lane 0 of 2 under both hashes; least-loaded splits them
    assert lane_of("b", 2) == lane_of("d", 2) and mixed_hash("b") % 2 == mixed_hash("d") % 2
    keys = ["b", "d"] * 4
    costs = [1000] * 8
    rates = {p: simulate(keys, costs, 1, 2, p).rate for p in POLICIES}
    assert rates["least-loaded"] == pytest.approx(8 / 0.004) == pytest.approx(balanced_bound(keys, costs, 2))
    assert rates["hash"] == pytest.approx(8 / 0.008) == rates["java"]
    assert rates["least-loaded"] >= max(rates.values())


def test_simulation_respects_the_bounds_and_matches_fixed_partitions() -> None:
    import random

    from placement_sim import POLICIES, Model, TwoChoices, simulate

    rng = random.Random(5)
    keys = [f"k{min(int(rng.expovariate(0.3)), 40)}" for _ in range(3_000)]
    costs = [rng.randrange(0, 3000) for _ in keys]
    for lanes in (3, 16):
        bound = balanced_bound(keys, costs, lanes)
        for policy in POLICIES:
            for model in (Model(), Model(window=50), Model(per_message=True)):
                r = simulate(keys, costs, 4, lanes, policy, model)
                assert r.messages == 3_000 and r.dispatches >= 3
                assert r.rate <= bound * (1 + 1e-9), (policy, lanes, model)
        # the whole load fits one window: a fixed placement's makespan is its busiest lane
        for placement in ("hash", "java"):
            r = simulate(keys, costs, 4, lanes, placement, Model(window=10**6, budget=10**6))
            assert r.rate == pytest.approx(partition_bound(keys, costs, 4, "KEY_ORDERLY", lanes, placement))
    # flow control: about a thousand messages per queue in flight, never the whole backlog
    assert simulate(keys, costs, 1, 4, "hash").max_in_flight <= 1000 + 32
    # two-choices is seeded
    a = simulate(keys, costs, 4, 16, "two-choices", seed=1)
    assert a == simulate(keys, costs, 4, 16, "two-choices", seed=1)
    with pytest.raises(ValueError, match="policy"):
        simulate(keys, costs, 4, 16, "random")
    # two-choices keeps a key with work on its lane, and forgets it once released
    tc = TwoChoices(2, ["x", "y", "x"].__getitem__)
    segments, counts = tc.route([("q", [0, 1, 2], 0)])
    assert sum(counts) == 3
    by_lane = {lane: items for lane, segs in enumerate(segments) if segs for _, items in segs}
    assert any({0, 2} <= set(items) for items in by_lane.values())
    for lane, items in by_lane.items():
        tc.release(lane, items)
    assert tc._table == {} and tc._loads == [0, 0]


def test_placement_sim_cli_prints_a_table(capsys: Any) -> None:
    from placement_sim import main

    assert main(["--workloads", "io5", "--lanes", "4,128", "--policies", "least-loaded,java"]) == 0
    out = capsys.readouterr().out
    assert "| io5 | 4 |" in out and "| io5 | 128 |" in out and "least-loaded | java |" in out


# -- bench_hung_key (issue 29) -------------------------------------------------------------


def test_hung_key_checks_find_loss_duplicates_inversions_and_overlaps() -> None:
    from bench_hung_key import Deliveries

    good = Deliveries()
    for seq, key in enumerate(["hung", "a", "b", "a"]):
        good.begin(key, seq)
        good.end(key, seq)
    assert good.problems(4) == [] and good.others == 3
    bad = Deliveries()
    bad.begin("a", 3)  # a's later message first, and still running when its earlier one starts
    bad.begin("a", 1)
    bad.end("a", 1)
    bad.end("a", 3)
    bad.begin("b", 2)
    bad.begin("c", 2)  # seq 2 twice; seq 0 never
    problems = "; ".join(bad.problems(4))
    assert "1 message(s) never ran" in problems and "1 message(s) ran more than once" in problems
    assert "1 per-key order inversion(s)" in problems and "1 call(s) of a key while another" in problems


def test_hung_key_bench_runs_before_and_after(tmp_path: Path) -> None:
    import subprocess

    out = tmp_path / "runs.json"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "bench_hung_key.py"),
            "--lanes",
            "2",
            "--messages",
            "200",
            "--cap",
            "3",
            "--repeat",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "check: ok: in all 2 runs each of the 201 messages ran exactly once" in done.stdout
    rows = {line.split("|")[2].strip(): line for line in done.stdout.splitlines() if line.startswith("| 2 |")}
    assert set(rows) == {"before", "after", "after / before"}, done.stdout
    runs = json.loads(out.read_text())["runs"]
    assert [(r["setting"], r["steal_after"]) for r in runs] == [("before", None), ("after", "auto")]
    for r in runs:
        assert r["problems"] == [] and r["ran_once"] == 201 and r["lanes"] == 2
        assert 0 < r["seconds"] <= 3 and r["ran_by_cap"] <= 200 and r["capped"] == (r["ran_by_cap"] < 200)
        # the child imported this checkout's package
        assert Path(r["lite_push"]) == BENCHMARKS.parent / "lite_push"
    # with keys moving, every other key ran before the cap
    assert not runs[1]["capped"] and runs[1]["ran_by_cap"] == 200
