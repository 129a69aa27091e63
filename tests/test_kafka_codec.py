"""The Kafka source's pure parts, without a broker: topic names (retry and
dead-letter topics under Kafka's legal characters), records as messages,
ownership from librdkafka's statistics, and the settings a broker refuses."""

from __future__ import annotations

import re

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lite_push import ConfigError
from lite_push.sources import dlq_topic, retry_topic
from lite_push.sources.kafka import KafkaBroker
from lite_push.sources.kafka.codec import MalformedRecord, decode, encode_headers, kafka_topic, key_decoder, lite_topic
from lite_push.sources.kafka.ownership import STATS_INTERVAL, Ownership

LEGAL = re.compile(r"[A-Za-z0-9._-]{1,249}")


# An escaped character takes at most 12 characters (``_xx`` per UTF-8 byte,
# at most 4 bytes): 19 of them fit in 249 with the longest prefix (16), 21
# characters outside the BMP (4 bytes each) never do.
@given(st.text(min_size=1, max_size=19))
def test_retry_and_dlq_names_are_legal_kafka_names_and_map_back(group: str) -> None:
    for lite in (retry_topic(group), dlq_topic(group)):
        stored = kafka_topic(lite)
        assert LEGAL.fullmatch(stored), stored
        assert lite_topic(stored) == lite
    assert kafka_topic(retry_topic(group)) != kafka_topic(dlq_topic(group))


@given(st.text(st.characters(min_codepoint=0x10000, max_codepoint=0x10FFFF), min_size=21, max_size=40))
def test_a_group_whose_kafka_name_is_too_long_is_refused_naming_it(group: str) -> None:
    for lite in (retry_topic(group), dlq_topic(group)):
        with pytest.raises(ValueError, match="longer than 249 characters") as info:
            kafka_topic(lite)
        assert repr(lite) in str(info.value)


def test_a_group_at_the_length_limit() -> None:
    fits = "g" * (249 - len("lite-push.retry."))
    assert kafka_topic(retry_topic(fits)) == "lite-push.retry." + fits
    with pytest.raises(ValueError, match="longer than 249"):
        kafka_topic(retry_topic(fits + "g"))


def test_names_are_readable_and_plain_topics_pass_through() -> None:
    assert kafka_topic("%RETRY%sms") == "lite-push.retry.sms"
    assert kafka_topic("%DLQ%orders/eu_1") == "lite-push.dlq.orders_2feu__1"
    assert kafka_topic("orders.v2-eu_x") == "orders.v2-eu_x"
    assert lite_topic("orders.v2-eu_x") == "orders.v2-eu_x"
    assert lite_topic("lite-push.retry.bad_zz") == "lite-push.retry.bad_zz"  # not an escape: left as it is


@pytest.mark.parametrize("bad", ["has space", "a/b", "", ".", "x" * 250, "naïve"])
def test_an_illegal_topic_name_is_refused_naming_it(bad: str) -> None:
    with pytest.raises(ValueError, match="topic"):
        kafka_topic(bad)


class _Record:
    """What confluent-kafka's Message offers the codec."""

    def __init__(self, key, value, headers, *, topic="T", partition=2, offset=41, ts=1_700_000_000_000):  # type: ignore[no-untyped-def]
        self._k, self._v, self._h = key, value, headers
        self._t, self._p, self._o, self._ts = topic, partition, offset, ts

    def key(self):  # type: ignore[no-untyped-def]
        return self._k

    def value(self):  # type: ignore[no-untyped-def]
        return self._v

    def headers(self):  # type: ignore[no-untyped-def]
        return self._h

    def topic(self):  # type: ignore[no-untyped-def]
        return self._t

    def partition(self):  # type: ignore[no-untyped-def]
        return self._p

    def offset(self):  # type: ignore[no-untyped-def]
        return self._o

    def timestamp(self):  # type: ignore[no-untyped-def]
        return (1, self._ts)


def test_a_record_becomes_a_message_and_back() -> None:
    headers = encode_headers("TagA", {"trace": "t-1", "RECONSUME_TIME": "2"}, "tags")
    m = decode(_Record(b"user-7", b"body", headers), "T", key_decoder("utf-8"), "tags", "kafka")
    assert (m.topic, m.queue_id, m.queue_offset, m.body, m.keys, m.tags) == ("T", 2, 41, b"body", "user-7", "TagA")
    assert m.properties == {"trace": "t-1", "RECONSUME_TIME": "2"} and m.reconsume_times == 2
    assert m.born_timestamp == m.store_timestamp == 1_700_000_000_000 and m.msg_id == "T-2-41"
    keyless = decode(_Record(None, None, None), "T", key_decoder("utf-8"), "tags", "kafka")
    assert (keyless.keys, keyless.body, keyless.tags, keyless.properties) == (None, b"", None, {})
    assert decode(_Record(b"\xff\x00", b"", None), "T", key_decoder("hex"), "tags", "kafka").keys == "ff00"


