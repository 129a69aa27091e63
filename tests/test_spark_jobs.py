"""The benchmark's PySpark jobs (``benchmarks/gen_load.py``,
``benchmarks/check_log.py``) and the workload definitions they share
(``benchmarks/workloads.py``).

The Spark tests share one local SparkSession for the module.  They need the
``bench`` extra (pyspark, pyarrow, pandas) and Java 17+; without them they
FAIL (never skip) and say so.
"""

from __future__ import annotations

import math
import random
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# the benchmark modules import each other flat (``import workloads``), as
# benchmarks/bench.py does; import them the same way so there is one copy
BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from workloads import (  # noqa: E402  (benchmarks/ is put on sys.path above)
    KEY_SPACE,
    LONGTAIL_SIGMA,
    WORKLOADS,
    Workload,
    ceiling_ratio,
    cost_range_us,
    get_workload,
    hot_key_bound,
    key_for_rank,
    key_pmf,
    keys_for,
    longtail_mu,
    mean_cost_ms,
    partition_bound,
    poisoned_ranks,
    poisoned_share,
    queue_of,
    queue_shares,
    skew_bound,
)

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import pyspark  # noqa: F401

    _BENCH_IMPORT_ERROR: ImportError | None = None
except ImportError as exc:  # pragma: no cover - depends on the environment
    _BENCH_IMPORT_ERROR = exc

BASE = Workload("base", 1_000, 4, 10)


def _within(count: int, n: int, p: float, sds: float = 5.0) -> bool:
    return abs(count - n * p) <= sds * math.sqrt(n * p * (1 - p))


# -- workloads.py (pure Python) ------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"name": ""}, "name"),
        ({"messages": 0}, "messages"),
        ({"messages": 1.5}, "messages"),
        ({"messages": True}, "messages"),
        ({"queues": 0}, "queues"),
        ({"keys": 0}, "keys"),
        ({"keys": KEY_SPACE + 1}, "keys"),
        ({"body_size": -1}, "body_size"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**63}, "seed"),
        ({"skew": "pareto"}, "skew"),
        ({"skew": "zipf"}, "zipf_s"),
        ({"zipf_s": 1.1}, "zipf_s"),
        ({"skew": "zipf", "zipf_s": float("nan")}, "zipf_s"),
        ({"skew": "hotkey", "hot_share": 1.0}, "hot_share"),
        ({"skew": "hotkey", "hot_share": 0.0}, "hot_share"),
        ({"hot_share": 0.3}, "hot_share"),
        ({"skew": "hotkey", "hot_share": 0.3, "keys": 1}, "keys"),
        ({"cost": "sleepy"}, "cost"),
        ({"cost_ms": 1.0}, "cost_ms"),
        ({"cost": "constant"}, "cost_ms"),
        ({"cost": "constant", "cost_ms": -1.0}, "cost_ms"),
        ({"cost": "constant", "cost_ms": 1.0, "cost_max_ms": 5.0}, "cost_max_ms"),
        ({"cost": "uniform", "cost_ms": 1.0, "cost_max_ms": 2.5}, "cost_max_ms"),
        ({"cost": "uniform", "cost_ms": 1.0, "cost_max_ms": 0.5}, "cost_max_ms"),
        ({"cost": "longtail", "cost_ms": 1.0, "cost_max_ms": 1.0}, "cost_max_ms"),
        ({"poison_keys": -0.1, "poison_failures": 2}, "poison_keys"),
        ({"poison_keys": 1.0, "poison_failures": 2}, "poison_keys"),
        ({"poison_keys": float("nan"), "poison_failures": 2}, "poison_keys"),
        ({"poison_keys": "0.1", "poison_failures": 2}, "poison_keys"),
        ({"poison_keys": 0.01, "poison_failures": 2}, "poison_keys"),  # 10 keys * 1 % rounds to no key
        ({"poison_failures": 2}, "poison_failures"),  # failures without poisoned keys
        ({"poison_keys": 0.1}, "poison_failures"),
        ({"poison_keys": 0.1, "poison_failures": -1}, "poison_failures"),
        ({"poison_keys": 0.1, "poison_failures": 1.5}, "poison_failures"),
        ({"poison_keys": 0.1, "poison_failures": True}, "poison_failures"),
    ],
)
def test_workload_validation_names_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        BASE.replace(**changes)


