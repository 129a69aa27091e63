"""The Kafka member's rebalance callbacks apply every change to the group
client themselves, also while the member closes.

A callback that does not leaves it to confluent-kafka, which first asks
librdkafka for the rebalance protocol: called from the revoke that
``Consumer.close()`` runs, that call can block for ever holding the GIL
(librdkafka issue #4041), and a test run once hung there.  The client here
records what it is asked; the callbacks' other collaborators record what
they are told."""

from __future__ import annotations

from typing import Any

from confluent_kafka import OFFSET_END, OFFSET_INVALID, KafkaError, KafkaException, TopicPartition

from lite_push.sources.contract import ConsumeFromWhere
from lite_push.sources.kafka.partitions import Partitions


class _GroupClient:
    """Records the assignment changes it is asked for; ``fails``: each raises."""

    def __init__(self, fails: bool = False) -> None:
        self.calls: list[tuple[str, list[tuple[str, int, int]]]] = []
        self._fails = fails

    def _record(self, name: str, partitions: list[TopicPartition]) -> None:
        self.calls.append((name, [(tp.topic, tp.partition, tp.offset) for tp in partitions]))
        if self._fails:
            raise KafkaException(KafkaError(KafkaError._STATE, "Erroneous state"))

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self._record("assign", partitions)

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self._record("unassign", partitions)


class _Recorder:
    """Any call is recorded as ``(name, args)``; ``group`` is ``"g"``."""

    group = "g"

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.calls.append((name, args))


def _partitions() -> tuple[Partitions, _Recorder, _Recorder]:
    owned, fetcher = _Recorder(), _Recorder()
    callbacks = Partitions(
        owned,  # type: ignore[arg-type]
        {},
        fetcher,  # type: ignore[arg-type]
        {},
        "kafka",
        _Recorder(),  # type: ignore[arg-type]
        ConsumeFromWhere.FIRST_OFFSET,
        None,
    )
    return callbacks, owned, fetcher


TPS = [TopicPartition("T", 0), TopicPartition("T", 3)]


def test_while_closing_each_callback_applies_the_change_itself_and_touches_nothing_else() -> None:
    callbacks, owned, fetcher = _partitions()
    callbacks.closing = True
    kc = _GroupClient()
    callbacks.on_revoke(kc, TPS)  # type: ignore[arg-type]
    callbacks.on_lost(kc, TPS[:1])  # type: ignore[arg-type]
    callbacks.on_assign(kc, TPS[1:])  # type: ignore[arg-type]
    assert kc.calls == [
        ("unassign", [("T", 0, OFFSET_INVALID), ("T", 3, OFFSET_INVALID)]),
        ("unassign", [("T", 0, OFFSET_INVALID)]),
        ("assign", [("T", 3, OFFSET_END)]),  # held at the end, never read
    ]
    # Only on_lost drops what it knows of the partition (nothing here), and tells no one.
    assert fetcher.calls == [("give_up", ([],))] and owned.calls == [("drop", ([],))]


def test_a_revoke_unassigns_after_the_runtime_was_told_and_the_fetcher_gave_up() -> None:
    callbacks, owned, fetcher = _partitions()
    kc = _GroupClient()
    callbacks.on_revoke(kc, TPS)  # type: ignore[arg-type]
    callbacks.on_assign(kc, [])  # type: ignore[arg-type]
    assert fetcher.calls == [("give_up", ([],))] and owned.calls == [("drop", ([],))]  # none of them was owned
    assert kc.calls == [("unassign", [("T", 0, OFFSET_INVALID), ("T", 3, OFFSET_INVALID)]), ("assign", [])]


def test_a_change_the_client_refuses_is_logged_not_raised(caplog: Any) -> None:
    callbacks, _, _ = _partitions()
    kc = _GroupClient(fails=True)
    callbacks.on_revoke(kc, TPS)  # type: ignore[arg-type]
    assert kc.calls and "applying a rebalance to 2 partition(s) failed" in caplog.text
    callbacks.closing = True
    callbacks.on_revoke(kc, TPS)  # type: ignore[arg-type]
    assert len(kc.calls) == 2
