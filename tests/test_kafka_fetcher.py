"""The Kafka member's fetcher (``lite_push.sources.kafka.fetcher``) against a
recording stand-in for its client: what it asks of librdkafka and when.
(Reading real records is the source contract's, on the mock cluster.)"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaException

from lite_push._types import MessageQueue
from lite_push.sources._owned import OwnedQueues
from lite_push.sources.kafka.codec import RecordFormat
from lite_push.sources.kafka.fetcher import Fetcher
from lite_push.sources.kafka.reading import PartitionState


class Client:
    """Records every call a fetcher makes of its client (a fetch client's
    methods: ``lite_push.sources.kafka.fetch_client``)."""

    def __init__(self, fail_metadata: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail_metadata = fail_metadata

    def load_metadata(self, topic: str, timeout: float) -> None:
        self.calls.append(("load_metadata", topic))
        if self.fail_metadata:
            raise KafkaException("no metadata")

    def assign(self, partitions: list[tuple[str, int, int]]) -> None:
        self.calls.append(("assign", partitions))

    def unassign(self, partitions: list[tuple[str, int]]) -> None:
        self.calls.append(("unassign", partitions))

    def pause(self, partitions: list[tuple[str, int]]) -> None:
        self.calls.append(("pause", partitions))

    def resume(self, partitions: list[tuple[str, int]]) -> None:
        self.calls.append(("resume", partitions))

    def seek(self, topic: str, partition: int, offset: int) -> None:
        self.calls.append(("seek", (topic, partition, offset)))


def _fetcher(client: Client) -> Fetcher:
    owned = OwnedQueues[PartitionState]("g", "c", "member")
    return Fetcher(client, owned, {}, RecordFormat(bytes.decode, "tags", "kafka"), lambda _r, _e: None)


def test_a_topic_new_to_the_fetcher_has_its_metadata_read_before_it_is_assigned() -> None:
    """A client idle before its first assignment fetched nothing for 0.9 s
    until its next metadata refresh: the fetcher asks for a new topic's
    metadata first, once per topic."""
    client = Client()
    fetcher = _fetcher(client)
    fetcher.assign([("orders", 0, 5), ("orders", 1, 7)])
    fetcher.assign([("orders", 2, 0), ("refunds", 0, 3)])
    assert client.calls == [
        ("load_metadata", "orders"),
        ("assign", [("orders", 0, 5), ("orders", 1, 7)]),
        ("load_metadata", "refunds"),
        ("assign", [("orders", 2, 0), ("refunds", 0, 3)]),
    ]


def test_metadata_that_cannot_be_read_does_not_stop_the_assignment() -> None:
    client = Client(fail_metadata=True)
    fetcher = _fetcher(client)
    fetcher.assign([("orders", 0, 5)])
    fetcher.assign([("orders", 1, 5)])  # asked again: it was not read
    assert client.calls == [
        ("load_metadata", "orders"),
        ("assign", [("orders", 0, 5)]),
        ("load_metadata", "orders"),
        ("assign", [("orders", 1, 5)]),
    ]


def test_a_partition_given_up_while_paused_is_resumed_first_and_a_resume_seeks_to_the_file_end() -> None:
    client = Client()
    fetcher = _fetcher(client)
    a = PartitionState(MessageQueue("orders", "kafka", 0), "orders", 10, None)
    b = PartitionState(MessageQueue("orders", "kafka", 1), "orders", 20, None)
    a.fetched, b.fetched = 14, 25
    fetcher.pause([a])
    a.paused = True
    fetcher.give_up([a, b])
    assert client.calls == [
        ("pause", [("orders", 0)]),
        ("resume", [("orders", 0)]),
        ("unassign", [("orders", 0), ("orders", 1)]),
    ]
    client.calls.clear()
    fetcher.resume([b])
    assert client.calls == [("resume", [("orders", 1)]), ("seek", ("orders", 1, 25))]