def test_workload_json_roundtrip_and_coercion() -> None:
    w = Workload("w", 10, 2, 5, skew="zipf", zipf_s=1, cost="uniform", cost_ms=2, cost_max_ms=3)
    assert w.zipf_s == 1.0 and isinstance(w.zipf_s, float)
    assert Workload.from_dict(w.to_dict()) == w
    with pytest.raises(ValueError, match="unknown Workload fields"):
        Workload.from_dict({**w.to_dict(), "queue": 3})
    p = w.replace(poison_keys=0.4, poison_failures=2)
    assert Workload.from_dict(p.to_dict()) == p
    assert BASE.replace(poison_keys=0, poison_failures=0) == BASE
    assert isinstance(BASE.replace(poison_keys=0).poison_keys, float)


def test_workload_json_without_the_poison_fields_still_loads(tmp_path: Path) -> None:
    import json

    from gen_load import WORKLOAD_JSON, read_workload

    # a _workload.json as written before the poison fields existed
    old = {k: v for k, v in get_workload("sms").to_dict().items() if not k.startswith("poison")}
    assert set(get_workload("sms").to_dict()) - set(old) == {"poison_keys", "poison_failures"}
    (tmp_path / WORKLOAD_JSON).write_text(json.dumps(old))
    w = read_workload(tmp_path)
    assert w == get_workload("sms") and (w.poison_keys, w.poison_failures) == (0.0, 0)
    assert poisoned_ranks(w) == frozenset()


def test_poisoned_ranks_size_and_determinism() -> None:
    from workloads import _poisoned_cached

    poison = get_workload("poison")
    assert poison == get_workload("sms").replace(name="poison", poison_keys=0.001, poison_failures=2)
    assert get_workload("poison-small").messages == 20_000
    ranks = poisoned_ranks(poison)
    assert isinstance(ranks, frozenset) and len(ranks) == round(10_000 * 0.001) == 10
    # recorded for the default seed (the report quotes them); the message
    # count does not enter the choice
    assert sorted(ranks) == [377, 664, 2471, 2700, 5000, 6173, 6422, 6470, 6477, 9761]
    assert poisoned_ranks(get_workload("poison-small")) == ranks
    _poisoned_cached.cache_clear()
    assert poisoned_ranks(poison) == ranks  # recomputed, not only cached
    other = poisoned_ranks(poison.replace(seed=43))
    assert len(other) == 10 and other != ranks
    for keys, share in ((1_000, 0.05), (100, 0.99), (7, 0.5), (3, 0.5)):
        w = BASE.replace(keys=keys, poison_keys=share, poison_failures=1)
        r = poisoned_ranks(w)
        assert len(r) == round(keys * share) and all(0 <= x < keys for x in r)
    assert poisoned_ranks(BASE) == frozenset() and poisoned_share(BASE) == 0.0
    pmf = key_pmf(poison)
    assert poisoned_share(poison) == pytest.approx(sum(pmf[r] for r in ranks))
    assert 0.0005 < poisoned_share(poison) < 0.002  # ~103 of 100,000 messages


def test_recorder_fails_poisoned_messages_until_their_retry() -> None:
    from harness import Recorder

    from lite_push import MessageExt

    def msg(seq: int, attempt: int) -> MessageExt:
        return MessageExt("T", 0, seq, seq.to_bytes(8, "big"), keys="k", reconsume_times=attempt)

    rec = Recorder([0, 0, 0], [0, 2, 0])
    rec([msg(0, 0)])
    for attempt in (0, 1):
        with pytest.raises(RuntimeError, match="poisoned"):
            rec([msg(2, 0), msg(1, attempt)])  # the whole batch fails, nothing is logged
    rec([msg(1, 2)])
    log = rec.table("r", ["a", "b", "c"])
    assert log["seq"].to_pylist() == [0, 1] and log["attempt"].to_pylist() == [0, 2]
    rec_nofail = Recorder([0, 0, 0], None)  # --no-failures
    rec_nofail([msg(1, 0)])
    assert rec_nofail.table("r", ["a", "b", "c"])["seq"].to_pylist() == [1]