@pytest.mark.parametrize(
    ("key", "headers", "reason"),
    [
        (b"\xff", None, "undecodable key"),
        (b"k", [("trace", b"\xfe")], "undecodable header 'trace'"),
        (b"k", [("RECONSUME_TIME", b"-1")], "RECONSUME_TIME"),
    ],
)
def test_a_malformed_record_says_why(key: bytes, headers: list[tuple[str, bytes]] | None, reason: str) -> None:
    with pytest.raises(MalformedRecord, match=re.escape(reason)):
        decode(_Record(key, b"", headers), "T", key_decoder("utf-8"), "tags", "kafka")


def _stats(state: str = "up", rxidle_us: int = 200_000, rtt_max_us: int = 1_000, coordinator: bool = True) -> str:
    brokers = {"127.0.0.1:9092/1": {"nodeid": 1, "state": "UP", "rxidle": 5, "rtt": {"max": 10}}}
    if coordinator:
        brokers["GroupCoordinator"] = {"nodeid": -1, "state": "UP", "rxidle": rxidle_us, "rtt": {"max": rtt_max_us}}
    return orjson.dumps({"brokers": brokers, "cgrp": {"state": state}}).decode()


def test_ownership_runs_a_session_from_the_coordinators_last_answer_less_its_round_trip() -> None:
    own = Ownership(10.0)
    assert own.left() < 0  # nothing known yet: not certain
    own.on_stats(_stats(rxidle_us=200_000, rtt_max_us=1_000), now=100.0)
    assert own.until == pytest.approx(100.0 - 0.201 + 10.0)
    own.on_stats(_stats(rxidle_us=9_000_000), now=100.5)  # an older answer never moves it back
    assert own.until == pytest.approx(109.799)
    for stale in (_stats(state="wait-join"), _stats(coordinator=False), "not json", "[]"):
        own.on_stats(stale, now=200.0)
    assert own.until == pytest.approx(109.799)  # none of these renews it


def test_an_assignment_renews_ownership_conservatively() -> None:
    own = Ownership(10.0)
    own.assigned()
    assert 10.0 - STATS_INTERVAL - 0.5 < own.left() <= 10.0 - STATS_INTERVAL


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"config": {"group.id": "x"}}, "config['group.id']"),
        ({"consumer_config": {"enable.auto.commit": True}}, "consumer_config['enable.auto.commit']"),
        ({"config": {"no.such.property": "1"}}, "config"),
        ({"session_timeout": 0.1}, "session_timeout"),
        ({"metadata_max_bytes": 10}, "metadata_max_bytes"),
        ({"key_encoding": "no-such-codec"}, "key_encoding"),
        ({"config": {"linger.ms": object()}}, "config['linger.ms']"),
    ],
)
def test_bad_broker_settings_raise_at_construction_naming_the_field(kwargs: dict, field: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError) as e:
        KafkaBroker("127.0.0.1:1", **kwargs)
    assert field in str(e.value)


def test_a_member_fetches_with_a_short_wait_unless_told_otherwise() -> None:
    """A member's ``fetch.wait.max.ms`` is 100 (a partition resumed after a
    flow-control pause waits for the fetch in flight); the broker's
    ``config`` or ``consumer_config`` sets another."""
    from lite_push import ConsumeFromWhere
    from lite_push.sources.kafka.settings import FETCH_WAIT_MAX_MS, member_settings

    def member(base: dict[str, str]) -> dict[str, object]:
        return member_settings(base, "g", "c", ConsumeFromWhere.FIRST_OFFSET, 10.0, lambda _s: None)

    assert FETCH_WAIT_MAX_MS == "100"
    assert member({})["fetch.wait.max.ms"] == "100"
    assert member({"fetch.wait.max.ms": "500"})["fetch.wait.max.ms"] == "500"
    broker = KafkaBroker("127.0.0.1:1", consumer_config={"fetch.wait.max.ms": 20})
    try:
        assert member(broker.client_settings())["fetch.wait.max.ms"] == "20"
    finally:
        broker.close()
