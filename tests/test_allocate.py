"""AllocateMessageQueueAveragely, against the worked examples of the
reference texts and the properties every allocation must have."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lite_push import MessageQueue
from lite_push.rebalance import AVERAGELY, STRATEGIES, AllocateStrategy, allocate_averagely, get_strategy


def mqs(n: int, topic: str = "T", broker: str = "b") -> list[MessageQueue]:
    return [MessageQueue(topic, broker, i) for i in range(n)]


def shares(n_queues: int, cids: list[str]) -> dict[str, list[int]]:
    queues = mqs(n_queues)
    return {c: [q.queue_id for q in allocate_averagely("g", c, queues, cids)] for c in cids}


def test_eight_queues_three_consumers():
    # 000: "c1: q1 q2 q3 / c2: q4 q5 q6 / c3: q7 q8" (1-based there)
    assert shares(8, ["c1", "c2", "c3"]) == {"c1": [0, 1, 2], "c2": [3, 4, 5], "c3": [6, 7]}


def test_remainder_goes_to_the_first_consumers():
    assert shares(10, ["c1", "c2", "c3"]) == {"c1": [0, 1, 2, 3], "c2": [4, 5, 6], "c3": [7, 8, 9]}
    assert shares(5, ["a", "b"]) == {"a": [0, 1, 2], "b": [3, 4]}


def test_more_consumers_than_queues():
    # 004: with fewer queues than consumers, one each in order, the rest get none
    assert shares(3, ["c1", "c2", "c3", "c4", "c5"]) == {"c1": [0], "c2": [1], "c3": [2], "c4": [], "c5": []}
    assert shares(1, ["a", "b"]) == {"a": [0], "b": []}


@pytest.mark.parametrize(
    ("n_queues", "n_cids", "expected"),
    [
        (8, 1, [[0, 1, 2, 3, 4, 5, 6, 7]]),
        (8, 2, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        (8, 4, [[0, 1], [2, 3], [4, 5], [6, 7]]),
        (8, 8, [[i] for i in range(8)]),
        (4, 4, [[0], [1], [2], [3]]),
    ],
)
def test_divisible_counts_split_evenly(n_queues: int, n_cids: int, expected: list[list[int]]):
    cids = [f"c{i}" for i in range(n_cids)]
    assert list(shares(n_queues, cids).values()) == expected


def test_inputs_are_sorted_defensively():
    queues = mqs(8)
    shuffled = queues[:]
    random.Random(7).shuffle(shuffled)
    assert allocate_averagely("g", "c2", shuffled, ["c3", "c1", "c2"]) == queues[3:6]


def test_queues_sort_by_topic_broker_then_id():
    queues = [MessageQueue("T", "b", 1), MessageQueue("T", "a", 1), MessageQueue("T", "a", 0), MessageQueue("T", "b", 0)]
    assert allocate_averagely("g", "c1", queues, ["c1", "c2"]) == [MessageQueue("T", "a", 0), MessageQueue("T", "a", 1)]


def test_unknown_client_gets_nothing():
    assert allocate_averagely("g", "stranger", mqs(8), ["c1", "c2"]) == []


@pytest.mark.parametrize(
    ("cid", "queues", "cids", "word"),
    [("", mqs(4), ["c1"], "current_cid"), ("c1", [], ["c1"], "mq_all"), ("c1", mqs(4), [], "cid_all")],
)
def test_empty_arguments_raise(cid: str, queues: list[MessageQueue], cids: list[str], word: str):
    with pytest.raises(ValueError, match=word):
        allocate_averagely("g", cid, queues, cids)


def test_strategy_object():
    assert isinstance(AVERAGELY, AllocateStrategy)
    assert AVERAGELY.name == "AVG"
    assert STRATEGIES["AVG"] is AVERAGELY
    assert get_strategy("AVG") is AVERAGELY
    assert AVERAGELY("g", "c1", mqs(8), ["c1", "c2", "c3"]) == allocate_averagely("g", "c1", mqs(8), ["c1", "c2", "c3"])
    with pytest.raises(ValueError, match="AVG"):
        get_strategy("NOPE")


@given(st.integers(1, 64), st.integers(1, 20))
def test_shares_partition_the_queues_in_runs(n_queues: int, n_cids: int):
    cids = [f"c{i:02d}" for i in range(n_cids)]
    got = shares(n_queues, cids)
    flat = [q for c in cids for q in got[c]]
    assert flat == list(range(n_queues))  # disjoint, complete, consecutive runs in cid order
    sizes = [len(got[c]) for c in cids]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the larger shares come first