def test_bare_loop_delivers_everything_once_in_key_order_over_keyorderly_lanes() -> None:
    """The LOOP ceiling probe (``harness.py --bare``): no consumer, but the
    same listener over KEY_ORDERLY's partitioning -- every message once,
    each key in offset order, each key in one lane."""
    from harness import TOPIC, AsyncRecorder, bare_loop

    from lite_push import EmbeddedBroker

    broker = EmbeddedBroker()
    broker.create_topic(TOPIC, queue_count=3)
    keys = [f"k{i % 7}" for i in range(60)]
    broker.send_batch(TOPIC, [(seq.to_bytes(8, "big"), key) for seq, key in enumerate(keys)])
    rec = AsyncRecorder([100] * 60)  # 0.1 ms each, so the lanes interleave
    seconds, cpu, t0 = bare_loop(broker, rec, 4, 60, "asyncio")
    log = rec.table("LOOP-4-asyncio", keys).to_pylist()
    assert seconds > 0 and cpu >= 0 and all(row["start_ns"] >= t0 for row in log)
    assert sorted(row["seq"] for row in log) == list(range(60))
    by_key: dict[str, list[tuple[int, int]]] = {}
    for row in sorted(log, key=lambda r: r["start_ns"]):
        by_key.setdefault(row["key"], []).append((row["queue"], row["offset"]))
    for key, seen in by_key.items():
        assert len({q for q, _ in seen}) == 1, key  # one queue per key (hash-routed by the broker)
        assert seen == sorted(seen), key  # offset order


def test_named_workloads() -> None:
    sms = get_workload("sms")
    assert (sms.messages, sms.queues, sms.keys, sms.skew, sms.zipf_s) == (100_000, 8, 10_000, "zipf", 0.5)
    assert (sms.cost, sms.cost_ms, sms.body_size) == ("constant", 1.0, 64)
    noop = get_workload("noop")
    assert (noop.messages, noop.queues, noop.keys, noop.skew, noop.cost, noop.body_size) == (
        1_000_000,
        8,
        10_000,
        "uniform",
        "none",
        16,
    )
    hot = get_workload("hotkey")
    assert (hot.messages, hot.queues, hot.keys, hot.skew, hot.hot_share, hot.cost_ms) == (
        100_000,
        8,
        10_000,
        "hotkey",
        0.3,
        1.0,
    )
    z = get_workload("zipf11")
    assert (z.messages, z.queues, z.keys, z.skew, z.zipf_s, z.cost_ms) == (100_000, 8, 10_000, "zipf", 1.1, 1.0)
    pc = get_workload("pc-bench")
    assert (pc.messages, pc.queues, pc.keys, pc.skew, pc.cost) == (10_000, 1, 10_000, "uniform", "uniform")
    assert cost_range_us(pc) == (0, 5000) and mean_cost_ms(pc) == 2.5
    assert get_workload("sms-small").messages == 20_000
    for name, w in WORKLOADS.items():
        if name.endswith("-small"):
            assert w == get_workload(name.removesuffix("-small")).replace(name=name, messages=w.messages)
    with pytest.raises(KeyError, match="sms"):
        get_workload("nope")


def test_keys_are_distinct_account_numbers_that_spread() -> None:
    keys = keys_for(get_workload("sms"))
    assert len(keys) == len(set(keys)) == 10_000
    for k in keys:
        assert len(k) == 16 and k.isdigit() and k[0] != "0"
        digits = [int(c) for c in reversed(k)]  # Luhn
        assert sum(d if i % 2 == 0 else (2 * d - 9 if d > 4 else 2 * d) for i, d in enumerate(digits)) % 10 == 0
    assert key_for_rank(123, 42) == keys[123]
    assert key_for_rank(123, 43) != keys[123]
    assert key_for_rank(KEY_SPACE - 1, 42) != key_for_rank(0, 42)
    counts = Counter(queue_of(k, 8) for k in keys)
    assert len(counts) == 8 and all(_within(c, len(keys), 1 / 8) for c in counts.values())
    # String.hashCode over digit strings is uneven modulo larger powers of two
    # (random 16-digit ids give the same ~1.4x busiest lane over 64): only
    # a loose check there
    counts = Counter(queue_of(k, 64) for k in keys)
    mean = len(keys) / 64
    assert len(counts) == 64 and 0.6 * mean < min(counts.values()) <= max(counts.values()) < 1.6 * mean


def test_queue_of_matches_the_runtime_router() -> None:
    from lite_push._kernels.router_py import java_hash, lane_of

    for k in keys_for(get_workload("sms"))[:2000]:
        assert queue_of(k, 8) == lane_of(k, 8)
    assert java_hash("abc") == 96354  # "abc".hashCode() in Java


