"""The Kafka fast decoder (``decode_plain``, compiled and pure-Python twins):
a record without headers becomes exactly the message the full decoder
(``codec.decode``) makes of it; anything else (headers, a key that does not
decode) is left to the full decoder, which names what is malformed.  The
compiled twin builds the message without its ``__init__`` and untracked:
nothing leaks, nothing is freed early, and every message has a dict of its
own.

The compiled cases skip when ``lite_push._kernels.kafka_decode_c`` was not built,
unless ``LITE_PUSH_REQUIRE_EXTENSIONS=1`` (then they fail).
"""

from __future__ import annotations

import dataclasses
import gc
import sys
import tracemalloc
from collections.abc import Callable
from types import ModuleType
from typing import Any

import confluent_kafka
import pytest
from conftest import assert_compiled_selected, compiled_twin
from hypothesis import given
from hypothesis import strategies as st

from lite_push import MessageExt, MessageQueue
from lite_push._kernels import kafka_decode as _kafka_decode
from lite_push._kernels import kafka_decode_py as _kafka_decode_py
from lite_push.sources.kafka.codec import MalformedRecord, RecordFormat, decode, key_decoder
from lite_push.sources.kafka.reading import PartitionState, take_batches


@pytest.fixture(scope="module", params=["c", "py"])
def twin(request: pytest.FixtureRequest) -> ModuleType:
    if request.param == "c":
        return compiled_twin("kafka_decode_c")
    return _kafka_decode_py


def test_kafka_decode_c_loaded() -> None:
    """Fails when ``_kafka_decode_c`` was built (or is required) but the
    selector silently fell back to the Python twin (for instance because
    MessageExt's fields changed and the compiled twin refused to load)."""
    assert_compiled_selected("kafka_decode_c", _kafka_decode.DECODE_IMPL, _kafka_decode.decode_plain, "decode_plain")


def _record(
    key: bytes | None,
    value: bytes | None,
    headers: Any,
    partition: int = 3,
    offset: int = 41,
    ts: int = 1_700_000_000_000,
    topic: str = "orders",
) -> Any:
    return confluent_kafka.Message(
        topic=topic, partition=partition, offset=offset, key=key, value=value, headers=headers, timestamp=(1, ts)
    )


_DECODERS = {"utf-8": key_decoder("utf-8"), "hex": key_decoder("hex"), "ascii": key_decoder("ascii")}

_headers = st.one_of(
    st.none(),
    st.just([]),
    st.lists(st.tuples(st.sampled_from(["tags", "trace", "RECONSUME_TIME"]), st.binary(max_size=4)), min_size=1),
)


@given(
    key=st.one_of(st.none(), st.binary(max_size=12), st.text(max_size=8).map(str.encode)),
    value=st.one_of(st.none(), st.binary(max_size=64)),
    headers=_headers,
    partition=st.integers(0, 1000),
    offset=st.integers(0, 2**62),
    ts=st.integers(-1, 2**45),
    encoding=st.sampled_from(sorted(_DECODERS)),
    topic=st.sampled_from(["orders", "%RETRY%g"]),
)
def test_a_plain_record_decodes_as_the_full_decoder_decodes_it_and_any_other_is_left_to_it(
    twin: ModuleType,
    key: bytes | None,
    value: bytes | None,
    headers: Any,
    partition: int,
    offset: int,
    ts: int,
    encoding: str,
    topic: str,
) -> None:
    rec = _record(key, value, headers, partition, offset, ts, topic="lite-push.retry.g" if topic != "orders" else topic)
    decode_key = _DECODERS[encoding]
    m = twin.decode_plain(rec, topic, decode_key, "kafka")
    try:
        full: MessageExt | None = decode(rec, topic, decode_key, "tags", "kafka")
    except MalformedRecord:
        full = None
    if headers:
        assert m is None
        return
    if full is None:  # the key does not decode: the full decoder says so
        assert m is None
        return
    assert m is not None and type(m) is MessageExt
    assert m == full
    for f in dataclasses.fields(MessageExt):
        assert type(getattr(m, f.name)) is type(getattr(full, f.name)), f.name


