"""The Kafka fetcher's client, both twins (``lite_push._kernels.kafka_fetch_c`` on
librdkafka's C API, ``fetch_client_py`` on confluent-kafka's ``Consumer``),
on librdkafka's mock cluster: the same records become the same messages,
filed under the same partitions; a record with headers goes through the
full decoder, a malformed one is kept for its dead letter; the assignment,
pause, resume, seek and watermarks behave alike.

The compiled cases skip when ``lite_push._kernels.kafka_fetch_c`` was not built,
unless ``LITE_PUSH_REQUIRE_EXTENSIONS=1`` (then they fail).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from conftest import NO_EXTENSIONS, REQUIRE_EXTENSIONS, compiled_path, compiled_twin

from lite_push import MessageExt, MessageQueue
from lite_push.sources.kafka import fetch_client
from lite_push.sources.kafka.codec import ReadRecord, RecordFormat, key_decoder
from lite_push.sources.kafka.fetch_client_py import FetchClient as PyFetchClient
from lite_push.sources.kafka.library import librdkafka_path
from lite_push.sources.kafka.mock_cluster import MockKafkaCluster
from lite_push.sources.kafka.reading import PartitionState, decode_rest, take_batches

LOGGER = logging.getLogger("test.fetch")


@pytest.fixture(scope="module")
def cluster() -> Iterator[MockKafkaCluster]:
    with MockKafkaCluster() as c:
        c.create_topic("orders", 2)
        producer = Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 0})
        for i in range(20):
            # offsets 0..9 per partition; partition 1's offset 4 has headers, 6 a key that is not UTF-8
            headers = [("tags", b"A"), ("trace", b"t-%d" % i)] if i == 9 else None
            key = b"\xff\xfe" if i == 13 else b"key-%d" % (i % 3)
            producer.produce("orders", b"value-%d" % i, key, partition=i % 2, headers=headers, timestamp=1000 + i)
        assert producer.flush(10) == 0
        yield c


@pytest.fixture(params=["c", "py"])
def new_client(request: pytest.FixtureRequest) -> Callable[[dict[str, str]], Any]:
    """Makes a client of one twin: ``(settings) -> client``."""
    if request.param == "c":
        cls = compiled_twin("kafka_fetch_c").FetchClient
        return lambda settings: cls(
            settings, LOGGER, library=librdkafka_path(), record_type=ReadRecord, slow=decode_rest
        )
    return lambda settings: PyFetchClient(settings, LOGGER)


def test_kafka_fetch_c_loaded() -> None:
    """Fails when ``_kafka_fetch_c`` was built (or is required) but the
    selector silently fell back to the Python twin."""
    if NO_EXTENSIONS:
        assert fetch_client.FETCH_IMPL == "python"
        return
    if compiled_path("kafka_fetch_c") is None and not REQUIRE_EXTENSIONS:
        pytest.skip("lite_push._kernels.kafka_fetch_c was not built")
    assert fetch_client.FETCH_IMPL == "cython"
    made = fetch_client.new_fetch_client
    assert isinstance(made, functools.partial) and made.func is compiled_twin("kafka_fetch_c").FetchClient


def _settings(cluster: MockKafkaCluster) -> dict[str, str]:
    return {"bootstrap.servers": cluster.bootstrap, "group.id": "fetch-test", "enable.auto.commit": "false"}


def _states(fetched: int = 0) -> dict[tuple[str, int], PartitionState]:
    out = {}
    for p in (0, 1):
        st = PartitionState(MessageQueue("orders", "kafka", p), "orders", fetched, None)
        out[("orders", p)] = st
    return out


def _read_all(client: Any, by_name: dict[tuple[str, int], PartitionState], fmt: RecordFormat, want: int) -> int:
    got = 0
    deadline = time.monotonic() + 10
    while sum(len(st.file) for st in by_name.values()) < want and time.monotonic() < deadline:
        got += client.read(by_name, 64, 0.05, fmt, "member")
    return got


FMT = RecordFormat(key_decoder("utf-8"), "tags", "kafka", "utf-8")


def _fields(m: MessageExt) -> dict[str, Any]:
    return {f.name: getattr(m, f.name) for f in dataclasses.fields(MessageExt)}


def test_records_are_filed_decoded_under_their_partitions(cluster: MockKafkaCluster, new_client: Any) -> None:
    client = new_client(_settings(cluster))
    try:
        client.load_metadata("orders", 10.0)
        client.assign([("orders", 0, 0), ("orders", 1, 0)])
        by_name = _states()
        _read_all(client, by_name, FMT, 20)
        p0, p1 = by_name[("orders", 0)], by_name[("orders", 1)]
        assert (p0.fetched, p1.fetched) == (10, 10)
        assert [m.queue_offset for m in p0.file] == list(range(10))
        first = p0.file[0]
        assert _fields(first) == {
            "topic": "orders",
            "queue_id": 0,
            "queue_offset": 0,
            "body": b"value-0",
            "keys": "key-0",
            "tags": None,
            "properties": {},
            "born_timestamp": 1000,
            "store_timestamp": 1000,
            "reconsume_times": 0,
            "msg_id": "orders-0-0",
            "broker_name": "kafka",
        }
        headed = p1.file[4]  # i == 9: the full decoder, at once
        assert type(headed) is MessageExt and headed.tags == "A" and headed.properties == {"trace": "t-9"}
        assert headed.keys == "key-0" and headed.msg_id == "orders-1-4"
        malformed = p1.file[6]  # i == 13: kept as the record, for its dead letter
        assert type(malformed) is not MessageExt and malformed.offset() == 6 and malformed.key() == b"\xff\xfe"
        # every other message: what it was sent as
        plain = [m for m in list(p0.file) + list(p1.file) if type(m) is MessageExt]
        assert len(plain) == 19
        for m in plain:
            i = 2 * m.queue_offset + m.queue_id
            assert (m.body, m.keys, m.born_timestamp) == (b"value-%d" % i, f"key-{i % 3}", 1000 + i)
        # take_batches dead-letters the malformed record with its reason and passes over it
        stored: list[tuple[int, str]] = []
        (batch,) = take_batches([p1], 32, FMT, lambda rec, reason: stored.append((rec.offset(), reason)), None)
        assert [m.queue_offset for m in batch.messages] == [0, 1, 2, 3, 4, 5, 7, 8, 9]
        assert stored and stored[0][0] == 6 and "undecodable key" in stored[0][1]
    finally:
        client.close()
        client.close()  # idempotent


@pytest.fixture(scope="module")
def ids_topic(cluster: MockKafkaCluster) -> str:
    """Partition 11 of a topic named with '.', '_' and '-': offsets 0..1204
    (one to four digits)."""
    topic = "ids.v2_x-1"
    cluster.create_topic(topic, 12)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})
    for i in range(1205):
        producer.produce(topic, b"v", b"k-%d" % (i % 7), partition=11)
    assert producer.flush(10) == 0
    return topic


def test_message_ids_name_topic_partition_and_offset(
    cluster: MockKafkaCluster, ids_topic: str, new_client: Any
) -> None:
    topic = ids_topic
    client = new_client(_settings(cluster))
    try:
        client.load_metadata(topic, 10.0)
        client.assign([(topic, 11, 0)])
        st = PartitionState(MessageQueue(topic, "kafka", 11), topic, 0, None)
        by_name = {(topic, 11): st}
        _read_all(client, by_name, FMT, 1205)
        assert [m.msg_id for m in st.file] == [f"{topic}-11-{i}" for i in range(1205)]
        assert all(type(m.msg_id) is str and m.msg_id.isascii() for m in st.file)
    finally:
        client.close()


def test_what_was_fetched_already_is_not_filed_again(cluster: MockKafkaCluster, new_client: Any) -> None:
    client = new_client(_settings(cluster))
    try:
        client.assign([("orders", 0, 0)])
        by_name = {("orders", 0): PartitionState(MessageQueue("orders", "kafka", 0), "orders", 0, None)}
        by_name[("orders", 0)].fetched = 7  # as after a seek back: records below are fetched again
        deadline = time.monotonic() + 10
        st = by_name[("orders", 0)]
        while len(st.file) < 3 and time.monotonic() < deadline:
            client.read(by_name, 64, 0.05, FMT, "member")
        assert [m.queue_offset for m in st.file] == [7, 8, 9] and st.fetched == 10
    finally:
        client.close()


def test_keys_in_another_encoding_go_through_its_decoder(cluster: MockKafkaCluster, new_client: Any) -> None:
    client = new_client(_settings(cluster))
    fmt = RecordFormat(key_decoder("hex"), "tags", "kafka", "hex")
    try:
        client.assign([("orders", 1, 0)])
        by_name = {("orders", 1): PartitionState(MessageQueue("orders", "kafka", 1), "orders", 0, None)}
        _read_all(client, by_name, fmt, 10)
        keys = [m.keys for m in by_name[("orders", 1)].file]
        assert keys[0] == b"key-1".hex() and keys[6] == "fffe"  # hex decodes any key
    finally:
        client.close()


def test_pause_resume_seek_and_watermarks(cluster: MockKafkaCluster, new_client: Any) -> None:
    client = new_client(_settings(cluster))
    try:
        assert client.watermarks("orders", 0, 10.0) == (0, 10)
        client.assign([("orders", 0, 0), ("orders", 1, 0)])
        client.pause([("orders", 1)])
        by_name = _states()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            client.read(by_name, 64, 0.05, FMT, "member")
        assert len(by_name[("orders", 0)].file) == 10
        assert len(by_name[("orders", 1)].file) == 0  # paused: nothing fetched
        assert client.cached_high("orders", 0) == 10
        client.resume([("orders", 1)])
        client.seek("orders", 1, 8)
        st = by_name[("orders", 1)]
        st.fetched = 8
        deadline = time.monotonic() + 10
        while len(st.file) < 2 and time.monotonic() < deadline:
            client.read(by_name, 64, 0.05, FMT, "member")
        assert [m.queue_offset for m in st.file] == [8, 9]
        client.unassign([("orders", 0), ("orders", 1)])
    finally:
        client.close()


def test_a_property_librdkafka_refuses_is_named(cluster: MockKafkaCluster, new_client: Any) -> None:
    with pytest.raises(Exception, match="no.such.property"):
        new_client({**_settings(cluster), "no.such.property": "1"})


def test_librdkafka_logs_through_the_logger_given(new_client: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A client's log lines (here: a broker that refuses connections) reach
    the logger, from the thread that reads (never librdkafka's own)."""
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = new_client({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "g", "reconnect.backoff.ms": "10"})
    try:
        with caplog.at_level(logging.DEBUG, logger="test.fetch"):
            deadline = time.monotonic() + 10
            while not caplog.records and time.monotonic() < deadline:
                client.read({}, 16, 0.05, FMT, "member")
        assert caplog.records, "no log line from librdkafka"
        assert any("refused" in r.getMessage() or "failed" in r.getMessage() for r in caplog.records), [
            r.getMessage() for r in caplog.records
        ]
    finally:
        client.close()


def test_messages_leak_nothing(cluster: MockKafkaCluster, new_client: Any) -> None:
    """Every message the client made is freed with its file: the strings
    each holds a reference to are back to where they were (a message the
    compiled twin built slot by slot with a reference too many would keep
    them up)."""
    import gc
    import sys

    broker = "".join(["kaf", "ka-leak"])  # a string of its own, not interned
    fmt = RecordFormat(key_decoder("utf-8"), "tags", broker, "utf-8")
    client = new_client(_settings(cluster))
    try:
        client.assign([("orders", 0, 0)])
        st = PartitionState(MessageQueue("orders", "kafka", 0), "orders", 0, None)
        by_name = {("orders", 0): st}
        gc.collect()
        before = sys.getrefcount(broker)
        for _ in range(20):
            deadline = time.monotonic() + 10
            while len(st.file) < 10 and time.monotonic() < deadline:
                client.read(by_name, 64, 0.05, fmt, "member")
            assert len(st.file) == 10 and all(m.broker_name is broker for m in st.file)
            st.file.clear()
            st.fetched = 0
            client.seek("orders", 0, 0)
        gc.collect()
        assert sys.getrefcount(broker) == before
    finally:
        client.close()