def test_pmf_is_exact() -> None:
    z = get_workload("zipf11")
    pmf = key_pmf(z)
    assert len(pmf) == 10_000 and math.isclose(math.fsum(pmf), 1.0, abs_tol=1e-12)
    h = sum(k**-1.1 for k in range(1, 10_001))
    assert math.isclose(pmf[0], 1 / h, rel_tol=1e-12) and math.isclose(pmf[9], 10**-1.1 / h, rel_tol=1e-12)
    assert 0.15 < pmf[0] < 0.16  # the "~16 %"
    hot = key_pmf(get_workload("hotkey"))
    assert hot[0] == 0.3 and math.isclose(hot[1], 0.7 / 9_999)


def test_bound_formula_worked_example() -> None:
    # 30 % on one key, 8 queues, the other 70 % spread evenly: the hot queue
    # holds 0.3 + 0.7/8 = 0.3875; key-ordered <= 1/(0.3c), baseline <= 1/(0.3875c)
    assert math.isclose(ceiling_ratio(0.3, 0.3 + 0.7 / 8), 0.3875 / 0.3)
    # balanced queues: q = 1/queues, the ratio is 1/(p*queues)
    assert math.isclose(ceiling_ratio(0.01, 1 / 8), 1 / (0.01 * 8))
    assert ceiling_ratio(0.5, 0.5) == 1.0

    hot = get_workload("hotkey")
    p, ratio = hot_key_bound(hot)
    shares = queue_shares(hot)
    assert p == 0.3 and math.isclose(sum(shares), 1.0)
    hot_queue = queue_of(keys_for(hot)[0], 8)
    others = sum(1 for k in keys_for(hot)[1:] if queue_of(k, 8) == hot_queue)
    q = 0.3 + 0.7 * others / 9_999
    assert max(shares) == pytest.approx(q) and ratio == pytest.approx(q / 0.3)
    assert 1.25 < ratio < 1.35
    b = skew_bound(hot)
    assert b.key_ordered_max_rate == pytest.approx(1 / (0.3 * 0.001))
    assert b.baseline_max_rate == pytest.approx(1 / (q * 0.001))

    p, ratio = hot_key_bound(get_workload("zipf11"))
    assert 1 / (p * 8) < 1 < ratio < 1.7  # the "~1.5x"
    p, ratio = hot_key_bound(get_workload("sms"))
    assert ratio >= 1 / (p * 8) and ratio == pytest.approx(1 / (p * 8), rel=0.15)
    p, ratio = hot_key_bound(get_workload("pc-bench"))  # one queue: everything serial in the baseline
    assert p == 1e-4 and ratio == pytest.approx(1e4)


def test_partition_bound_is_the_busiest_partitions_total_cost() -> None:
    from lite_push._kernels.router import lane_of

    # Three keys; "a" and "c" share a lane at n=2 iff their hashes agree mod 2.
    keys = ["a", "b", "c", "a", "b", "a"]
    costs = [1000, 2000, 3000, 1000, 2000, 1000]  # us; total 10 ms
    loads = [0, 0]
    for k, c in zip(keys, costs, strict=True):
        loads[lane_of(k, 2)] += c
    assert partition_bound(keys, costs, 3, "KEY_ORDERLY", 2) == pytest.approx(6 / (max(loads) / 1e6))
    # a single lane runs everything one after another
    assert partition_bound(keys, costs, 3, "KEY_ORDERLY", 1) == pytest.approx(6 / 0.010)
    assert partition_bound(keys, costs, 3, "CONCURRENTLY", 4) == pytest.approx(6 / 0.0025)
    # QUEUE_ORDERLY: the busiest queue, but never faster than total / threads
    qloads = [0, 0, 0]
    for k, c in zip(keys, costs, strict=True):
        qloads[queue_of(k, 3)] += c
    assert partition_bound(keys, costs, 3, "QUEUE_ORDERLY", 20) == pytest.approx(6 / (max(qloads) / 1e6))
    assert partition_bound(keys, costs, 3, "QUEUE_ORDERLY", 1) == pytest.approx(6 / 0.010)
    assert partition_bound(keys, [0] * 6, 3, "KEY_ORDERLY", 2) == math.inf
    with pytest.raises(ValueError, match="mode"):
        partition_bound(keys, costs, 3, "FAST", 2)
    with pytest.raises(ValueError, match="length"):
        partition_bound(keys, costs[:2], 3, "KEY_ORDERLY", 2)


