"""Messages and the router's segments are left to their reference counts:
the compiled ``untrack_all`` takes a batch out of the cyclic collector's lists
(a consumer holds thousands of them with a backlog, and every full
collection walked them all), the Python twin leaves them as they are, and
either way nothing leaks and nothing is freed early.

The compiled cases skip when ``lite_push._kernels.untrack_c`` (or ``_router_c``) was
not built, unless ``LITE_PUSH_REQUIRE_EXTENSIONS=1`` (then they fail).
"""

from __future__ import annotations

import gc
import tracemalloc
from types import ModuleType

import orjson
import pytest
from conftest import assert_compiled_selected, compiled_twin

from lite_push import ConsumeFromWhere, EmbeddedBroker, MessageExt, MessageQueue
from lite_push._kernels import untrack as _untrack
from lite_push._kernels import untrack_py as _untrack_py
from lite_push.sources.kafka.codec import RecordFormat
from lite_push.sources.kafka.reading import PartitionState, take_batches
from lite_push.sources.redis.codec import decode as redis_decode


@pytest.fixture(scope="module")
def untrack_c() -> ModuleType:
    return compiled_twin("untrack_c")


def test_untrack_c_loaded() -> None:
    """Fails when ``_untrack_c`` was built (or is required) but the selector
    silently fell back to the Python twin."""
    assert_compiled_selected("untrack_c", _untrack.UNTRACK_IMPL, _untrack.untrack_all, "untrack_all")


def _msg(offset: int = 0) -> MessageExt:
    return MessageExt("T", 0, offset, b"body", keys=f"k{offset}", properties={"a": "b"})


def test_only_the_compiled_twin_untracks_and_both_leave_the_objects_as_they_were(untrack_c: ModuleType) -> None:
    m, other = _msg(), _msg(1)
    assert gc.is_tracked(m)
    _untrack_py.untrack_all([m])
    assert gc.is_tracked(m)
    batch = [m, 7, "s", other]  # never tracked (7, "s"): unchanged
    untrack_c.untrack_all(batch)
    assert not gc.is_tracked(m) and not gc.is_tracked(other)
    untrack_c.untrack_all(batch)  # twice: a no-op
    untrack_c.untrack_all([])
    assert batch == [m, 7, "s", other] and not gc.is_tracked(m)
    assert (m.topic, m.queue_offset, m.body, m.keys, m.properties) == ("T", 0, b"body", "k0", {"a": "b"})


def test_untracked_messages_are_freed_by_their_reference_count_and_kept_while_held(untrack_c: ModuleType) -> None:
    """200,000 untracked messages made and dropped leave no memory behind
    (freed as their last reference goes, not left for a collection); the
    ones still held survive full collections whole."""
    held = [_msg(i) for i in range(1000)]
    untrack_c.untrack_all(held)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(0, 200_000, 100):
            untrack_c.untrack_all([_msg(j) for j in range(i, i + 100)])
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, grown  # one message is ~300 bytes: 200,000 kept would be ~60 MB
    gc.collect()
    gc.collect()
    assert [m.queue_offset for m in held] == list(range(1000))
    assert all(m.keys == f"k{m.queue_offset}" and m.properties == {"a": "b"} for m in held)


def _expect_untracked(msgs: list[MessageExt]) -> None:
    assert msgs
    if _untrack.UNTRACK_IMPL == "cython":
        assert not any(gc.is_tracked(m) for m in msgs)
    else:
        assert all(gc.is_tracked(m) for m in msgs)


def test_the_sources_hand_out_untracked_messages() -> None:
    """What the embedded broker stores and hands out, a Kafka partition's
    batch and what the Redis codec decodes are untracked with the compiled
    twin."""
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=2)
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(20)])
    source = broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET)
    source.subscribe("T")
    batches = source.poll(1.0, 32)
    _expect_untracked([m for b in batches for m in b.messages])
    source.close()

    class Record:
        def key(self) -> bytes:
            return b"k"

        def value(self) -> bytes:
            return b"v"

        def headers(self) -> list[tuple[str, bytes]]:
            return [("p", b"1")]

        def topic(self) -> str:
            return "T"

        def partition(self) -> int:
            return 0

        def offset(self) -> int:
            return 5

        def timestamp(self) -> tuple[int, int]:
            return (1, 1_700_000_000_000)

    st = PartitionState(MessageQueue("T", "kafka", 0), "T", 5, None)
    st.file.append(Record())
    fmt = RecordFormat(bytes.decode, "tags", "kafka")
    (batch,) = take_batches([st], 32, fmt, lambda _r, _e: None, None)
    assert [m.queue_offset for m in batch.messages] == [5]
    _expect_untracked(batch.messages)

    meta = orjson.dumps({"k": "k", "p": {"x": "y"}})
    entries = [(f"{i + 1}-0".encode(), [b"b", b"v", b"m", meta, b"s", b"1"]) for i in range(3)]
    bad: list[tuple[MessageExt, str]] = []
    decoded = redis_decode("ns", MessageQueue("T", "ns", 0), entries, bad)
    assert bad == [] and [m.queue_offset for m in decoded] == [0, 1, 2]
    _expect_untracked(decoded)


def test_the_compiled_router_untracks_its_segments() -> None:
    """A segment (its list of messages and its ``(tag, list)`` pair) is
    held until its lane is done: the compiled router untracks both; the
    segments still hold what was routed."""
    router_c = compiled_twin("router_c")
    r = router_c.KeyRouter(16, "load", None, 8)
    tag = object()
    msgs = [_msg(i) for i in range(40)]
    segments, counts = r.route([(tag, msgs, 0)])
    routed = [(seg, sub) for segs in segments if segs for seg in segs for sub in [seg[1]]]
    assert sum(counts) == 40 and sorted(m.queue_offset for _, sub in routed for m in sub) == list(range(40))
    assert all(seg[0] is tag for seg, _ in routed)
    assert not any(gc.is_tracked(seg) or gc.is_tracked(sub) for seg, sub in routed)
    gc.collect()
    assert sorted(m.queue_offset for _, sub in routed for m in sub) == list(range(40))
