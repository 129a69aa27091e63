"""The Kafka side-by-side benchmark (issue 18): its delivery check flags each
kind of planted fault, the rounds alternate, and the producer plus the serial
loop round-trip a small topic on the mock cluster (a few seconds)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# the benchmark modules import each other flat (``import workloads``)
BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from bench_kafka import Check, check, measure, rounds_order  # noqa: E402  (benchmarks/ is put on sys.path above)
from kafka_peers import produce, run_serial  # noqa: E402
from workloads import queue_of  # noqa: E402

#: seq -> key: "a" has seqs 0, 2, 4; "b" has 1, 3.
KEYS = ["a", "b", "a", "b", "a"]


def calls(*rows: tuple[int, int, int]) -> tuple[list[int], list[int], list[int]]:
    """``(seq, start, end)`` rows as the three columns ``check`` takes."""
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


def test_a_clean_run_passes() -> None:
    # keys a and b interleave in time; each key's calls follow one another
    got = check(KEYS, *calls((0, 0, 10), (1, 0, 10), (2, 10, 20), (3, 12, 30), (4, 20, 25)))
    assert got == Check(0, 0, 0, 0) and got.clean


def test_a_lost_message_is_counted() -> None:
    assert check(KEYS, *calls((0, 0, 10), (1, 0, 10), (3, 12, 30), (4, 20, 25))) == Check(1, 0, 0, 0)


def test_an_out_of_range_seq_is_not_a_delivery() -> None:
    got = check(KEYS, *calls((0, 0, 1), (1, 0, 1), (2, 1, 2), (3, 1, 2), (99, 2, 3)))
    assert got.lost == 1


def test_a_redelivery_is_a_duplicate_not_an_inversion() -> None:
    # seq 0 again after 2 and 4: only first deliveries are held to the order
    got = check(KEYS, *calls((0, 0, 10), (1, 0, 10), (2, 10, 20), (3, 12, 30), (4, 20, 25), (0, 30, 40)))
    assert got == Check(0, 1, 0, 0)


def test_an_inversion_within_a_key_is_counted() -> None:
    # key a's seq 4 starts before its seq 2 (no overlap in time)
    got = check(KEYS, *calls((0, 0, 10), (1, 0, 10), (4, 10, 20), (3, 12, 30), (2, 20, 25)))
    assert got == Check(0, 0, 1, 0)


def test_an_inversion_across_keys_is_not() -> None:
    # b's seq 3 starts before a's seq 0: different keys, no order between them
    assert check(KEYS, *calls((1, 0, 1), (3, 1, 2), (0, 5, 6), (2, 6, 7), (4, 7, 8))).clean
    # each decrease within a key counts once: a's 4, 2, 0 are two
    assert check(KEYS, *calls((1, 0, 1), (3, 1, 2), (4, 5, 6), (2, 6, 7), (0, 7, 8))).order_violations == 2


def test_overlapping_calls_of_one_key_are_counted() -> None:
    # a's seq 2 starts at 5, before seq 0 (started at 0) ends at 10
    got = check(KEYS, *calls((0, 0, 10), (1, 0, 10), (2, 5, 20), (3, 12, 30), (4, 20, 25)))
    assert got == Check(0, 0, 0, 1)
    # a call that starts exactly when the previous one ended does not overlap
    assert check(KEYS, *calls((0, 0, 10), (1, 0, 10), (2, 10, 20), (3, 10, 30), (4, 20, 25))).clean


def test_an_overlap_with_any_earlier_call_counts() -> None:
    # seq 0 runs long; seq 2 follows a short duplicate but still overlaps seq 0
    got = check(KEYS, *calls((0, 0, 100), (0, 1, 2), (1, 0, 1), (2, 3, 4), (3, 2, 3), (4, 200, 201)))
    assert got.overlaps == 2 and got.duplicates == 1


def test_rounds_rotate_the_consumers() -> None:
    names = ["lite_push", "pyrallel", "serial"]
    assert [rounds_order(names, r) for r in range(4)] == [
        ["lite_push", "pyrallel", "serial"],
        ["pyrallel", "serial", "lite_push"],
        ["serial", "lite_push", "pyrallel"],
        ["lite_push", "pyrallel", "serial"],
    ]


@pytest.mark.timeout(60)
def test_the_serial_loop_reads_what_was_produced() -> None:
    from lite_push.sources.kafka.mock_cluster import MockKafkaCluster

    keys = [f"k{i % 7}" for i in range(60)]
    costs = [0] * len(keys)
    with MockKafkaCluster() as cluster:
        cluster.create_topic("t", 4)
        produce(cluster.bootstrap, "t", keys, 4, 16)
        run = run_serial(cluster.bootstrap, "t", "g", costs, timeout=30)
        # every message sits in the partition the harness's hash chooses
        from confluent_kafka import Consumer

        c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "probe", "auto.offset.reset": "earliest"})
        c.subscribe(["t"])
        seen = 0
        while seen < len(keys):
            msg = c.poll(5.0)
            assert msg is not None, f"only {seen} of {len(keys)} read back"
            seq = int.from_bytes(msg.value()[:8], "big")
            assert msg.key() == keys[seq].encode() and msg.partition() == queue_of(keys[seq], 4)
            assert len(msg.value()) == 16
            seen += 1
        c.close()
    assert run.error is None
    row = measure(run, keys, hot_rate=1.0)
    assert (row["lost"], row["duplicates"], row["order_violations"], row["overlaps"]) == (0, 0, 0, 0)
    assert row["calls"] == len(keys) and float(row["rate"]) > 0