def test_longtail_mean_is_cost_ms_after_the_cap() -> None:
    w = BASE.replace(cost="longtail", cost_ms=1.0, cost_max_ms=10.0)
    mu = longtail_mu(w)
    rng = random.Random(1)
    n = 200_000
    xs = [min(math.exp(mu + LONGTAIL_SIGMA * rng.gauss(0, 1)), 10.0) for _ in range(n)]
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / n)
    assert abs(mean - 1.0) < 5 * sd / math.sqrt(n)


# -- the Spark jobs -----------------------------------------------------------------


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    if _BENCH_IMPORT_ERROR is not None:
        pytest.fail(
            f"pyspark/pyarrow not importable ({_BENCH_IMPORT_ERROR}): install the bench extra, "
            "e.g. .venv/bin/pip install -e '.[bench]'",
            pytrace=False,
        )
    from gen_load import spark_session

    session = spark_session("local[2]", app_name="test_spark_jobs", shuffle_partitions=4)
    yield session
    session.stop()


def _generate(spark: Any, workload: Workload, out: Path, partitions: int | None = None) -> Any:
    from gen_load import generate

    generate(spark, workload, out, partitions=partitions)
    return pq.read_table(out).sort_by("seq")


def test_generator_rows_columns_and_json(spark: Any, tmp_path: Path) -> None:
    from gen_load import read_workload

    w = Workload("tiny", 1_000, 4, 50, skew="zipf", zipf_s=0.8, body_size=33, cost="constant", cost_ms=1.0, seed=7)
    t = _generate(spark, w, tmp_path / "tiny")
    assert t.schema.names == ["seq", "key", "cost_us", "body_size", "fail_times"]
    assert [t.schema.field(c).type for c in t.schema.names] == [pa.int64(), pa.string()] + [pa.int32()] * 3
    assert t.num_rows == 1_000 and t["seq"].to_pylist() == list(range(1_000))
    assert set(t["key"].to_pylist()) <= set(keys_for(w))
    assert set(t["cost_us"].to_pylist()) == {1000} and set(t["body_size"].to_pylist()) == {33}
    assert set(t["fail_times"].to_pylist()) == {0}  # no poisoned keys
    assert read_workload(tmp_path / "tiny") == w


def test_generator_fail_times_match_the_poisoned_ranks(spark: Any, tmp_path: Path) -> None:
    from gen_load import poison_summary, read_workload

    w = Workload(
        "pois", 2_000, 4, 100, skew="zipf", zipf_s=0.8, cost="constant", cost_ms=1.0, poison_keys=0.1, poison_failures=3
    )
    t = _generate(spark, w, tmp_path / "pois")
    ranks = poisoned_ranks(w)
    rank_of = {k: r for r, k in enumerate(keys_for(w))}
    expected = [3 if rank_of[k] in ranks else 0 for k in t["key"].to_pylist()]
    assert t["fail_times"].to_pylist() == expected
    assert 0 < sum(1 for f in expected if f) < 2_000
    assert read_workload(tmp_path / "pois") == w
    summary = poison_summary(tmp_path / "pois")
    counts = Counter(k for k, f in zip(t["key"].to_pylist(), expected, strict=True) if f)
    assert summary.keys == 10 and summary.messages == sum(counts.values())
    assert summary.per_key == dict(counts) and summary.largest_key == max(counts.values())
    assert sum(summary.per_queue.values()) == summary.messages


def test_generator_is_deterministic(spark: Any, tmp_path: Path) -> None:
    w = Workload("det", 3_000, 4, 200, skew="zipf", zipf_s=1.0, cost="longtail", cost_ms=1.0, cost_max_ms=8.0)
    a = _generate(spark, w, tmp_path / "a", partitions=1)
    b = _generate(spark, w, tmp_path / "b", partitions=3)  # another split, the same rows
    assert a.equals(b)
    c = _generate(spark, w.replace(seed=43), tmp_path / "c", partitions=1)
    assert not a.equals(c)
    assert a["key"].to_pylist() != c["key"].to_pylist() and a["cost_us"].to_pylist() != c["cost_us"].to_pylist()
    # the seed also changes which rows draw which rank, not only the key strings
    rank_a = {k: r for r, k in enumerate(keys_for(w))}
    rank_c = {k: r for r, k in enumerate(keys_for(w.replace(seed=43)))}
    assert [rank_a[k] for k in a["key"].to_pylist()] != [rank_c[k] for k in c["key"].to_pylist()]