def test_each_message_gets_a_dict_of_its_own_and_values_that_outlive_the_record(twin: ModuleType) -> None:
    recs = [_record(f"k{i}".encode(), f"v{i}".encode(), None, offset=i) for i in range(3)]
    msgs = [twin.decode_plain(r, "orders", bytes.decode, "kafka") for r in recs]
    del recs
    gc.collect()
    msgs[0].properties["x"] = "1"
    assert [m.properties for m in msgs] == [{"x": "1"}, {}, {}]
    expected = [(f"k{i}", f"v{i}".encode(), f"orders-3-{i}") for i in range(3)]
    assert [(m.keys, m.body, m.msg_id) for m in msgs] == expected
    msgs[1].keys = "changed"  # an ordinary, mutable message
    assert dataclasses.replace(msgs[1], tags="t").keys == "changed"


def test_the_compiled_twin_leaves_messages_untracked_freed_by_reference_count_and_holding_no_extra_references() -> None:
    decoder = compiled_twin("kafka_decode_c")
    topic, broker = "".join(["or", "ders"]), "".join(["kaf", "ka"])  # objects of their own, to count references
    before = (sys.getrefcount(topic), sys.getrefcount(broker))
    rec = _record(b"k", b"v", None)
    held = [decoder.decode_plain(rec, topic, bytes.decode, broker) for _ in range(1000)]
    assert not any(gc.is_tracked(m) for m in held)
    assert sys.getrefcount(topic) == before[0] + 1000
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(100):
            [decoder.decode_plain(rec, topic, bytes.decode, broker) for _ in range(1000)]
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, grown  # 100,000 messages kept would be tens of MB
    gc.collect()
    assert all(m.topic == "orders" and m.body == b"v" and m.broker_name == "kafka" for m in held)
    del held
    assert (sys.getrefcount(topic), sys.getrefcount(broker)) == before


def test_a_partitions_batch_mixes_plain_records_with_headed_and_malformed_ones() -> None:
    """take_batches: plain records by the fast path, a record with headers
    by the full decoder (its tags filter), a malformed key dead-lettered
    with the reason and passed over; offsets stay in order."""
    stored: list[tuple[int, str]] = []
    store: Callable[[Any, str], BaseException | None] = lambda rec, reason: stored.append((rec.offset(), reason))  # noqa: E731
    st_ = PartitionState(MessageQueue("orders", "kafka", 3), "orders", 10, frozenset({"A"}))
    st_.file.extend(
        [
            _record(b"k1", b"a", [("tags", b"A"), ("trace", b"t")], offset=10),
            _record(b"k2", b"b", None, offset=11),  # no tags: filtered out by the subscription
            _record(b"\xff", b"c", None, offset=12),  # malformed key
            _record(b"k3", b"d", [("tags", b"A")], offset=13),
            _record(b"k4", b"e", [("tags", b"B")], offset=14),
        ]
    )
    fmt = RecordFormat(key_decoder("utf-8"), "tags", "kafka")
    (batch,) = take_batches([st_], 32, fmt, store, None)
    assert [(m.queue_offset, m.keys, m.tags) for m in batch.messages] == [(10, "k1", "A"), (13, "k3", "A")]
    assert batch.messages[0].properties == {"trace": "t"}
    assert batch.next_offset == 15 and st_.pos == 15 and not st_.file
    assert len(stored) == 1 and stored[0][0] == 12 and "undecodable key" in stored[0][1]

    st_ = PartitionState(MessageQueue("orders", "kafka", 3), "orders", 0, None)
    st_.file.extend([_record(b"k", b"x", None, offset=i) for i in range(5)])
    (batch,) = take_batches([st_], 3, fmt, store, None)  # at most max_per_queue, the rest stays filed
    assert [m.queue_offset for m in batch.messages] == [0, 1, 2] and len(st_.file) == 2 and st_.pos == 3
