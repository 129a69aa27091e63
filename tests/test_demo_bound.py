"""The demo's bound sentence: the throughput no run can beat, for the lane
placement the demo uses.

With ``"load"`` placement (the default) the bound is ``lanes / delay``;
with a fixed placement (``"hash"``, ``"java"``) it is the busiest lane's.
The lanes the bound assumes are checked against the router itself
(:class:`KeyRouter`), and the bound against the shortest time any schedule
of those lanes needs: a run's rate can never exceed it, so the sentence can
never say more than 100 %.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest

from lite_push._kernels.router import KeyRouter
from lite_push.demo import account_keys, lane_balance, rate_bound

DELAY = 0.001


def _router_lanes(keys: list[str], messages: int, lanes: int, placement: str) -> Counter[int]:
    """Messages per lane when the router places ``messages`` cycling over
    ``keys`` (as ``fill_broker`` sends them), all at once."""
    router = KeyRouter(lanes, placement, key_of=lambda k: k)
    items = [keys[i % len(keys)] for i in range(messages)]
    _, counts = router.route([("q", items, 0)])
    return Counter({lane: n for lane, n in enumerate(counts) if n})


@pytest.mark.parametrize("placement", ["hash", "java"])
@pytest.mark.parametrize(("keys", "messages", "lanes"), [(10_000, 100_000, 64), (50, 1_003, 16), (7, 10, 64)])
def test_a_fixed_placement_is_bound_by_its_busiest_lane(placement: str, keys: int, messages: int, lanes: int) -> None:
    key_list = account_keys(keys)
    per_lane = _router_lanes(key_list, messages, lanes, placement)
    bound = rate_bound(key_list, messages, lanes, DELAY, placement)
    fastest = max(per_lane.values()) * DELAY  # the busiest lane runs its messages one after another
    assert bound.rate == pytest.approx(messages / fastest)
    assert bound.rate <= lanes / DELAY * (1 + 1e-12)
    assert f"with {placement} placement, the busiest lane holding" in bound.reason


@pytest.mark.parametrize(("keys", "messages", "lanes"), [(10_000, 100_000, 64), (50, 1_003, 16), (7, 10, 64)])
def test_load_placement_is_bound_by_the_lanes(keys: int, messages: int, lanes: int) -> None:
    key_list = account_keys(keys)
    bound = rate_bound(key_list, messages, lanes, DELAY, "load")
    assert bound.rate == lanes / DELAY and bound.reason == f"{lanes} lanes x 1 ms allow"
    # the fastest any schedule can be: every lane busy until the last message
    fastest = math.ceil(messages / lanes) * DELAY
    assert messages / fastest <= bound.rate
    # a fixed placement's bound is never above it: load placement is not judged by hash balance
    for fixed in ("hash", "java"):
        assert rate_bound(key_list, messages, lanes, DELAY, fixed).rate <= bound.rate * (1 + 1e-12)


def test_the_old_key_balance_is_kept_for_fixed_placements() -> None:
    keys = account_keys(1000)
    for placement in ("hash", "java"):
        per_lane = _router_lanes(keys, len(keys), 64, placement)  # one message per key
        assert lane_balance(keys, 64, placement) == pytest.approx(max(per_lane.values()) * 64 / len(keys))
    with pytest.raises(ValueError, match="placement"):
        lane_balance(keys, 64, "load")
    with pytest.raises(ValueError, match="delay"):
        rate_bound(keys, 10, 64, 0.0, "load")