def test_zipf_share_and_uniform_cost(spark: Any, tmp_path: Path) -> None:
    n = 20_000
    w = get_workload("zipf11").replace(messages=n, cost="uniform", cost_ms=2.5, cost_max_ms=5.0)
    t = _generate(spark, w, tmp_path / "z")
    counts = Counter(t["key"].to_pylist())
    keys, pmf = keys_for(w), key_pmf(w)
    top_share, _ = hot_key_bound(w)
    assert _within(counts[keys[0]], n, top_share)
    for r in (1, 2, 9, 99):
        assert _within(counts[keys[r]], n, pmf[r])
    costs = t["cost_us"].to_pylist()
    assert min(costs) >= 0 and max(costs) <= 5000
    sd = math.sqrt((5001**2 - 1) / 12)  # discrete uniform 0..5000
    assert abs(sum(costs) / n - 2500) < 5 * sd / math.sqrt(n)
    assert min(costs) < 50 and max(costs) > 4950


def test_hotkey_share_and_longtail_cost(spark: Any, tmp_path: Path) -> None:
    n = 20_000
    w = get_workload("hotkey").replace(messages=n, keys=1_000, cost="longtail", cost_ms=1.0, cost_max_ms=20.0)
    t = _generate(spark, w, tmp_path / "h")
    counts = Counter(t["key"].to_pylist())
    keys = keys_for(w)
    top_share, _ = hot_key_bound(w)
    assert top_share == 0.3 and _within(counts[keys[0]], n, 0.3)
    rest = 0.7 / 999
    assert max(c for k, c in counts.items() if k != keys[0]) < n * rest + 5 * math.sqrt(n * rest)
    assert len(counts) > 990
    costs = t["cost_us"].to_pylist()
    assert min(costs) >= 0 and max(costs) <= 20_000
    mean = sum(costs) / n
    sd = math.sqrt(sum((c - mean) ** 2 for c in costs) / n)
    assert abs(mean - 1000) < 5 * sd / math.sqrt(n)
    assert sorted(costs)[int(0.99 * n)] > 4 * 1000  # a long tail: p99 well above the mean


def test_uniform_keys_no_cost(spark: Any, tmp_path: Path) -> None:
    n = 20_000
    w = get_workload("noop").replace(messages=n, keys=100)
    t = _generate(spark, w, tmp_path / "u")
    counts = Counter(t["key"].to_pylist())
    assert len(counts) == 100 and all(_within(c, n, 0.01) for c in counts.values())
    assert set(t["cost_us"].to_pylist()) == {0} and set(t["body_size"].to_pylist()) == {16}


@pytest.mark.parametrize(
    "workload",
    [
        get_workload("sms-seq").replace(messages=3_000),  # zipf ranks, sequential key strings
        get_workload("hotkey").replace(messages=3_000),
        get_workload("pc-bench").replace(messages=3_000),  # uniform cost
        Workload("lt", 3_000, 4, 50, cost="longtail", cost_ms=1.0, cost_max_ms=10.0, seed=7),
    ],
    ids=lambda w: w.name,
)
def test_redraw_is_the_generators_rows(spark: Any, tmp_path: Path, workload: Workload) -> None:
    """``redraw.py`` (pure Python, used by ``placement_sim.py``) gives the
    generator's exact keys and costs per seq; the generator honours
    ``key_format``."""
    from redraw import draw

    t = _generate(spark, workload, tmp_path / workload.name)
    keys, costs = draw(workload)
    assert t["key"].to_pylist() == keys
    assert t["cost_us"].to_pylist() == costs
    if workload.key_format == "sequential":
        assert set(keys) <= {f"acct-{r}" for r in range(workload.keys)} and "acct-0" in keys


# -- the checker on hand-built logs ---------------------------------------------------

#: seq -> key of the hand-built workload.
CHECK_KEYS = ["A", "A", "B", "B", "A", "C", "B", "C"]


def _perfect(run: str) -> list[dict[str, Any]]:
    """Each key's messages back to back from t=0, in seq order (keys overlap
    each other, never themselves)."""
    rows = []
    clock: dict[str, int] = {}
    for seq, key in enumerate(CHECK_KEYS):
        start = clock.get(key, 0)
        clock[key] = start + 10
        rows.append(
            {
                "run": run,
                "seq": seq,
                "key": key,
                "queue": ord(key) % 2,
                "offset": seq,
                "lane": ord(key) % 3,
                "start_ns": start,
                "end_ns": start + 10,
                "attempt": 0,
            }
        )
    return rows


def _write_log(rows: list[dict[str, Any]], out: Path) -> Path:
    schema = pa.schema(
        [
            ("run", pa.string()),
            ("seq", pa.int64()),
            ("key", pa.string()),
            ("queue", pa.int32()),
            ("offset", pa.int64()),
            ("lane", pa.int32()),
            ("start_ns", pa.int64()),
            ("end_ns", pa.int64()),
            ("attempt", pa.int32()),
        ]
    )
    out.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), out / "part-0.parquet")
    return out


def test_checker_on_hand_built_logs(spark: Any, tmp_path: Path) -> None:
    from check_log import REPORT_COLUMNS, check, to_markdown

    wdir = tmp_path / "workload"
    wdir.mkdir()
    pq.write_table(
        pa.table({"seq": pa.array(range(len(CHECK_KEYS)), pa.int64()), "key": CHECK_KEYS}), wdir / "part-0.parquet"
    )

    def at(rows: list[dict[str, Any]], seq: int) -> dict[str, Any]:
        return next(r for r in rows if r["seq"] == seq)

    runs: list[dict[str, Any]] = []
    runs += _perfect("perfect")

    lost = [r for r in _perfect("lost") if r["seq"] != 3]
    runs += lost

    dup = _perfect("dup")
    dup.append({**at(dup, 4), "start_ns": 30, "end_ns": 40, "attempt": 1})  # after the first one, no overlap
    runs += dup

    inv = _perfect("inversion")  # A's seq 1 runs before seq 0, back to back
    at(inv, 1).update(start_ns=0, end_ns=10)
    at(inv, 0).update(start_ns=10, end_ns=20)
    runs += inv

    ovl = _perfect("overlap")  # A's seq 1 starts halfway through seq 0: an overlap and an inversion
    at(ovl, 1).update(start_ns=5, end_ns=15)
    runs += ovl

    redo = _perfect("overlapping-redelivery")  # seq 6 delivered again while its first delivery runs
    redo.append({**at(redo, 6), "start_ns": 25, "end_ns": 35, "attempt": 1})
    runs += redo

    junk = _perfect("junk")
    at(junk, 7)["key"] = "Z"
    junk.append({**at(junk, 5), "seq": 99, "start_ns": 1000, "end_ns": 1010})
    runs += junk

    log1 = _write_log(runs, tmp_path / "log1")
    log2 = _write_log(_perfect("second-dir"), tmp_path / "log2")

    report = check(spark, wdir, [log1, log2])
    by_run = {r["run"]: r for r in report}
    assert [r["run"] for r in report] == [
        "dup",
        "inversion",
        "junk",
        "lost",
        "overlap",
        "overlapping-redelivery",
        "perfect",
        "second-dir",
    ]
    zero = {"messages": 8, "delivered": 8, "lost": 0, "duplicates": 0, "inversions": 0, "concurrent": 0}
    zero.update(deliveries=8, unknown=0, key_mismatch=0)
    assert all(set(r) == set(REPORT_COLUMNS) for r in report)
    assert by_run["perfect"] == {"run": "perfect", **zero}
    assert by_run["second-dir"] == {"run": "second-dir", **zero}
    assert by_run["lost"] == {"run": "lost", **zero, "delivered": 7, "lost": 1, "deliveries": 7}
    assert by_run["dup"] == {"run": "dup", **zero, "duplicates": 1, "deliveries": 9}
    assert by_run["inversion"] == {"run": "inversion", **zero, "inversions": 1}
    assert by_run["overlap"] == {"run": "overlap", **zero, "inversions": 1, "concurrent": 1}
    assert by_run["overlapping-redelivery"] == {
        "run": "overlapping-redelivery",
        **zero,
        "duplicates": 1,
        "concurrent": 1,
        "deliveries": 9,
    }
    assert by_run["junk"] == {"run": "junk", **zero, "deliveries": 9, "unknown": 1, "key_mismatch": 1}

    table = to_markdown(report).splitlines()
    assert table[0].startswith("| run | messages | delivered | lost |") and len(table) == 2 + len(report)
    assert "| lost | 8 | 7 | 1 | 0 | 0 | 0 | 7 | 0 | 0 |" in table
